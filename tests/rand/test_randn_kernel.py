"""Tests of randn's kernel configuration (randn_kernel.py): the chooser and the config's own checks (CPU tier)."""

import pytest
import torch

from cann_ops_tilelang.rand._counter_normal import GROUP_ELEMENTS, GROUP_PAIRS, mix32, pairs_drawn, seed_keys
from cann_ops_tilelang.rand.randn_kernel import RandnConfig, choose_randn_config
from tests.testing.lowering import ASCEND_950_VECTOR_CORES, H200_SMS

from .randn_ref import mix32_ref


@pytest.mark.parametrize(
    ('dtype', 'block', 'vec'), [(torch.float32, 8192, 4), (torch.bfloat16, 16384, 8), (torch.float16, 16384, 8)]
)
def test_choose_randn_config(dtype, block, vec):
    ascend = choose_randn_config(backend='ascend', dtype=dtype, num_cores=ASCEND_950_VECTOR_CORES)
    assert ascend == RandnConfig('ascend', str(dtype).removeprefix('torch.'), ASCEND_950_VECTOR_CORES, block, 0, 0, 2)
    cuda = choose_randn_config(backend='cuda', dtype=dtype, num_cores=H200_SMS)
    assert cuda == RandnConfig('cuda', str(dtype).removeprefix('torch.'), H200_SMS, 0, 256, vec, 1)
    assert cuda.vec * dtype.itemsize == 16  # one 16-byte store per half group and thread


def test_choose_randn_config_rejects_dtype():
    for backend in ('ascend', 'cuda'):
        with pytest.raises(ValueError, match='randn supports .* got torch.float64'):
            choose_randn_config(backend=backend, dtype=torch.float64, num_cores=1)


@pytest.mark.parametrize(
    ('fields', 'match'),
    [
        (('npu', 'float32', 1, 8192, 0, 0, 2), 'backend must be'),
        (('ascend', 'int8', 1, 8192, 0, 0, 2), 'dtype must be one of'),
        (('ascend', 'float32', 0, 8192, 0, 0, 2), 'num_cores must be >= 1'),
        (('ascend', 'float32', 1, 200, 0, 0, 2), 'whole groups'),
        (('cuda', 'float32', 1, 0, 256, 8, 1), '16-byte store'),
        (('cuda', 'bfloat16', 1, 0, 100, 8, 1), 'whole warps'),
    ],
)
def test_randn_config_rejects(fields, match):
    with pytest.raises(ValueError, match=match):
        RandnConfig(*fields)


def test_pairs_drawn_is_whole_groups():
    assert [pairs_drawn(n) for n in (1, GROUP_ELEMENTS, GROUP_ELEMENTS + 1)] == [GROUP_PAIRS, GROUP_PAIRS, 128]


def test_host_mix_matches_replay():
    """The host's key mix (Python ints) and the replay's (tensors) are one function."""
    values = [0, 1, 2**31, 2**32 - 1, *seed_keys(7)]
    assert mix32_ref(torch.tensor(values, dtype=torch.int64)).tolist() == [mix32(v) for v in values]


def test_seed_keys():
    assert seed_keys(0) != seed_keys(1)
    assert seed_keys(-1) == seed_keys(2**64 - 1)  # the 64-bit two's complement, as torch.manual_seed takes it
    assert all(0 <= k < 2**32 for k in seed_keys(123))
