"""The counter-based normal generator of randn: its definition and constants, shared by both backends.

Every output element is a pure function of (seed, stream offset, element index), made only of operations that
round the same way everywhere (uint32 wrap-around arithmetic, shifts, bit casts, exact int -> float conversions,
IEEE fp32 multiply, add, fused multiply-add and square root), so the Ascend and CUDA kernels and the CPU replay in
tests/rand/randn_ref.py produce the same bits.

State (one int64[2] tensor per device, read by the kernels as int32[4] = [k0, k1, offset_lo, offset_hi]):
word 0 packs the two 32-bit seed keys k0 | k1 << 32 (`seed_keys`), word 1 is the pair counter's offset, advanced
by `pairs_drawn(n)` after each call.

A call of n elements draws G = ceil(n / GROUP_ELEMENTS) groups. Pair q = 64 g + j (j < 64) of group g gives the
two elements 128 g + j and 128 g + 64 + j (a register of 64 pairs stores two contiguous halves; on CUDA a warp's
lanes write contiguous addresses). With the 64-bit counter c = offset + q = (c_hi, c_lo):

    key = mix(k0 ^ c_hi)                   (two values per call: the kernels compute them once, select per lane)
    h1 = mix(c_lo ^ key),  h2 = mix(h1 ^ k1)
    u1 = fma(a, 2**-24, fma(b, 2**-40, 2**-41))    a = h1 >> 8, b = (h1 & 0xff) << 8 | (h2 & 0xff)   (0, 1]
    phi = fma(f - 2**21, ANGLE_STEP, ANGLE_STEP / 2)   f = (h2 >> 8) & 0x3fffff                   (-pi/4, pi/4)
    r = sqrt(-2 ln u1),  (cos, sin) of phi + quarter * pi / 2,  quarter = h2 >> 30
    element 128 g + j = r cos,  element 128 g + 64 + j = r sin   (Box-Muller), rounded to the output dtype

ln, sin and cos are this module's polynomials (fitted here, see docs/rand.md): ln u1 = e ln 2 + ln m with
u1 = m 2**e, m in [sqrt(1/2), sqrt(2)) from the bits, ln m = fma(x * x, LN_POLY(x), x), x = m - 1;
sin = fma(phi * z, SIN_POLY(z), phi), cos = fma(z, COS_POLY(z), 1), z = phi * phi; every polynomial in Horner form,
one fma per coefficient. The quarter turn swaps (cos, sin) when bit 30 of h2 is set and flips the sign of the
cosine when bits 30 and 31 differ and of the sine when bit 31 is set (xor of the fp32 sign bit).
"""

from __future__ import annotations

import hashlib
import math

# Pairs per group (one Ascend fp32 register of counters) and the elements they give.
GROUP_PAIRS = 64
GROUP_ELEMENTS = 2 * GROUP_PAIRS

# mix(x): x ^= x >> 16; x *= MIX_MUL_1; x ^= x >> 15; x *= MIX_MUL_2; x ^= x >> 16 (uint32). The multipliers are
# the best of 60 random odd pairs in an avalanche test (every output bit flips with probability 0.5 +- 0.012 for
# every flipped input bit, the noise of the 2**14 samples).
MIX_SHIFTS = (16, 15, 16)
MIX_MUL_1 = 0xDCCC3D67
MIX_MUL_2 = 0xA019D2E7

# u1 from 40 random bits: a (24 bits) and b (16 bits), 2**-41 <= u1 <= 1; |z| <= sqrt(2 ln 2**41) = 7.55.
U1_HIGH_SCALE = 2.0**-24
U1_LOW_SCALE = 2.0**-40
U1_LOW_BIAS = 2.0**-41
# The angle: 22 bits within a quarter turn, centred on 0.
ANGLE_BITS = 22
ANGLE_STEP = float.fromhex('0x1.921fb6p-22')  # fp32(pi / 2 / 2**22)
ANGLE_HALF_STEP = ANGLE_STEP / 2  # exact (a power-of-two scaling)

# ln: exponent split at sqrt(1/2) (the fp32 bits of the mantissa boundary), ln 2 in fp32.
LN_SPLIT_BITS = 0x3F3504F3
LN2 = float.fromhex('0x1.62e430p-1')
# (ln(1 + x) - x) / x**2 on [sqrt(1/2) - 1, sqrt(2) - 1], highest degree first (fp32 values; fitted by Lawson's
# iteration on 4000 Chebyshev nodes, degree 7: max |error| of ln(1 + x) 2.6e-8 before fp32 evaluation).
LN_POLY = (
    0.09226633608341217,
    -0.1435229629278183,
    0.1477501094341278,
    -0.16562022268772125,
    0.1997445970773697,
    -0.2500205934047699,
    0.33333641290664673,
    -0.4999999403953552,
)
# (sin(p) - p) / p**3 and (cos(p) - 1) / p**2 as polynomials in z = p**2, |p| <= pi / 4, highest degree first
# (max |error| of sin 9.7e-9, of cos 1.9e-10 before fp32 evaluation).
SIN_POLY = (-0.00019588008581195027, 0.008332748897373676, -0.166666641831398)
COS_POLY = (2.4464934540446848e-05, -0.0013887601671740413, 0.04166664928197861, -0.5)

_MASK32 = 0xFFFFFFFF


def mix32(x: int) -> int:
    """The generator's 32-bit mix on a Python int (the host's key derivation; the kernels inline the same)."""
    s1, s2, s3 = MIX_SHIFTS
    x ^= x >> s1
    x = (x * MIX_MUL_1) & _MASK32
    x ^= x >> s2
    x = (x * MIX_MUL_2) & _MASK32
    return x ^ (x >> s3)


def seed_keys(seed: int) -> tuple[int, int]:
    """(k0, k1), two 32-bit keys of a seed (BLAKE2b of its 64-bit two's complement, little endian)."""
    digest = hashlib.blake2b((seed & (2**64 - 1)).to_bytes(8, 'little'), digest_size=8).digest()
    return int.from_bytes(digest[:4], 'little'), int.from_bytes(digest[4:], 'little')


def pairs_drawn(num_elements: int) -> int:
    """How far a call of num_elements advances the pair counter (whole groups: calls of multiples of 128
    elements concatenate into the stream of one call)."""
    return math.ceil(num_elements / GROUP_ELEMENTS) * GROUP_PAIRS
