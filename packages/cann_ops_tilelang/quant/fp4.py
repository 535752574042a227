"""FP4 (e2m1): decoding the packed bytes that the FP4 casts write (TileKernels' helper), and what the domain's FP4
kernels share on both backends: a code's value (cast_back, per_token_cast_and_cast_back) and the e2m1 roundings
(per_token_cast: to nearest even, and stochastic)."""

from __future__ import annotations

import itertools

import torch

# The 16 e2m1 codes s|ee|m: exponent bias 1, one mantissa bit, no inf or NaN (OCP MX: 0, 0.5, 1, 1.5, 2, 3, 4, 6)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_PACKED_DTYPES = (torch.int8, torch.uint8)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed FP4: each byte of x (..., K) holds two e2m1 values, the low nibble first, giving (..., 2 K) of
    `out_dtype` (TileKernels 2.1.0's helper, for checking FP4 data). Plain PyTorch on x's device, exact: every
    e2m1 value is a bf16 / fp16 / fp32 value; -0.0 keeps its sign."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'x must be a torch.Tensor, got {type(x).__name__}')
    if x.dtype not in _PACKED_DTYPES:
        raise TypeError(f'x must have dtype torch.int8 or torch.uint8 (two e2m1 codes a byte), got {x.dtype}')
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f'out_dtype must be a floating-point torch.dtype, got {out_dtype!r}')
    if x.dim() == 0:
        raise ValueError('x must have at least 1 dimension (its last one doubles), got a 0-d tensor')
    table = torch.tensor(E2M1_VALUES, dtype=out_dtype, device=x.device)
    codes = x.view(torch.uint8).to(torch.int64) if x.dtype == torch.int8 else x.to(torch.int64)
    pairs = torch.stack((table[codes & 0x0F], table[codes >> 4]), dim=-1)
    return pairs.reshape(*x.shape[:-1], 2 * x.shape[-1])


# ---------------------------------------------------------------- encoding, for the FP4 casts' kernels

E2M1_MAX = E2M1_VALUES[7]  # largest e2m1 magnitude
# Midpoint k lies between the magnitudes of codes k and k + 1. A magnitude exactly on it rounds to the even code:
# down for even k ('<='), up for odd k ('<').
E2M1_MIDPOINTS = tuple((a + b) / 2 for a, b in itertools.pairwise(E2M1_VALUES[:8]))
E2M1_SIGN = 0x8  # the sign bit of a code
# Stochastic rounding: u = (h >> E2M1_RANDOM_SHIFT) * 2**-24 from the element's 32 hash bits h (24 bits, exact in fp32).
E2M1_RANDOM_SHIFT = 8
E2M1_RANDOM_SCALE = 2.0**-24
# (code k, magnitude of code k, 1 / (magnitude of code k + 1 - magnitude of code k)) for k = 6 .. 0: the lower
# neighbour of a magnitude below the next code's, and the inverse of the spacing (a power of two, so exact).
E2M1_LOWER_STEPS = tuple((k, E2M1_VALUES[k], 1.0 / (E2M1_VALUES[k + 1] - E2M1_VALUES[k])) for k in range(6, -1, -1))


# Decoding: e2m1 code s|ee|m -> fp32 bits. For ee > 0 the value 2**(ee - 1) * (1 + m / 2) has the fp32 exponent
# field ee + 126 and its mantissa's top bit m, so the bits are (ee|m << 22) + (126 << 23); codes 0 and 1 (0 and 0.5,
# e2m1's zero and subnormal) are selected instead; the sign moves from bit 3 to bit 31.
E2M1_MANTISSA_SHIFT = 22
E2M1_EXP_OFFSET = 126 << 23
E2M1_HALF_BITS = 0x3F000000  # fp32 0.5: code 1
E2M1_SIGN_SHIFT = 28
E2M1_MAGNITUDE = 0x7  # the magnitude bits of a code


