"""Pure-PyTorch oracles of quant.cast (semantics: packages/cann_ops_tilelang/quant/cast_kernel.py): the plain casts,
the counter-based random bits and the stochastic roundings, written from the contract, in int64 / float64
arithmetic on the CPU.

Tests only; never imported at run time, and it imports no kernel module: the hash constants are written out here
again, so that a changed constant in the package is a failing test, not a silently changed reference.
"""

from __future__ import annotations

import torch

from tests.quant.cast_ref import e4m3_ref

MASK32 = 0xFFFFFFFF
# The element hash (cast_kernel.SR_HASH): index step, the two multipliers, the three shifts.
_INDEX_STEP = 0x9E3779B1
_MUL1 = 0x85EBCA6B
_MUL2 = 0xC2B2AE35
# The seed's mixing: MurmurHash3's 32-bit finaliser.
_FMIX = ((16, _MUL1), (13, _MUL2), (16, None))

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
BF16_MAX_BITS = 0x7F7F0000  # fp32 bits of the largest finite bf16
E4M3_MIN_NORMAL = 2.0**-6
E4M3_QUANTUM_SUB = 2.0**-9  # spacing of e4m3 below 2**-6


def seed_key(seed: int) -> int:
    """The 32-bit key of a seed in [0, 2**32): MurmurHash3's finaliser (a bijection), so distinct seeds have
    distinct keys and neighbouring seeds unrelated ones."""
    h = seed & MASK32
    for shift, mul in _FMIX:
        h ^= h >> shift
        if mul is not None:
            h = (h * mul) & MASK32
    return h


def random_bits(numel: int, key: int) -> torch.Tensor:
    """uint32 random bits (as int64) of elements 0 .. numel - 1 for a key: h = index * STEP + key; h ^= h >> 16;
    h *= MUL1; h ^= key; h ^= h >> 13; h *= MUL2 (all mod 2**32). The roundings use the top bits."""
    h = (torch.arange(numel, dtype=torch.int64) * _INDEX_STEP + key) & MASK32
    h ^= h >> 16
    h = (h * _MUL1) & MASK32
    h ^= key
    h ^= h >> 13
    return (h * _MUL2) & MASK32


