"""Param IDs and numeric assertions."""

import pytest
import torch

from tests.testing.bench import make_param_id
from tests.testing.numeric import assert_close, assert_equal, calc_diff, count_bytes


def test_param_ids_are_stable_and_readable():
    params = {'num_tokens': 4001, 'hidden': 4096, 'dtype': torch.bfloat16, 'eps': 1e-6, 'save': False}
    assert make_param_id(params) == 'num_tokens=4001-hidden=4096-dtype=bf16-eps=1e-06-save=False'
    assert make_param_id({'shape': (2, 3)}) == 'shape=2x3'


def test_param_ids_refuse_unstable_values():
    with pytest.raises(TypeError, match='dict of parameters'):
        make_param_id([1, 2])
    with pytest.raises(TypeError, match='stable test ID'):
        make_param_id({'x': object()})


def test_assert_equal_is_bit_exact():
    x = torch.randn(64, dtype=torch.bfloat16)
    assert_equal(x, x.clone())
    y = x.clone()
    y[5] = y[5] * 1.5 + 1
    with pytest.raises(AssertionError, match='1 of 64 elements differ; first at \\(5,\\)'):
        assert_equal(y, x)
    nan = torch.full((3,), float('nan'))
    assert_equal(nan, nan.clone())


def test_assert_equal_checks_metadata():
    x = torch.zeros(2, 3)
    with pytest.raises(AssertionError, match='dtype'):
        assert_equal(x, x.double())
    with pytest.raises(AssertionError, match='shape'):
        assert_equal(x, x.reshape(3, 2))
    with pytest.raises(AssertionError, match='stride'):
        assert_equal(x.t(), x.t().contiguous())
    assert_equal(x.t(), x.t().contiguous(), check_stride=False)
    assert_equal(torch.tensor([-0.0]), torch.tensor([-0.0]))
    with pytest.raises(AssertionError):
        assert_equal(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_assert_close_refuses_nan():
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([float('nan')]), torch.tensor([float('nan')]), atol=1.0, rtol=1.0)
    assert_close(torch.tensor([1.0]), torch.tensor([1.001]), atol=0.0, rtol=1e-2)


def test_calc_diff_and_count_bytes():
    x = torch.randn(100)
    assert calc_diff(x, x) == pytest.approx(0.0, abs=1e-12)
    assert calc_diff(x, -x) == pytest.approx(2.0)
    assert calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert count_bytes(torch.zeros(4, dtype=torch.bfloat16), None, torch.zeros(2)) == 16
