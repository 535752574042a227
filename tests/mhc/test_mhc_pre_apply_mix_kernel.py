"""Tests of the mhc_pre_apply_mix kernel family's configuration and lowering (mhc_pre_apply_mix_kernel.py): CPU
tier, and on a CUDA GPU (`npu`, level 1) the forward's schedule variants against the chosen one.

Each (mhc_mult, hidden) of the level lowers once per backend and direction (the token count is dynamic); the
Ascend kernels' UB stays within its limit, the CUDA kernels access memory in 16-byte vectors where a thread's
share of a row allows. Lowering checks no values (test_mhc_pre_apply_mix_fwd.py / _bwd.py do).
"""

import dataclasses

import pytest
import torch

from cann_ops_tilelang.kernel_target import Launcher
from cann_ops_tilelang.mhc._mhc_expand_apply_common import ASCEND_STAGES, ASCEND_UB_BUDGET
from cann_ops_tilelang.mhc.mhc_pre_apply_mix_kernel import (
    CUDA_FWD_TILE_ELEMENTS,
    get_mhc_pre_apply_mix_kernel,
    make_mhc_pre_apply_mix_kernel,
)
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import assert_ascend_kernel_lowers, assert_cuda_kernel_lowers

from .expand_apply_cases import PARAMS, bf16, mix, poisoned, pre_apply_mix_config

LOWERING_PARAMS = generate_samples(sizes=[p['sizes'] for p in PARAMS], direction=['fwd', 'bwd'])


@pytest.mark.parametrize('params', LOWERING_PARAMS, ids=make_param_id)
def test_mhc_pre_apply_mix_ascend_kernel_lowers(params):
    cfg = pre_apply_mix_config('ascend', params['direction'], *params['sizes'])
    assert_ascend_kernel_lowers(
        lambda: make_mhc_pre_apply_mix_kernel(cfg),
        key=cfg,
        kernel_name=f'mhc_pre_apply_mix_{params["direction"]}_kernel',
    )


@pytest.mark.parametrize('params', LOWERING_PARAMS, ids=make_param_id)
def test_mhc_pre_apply_mix_cuda_kernel_lowers(params):
    cfg = pre_apply_mix_config('cuda', params['direction'], *params['sizes'])
    lowered = assert_cuda_kernel_lowers(
        lambda: make_mhc_pre_apply_mix_kernel(cfg),
        key=cfg,
        kernel_name=f'mhc_pre_apply_mix_{params["direction"]}_kernel',
    )
    if cfg.vector == 8:
        assert 'uint4' in lowered.source  # 16-byte loads and stores of the bf16 rows
    assert 'atomic' not in lowered.source.lower()  # the backward's reduction is a fixed tree
    if cfg.direction == 'bwd':  # registers for 512 resident threads per SM
        assert f'__launch_bounds__({cfg.threads}, {512 // cfg.threads})' in lowered.source


@pytest.mark.parametrize('mhc', range(1, 9))
@pytest.mark.parametrize('hidden', [64, 192, 2560, 4096, 7168, 16384])
def test_mhc_pre_apply_mix_config_tiles(mhc, hidden):
    """Ascend: a whole number of hidden blocks, the widest whose bf16 tiles fit the UB budget; CUDA: power-of-two
    blocks; the backward's threads (a power of two, 32 .. 128) each hold whole vectors of every stream row."""
    for direction, rows in (('fwd', mhc + 1), ('bwd', 2 * mhc + 1)):
        asc = pre_apply_mix_config('ascend', direction, mhc, hidden)
        assert hidden % asc.hidden_block == 0
        assert asc.hidden_block % 64 == 0
        assert ASCEND_STAGES * rows * 2 * asc.hidden_block <= ASCEND_UB_BUDGET
        wider = [b for b in range(asc.hidden_block + 64, hidden + 1, 64) if hidden % b == 0]
        assert not wider or ASCEND_STAGES * rows * 2 * wider[0] > ASCEND_UB_BUDGET
    fwd = pre_apply_mix_config('cuda', 'fwd', mhc, hidden)
    assert fwd.token_block * fwd.hidden_block == CUDA_FWD_TILE_ELEMENTS
    assert fwd.vector == 8
    assert fwd.hidden_inner
    assert fwd.threads * fwd.vector * 2 == CUDA_FWD_TILE_ELEMENTS  # two 16-byte vectors of every stream a thread
    bwd = pre_apply_mix_config('cuda', 'bwd', mhc, hidden)
    threads, vector, block = bwd.threads, bwd.vector, bwd.hidden_block
    assert threads in (32, 64, 128)
    assert vector in (2, 4, 8)
    assert block % (threads * vector) == 0
    assert vector == 8 or block // vector == 32  # 16-byte vectors unless the block is too narrow for 32 threads


