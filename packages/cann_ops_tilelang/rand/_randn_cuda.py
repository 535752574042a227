"""CUDA kernel of randn (the generator: _counter_normal.py; configuration: randn_kernel.py).

Each thread computes `cfg.vec` neighbouring pairs of one group (16 bytes of each half of the group: 4 fp32 or 8
bf16 elements) and writes them with one 16-byte store per half; the 64 pairs of a group are 64 / vec
neighbouring lanes, so a warp's stores cover whole 512-byte (fp32) or 256-byte (bf16) runs. The grid is flat,
one thread block per `threads * vec` pairs; the thread block that holds the end of the output stores its
partial 16-byte runs element by element.

Bit identity with the Ascend kernel and the CPU replay: every product goes through __fmul_rn, every sum through
__fadd_rn and every fused multiply-add through __fmaf_rn, so nvcc contracts nothing (its default -fmad=true
would fuse a product into a following add); the square root is __fsqrt_rn (IEEE whatever the flags). The state
(keys and the pair offset) is read from device memory by every thread: nothing on the host changes from call to
call, so a captured CUDA graph draws fresh numbers on each replay (randn.py advances the offset).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

from ._counter_normal import (
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


def cuda_randn_kernel(cfg):
    """`cfg` is a RandnConfig (backend "cuda")."""
    import tilelang.language as T

    f32, u32, i32 = T.float32, T.uint32, T.int32
    dtype, vec, threads = cfg.dtype, cfg.vec, cfg.threads
    pairs_per_block = threads * vec
    s1, s2, s3 = MIX_SHIFTS
    num_elements = T.dynamic('num_elements')
    num_pairs = T.ceildiv(num_elements, GROUP_ELEMENTS) * GROUP_PAIRS

    def mul(a, b):
        return T.call_extern(f32, '__fmul_rn', a, b)

    def fma(a, b, c):
        return T.call_extern(f32, '__fmaf_rn', a, b, c)

    # Every intermediate is a local variable (T.alloc_var): TileLang would otherwise inline each use of a value
    # as its whole expression tree.
    @T.macro
    def mix(x):
        h = T.alloc_var(u32)
        h = x ^ (x >> u32(s1))
        h = h * u32(MIX_MUL_1)
        h = h ^ (h >> u32(s2))
        h = h * u32(MIX_MUL_2)
        h = h ^ (h >> u32(s3))
        return h

    @T.macro
    def horner(coefficients, z):
        p = T.alloc_var(f32)
        p = f32(coefficients[0])
        for c in coefficients[1:]:
            p = fma(p, z, f32(c))
        return p

    @T.macro
    def radius(h1, h2):
        """sqrt(-2 ln u1) of the pair's 40 uniform bits."""
        u1 = T.alloc_var(f32)
        e = T.alloc_var(i32)
        x = T.alloc_var(f32)
        ln_u1 = T.alloc_var(f32)
        low = T.Cast(f32, T.Cast(i32, ((h1 & u32(0xFF)) << u32(8)) | (h2 & u32(0xFF))))
        high = T.Cast(f32, T.Cast(i32, h1 >> u32(8)))
        u1 = fma(high, f32(U1_HIGH_SCALE), fma(low, f32(U1_LOW_SCALE), f32(U1_LOW_BIAS)))
        e = (T.reinterpret(u1, i32) - i32(LN_SPLIT_BITS)) >> i32(23)
        x = T.call_extern(f32, '__fsub_rn', T.reinterpret(T.reinterpret(u1, i32) - (e << i32(23)), f32), f32(1.0))
        ln_u1 = fma(mul(x, x), horner(LN_POLY, x), x)
        ln_u1 = fma(T.Cast(f32, e), f32(LN2), ln_u1)
        return T.call_extern(f32, '__fsqrt_rn', mul(ln_u1, f32(-2.0)))

    @T.macro
    def pair(q, key_low, key_high, offset_lo, k1, cos_local, sin_local, v):
        """Pair q (of this call): (r cos, r sin) into the thread's registers at v."""
        c_lo = T.alloc_var(u32)
        h1 = T.alloc_var(u32)
        h2 = T.alloc_var(u32)
        r = T.alloc_var(f32)
        phi = T.alloc_var(f32)
        z = T.alloc_var(f32)
        sin = T.alloc_var(f32)
        cos = T.alloc_var(f32)
        c_lo = offset_lo + T.Cast(u32, q)
        h1 = mix(c_lo ^ T.if_then_else(c_lo < offset_lo, key_high, key_low))
        h2 = mix(h1 ^ k1)
        r = radius(h1, h2)
        centred = T.Cast(i32, (h2 >> u32(8)) & u32((1 << ANGLE_BITS) - 1)) - i32(1 << (ANGLE_BITS - 1))
        phi = fma(T.Cast(f32, centred), f32(ANGLE_STEP), f32(ANGLE_HALF_STEP))
        z = mul(phi, phi)
        sin = fma(mul(phi, z), horner(SIN_POLY, z), phi)
        cos = fma(z, horner(COS_POLY, z), f32(1.0))
        swap = (h2 & u32(0x40000000)) != u32(0)
        x_sign = (h2 ^ (h2 << u32(1))) & u32(0x80000000)
        y_sign = h2 & u32(0x80000000)
        x_part = T.reinterpret(T.reinterpret(T.if_then_else(swap, sin, cos), u32) ^ x_sign, f32)
        y_part = T.reinterpret(T.reinterpret(T.if_then_else(swap, cos, sin), u32) ^ y_sign, f32)
        cos_local[v] = T.Cast(dtype, mul(r, x_part))
        sin_local[v] = T.Cast(dtype, mul(r, y_part))

    @T.prim_func
    def randn_kernel(
        out: T.Tensor((num_elements,), dtype),
        state: T.Tensor((4,), i32),
    ):
        with T.Kernel(T.ceildiv(num_pairs, pairs_per_block), threads=threads) as bx:
            tx = T.get_thread_binding()
            cos_local = T.alloc_local((vec,), dtype)
            sin_local = T.alloc_local((vec,), dtype)
            k0 = T.Cast(u32, state[0])
            k1 = T.Cast(u32, state[1])
            offset_lo = T.Cast(u32, state[2])
            offset_hi = T.Cast(u32, state[3])
            # The two high counter words a call can meet (its pairs number < 2**31): their keys, once per thread.
            key_low = T.alloc_var(u32)
            key_high = T.alloc_var(u32)
            key_low = mix(k0 ^ offset_hi)
            key_high = mix(k0 ^ (offset_hi + u32(1)))
            first = (bx * threads + tx) * vec  # pair index; < num_pairs + pairs_per_block <= 2**31 (the limit)
            for v in T.unroll(vec):
                pair(first + v, key_low, key_high, offset_lo, k1, cos_local, sin_local, v)
            start = (first // GROUP_PAIRS) * GROUP_ELEMENTS + first % GROUP_PAIRS
            if start + GROUP_PAIRS + vec <= num_elements:
                for v in T.vectorized(vec):
                    out[start + v] = cos_local[v]
                for v in T.vectorized(vec):
                    out[start + GROUP_PAIRS + v] = sin_local[v]
            else:
                for v in T.serial(vec):
                    if start + v < num_elements:
                        out[start + v] = cos_local[v]
                    if start + GROUP_PAIRS + v < num_elements:
                        out[start + GROUP_PAIRS + v] = sin_local[v]

    return randn_kernel
