"""Shared argument checks of the public interfaces."""

import pytest
import torch

from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.validation import (
    check_bool,
    check_last_dim_contiguous,
    check_out,
    check_positive_float,
    check_tensor,
    may_overlap,
)


def test_check_tensor_types_and_dims():
    with pytest.raises(TypeError, match='x must be a torch.Tensor, got list'):
        check_tensor('x', [1], dtype=torch.float32)
    with pytest.raises(TypeError, match='x must have dtype torch.bfloat16'):
        check_tensor('x', torch.zeros(2), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match='x must have 3 dimensions'):
        check_tensor('x', torch.zeros(2), dtype=torch.float32, ndim=3)


def test_last_dim_contiguity():
    base = torch.zeros(4, 8)
    check_last_dim_contiguous('k', base[:, :4])  # outer stride free
    with pytest.raises(ValueError, match='contiguous last dimension'):
        check_last_dim_contiguous('k', base.t())


def test_scalars():
    assert check_bool('flag', True) is True
    with pytest.raises(TypeError, match='flag must be a bool'):
        check_bool('flag', 1)
    assert check_positive_float('eps', 1) == 1.0
    for bad in (0.0, -1e-6, float('nan'), float('inf')):
        with pytest.raises(ValueError, match='eps must be a finite number > 0'):
            check_positive_float('eps', bad)
    with pytest.raises(TypeError, match='eps must be a float'):
        check_positive_float('eps', '1e-6')


def test_overlap_detection():
    buf = torch.zeros(16)
    assert may_overlap(buf[:8], buf[4:12])
    assert not may_overlap(buf[:8], buf[8:])
    assert may_overlap(buf[::2], buf[1::2])  # conservative for interleaved views
    assert not may_overlap(buf, torch.zeros(16))


def test_check_out():
    x = torch.zeros(2, 4)
    ok = torch.empty(2, 4)
    assert check_out('out', ok, shape=(2, 4), dtype=torch.float32, device=x.device, inputs={'x': x}) is ok
    with pytest.raises(ValueError, match=r'out must have shape \(2, 4\)'):
        check_out('out', torch.empty(4, 2), shape=(2, 4), dtype=torch.float32, device=x.device, inputs={})
    with pytest.raises(TypeError, match='out must have dtype'):
        check_out('out', ok.double(), shape=(2, 4), dtype=torch.float32, device=x.device, inputs={})
    with pytest.raises(ValueError, match='out must be contiguous'):
        check_out('out', torch.empty(4, 2).t(), shape=(2, 4), dtype=torch.float32, device=x.device, inputs={})
    with pytest.raises(ValueError, match='out must not alias the input x'):
        check_out('out', x, shape=(2, 4), dtype=torch.float32, device=x.device, inputs={'x': x})
    with pytest.raises(RuntimeError, match='out must be on meta'):
        check_out('out', ok, shape=(2, 4), dtype=torch.float32, device=torch.device('meta'), inputs={})


@pytest.mark.parametrize(('hc', 'hidden'), [(1, 64), (8, 16384), (3, 192)])
def test_engram_limits_accept(hc, hidden):
    check_hc_hidden('op', hc, hidden)


@pytest.mark.parametrize(
    ('hc', 'hidden', 'message'),
    [(0, 64, 'hc'), (9, 64, 'hc'), (4, 100, 'multiple of 64'), (4, 16448, 'up to 16384'), (4, 0, 'multiple of 64')],
)
def test_engram_limits_refuse(hc, hidden, message):
    with pytest.raises(ValueError, match=message):
        check_hc_hidden('op', hc, hidden)