def _bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 bits of a flattened bf16 / fp32 tensor, as int64 in [0, 2**32)."""
    return x.reshape(-1).float().view(torch.int32).to(torch.int64) & MASK32


def stochastic_bf16_ref(x: torch.Tensor, seed: int) -> torch.Tensor:
    """fp32 x -> bf16 by stochastic rounding (int16 bits view of the result, x's shape).

    Finite values: (|bits| min BF16_MAX_BITS) + (h >> 16), shifted right by 16, with x's sign: the magnitude
    rounds up with probability (its low 16 bits) / 2**16, saturating at the largest finite bf16. +-inf stay,
    NaN becomes the quiet NaN 0x7FC0 with x's sign."""
    bits = _bits(x)
    r16 = random_bits(bits.numel(), seed_key(seed)) >> 16
    mag = bits & 0x7FFFFFFF
    rounded = (mag.clamp(max=BF16_MAX_BITS) + r16) >> 16
    rounded = torch.where(mag >= 0x7F800000, torch.where(mag == 0x7F800000, 0x7F80, 0x7FC0), rounded)
    result = rounded | ((bits >> 16) & 0x8000)
    return result.to(torch.int32).to(torch.int16).reshape(x.shape)  # int16 wraps the sign bit


def stochastic_e4m3_ref(x: torch.Tensor, seed: int) -> torch.Tensor:
    """fp32 / bf16 x -> float8_e4m3fn by stochastic rounding (uint8 bits view of the result, x's shape).

    a = min(|x|, 448); below 2**-6 (e4m3's subnormals, spacing 2**-9) a is first put on a grid of 2**-29 with
    one round to nearest even, fp32(a + 2**-6); then the magnitude's 20 bits below e4m3's last mantissa bit are
    the distance fraction, and it rounds up when they plus the element's top 20 random bits carry. NaN -> 0x7F
    with x's sign; +-inf and values past 448 saturate to +-448; -0.0 stays -0.0."""
    bits = _bits(x)
    r20 = random_bits(bits.numel(), seed_key(seed)) >> 12
    mag = bits & 0x7FFFFFFF
    a = (mag.to(torch.int32)).view(torch.float32).clamp(max=E4M3_MAX)  # NaN stays NaN, replaced below
    # fp32 add (one rounding), then halving (exact): the subnormal magnitude a moved into the binade of 2**-7
    lifted = (a + torch.tensor(E4M3_MIN_NORMAL, dtype=torch.float32)) * 0.5
    aligned = torch.maximum(a, lifted).view(torch.int32).to(torch.int64)
    code = (aligned + r20 - 0x3C000000) >> 20  # 0x3C000000: fp32 bits of 2**-7, e4m3 code 0 on this grid
    code = torch.where(mag > 0x7F800000, 0x7F, code)
    result = code | ((bits >> 24) & 0x80)
    return result.to(torch.uint8).reshape(x.shape)


def stochastic_e4m3_by_value(x: torch.Tensor, seed: int) -> torch.Tensor:
    """The same rounding as stochastic_e4m3_ref, for finite x, from the values in float64: the two e4m3
    neighbours lo <= |x| < hi of min(|x|, 448) and the fraction f = (|x| - lo) / (hi - lo) on the grid the contract
    names (2**-29 below 2**-6, exact above); up when r20 >= 2**20 * (1 - f). A second derivation to check the bit
    tricks of the first (uint8 bits view)."""
    flat = x.reshape(-1).float()
    r20 = (random_bits(flat.numel(), seed_key(seed)) >> 12).double()
    a = flat.abs().double().clamp(max=E4M3_MAX)
    small = a < E4M3_MIN_NORMAL
    a_grid = torch.where(small, torch.round(a * 2.0**29) / 2.0**29, a)  # round half to even, as fp32's add
    exponent = torch.floor(torch.log2(a_grid.clamp(min=E4M3_MIN_NORMAL)))
    quantum = torch.where(small, torch.full_like(a, E4M3_QUANTUM_SUB), torch.exp2(exponent - 3))
    lo = torch.floor(a_grid / quantum) * quantum
    frac = (a_grid - lo) / quantum
    up = r20 + frac * 2.0**20 >= 2.0**20
    magnitude = (lo + up.double() * quantum).float()
    signed = torch.where(flat.view(torch.int32) < 0, -magnitude, magnitude)
    return signed.to(torch.float8_e4m3fn).view(torch.uint8).reshape(x.shape)


def stochastic_bf16_by_value(x: torch.Tensor, seed: int) -> torch.Tensor:
    """stochastic_bf16_ref for finite fp32 x from the values: neighbours by truncation toward zero, up when
    r16 >= 2**16 * (1 - f), the largest finite bf16 kept (int16 bits view)."""
    flat = x.reshape(-1).float()
    r16 = (random_bits(flat.numel(), seed_key(seed)) >> 16).double()
    mag = flat.abs()
    lo = (mag.view(torch.int32) & ~0xFFFF).view(torch.float32)
    hi = ((mag.view(torch.int32) & ~0xFFFF) + 0x10000).view(torch.float32)
    frac = (mag.double() - lo.double()) / (hi.double() - lo.double())
    up = (r16 + frac * 2.0**16 >= 2.0**16) & (lo.view(torch.int32) < BF16_MAX_BITS)
    magnitude = torch.where(up, hi, lo)
    signed = torch.where(flat.view(torch.int32) < 0, -magnitude, magnitude)
    return signed.to(torch.bfloat16).view(torch.int16).reshape(x.shape)


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the e2m1 magnitudes of codes 0 .. 7


def stochastic_e2m1_ref(v: torch.Tensor, seed: int) -> torch.Tensor:
    """fp32 values v (per_token_cast's products x * inverse, element index = the flattened position) -> e2m1 codes
    (uint8, 0..15, v's shape) by stochastic rounding, in float64 from the definition:

    a = |v|; a >= 6, +-inf and NaN give code 7 (+-6); otherwise lo = the largest e2m1 magnitude <= a, hi the next
    one, frac = (a - lo) / (hi - lo), u = (h >> 8) / 2**24 from the element's 32 hash bits h, and the magnitude is
    hi if u < frac, else lo. The sign bit is v's (so -0.0 gives code 8)."""
    flat = v.reshape(-1).float()
    u = (random_bits(flat.numel(), seed_key(seed)) >> 8).double() / 2.0**24
    a = flat.double().abs()
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)
    finite_below = a < 6.0  # false for NaN and inf
    a_in = torch.where(finite_below, a, torch.zeros_like(a))
    lower = (torch.searchsorted(grid, a_in, right=True) - 1).clamp(0, 6)  # grid[lower] <= a < grid[lower + 1]
    lo, hi = grid[lower], grid[lower + 1]
    frac = (a_in - lo) / (hi - lo)
    codes = torch.where(finite_below, lower + (u < frac).long(), torch.full_like(lower, 7))
    sign = (flat.view(torch.int32) < 0).long() << 3
    return (codes | sign).to(torch.uint8).reshape(v.shape)


