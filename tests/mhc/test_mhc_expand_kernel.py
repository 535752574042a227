"""Tests of the mhc_expand kernel family's configuration and lowering (mhc_expand_kernel.py): CPU tier.

Each (mhc_mult, hidden) of the level lowers once per backend and direction (the token count is dynamic); the
Ascend kernels' UB stays within its limit, the CUDA kernels access memory in 16-byte vectors. Lowering checks no
values (test_mhc_expand_fwd.py / _bwd.py do, on a device or the emulator).
"""

import dataclasses

import pytest

from cann_ops_tilelang.mhc._mhc_expand_apply_common import ASCEND_STAGES, ASCEND_UB_BUDGET
from cann_ops_tilelang.mhc.mhc_expand_kernel import MhcExpandConfig, make_mhc_expand_kernel
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples
from tests.testing.lowering import assert_ascend_kernel_lowers, assert_cuda_kernel_lowers

from .expand_apply_cases import PARAMS, expand_config

LOWERING_PARAMS = generate_samples(sizes=[p['sizes'] for p in PARAMS], direction=['fwd', 'bwd'])


@pytest.mark.parametrize('params', LOWERING_PARAMS, ids=make_param_id)
def test_mhc_expand_ascend_kernel_lowers(params):
    cfg = expand_config('ascend', params['direction'], *params['sizes'])
    assert_ascend_kernel_lowers(
        lambda: make_mhc_expand_kernel(cfg), key=cfg, kernel_name=f'mhc_expand_{params["direction"]}_kernel'
    )


@pytest.mark.parametrize('params', LOWERING_PARAMS, ids=make_param_id)
def test_mhc_expand_cuda_kernel_lowers(params):
    cfg = expand_config('cuda', params['direction'], *params['sizes'])
    lowered = assert_cuda_kernel_lowers(
        lambda: make_mhc_expand_kernel(cfg), key=cfg, kernel_name=f'mhc_expand_{params["direction"]}_kernel'
    )
    assert 'uint4' in lowered.source  # 16-byte loads and stores of the bf16 rows


@pytest.mark.parametrize('mhc', range(1, 9))
@pytest.mark.parametrize('hidden', [64, 192, 2560, 4096, 7168, 16384])
def test_mhc_expand_config_tiles(mhc, hidden):
    """Ascend: a whole number of hidden blocks per row, the widest whose tiles fit the UB budget in its buffer
    versions; CUDA: a power-of-two block of up to 1024 columns and 4096 elements per thread block."""
    for direction, rows in (('fwd', 1), ('bwd', mhc + 1)):
        asc = expand_config('ascend', direction, mhc, hidden)
        assert hidden % asc.hidden_block == 0
        assert asc.hidden_block % 64 == 0
        assert ASCEND_STAGES * rows * 2 * asc.hidden_block <= ASCEND_UB_BUDGET
        wider = [b for b in range(asc.hidden_block + 64, hidden + 1, 64) if hidden % b == 0]
        assert not wider or ASCEND_STAGES * rows * 2 * wider[0] > ASCEND_UB_BUDGET
        cuda = expand_config('cuda', direction, mhc, hidden)
        block = cuda.hidden_block
        assert block & (block - 1) == 0
        assert hidden % block == 0
        assert 64 <= block <= 1024
        assert block == 1024 or hidden % (2 * block) or block * 2 > hidden
        assert cuda.token_block * block == 4096
        assert cuda.threads == 256


def test_mhc_expand_config_for_the_peer_shapes():
    # mhc_mult 4: the whole row in one Ascend task (fwd up to 49152 columns, bwd up to 9830).
    assert [expand_config('ascend', d, 4, h).hidden_block for d in ('fwd', 'bwd') for h in (2560, 7168)] == [
        2560,
        7168,
        2560,
        7168,
    ]
    assert [expand_config('cuda', 'fwd', 4, h).hidden_block for h in (2560, 4096, 7168)] == [512, 1024, 1024]


@pytest.mark.parametrize(
    ('change', 'match'),
    [
        ({'backend': 'rocm'}, 'backend must be'),
        ({'direction': 'sideways'}, 'direction must be one of'),
        ({'mhc': 9}, r'mhc must be in \[1, 8\]'),
        ({'hidden': 96}, 'hidden must be a positive multiple of 64'),
        ({'hidden_block': 192}, 'must be a multiple of 64 dividing'),
        ({'token_block': 0}, 'must be >= 1'),
    ],
)
def test_mhc_expand_config_rejects(change, match):
    cfg = expand_config('cuda', 'fwd', 4, 256)
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(cfg, **change)


def test_mhc_expand_ascend_task_is_one_token():
    with pytest.raises(ValueError, match='an Ascend task is one token'):
        dataclasses.replace(expand_config('ascend', 'fwd', 4, 256), token_block=2)
    assert isinstance(expand_config('ascend', 'bwd', 4, 256), MhcExpandConfig)