def cuda_e2m1_value(T, code):
    """The fp32 value (exact) of an e2m1 code (uint32 PrimExpr; bits above the low four must be zero)."""
    magnitude = code & T.uint32(E2M1_MAGNITUDE)
    bits = T.if_then_else(
        magnitude < T.uint32(2),
        magnitude * T.uint32(E2M1_HALF_BITS),
        (magnitude << T.uint32(E2M1_MANTISSA_SHIFT)) + T.uint32(E2M1_EXP_OFFSET),
    )
    return T.reinterpret(bits | ((code & T.uint32(E2M1_SIGN)) << T.uint32(E2M1_SIGN_SHIFT)), T.float32)


def ascend_e2m1_decode_macro(T):
    """A SIMD macro `decode(codes)` for inside a `T.SimdVF()`: the fp32 values (float32x64, exact) of 64 e2m1
    codes, one per 32-bit lane (uint32x64; bits above the low four are ignored)."""
    S = T.simd

    @T.macro
    def decode(codes):
        magnitude = S.vand(codes, S.vdup(E2M1_MAGNITUDE, T.uint32))
        normal = S.vadds(S.vshls(magnitude, E2M1_MANTISSA_SHIFT), E2M1_EXP_OFFSET)
        small = S.vsel(S.vdup(E2M1_HALF_BITS, T.uint32), S.vdup(0, T.uint32), S.vcmps(magnitude, 1, op='eq'))
        bits = S.vsel(small, normal, S.vcmps(magnitude, 2, op='lt'))
        sign = S.vshls(S.vand(codes, S.vdup(E2M1_SIGN, T.uint32)), E2M1_SIGN_SHIFT)
        return T.reinterpret(S.vor(bits, sign), 'float32x64')

    return decode


def cuda_e2m1_code(T, value):
    """The e2m1 code (0..15, uint32 PrimExpr) of an fp32 PrimExpr: nearest even on the e2m1 grid, saturating at
    +-6; +-inf and NaN give +-6 (the magnitude compares false for NaN: each midpoint test is 'not above');
    the sign bit is the input's, so -0.0 and negative values below 0.25 give code 8 (-0)."""
    magnitude = T.abs(value)
    code = T.uint32(7)
    for k, midpoint in enumerate(E2M1_MIDPOINTS):
        below = magnitude <= T.float32(midpoint) if k % 2 == 0 else magnitude < T.float32(midpoint)
        code = code - T.Select(below, T.uint32(1), T.uint32(0))
    return code | ((T.reinterpret(value, T.uint32) >> T.uint32(28)) & T.uint32(E2M1_SIGN))


def cuda_e2m1_stochastic_code(T, value, h):
    """The e2m1 code (uint32 PrimExpr) of an fp32 PrimExpr by stochastic rounding with the element's hash bits `h`
    (uint32): a = |value|; below 6 the lower grid neighbour lo (code k) and the spacing s to the next one give
    frac = (a - lo) / s (exact: a - lo is, s is a power of two), and the code rounds up to k + 1 iff
    u = (h >> 8) * 2**-24 < frac; a >= 6, +-inf and NaN give code 7 (+-6: the nearest-even code's rule). The sign
    bit is the input's (so -0.0 and negatives that round to 0 give code 8). Exact fp32 operations (`__fsub_rn` /
    `__fmul_rn`), so the same code as the Ascend macro's."""
    f32, u32 = T.float32, T.uint32
    magnitude = T.abs(value)
    below_max = magnitude < T.float32(E2M1_MAX)  # false for NaN
    code, lower, inverse_spacing = T.uint32(7), T.float32(E2M1_MAX), T.float32(0.0)
    for k, low, inv in E2M1_LOWER_STEPS:  # descending: the last true test is the lower neighbour
        below = magnitude < T.float32(E2M1_VALUES[k + 1])
        code = T.Select(below, T.uint32(k), code)
        lower = T.Select(below, T.float32(low), lower)
        inverse_spacing = T.Select(below, T.float32(inv), inverse_spacing)
    frac = T.call_extern(f32, '__fmul_rn', T.call_extern(f32, '__fsub_rn', magnitude, lower), inverse_spacing)
    frac = T.Select(below_max, frac, T.float32(0.0))  # a >= 6, inf, NaN: never up (u >= 0)
    u = T.Cast(f32, T.Cast('int32', h >> T.uint32(E2M1_RANDOM_SHIFT))) * T.float32(E2M1_RANDOM_SCALE)
    code = code + T.Select(u < frac, T.uint32(1), T.uint32(0))
    return code | ((T.reinterpret(value, u32) >> T.uint32(28)) & T.uint32(E2M1_SIGN))


