"""Ascend 950 kernel of randn (the generator: _counter_normal.py; configuration: randn_kernel.py).

A persistent loop over tasks of `cfg.block` elements (whole groups of 128) on the vector cores. Each task's SIMD
VF loads the state words as broadcast registers (no scalar reads), makes the two counter keys of the call, then
computes one group per iteration: the 64 counters of its pairs are one uint32 register (vci), and the two halves
of the group (64 cosines, 64 sines) are two fp32 registers, stored as they are or narrowed to bf16 / fp16.
Groups past the end of the output are not computed; the DMA back to GM copies the valid elements only.

Bit identity with CUDA and the CPU replay: the integer steps wrap modulo 2**32 (uint32 lanes), the int -> fp32
conversions are exact (values below 2**24), every fused multiply-add is vmula / vmadd (one rounding, as
asc_madd.md documents), every other product and sum is one IEEE fp32 operation, and the square root is the
correctly rounded one (precision 'vsqrt_0ulp_ftz_false': a Newton-corrected chain, not the bare instruction).
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

_STATE_WORDS = 4
_STATE_UB_WORDS = 8  # one 32-byte block


def ascend_randn_kernel(cfg):
    """`cfg` is a RandnConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32, i32, u32 = T.float32, T.int32, T.uint32
    vf32, vi32, vu32 = 'float32x64', 'int32x64', 'uint32x64'
    dtype, block, grid, stages = cfg.dtype, cfg.block, cfg.num_cores, cfg.num_stages
    pairs_per_task = block // 2
    s1, s2, s3 = MIX_SHIFTS
    num_elements = T.dynamic('num_elements')

    def as_u32(v):
        return T.reinterpret(v, vu32)

    def to_f32(v):
        """uint32 lanes below 2**24 -> fp32 (exact)."""
        return S.vcvt(T.reinterpret(v, vi32), f32)

    @T.macro
    def mix(x):
        h = S.alloc_var(u32)
        h = S.vxor(x, S.vshrs(x, s1))
        h = S.vmuls(h, T.uint32(MIX_MUL_1))
        h = S.vxor(h, S.vshrs(h, s2))
        h = S.vmuls(h, T.uint32(MIX_MUL_2))
        h = S.vxor(h, S.vshrs(h, s3))
        return h

    @T.macro
    def horner(coefficients, z):
        """p = p * z + c per coefficient, fused (vmadd)."""
        p = S.alloc_var(f32)
        p = S.vdup(f32(coefficients[0]), f32)
        for c in coefficients[1:]:
            S.vmadd(p, z, S.vdup(f32(c), f32))
        return p

    @T.macro
    def fma_scalar(a, b, c):
        """a * b + c (b and c scalars), fused."""
        acc = S.alloc_var(f32)
        acc = S.vdup(f32(c), f32)
        S.vmula(acc, a, S.vdup(f32(b), f32))
        return acc

    @T.macro
    def radius(h1, h2, low_byte):
        """sqrt(-2 ln u1) of the pair's 40 uniform bits."""
        low = S.alloc_var(f32)
        u1 = S.alloc_var(f32)
        e = S.alloc_var(i32)
        x = S.alloc_var(f32)
        ln_u1 = S.alloc_var(f32)
        low_bits = S.vor(S.vshls(S.vand(h1, low_byte), 8), S.vand(h2, low_byte))
        low = fma_scalar(to_f32(low_bits), U1_LOW_SCALE, U1_LOW_BIAS)
        u1 = low
        S.vmula(u1, to_f32(S.vshrs(h1, 8)), S.vdup(f32(U1_HIGH_SCALE), f32))
        e = S.vshrs(S.vadds(T.reinterpret(u1, vi32), i32(-LN_SPLIT_BITS)), 23)  # arithmetic: int32 lanes
        x = S.vadds(T.reinterpret(S.vsub(T.reinterpret(u1, vi32), S.vshls(e, 23)), vf32), f32(-1.0))
        ln_u1 = x
        S.vmula(ln_u1, S.vmul(x, x), horner(LN_POLY, x))
        S.vmula(ln_u1, S.vcvt(e, f32), S.vdup(f32(LN2), f32))
        # The correctly rounded square root (TileLang's replica of CANN's 0-ulp algorithm), not the bare SFU one.
        return S.vsqrt(S.vmuls(ln_u1, f32(-2.0)), precision='vsqrt_0ulp_ftz_false')

    @T.macro
    def group(out_ub, g, first_pair, k1, off_lo, key_low, key_high, masks):
        """Group g of the task: pairs first_pair + 64 g ..., into out_ub[128 g : 128 g + 128]."""
        low_byte, angle_mask, swap_bit, sign_bit = masks
        c_lo = S.alloc_var(u32)
        h1 = S.alloc_var(u32)
        h2 = S.alloc_var(u32)
        r = S.alloc_var(f32)
        phi = S.alloc_var(f32)
        z = S.alloc_var(f32)
        sin = S.alloc_var(f32)
        cos = S.alloc_var(f32)
        c_lo = S.vadd(as_u32(S.vci(first_pair + g * GROUP_PAIRS, i32)), off_lo)
        h1 = mix(S.vxor(c_lo, S.vsel(key_high, key_low, S.vcmp(c_lo, off_lo, op='lt'))))
        h2 = mix(S.vxor(h1, k1))
        r = radius(h1, h2, low_byte)
        centred = S.vadds(T.reinterpret(S.vand(S.vshrs(h2, 8), angle_mask), vi32), i32(-(1 << (ANGLE_BITS - 1))))
        phi = fma_scalar(S.vcvt(centred, f32), ANGLE_STEP, ANGLE_HALF_STEP)
        z = S.vmul(phi, phi)
        sin = phi
        S.vmula(sin, S.vmul(phi, z), horner(SIN_POLY, z))
        cos = S.vdup(f32(1.0), f32)
        S.vmula(cos, z, horner(COS_POLY, z))
        swap = S.vcmps(S.vand(h2, swap_bit), T.uint32(0), op='ne')
        x_sign = S.vand(S.vxor(h2, S.vshls(h2, 1)), sign_bit)
        y_sign = S.vand(h2, sign_bit)
        x_part = T.reinterpret(S.vxor(as_u32(S.vsel(sin, cos, swap)), x_sign), vf32)
        y_part = T.reinterpret(S.vxor(as_u32(S.vsel(cos, sin, swap)), y_sign), vf32)
        for half, part in ((0, x_part), (1, y_part)):
            value = S.vmul(r, part)
            if dtype == 'float32':
                S.vsts(out_ub[g * GROUP_ELEMENTS + half * GROUP_PAIRS], value)
            else:
                S.vsts(out_ub[g * GROUP_ELEMENTS + half * GROUP_PAIRS], S.vcvt(value, dtype), dist='PK_B32')

    @T.prim_func
    def randn_kernel(
        out: T.Tensor((num_elements,), dtype),
        state: T.Tensor((_STATE_WORDS,), i32),
    ):
        with T.Kernel(grid) as cid:
            state_ub = T.alloc_shared((_STATE_UB_WORDS,), i32)
            out_ub = T.alloc_shared((block,), dtype)
            T.annotate_buffer_versions({state_ub: 1, out_ub: stages})
            T.copy(state[0:_STATE_WORDS], state_ub[0:_STATE_WORDS])
            for task in T.Persistent([T.ceildiv(num_elements, block)], grid, cid, group_size=1, num_stages=stages):
                start = task * block
                valid = T.min(block, num_elements - start)
                with T.SimdVF():
                    k0 = as_u32(S.vld(state_ub[0], dist='BRC_B32'))
                    k1 = as_u32(S.vld(state_ub[1], dist='BRC_B32'))
                    off_lo = as_u32(S.vld(state_ub[2], dist='BRC_B32'))
                    off_hi = as_u32(S.vld(state_ub[3], dist='BRC_B32'))
                    # The two high counter words a call can meet (its pairs number < 2**31) and their keys.
                    key_low = mix(S.vxor(k0, off_hi))
                    key_high = mix(S.vxor(k0, S.vadds(off_hi, T.uint32(1))))
                    masks = (
                        S.vdup(T.uint32(0xFF), u32),
                        S.vdup(T.uint32((1 << ANGLE_BITS) - 1), u32),
                        S.vdup(T.uint32(0x40000000), u32),
                        S.vdup(T.uint32(0x80000000), u32),
                    )
                    for g in T.serial(T.ceildiv(valid, GROUP_ELEMENTS)):
                        group(out_ub, g, task * pairs_per_task, k1, off_lo, key_low, key_high, masks)
                T.copy(out_ub[0:valid], out[start : start + valid])

    return randn_kernel