def plain_cast_ref(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x -> dtype to nearest even through fp32 (every source value is an fp32 value, so the one rounding is the
    narrowing's); float8_e4m3fn / float8_e5m2 saturate at +-448 / +-57344 (+-inf too, NaN stays NaN), the others
    follow IEEE (overflow -> inf)."""
    wide = x.float()
    if dtype == torch.float8_e4m3fn:
        return e4m3_ref(wide)
    if dtype == torch.float8_e5m2:
        return wide.clamp(-E5M2_MAX, E5M2_MAX).to(dtype)
    return wide.to(dtype)


# Values every cast meets in the tests: signed zeros, infinities, NaN, fp32 / bf16 subnormals, the e4m3, e5m2, fp16
# and bf16 boundaries (smallest normal, subnormals, largest finite, just past it), ties of nearest-even and exact
# neighbours.
SPECIAL_VALUES = (
    0.0, -0.0, float('inf'), float('-inf'), float('nan'), -float('nan'),
    1e-45, -3e-39, 2.0**-126, 2.0**-130,
    2.0**-9, 2.0**-10, 3 * 2.0**-11, -(2.0**-6), 2.0**-6 - 2.0**-12, 2.0**-7,
    448.0, -448.0, 449.0, 464.0, -480.0, 1e6, 65504.0, 65520.0, -1e5, 57344.0, -61440.0, 2.0**-16, 3 * 2.0**-18,
    3.3895313892515355e38, 3.39e38, -3.4028234663852886e38,
    1.0, 1.0 + 2.0**-8, 1.0 + 2.0**-9, -1.5 * 2.0**-7, 0.1, -0.3,
)  # fmt: skip


def cast_inputs(numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Test input of `numel` elements of `dtype`: magnitudes over 2**-24 .. 2**10 with random signs, the
    SPECIAL_VALUES at the front (as many as fit), as `dtype`, on `device`. An FP8 input is the plain saturating
    cast of the fp32 values."""
    values = torch.randn(numel) * torch.exp2(torch.randint(-24, 10, (numel,)).float())
    special = torch.tensor(SPECIAL_VALUES[:numel], dtype=torch.float32)
    values[: special.numel()] = special
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return plain_cast_ref(values, dtype).to(device)
    return values.to(dtype).to(device)


def nan_canonical(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Integer bits of a plain cast's result with every NaN as the format's positive quiet NaN (the payload and
    sign of a NaN the plain casts keep are the backend's, unspecified by the contract)."""
    nan_bits = {
        torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00, torch.float8_e4m3fn: 0x7F,
        torch.float8_e5m2: 0x7F,
    }  # fmt: skip
    values = bits.view(dtype)
    return torch.where(values.float().isnan(), torch.tensor(nan_bits[dtype]).to(bits.dtype), bits)
