"""apply_rotary, kernel level: the configuration chooser (pure, its tiling rules and limits) and the lowering of
both backends' kernels (CPU tier: Ascend C for the Ascend 950, CUDA for the H200's sm_90a)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cann_ops_tilelang.transform._apply_rotary_ascend import ascend_overread
from cann_ops_tilelang.transform.apply_rotary_kernel import (
    ROT_DIMS,
    ApplyRotaryConfig,
    choose_apply_rotary_config,
    make_apply_rotary_kernel,
)
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)

KERNEL_NAME = 'apply_rotary_kernel'
LEVEL = get_test_level()
NUM_CORES = {'ascend': ASCEND_950_VECTOR_CORES, 'cuda': H200_SMS}

# Level 0: the kernels test_apply_rotary.py runs at level 0; level 1 every rot_dim, dtype and pairing once.
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(dtype=torch.bfloat16, rot_dim=64, heads=4, interleaved=False, positions=None),
        dict(dtype=torch.bfloat16, rot_dim=64, heads=2, interleaved=False, positions=None),
        dict(dtype=torch.float32, rot_dim=96, heads=3, interleaved=True, positions=torch.int64),
        dict(dtype=torch.float32, rot_dim=96, heads=3, interleaved=True, positions=None),
    ],
    default=[
        dict(dtype=dtype, rot_dim=rot_dim, heads=heads, interleaved=interleaved, positions=positions)
        for rot_dim, dtype, heads, interleaved, positions in zip(
            ROT_DIMS,
            [torch.float32, torch.bfloat16, torch.float16] * 3,
            [16, 5, 8, 1, 2, 128, 32, 8],
            [False, True] * 4,
            [torch.int32, None, torch.int64] * 3,
            strict=False,
        )
    ],
)


def _config(backend: str, **variant) -> ApplyRotaryConfig:
    return choose_apply_rotary_config(backend=backend, num_cores=NUM_CORES[backend], **variant)


# ---------------------------------------------------------------- CPU tier: configuration


def test_config_is_pure_and_hashable():
    a = choose_apply_rotary_config(backend='cuda', num_cores=132, dtype=torch.bfloat16, rot_dim=128, heads=32)
    b = choose_apply_rotary_config(backend='cuda', num_cores=132, dtype='bfloat16', rot_dim=128, heads=32)
    assert a == b
    assert hash(a) == hash(b)
    assert (a.vec, a.cs_vec, a.units, a.groups, a.key_groups) == (8, 4, 8, 8, 0)
    assert a.threads == 256
    # Llama's key (8 heads) in the same launch: 8 + 2 groups of 8 units per token, 3 tokens per block
    fused = choose_apply_rotary_config(
        backend='cuda', num_cores=132, dtype=torch.bfloat16, rot_dim=128, heads=32, key_heads=8
    )
    assert (fused.groups, fused.key_groups, fused.groups_per_block, fused.tokens_per_block) == (8, 2, 10, 3)
    assert (fused.chunks, fused.threads) == (1, 240)


@pytest.mark.parametrize('rot_dim', ROT_DIMS)
@pytest.mark.parametrize('heads', [1, 3, 32, 128])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32])
def test_ascend_tiles_fit_their_stage(rot_dim, heads, dtype):
    cfg = _config('ascend', dtype=dtype, rot_dim=rot_dim, heads=heads)
    assert heads % cfg.head_group == 0
    assert cfg.stage_bytes <= 48 * 1024
    assert 1 <= cfg.block_tokens <= 64
    # the stray lanes of a partial chunk stay inside the pad rows of the tiles
    assert 0 <= ascend_overread(rot_dim) <= 96


@pytest.mark.parametrize('rot_dim', ROT_DIMS)
@pytest.mark.parametrize(('heads', 'key_heads'), [(1, 0), (3, 3), (5, 1), (32, 8), (128, 1), (127, 0)])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32])
def test_cuda_blocks_cover_every_head_group(rot_dim, heads, key_heads, dtype):
    cfg = _config('cuda', dtype=dtype, rot_dim=rot_dim, heads=heads, key_heads=key_heads)
    assert cfg.vec * cfg.units == rot_dim // 2
    assert heads % (heads // cfg.groups) == 0
    assert cfg.chunks * cfg.groups_per_block >= cfg.all_groups > (cfg.chunks - 1) * cfg.groups_per_block
    assert cfg.threads <= 256
    assert cfg.threads == cfg.tokens_per_block * cfg.groups_per_block * cfg.units


def test_ascend_takes_one_tensor_per_launch():
    with pytest.raises(ValueError, match='key_heads must be 0'):
        _config('ascend', dtype=torch.bfloat16, rot_dim=64, heads=4, key_heads=2)


def test_cuda_narrows_to_the_access_width():
    cfg = _config('cuda', dtype=torch.bfloat16, rot_dim=64, heads=4, vec=2, cs_vec=4)
    assert (cfg.vec, cfg.cs_vec, cfg.units) == (2, 2, 16)


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(rot_dim=48), r'rot_dim must be a multiple of 32 in \[32, 256\], got 48'),
        (dict(rot_dim=288), 'got 288'),
        (dict(dtype=torch.float64), 'dtype must be torch.bfloat16, torch.float16 or torch.float32'),
        (dict(positions=torch.int16), 'positions must be None, torch.int32 or torch.int64'),
        (dict(heads=0), 'heads must be >= 1'),
        (dict(key_heads=-1), 'key_heads >= 0'),
        (dict(backend='cpu'), 'backend must be "ascend" or "cuda"'),
        (dict(backend='cuda', vec=3), 'vec must be a power of two up to 8'),
    ],
)
def test_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, dtype=torch.bfloat16, rot_dim=64, heads=4) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_apply_rotary_config(**args)


def test_config_checks_itself():
    cfg = _config('cuda', dtype=torch.float32, rot_dim=64, heads=4)
    with pytest.raises(ValueError, match='cs_vec must be 1, 2 or 4 and divide vec'):
        dataclasses.replace(cfg, vec=2, cs_vec=4)
    with pytest.raises(ValueError, match=r'groups_per_block must be in \[1, 1\]'):
        dataclasses.replace(cfg, groups_per_block=2)
    ascend = _config('ascend', dtype=torch.float32, rot_dim=256, heads=64)
    with pytest.raises(ValueError, match='exceeds 49152'):
        dataclasses.replace(ascend, block_tokens=ascend.block_tokens * 4)
    with pytest.raises(ValueError, match='head_group 3 must divide heads 64'):
        dataclasses.replace(ascend, head_group=3)


# ---------------------------------------------------------------- CPU tier: lowering


@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_apply_rotary_ascend_kernel_lowers(variant):
    cfg = _config('ascend', **variant)
    assert_ascend_kernel_lowers(lambda: make_apply_rotary_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


# CUDA: each variant alone and with a key in the same launch (GQA at level 0; more head ratios at level 1)
CUDA_VARIANTS = [v | dict(key_heads=k) for v in VARIANTS for k in (0, max(1, v['heads'] // 2))]


@pytest.mark.parametrize('variant', CUDA_VARIANTS, ids=make_param_id)
def test_apply_rotary_cuda_kernel_lowers(variant):
    cfg = _config('cuda', **variant)
    lowered = assert_cuda_kernel_lowers(lambda: make_apply_rotary_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    # x moves in 16-byte vectors (uint4 / float4) where the access width allows it
    assert 'uint4' in lowered.source or 'float4' in lowered.source
