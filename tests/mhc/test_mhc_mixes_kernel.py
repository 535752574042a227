"""Kernel-layer tests of the mix operators (packages/cann_ops_tilelang/mhc/_mixes_kernel.py): the configuration
chooser and its validation, and the lowering of every kernel kind on both backends for the level's mhc_mult
(CPU tier: no device; lowering checks no values, the operators' device tests do)."""

import pytest

from cann_ops_tilelang.mhc._mixes_common import MAX_PARTIALS, split_width
from cann_ops_tilelang.mhc._mixes_kernel import (
    KINDS,
    MhcMixesConfig,
    choose_mhc_mixes_config,
    make_mhc_mixes_kernel,
)
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)

from .mixes_cases import gen_mhc_mult

KERNEL_NAMES = {
    'head_fwd': 'mhc_head_compute_mix_fwd_kernel',
    'head_bwd': 'mhc_head_compute_mix_bwd_kernel',
    'split_fwd': 'mhc_pre_split_mixes_fwd_kernel',
    'split_bwd': 'mhc_pre_split_mixes_bwd_kernel',
    'split_reduce': 'mhc_pre_split_mixes_bwd_reduce_kernel',
}
PARAMS = generate_samples(get_test_level(), kind=KINDS, mhc_mult=gen_mhc_mult)


def make_config(backend: str, kind: str, mhc_mult: int) -> MhcMixesConfig:
    """The config of an Ascend 950 (64 vector cores) or an H200 (132 SMs); the head backward with one partial
    row per core, as TileKernels' callers pass num_sms."""
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    num_partials = num_cores if kind == 'head_bwd' else 0
    return choose_mhc_mixes_config(
        backend=backend, num_cores=num_cores, kind=kind, mhc_mult=mhc_mult, num_partials=num_partials
    )


@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_mixes_ascend_kernel_lowers(params):
    cfg = make_config('ascend', params['kind'], params['mhc_mult'])
    assert_ascend_kernel_lowers(lambda: make_mhc_mixes_kernel(cfg), key=cfg, kernel_name=KERNEL_NAMES[cfg.kind])


@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_mixes_cuda_kernel_lowers(params):
    cfg = make_config('cuda', params['kind'], params['mhc_mult'])
    lowered = assert_cuda_kernel_lowers(lambda: make_mhc_mixes_kernel(cfg), key=cfg, kernel_name=KERNEL_NAMES[cfg.kind])
    assert 'atomic' not in lowered.source.lower()  # the backward's sums are ordered: no atomics


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_mhc_mixes_config_choice(backend):
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    fwd = make_config(backend, 'split_fwd', 4)
    assert (fwd.width, fwd.num_scales, fwd.num_partials) == (24, 3, 0)
    assert fwd.token_block == (64 if backend == 'ascend' else 32)
    assert fwd.num_stages == (2 if backend == 'ascend' else 1)
    # The split backward and its reduce: one partial row per core, both the same count.
    assert make_config(backend, 'split_bwd', 3).num_partials == num_cores
    assert make_config(backend, 'split_reduce', 3).num_partials == num_cores
    head = make_config(backend, 'head_bwd', 5)
    assert (head.width, head.num_scales, head.num_partials) == (5, 1, num_cores)
    chosen = choose_mhc_mixes_config(
        backend=backend, num_cores=num_cores, kind='head_fwd', mhc_mult=2, token_block_size=8
    )
    assert chosen.token_block == 8
    narrow = choose_mhc_mixes_config(
        backend=backend, num_cores=num_cores, kind='head_fwd', mhc_mult=2, token_block_size=2
    )
    assert narrow.token_block == (8 if backend == 'ascend' else 2)  # Ascend tiles are whole 64-lane registers
    assert [split_width(m) for m in range(1, 9)] == [3, 8, 15, 24, 35, 48, 63, 80]


@pytest.mark.parametrize(
    ('changes', 'match'),
    [
        ({'backend': 'cpu'}, 'backend must be'),
        ({'kind': 'fwd'}, 'kind must be one of'),
        ({'mhc_mult': 9}, r'mhc_mult must be in \[1, 8\]'),
        ({'num_cores': 0}, 'num_cores must be >= 1'),
        ({'token_block': 48}, 'token_block must be a power of two'),
        ({'token_block': 128}, 'token_block must be a power of two'),
        ({'num_partials': 0}, 'num_partials must be in'),
        ({'num_partials': MAX_PARTIALS + 1}, 'num_partials must be in'),
        ({'threads': 64, 'mhc_mult': 8}, 'a thread per column and scale: 83 threads'),
    ],
    ids=['backend', 'kind', 'mhc-mult', 'cores', 'block', 'block-large', 'partials', 'partials-large', 'threads'],
)
def test_mhc_mixes_config_rejects(changes, match):
    base = make_config('cuda', 'split_bwd', 4)
    with pytest.raises(ValueError, match=match):
        MhcMixesConfig(**{**base.__dict__, **changes})


def test_mhc_mixes_config_rejects_forward_partials_and_large_ascend_reduce():
    fwd = make_config('ascend', 'head_fwd', 4)
    with pytest.raises(ValueError, match='Ascend: token_block must be >= 8'):
        MhcMixesConfig(**{**fwd.__dict__, 'token_block': 4})
    with pytest.raises(ValueError, match='num_partials must be in'):
        MhcMixesConfig(**{**fwd.__dict__, 'num_partials': 4})
    with pytest.raises(ValueError, match='partial rows do not fit UB'):
        choose_mhc_mixes_config(backend='ascend', num_cores=256, kind='split_reduce', mhc_mult=8)
