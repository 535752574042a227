"""The configuration chooser of the SwiGLU backward kernels (moe_swiglu_backward_kernel.py): pure, hashable, its
tiles and thread counts, and the combinations it refuses. CPU tier, nothing compiled."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cann_ops_tilelang.moe.moe_swiglu_backward_kernel import (
    MoeSwigluBackwardConfig,
    choose_moe_swiglu_backward_config,
)
from tests.testing.lowering import ASCEND_950_VECTOR_CORES, H200_SMS

BF16, FP32, FP8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn


def choose(backend: str, hidden: int, x=BF16, grad=BF16, out=BF16, **options) -> MoeSwigluBackwardConfig:
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_moe_swiglu_backward_config(
        backend=backend, num_cores=num_cores, hidden=hidden, x_dtype=x, grad_dtype=grad, out_dtype=out, **options
    )


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_config_is_pure_and_hashable(backend):
    first, second = choose(backend, 7168, with_weight=True), choose(backend, 7168, with_weight=True)
    assert first == second
    assert hash(first) == hash(second)
    assert {first: 1}[second] == 1
    assert first.x_dtype == 'bfloat16'
    assert first.with_weight
    assert not first.cast
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.hidden = 64


@pytest.mark.parametrize(
    ('hidden', 'block_size', 'ascend_block_k', 'cuda_block_k', 'cuda_threads'),
    [
        (64, 0, 64, 64, 32),  # one register, one warp
        (192, 0, 192, 192, 32),  # 64 * 3: one tile, a warp of 6 channels each
        (1088, 0, 1088, 64, 32),  # 64 * 17: Ascend one tile, CUDA tiles of one register
        (4096, 0, 2048, 1024, 128),
        (7168, 0, 1792, 1024, 128),
        (16384, 0, 2048, 1024, 128),
        (384, 128, 384, 384, 64),
        (7168, 32, 1792, 1024, 128),
    ],
)
def test_config_tiles(hidden, block_size, ascend_block_k, cuda_block_k, cuda_threads):
    """Ascend: the longest tile of at most 2048 channels dividing H; CUDA: at most 1024, whole channels per thread."""
    x = FP8 if block_size else BF16
    ascend = choose('ascend', hidden, x=x, block_size=block_size)
    cuda = choose('cuda', hidden, x=x, block_size=block_size)
    assert (ascend.block_k, ascend.num_stages, ascend.num_cores) == (ascend_block_k, 2, ASCEND_950_VECTOR_CORES)
    assert (cuda.block_k, cuda.threads) == (cuda_block_k, cuda_threads)
    for cfg in (ascend, cuda):
        assert cfg.hidden % cfg.block_k == 0
        assert cfg.num_col_tiles == hidden // cfg.block_k
        if block_size:
            assert cfg.groups_per_tile == cfg.block_k // block_size
            assert cfg.sf_cols == 2 * hidden // block_size


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(hidden=96), 'positive multiple of 64'),
        (dict(hidden=0), 'positive multiple of 64'),
        (dict(hidden=96, x=FP8, block_size=128), 'positive multiple of 64'),  # H = 64 * odd: a block across
        (dict(hidden=128, x=torch.float16), 'x_dtype must be one of'),
        (dict(hidden=128, x=FP8), 'x_dtype and out_dtype must be one of'),
        (dict(hidden=128, x=FP8, out=FP32, block_size=32), 'bfloat16 x_grad'),
        (dict(hidden=128, block_size=32), 'float8_e4m3fn x'),
        (dict(hidden=128, x=FP8, block_size=16), 'block_size must be 0 or one of'),
        (dict(hidden=128, grad=FP8), 'grad_dtype must be one of'),
        (dict(hidden=128, round_sf=True), 'options of the cast'),
        (dict(hidden=128, x=FP8, block_size=32, packed_ue8m0=True), 'needs round_sf'),
        (dict(hidden=64, x=FP8, block_size=64, round_sf=True, packed_ue8m0=True), 'whole int32 words'),
        (dict(hidden=128, num_experts=-1), 'num_experts must be >= 0'),
    ],
)
def test_config_refuses(kwargs, match):
    for backend in ('ascend', 'cuda'):
        with pytest.raises(ValueError, match=match):
            choose(backend, **kwargs)
    with pytest.raises(ValueError, match='backend must be'):
        choose('cpu', 128)