@pytest.mark.parametrize('hidden_inner', [True, False])
def test_mhc_pre_apply_mix_cuda_fwd_grid_orders_lower(hidden_inner):
    """Both grids of the forward lower: hidden-first on one grid dimension (blockIdx.x split by the constant
    count of hidden blocks), token-first on two."""
    cfg = dataclasses.replace(pre_apply_mix_config('cuda', 'fwd', 4, 7168), hidden_inner=hidden_inner)
    lowered = assert_cuda_kernel_lowers(
        lambda: make_mhc_pre_apply_mix_kernel(cfg), key=cfg, kernel_name='mhc_pre_apply_mix_fwd_kernel'
    )
    assert ('blockIdx.y' in lowered.source) != hidden_inner
    assert ('/ 7)' in lowered.source) == hidden_inner  # 7168 / 1024 hidden blocks per token tile


@pytest.mark.parametrize(
    ('change', 'match'),
    [
        ({'direction': 'sideways'}, 'direction must be one of'),
        ({'mhc': 0}, r'mhc must be in \[1, 8\]'),
        ({'hidden_block': 384}, 'must be a multiple of 64 dividing'),
        ({'token_block': 2}, 'a task of this kernel is one token'),
        ({'threads': 256}, 'whole vectors'),
        ({'clamped_reads': True}, 'clamped_reads is a CUDA forward field'),
    ],
)
def test_mhc_pre_apply_mix_config_rejects(change, match):
    cfg = pre_apply_mix_config('cuda', 'bwd', 4, 1024)
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(cfg, **change)


@pytest.mark.parametrize('change', [{'threads': 48}, {'threads': 512}, {'token_block': 3, 'threads': 256}])
def test_mhc_pre_apply_mix_fwd_config_rejects_partial_threads(change):
    """The forward's threads are whole warps that each take whole vectors of the tile."""
    cfg = pre_apply_mix_config('cuda', 'fwd', 4, 1024)
    with pytest.raises(ValueError, match='whole warps'):
        dataclasses.replace(cfg, **change)


# The forward's schedules that the device experiment of issue #33 times against the chosen one (same arithmetic
# per element, so the same bits): name -> the config's changes at hidden H (threads: 8-element vectors, V of
# every stream row a thread).
def _tile(block, tokens, vectors, **change):
    return dict(hidden_block=block, token_block=tokens, threads=tokens * block // (8 * vectors), **change)


FWD_VARIANTS = {
    'clamped': lambda cfg: {'clamped_reads': True},
    '512x1': lambda cfg: _tile(512, 1, 1),
    '512x2_clamped': lambda cfg: _tile(512, 2, 2, clamped_reads=True),
    'row_v1': lambda cfg: _tile(cfg.hidden, 1, 1),
    'row_v2': lambda cfg: _tile(cfg.hidden, 1, 2),
}


def fwd_variant(name, mhc, hidden):
    cfg = pre_apply_mix_config('cuda', 'fwd', mhc, hidden)
    return dataclasses.replace(cfg, **FWD_VARIANTS[name](cfg))


@pytest.mark.parametrize('name', list(FWD_VARIANTS))
def test_mhc_pre_apply_mix_cuda_fwd_variants_lower(name):
    """Each variant lowers with 16-byte accesses; clamped reads index x by min(token, T - 1) and still mask the
    stores of rows past the token count; one-token tiles need no mask (the grid is the token count)."""
    cfg = fwd_variant(name, 4, 2560)
    lowered = assert_cuda_kernel_lowers(
        lambda: make_mhc_pre_apply_mix_kernel(cfg), key=cfg, kernel_name='mhc_pre_apply_mix_fwd_kernel'
    )
    assert 'uint4' in lowered.source
    assert ('min(' in lowered.source) == cfg.clamped_reads
    assert ('< num_tokens)' in lowered.source) == (cfg.token_block > 1)


# Level 1: (mhc_mult, hidden) of the device check; 67 tokens leave the last token tile of every variant partial.
VARIANT_SIZES = by_level(get_test_level(), core=[], default=[(4, 2560), (7, 4096)])


@pytest.mark.npu
@pytest.mark.parametrize('name', list(FWD_VARIANTS))
@pytest.mark.parametrize('sizes', VARIANT_SIZES, ids=lambda s: f'mhc{s[0]}-h{s[1]}')
def test_mhc_pre_apply_mix_cuda_fwd_variants_values(sizes, name, device):
    """Each variant's o equals the chosen schedule's bit for bit (67 tokens and one)."""
    if device.type != 'cuda':
        pytest.skip('the schedule variants are CUDA configurations')
    mhc, hidden = sizes
    default = pre_apply_mix_config('cuda', 'fwd', mhc, hidden)
    for num_tokens in (67, 1):
        x = bf16(num_tokens, mhc, hidden, device=device)
        w = mix(num_tokens, mhc, device)
        outs = []
        for cfg in (default, fwd_variant(name, mhc, hidden)):
            o = poisoned(num_tokens, hidden, device=device)
            Launcher(get_mhc_pre_apply_mix_kernel, cfg, device).launch(x, w, o)
            outs.append(o)
        assert not outs[0].isnan().any()
        assert torch.equal(outs[1], outs[0])
