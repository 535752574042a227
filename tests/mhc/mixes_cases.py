"""Shapes, inputs and tolerances the mix operators' tests share (mhc_head_compute_mix_*, mhc_pre_split_mixes_*)."""

import torch

from tests.testing.generator import by_level

# Level 0 (each kernel configuration compiles once): the peer's mHC4 and the narrowest, M = 1; tokens with a
# tail tile and with several tiles per worker of the emulated chip. Level 1: every M of 1 .. 8.
BENCHMARK_TOKENS = (4001, 8001)
BENCHMARK_MULT = 4  # the peer's mhc_mult


def gen_mhc_mult(level: int) -> list[int]:
    return by_level(level, [1, 4], [2, 3, 5, 6, 7, 8])


def gen_num_tokens(level: int) -> list[int]:
    return by_level(level, [37, 300], [1, 64, 1000], [4001, 8001])


def logits(num_tokens: int, width: int, device) -> torch.Tensor:
    """Mix logits of the size RMS-normed projections give (|x| up to ~4)."""
    return torch.randn(num_tokens, width, device=device)


def sum_tolerance(terms: torch.Tensor, dim: int | tuple[int, ...]) -> torch.Tensor:
    """fp32 sums of `terms` (float64) against float64: a few ulps of the sum of magnitudes."""
    return 1e-6 * terms.abs().sum(dim) + 1e-6


def assert_sums_close(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == torch.float32, actual.dtype
    error = (actual.double() - expected).abs()
    assert bool((error <= bound).all()), f'max error {float((error - bound).max())} over the bound'
