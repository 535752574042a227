"""Ascend 950 kernel of per_token_cast (math and config: per_token_cast_kernel.py).

A persistent loop over (token, column tile) tasks on the vector cores. Per task the row slice lands in UB
and one SIMD VF makes three passes over it, in fp32 (bf16 widens exactly): the absolute maximum of each block
(a masked reduction per 32-, 64- or 128-element block), the scale factors and their inverses for 64 blocks
per register, then x * inverse narrowed to float8_e4m3fn. The fp8 row and the scale row go back to GM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, the constants of the math as arguments, and the lane width, which the config checks too, lives here.
LANES = 64  # fp32 lanes of one 256-byte Ascend vector register


def ascend_per_token_cast_kernel(cfg, *, amax_floor: float, fp8_max: float):
    """`cfg` is a PerTokenCastConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, bk, bs, stages = cfg.hidden, cfg.block_k, cfg.block_size, cfg.num_stages
    in_dtype, sf_dtype = cfg.in_dtype, cfg.sf_dtype
    n_tiles = cfg.num_col_tiles
    groups = cfg.groups_per_tile
    groups_padded = -(-groups // LANES) * LANES  # whole registers of scales
    sf_len = groups + cfg.sf_padding  # scale elements one task stores (padding only when it owns the row)
    chunks = bk // LANES
    grid = cfg.num_cores
    inv_fp8_max = 1.0 / fp8_max  # rounded to fp32 where it is used, as the reference's constant

    num_tokens = T.dynamic('num_tokens')

    @T.macro
    def load_f32(x_ub, c):
        if in_dtype == 'bfloat16':
            return S.vcvt(S.vld(x_ub[c * LANES], dist='UNPK_B16'), f32)
        return S.vld(x_ub[c * LANES])

    @T.macro
    def cast_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub):
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-element block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            # Pass 1: |x| maxima, one per block, into amax_ub[0:groups].
            if bs == 128:
                for p in T.serial(chunks // 2):
                    pair_max = S.vmax(S.vabs(load_f32(x_ub, 2 * p)), S.vabs(load_f32(x_ub, 2 * p + 1)))
                    S.vsts(amax_ub[p], S.vcmax(pair_max), dist='ONEPT_B32')
            else:
                for c in T.serial(chunks):
                    a = S.vabs(load_f32(x_ub, c))
                    if bs == 64:
                        S.vsts(amax_ub[c], S.vcmax(a), dist='ONEPT_B32')
                    else:
                        S.vsts(amax_ub[2 * c], S.vcmax(a, low), dist='ONEPT_B32')
                        S.vsts(amax_ub[2 * c + 1], S.vcmax(a, high), dist='ONEPT_B32')
            S.mem_bar('VST_VLD')
            # Pass 2: scales and inverses, 64 blocks per register. Lanes past `groups` compute on whatever
            # amax_ub holds there and are never stored to GM (packed padding lanes are zeroed first).
            for q in T.serial(groups_padded // LANES):
                clamped = S.vmaxs(S.vld(amax_ub[q * LANES]), amax_floor)
                if cfg.round_sf:
                    bits = T.reinterpret(S.vmuls(clamped, inv_fp8_max), 'uint32x64')
                    # Round up to a power of two: carry any mantissa bit into the exponent, drop the mantissa.
                    pow2 = S.vand(S.vadds(bits, 0x7FFFFF), S.vdup(0x7F800000, T.uint32))
                    biased = S.vshrs(pow2, 23)
                    # 1 / 2**e has biased exponent 254 - (e + 127); an inf scale (255) gets inverse +0.
                    inv_exp = S.vmaxs(S.vsub(S.vdup(254, T.int32), T.reinterpret(biased, 'int32x64')), 0)
                    S.vsts(inv_ub[q * LANES], T.reinterpret(S.vshls(inv_exp, 23), 'float32x64'))
                    if cfg.packed_ue8m0:
                        valid = S.update_mask(groups - q * LANES, 32)
                        exp_bytes = S.vsel(biased, S.vdup(0, T.uint32), valid)
                        S.vsts(sf_ub[q * LANES], T.reinterpret(exp_bytes, 'uint8x256'), dist='PK4_B32')
                    else:
                        S.vsts(sf_ub[q * LANES], T.reinterpret(pow2, 'float32x64'))
                else:
                    fmax = S.vdup(fp8_max, f32)
                    S.vsts(sf_ub[q * LANES], S.vdiv(clamped, fmax))
                    S.vsts(inv_ub[q * LANES], S.vdiv(fmax, clamped))
            S.mem_bar('VST_VLD')
            # Pass 3: x * inverse -> e4m3 (nearest even, saturating), one byte per fp32 lane, packed.
            for c in T.serial(chunks):
                if bs == 32:
                    inverse = S.vsel(
                        S.vld(inv_ub[2 * c], dist='BRC_B32'), S.vld(inv_ub[2 * c + 1], dist='BRC_B32'), low
                    )
                else:
                    inverse = S.vld(inv_ub[c * LANES // bs], dist='BRC_B32')
                scaled = S.vmul(load_f32(x_ub, c), inverse)
                S.vsts(out_ub[c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.prim_func
    def per_token_cast_kernel(
        x: T.Tensor((num_tokens, hidden), in_dtype),
        out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        out_sf: T.Tensor((num_tokens, cfg.sf_cols), sf_dtype),
    ):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bk,), in_dtype)
            out_ub = T.alloc_shared((bk,), T.float8_e4m3fn)
            amax_ub = T.alloc_shared((groups_padded,), f32)
            inv_ub = T.alloc_shared((groups_padded,), f32)
            sf_ub = T.alloc_shared((groups_padded,), sf_dtype)
            T.annotate_buffer_versions({x_ub: stages, out_ub: stages, sf_ub: stages, amax_ub: 1, inv_ub: 1})
            for task in T.Persistent([num_tokens * n_tiles], grid, cid, group_size=1, num_stages=stages):
                t = task // n_tiles
                j = task % n_tiles
                T.copy(x[t, j * bk : j * bk + bk], x_ub)
                cast_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub)
                T.copy(out_ub, out[t, j * bk : j * bk + bk])
                T.copy(sf_ub[0:sf_len], out_sf[t, j * groups : j * groups + sf_len])

    return per_token_cast_kernel
