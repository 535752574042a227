"""CPU replay of randn's generator (definition: packages/cann_ops_tilelang/rand/_counter_normal.py).

Tests only; never imported at run time. It takes the generator's constants from the package (one home) and
replays its operation sequence in torch on the CPU: uint32 arithmetic in int64 tensors (products split so that
nothing overflows); fp32 products and square roots computed in float64 and rounded once to fp32 (`mul_f32`,
`sqrt_f32`: correctly rounded, which torch's own float32 sqrt on the CPU is not: this build's vectorised sqrt
is off by one ulp on some inputs, e.g. sqrt(0.9654906988143921)); the fused multiply-adds by `fma_f32` (exact).
The kernels must match it bit for bit.
"""

from __future__ import annotations

import torch

from cann_ops_tilelang.rand._counter_normal import (
    ANGLE_BITS,
    ANGLE_HALF_STEP,
    ANGLE_STEP,
    COS_POLY,
    GROUP_ELEMENTS,
    GROUP_PAIRS,
    LN2,
    LN_POLY,
    LN_SPLIT_BITS,
    MIX_MUL_1,
    MIX_MUL_2,
    MIX_SHIFTS,
    SIN_POLY,
    U1_HIGH_SCALE,
    U1_LOW_BIAS,
    U1_LOW_SCALE,
)

MASK32 = 0xFFFFFFFF
SIGN_BIT = 0x80000000


def fma_f32(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
    """fp32 a * b + c with one rounding (to nearest even), as the kernels' fma.

    a * b is exact in float64; the float64 sum is rounded to odd (truncated, its last bit set when inexact: the
    TwoSum error tells), after which the rounding to fp32 is correct (53 >= 24 + 2 bits)."""
    a64 = a.double()
    b64 = b.double() if isinstance(b, torch.Tensor) else torch.full_like(a64, b)
    c64 = c.double() if isinstance(c, torch.Tensor) else torch.full_like(a64, c)
    p = a64 * b64
    s = p + c64
    bp = s - c64  # TwoSum: s + err == p + c exactly
    err = (p - bp) + (c64 - (s - bp))
    inexact = err != 0
    # Truncation toward zero of the exact sum: s itself when the error points away from zero, else its neighbour.
    toward_zero = inexact & ((err > 0) != (s > 0))
    truncated = torch.where(toward_zero, torch.nextafter(s, torch.zeros_like(s)), s)
    bits = truncated.view(torch.int64)
    odd = torch.where(inexact, bits | 1, bits).view(torch.float64)
    return odd.float()


def mul_f32(a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    """fp32 a * b, correctly rounded (the float64 product of two fp32 values is exact)."""
    return (a.double() * (b.double() if isinstance(b, torch.Tensor) else b)).float()


def sqrt_f32(a: torch.Tensor) -> torch.Tensor:
    """fp32 sqrt(a), correctly rounded (float64 then fp32: the double rounding is innocuous, 53 >= 2 * 24 + 2)."""
    return torch.sqrt(a.double()).float()


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2**32 for uint32 values held in int64, with 48-bit partial products."""
    low = (x * (m & 0xFFFF)) & MASK32
    high = ((x * (m >> 16)) & 0xFFFF) << 16
    return (low + high) & MASK32


def mix32_ref(x: torch.Tensor) -> torch.Tensor:
    s1, s2, s3 = MIX_SHIFTS
    x = x ^ (x >> s1)
    x = _mul32(x, MIX_MUL_1)
    x = x ^ (x >> s2)
    x = _mul32(x, MIX_MUL_2)
    return x ^ (x >> s3)


def _as_float(bits: torch.Tensor) -> torch.Tensor:
    """uint32 bits (int64) -> the fp32 they encode."""
    signed = torch.where(bits >= 2**31, bits - 2**32, bits)
    return signed.to(torch.int32).view(torch.float32)


def _as_bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32).to(torch.int64) & MASK32


def _horner(coefficients, z: torch.Tensor) -> torch.Tensor:
    p = torch.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        p = fma_f32(p, z, c)
    return p


def randn_pairs_ref(k0: int, k1: int, offset: int, num_pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (r cos, r sin) of the pairs offset .. offset + num_pairs - 1 of the stream with keys (k0, k1)."""
    counter = offset + torch.arange(num_pairs, dtype=torch.int64)
    c_lo, c_hi = counter & MASK32, counter >> 32
    key = mix32_ref(c_hi ^ k0)
    h1 = mix32_ref(c_lo ^ key)
    h2 = mix32_ref(h1 ^ k1)

    a = (h1 >> 8).float()  # < 2**24: exact
    b = (((h1 & 0xFF) << 8) | (h2 & 0xFF)).float()
    u1 = fma_f32(a, U1_HIGH_SCALE, fma_f32(b, U1_LOW_SCALE, U1_LOW_BIAS))
    bits = _as_bits(u1)
    e = (bits - LN_SPLIT_BITS) >> 23  # arithmetic shift of a value in int32 range
    m = _as_float(bits - (e << 23))
    x = m - 1.0  # exact (Sterbenz)
    ln_m = fma_f32(mul_f32(x, x), _horner(LN_POLY, x), x)
    ln_u1 = fma_f32(e.float(), LN2, ln_m)
    r = sqrt_f32(mul_f32(ln_u1, -2.0))

    f = (h2 >> 8) & ((1 << ANGLE_BITS) - 1)
    phi = fma_f32((f - (1 << (ANGLE_BITS - 1))).float(), ANGLE_STEP, ANGLE_HALF_STEP)
    z = mul_f32(phi, phi)
    sin = fma_f32(mul_f32(phi, z), _horner(SIN_POLY, z), phi)
    cos = fma_f32(z, _horner(COS_POLY, z), 1.0)
    swap = (h2 & 0x40000000) != 0
    x_part = torch.where(swap, sin, cos)
    y_part = torch.where(swap, cos, sin)
    x_sign = (h2 ^ (h2 << 1)) & SIGN_BIT
    y_sign = h2 & SIGN_BIT
    x_part = _as_float(_as_bits(x_part) ^ x_sign)
    y_part = _as_float(_as_bits(y_part) ^ y_sign)
    return mul_f32(r, x_part), mul_f32(r, y_part)


def randn_ref(num_elements: int, k0: int, k1: int, offset: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The flat (num_elements,) output of one call with keys (k0, k1) and pair offset `offset`, in `dtype`."""
    groups = -(-num_elements // GROUP_ELEMENTS)
    cos, sin = randn_pairs_ref(k0, k1, offset, groups * GROUP_PAIRS)
    flat = torch.cat((cos.view(groups, GROUP_PAIRS), sin.view(groups, GROUP_PAIRS)), dim=1).view(-1)
    return flat[:num_elements].to(dtype)
