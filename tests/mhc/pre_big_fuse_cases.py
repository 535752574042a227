"""Parameter sets and inputs the tests of mhc_pre_big_fuse_fwd and mhc_pre_big_fuse_bwd share.

The compositions launch the domain's kernels, each compiled per configuration of its own: level 0 takes sizes
whose stage configurations the stages' own level-0 tests compile too (mhc_mult 4, hidden 256, 16 splits, Sinkhorn
repeat 3; on Ascend the forward is one fused kernel of its own); level 1 every other mhc_mult from 1 to 8, with
other split counts and repeats.
"""

import math

import torch

from tests.testing.generator import by_level, generate_samples, get_test_level

from .mhc_reduce_partials_and_rmsnorm_fwd_ref import prenorm_gemm_partials

# (mhc_mult, hidden, n_splits, sinkhorn_repeat): one configuration of the stages each.
CASES = by_level(
    get_test_level(),
    core=[(4, 256, 16, 3)],
    default=[
        (1, 64, 1, 1),
        (2, 192, 2, 10),
        (3, 128, 4, 2),
        (5, 320, 2, 7),
        (6, 128, 1, 4),
        (7, 64, 16, 2),
        (8, 256, 2, 20),
    ],
)
PARAMS = generate_samples(case=CASES)
# Token counts of a values test (runtime sizes: no compile of their own); 0 has tests of its own.
NUM_TOKENS = (1, 37)
# The forward's fused CUDA kernel (an option, FUSE_ON_CUDA; from level 1): mhc_mult 1 / 4 / 8, hidden from one
# 64-column block to the peer's widths, 1 or 16 splits, Sinkhorn repeat 1 or 20, each a kernel of its own; the
# token counts add a Sinkhorn block's and a stream tile's tails and the benchmark's 4001.
FUSED_CASES = by_level(
    get_test_level(),
    core=[],
    default=[
        (1, 64, 1, 1),
        (1, 192, 16, 20),
        (4, 2560, 1, 20),
        (4, 4096, 16, 20),
        (4, 320, 16, 1),
        (8, 256, 16, 1),
        (8, 7168, 1, 20),
    ],
)
FUSED_PARAMS = generate_samples(case=FUSED_CASES)
FUSED_NUM_TOKENS = (1, 37, 4001)
# The forward's fused Ascend kernel (the default there; from level 1): every mhc_mult, 1 / 2 / 16 splits, Sinkhorn
# repeat 1 / 20, hidden 64 / 192 / 2560, each a kernel of its own; the token counts a task's tail (16 tokens a
# task) and tasks on several cores.
ASCEND_FUSED_CASES = by_level(
    get_test_level(),
    core=[],
    default=[
        (1, 64, 1, 1),
        (2, 192, 2, 20),
        (3, 2560, 16, 1),
        (4, 192, 16, 20),
        (5, 64, 2, 1),
        (6, 2560, 1, 20),
        (7, 192, 16, 1),
        (8, 2560, 16, 20),
    ],
)
ASCEND_FUSED_PARAMS = generate_samples(case=ASCEND_FUSED_CASES)
ASCEND_FUSED_NUM_TOKENS = (1, 37, 300)
# The fused Ascend kernel's lowering (CPU tier): the narrowest and widest mhc_mult and hidden widths.
ASCEND_LOWERING_CASES = [(1, 64, 1, 1), (4, 2560, 16, 20), (8, 7168, 16, 20), (8, 192, 2, 1)]
# The fused kernel's lowering (CPU tier): a Sinkhorn block's tail and a stream tile's, the widest mhc_mult.
LOWERING_CASES = [(1, 64, 1, 1), (4, 4096, 16, 20), (8, 7168, 16, 20), (5, 320, 2, 7)]
# The peer's benchmark shapes: tokens 4001 / 8001, hidden 2560 .. 7168, mhc_mult 4, its default 16 splits.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[2560, 4096, 7168])
BENCHMARK_MULT, BENCHMARK_SPLITS, BENCHMARK_REPEAT = 4, 16, 20

RMS_EPS, PRE_EPS, SINKHORN_EPS, POST_MULT = 1e-6, 1e-2, 1e-6, 2.0


def make_inputs(num_tokens: int, mhc_mult: int, hidden: int, n_splits: int, device) -> list[torch.Tensor]:
    """[gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual]: the partials of the prenorm GEMM of the
    residual with a projection whose mixes come out O(1), as in a model."""
    mhc_mult3 = mhc_mult * (mhc_mult + 2)
    residual = torch.randn(num_tokens, mhc_mult, hidden).bfloat16()
    fn = torch.randn(mhc_mult3, mhc_mult * hidden) / math.sqrt(mhc_mult * hidden)
    out_mul, sqrsum = prenorm_gemm_partials(residual.flatten(1), fn, n_splits)
    tensors = [out_mul.squeeze(2), sqrsum.squeeze(2), torch.rand(3) + 0.5, torch.randn(mhc_mult3) * 0.5, residual]
    return [t.contiguous().to(device) for t in tensors]


def scalars(repeat: int) -> tuple:
    """rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat."""
    return RMS_EPS, PRE_EPS, SINKHORN_EPS, POST_MULT, repeat


def poisoned(*shape: int, dtype=torch.float32, device) -> torch.Tensor:
    """A buffer full of NaN: an element the call does not write stays NaN."""
    return torch.full(shape, float('nan'), dtype=dtype, device=device)