def ascend_e2m1_stochastic_macro(T):
    """SIMD macro `stochastic_codes(v, h)` for inside a `T.SimdVF()`: the e2m1 codes of 64 fp32 lanes by the
    stochastic rounding of cuda_e2m1_stochastic_code, lane by lane, `h` the lanes' hash bits (uint32x64); one code
    per 32-bit lane (uint32x64), for ascend_e2m1_macros' `store_pairs`."""
    S = T.simd

    @T.macro
    def stochastic_codes(v, h):
        magnitude = S.vabs(v)
        code = S.vdup(7, T.int32)
        lower = S.vdup(E2M1_MAX, T.float32)
        inverse_spacing = S.vdup(0.0, T.float32)
        for k, low, inv in E2M1_LOWER_STEPS:
            below = S.vcmps(magnitude, E2M1_VALUES[k + 1], op='lt')
            code = S.vsel(S.vdup(k, T.int32), code, below)
            lower = S.vsel(S.vdup(low, T.float32), lower, below)
            inverse_spacing = S.vsel(S.vdup(inv, T.float32), inverse_spacing, below)
        frac = S.vmul(S.vsub(magnitude, lower), inverse_spacing)
        # a >= 6, inf, NaN: frac 0, so never up (u >= 0)
        frac = S.vsel(frac, S.vdup(0.0, T.float32), S.vcmps(magnitude, E2M1_MAX, op='lt'))
        u = S.vmuls(S.vcvt(T.reinterpret(S.vshrs(h, E2M1_RANDOM_SHIFT), 'int32x64'), T.float32), E2M1_RANDOM_SCALE)
        code = S.vsel(S.vadds(code, 1), code, S.vcmp(u, frac, op='lt'))
        sign = S.vand(S.vshrs(T.reinterpret(v, 'uint32x64'), 28), S.vdup(E2M1_SIGN, T.uint32))
        return S.vor(T.reinterpret(code, 'uint32x64'), sign)

    return stochastic_codes


def ascend_e2m1_macros(T):
    """SIMD macros of the FP4 casts, for inside a `T.SimdVF()` (the rounding of cuda_e2m1_code, lane by lane):

    - `codes(v)`: the e2m1 codes of 64 fp32 lanes, one per 32-bit lane (uint32x64);
    - `store_pairs(out_ub, offset, even_reg, odd_reg)`: the codes of 128 consecutive elements (two registers in
      element order) as 64 bytes at out_ub[offset] (int8), element 2 i in the low nibble of byte i.
    """
    S = T.simd

    @T.macro
    def codes(v):
        magnitude = S.vabs(v)
        code = S.vdup(7, T.int32)
        for k, midpoint in enumerate(E2M1_MIDPOINTS):
            below = S.vcmps(magnitude, midpoint, op='le' if k % 2 == 0 else 'lt')
            code = S.vsel(S.vadds(code, -1), code, below)
        sign = S.vand(S.vshrs(T.reinterpret(v, 'uint32x64'), 28), S.vdup(E2M1_SIGN, T.uint32))
        return S.vor(T.reinterpret(code, 'uint32x64'), sign)

    @T.macro
    def store_pairs(out_ub, offset, first, second):
        # (first, second) as one sequence of 128 codes: even elements to `low`, odd ones to `high`.
        low, high = S.vdintlv(first, second)
        packed = S.vor(low, S.vshls(high, 4))
        S.vsts(out_ub[offset], T.reinterpret(packed, 'int8x256'), dist='PK4_B32')

    return codes, store_pairs
