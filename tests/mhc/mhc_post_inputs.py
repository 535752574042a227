"""Inputs and parameter sets of the mhc_post_fwd / mhc_post_bwd tests (one home for both)."""

from __future__ import annotations

import torch

from tests.testing.generator import by_level, generate_samples

# (S, T): empty, one token, leading dims of several sequences, a tail of no block size, the benchmark counts.
LEADING = ((1, 0), (1, 1), (2, 7), (1, 130), (3, 333), (1, 4001))


def gen_leading(level: int) -> list[tuple[int, int]]:
    return by_level(level, core=LEADING[:3], default=LEADING[3:4], full=LEADING[4:])


def gen_mhc(level: int) -> list[int]:
    """mhc_mult: the peer's 4, then every value 1..8 (the peer's Ascend takes 4 only)."""
    return by_level(level, core=(4,), default=(1, 3, 8), full=(2, 5, 6, 7))


def gen_hidden(level: int) -> list[int]:
    """H: the minimum, several vectors, production sizes (the Ascend forward tiles 7168 in two)."""
    return by_level(level, core=(128,), default=(64, 192), full=(2560, 7168))


def shape_params(level: int) -> list[dict]:
    """The kernels of a level: one per (M, H); the token count is dynamic."""
    return generate_samples(level, mhc=gen_mhc, hidden=gen_hidden)


def value_params(level: int) -> list[dict]:
    """Every (M, H) of the level with the level's leading dims; the large (S, T) only with small kernels."""
    return generate_samples(
        level,
        mhc=gen_mhc,
        hidden=gen_hidden,
        leading=gen_leading,
        where=lambda p: p['leading'][0] * p['leading'][1] * p['mhc'] * p['hidden'] <= 2**21,
    )


BENCHMARK_PARAMS = generate_samples(leading=((1, 4001), (1, 8001)), mhc=(4,), hidden=(2560, 4096, 7168))


def post_inputs(leading, mhc: int, hidden: int, device, *, d_o: bool = False, seed: int = 0) -> tuple:
    """x (S, T, H) bf16, residual (S, T, M, H) bf16, post_layer_mix (S, T, M, 1) fp32, comb_res_mix (S, T, M, M)
    fp32 and, with d_o, the output gradient (S, T, M, H) bf16: values as in a model (mixes in [0, 2] and
    around 1 / M, as the Sinkhorn-normalised matrix), drawn on the device."""
    generator = torch.Generator(device=device).manual_seed(seed)
    s, t = leading

    def randn(*shape):
        return torch.randn(shape, generator=generator, device=device)

    x = randn(s, t, hidden).bfloat16()
    residual = randn(s, t, mhc, hidden).bfloat16()
    post = 2 * torch.rand((s, t, mhc, 1), generator=generator, device=device)
    comb = torch.rand((s, t, mhc, mhc), generator=generator, device=device) * (2 / mhc)
    if not d_o:
        return x, residual, post, comb
    return x, residual, post, comb, randn(s, t, mhc, hidden).bfloat16()
