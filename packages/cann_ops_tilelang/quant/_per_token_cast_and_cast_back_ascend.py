"""Ascend 950 kernel of per_token_cast_and_cast_back (math and config: per_token_cast_and_cast_back_kernel.py).

A persistent loop over (token, column tile) tasks on the vector cores, `cfg.num_stages` buffer versions so that
the DMAs of the next task overlap the vector work of this one. Per task the row slice (row stride dynamic) lands
in UB and one SIMD VF makes three passes over it, in fp32 (bf16 widens exactly, UNPK_B16 loads):
  - the absolute maximum of each block (a masked reduction per 16-, 32-, 64- or 128-element block);
  - the scales and their inverses, 64 blocks per register (per_token_cast's rule for the format, _scale_rules.py);
    E4M3 scales are widened to fp32 once, for the multiply back;
  - per 64 elements: x * inverse narrowed to float8_e4m3fn (nearest even; clamped to +-448 first where E4M3 scales
    let a product pass it; one byte in the low byte of each 32-bit lane, PART_P0) and widened back to fp32 from the
    same part (exact), or rounded to e2m1 codes (fp4.ascend_e2m1_macros, per_token_cast's rounding) and decoded
    (fp4.ascend_e2m1_decode_macro, cast_back's), times the block's scale, then the fp32 store, or vcvt fp32 -> bf16
    (nearest even, non-saturating) and a packing store of the low halves.
The round-tripped slice goes back to the same place in GM (x in place: tasks own disjoint slices).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_and_cast_back_kernel.py, never the other way round (no import circle).
from ._per_token_cast_ascend import ascend_quarter_masks_macro, ascend_row_macros
from ._scale_rules import LANES, ascend_cast_scales_macro, ascend_precomputed_macros
from .fp4 import ascend_e2m1_decode_macro, ascend_e2m1_macros


def ascend_per_token_cast_and_cast_back_kernel(cfg):
    """`cfg` is a PerTokenCastAndCastBackConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, bk, bs, stages = cfg.hidden, cfg.block_k, cfg.block_size, cfg.num_stages
    in_dtype = cfg.in_dtype
    n_tiles = cfg.num_col_tiles
    groups = cfg.groups_per_tile
    groups_padded = -(-groups // LANES) * LANES  # whole registers of scales
    chunks = bk // LANES
    grid = cfg.num_cores
    fp4, e4m3_sf = cfg.fmt == 'e2m1', cfg.e4m3_sf
    scales = ascend_cast_scales_macro(T, fmt=cfg.fmt, round_sf=cfg.round_sf, packed_ue8m0=False, e4m3_sf=e4m3_sf)
    _, saturate = ascend_precomputed_macros(T)
    e2m1_codes, _ = ascend_e2m1_macros(T)
    decode = ascend_e2m1_decode_macro(T)
    quarter_masks = ascend_quarter_masks_macro(T)
    # The scale buffer's dtype: E4M3 bytes, widened into scale_ub for the multiply back; else fp32 (scale_ub is it).
    sf_dtype = T.float8_e4m3fn if e4m3_sf else f32

    num_tokens = T.dynamic('num_tokens')
    x_stride = T.dynamic('x_stride')

    load_f32, block_maxima, block_scalar = ascend_row_macros(T, in_dtype=in_dtype, block_size=bs, chunks=chunks)

    @T.macro
    def store_f32(out_ub, c, value):
        if in_dtype == 'float32':
            S.vsts(out_ub[c * LANES], value)
        else:
            # bf16 into the low half of each 32-bit lane (PART_EVEN), the low halves packed by the store.
            S.vsts(out_ub[c * LANES], S.vcvt(value, T.bfloat16, sat=False), dist='PK_B32')

    @T.macro
    def round_trip(scaled):
        """fp32 products -> the nearest values of the data format, in fp32 (exact)."""
        if fp4:
            return decode(e2m1_codes(scaled))
        return S.vcvt(S.vcvt(saturate(scaled) if e4m3_sf else scaled, T.float8_e4m3fn), f32)

    @T.macro
    def round_trip_vf(x_ub, amax_ub, sf_ub, inv_ub, out_ub, scale_ub):
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-element block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            quarters = quarter_masks() if bs == 16 else None
            # Pass 1: |x| maxima, one per block, into amax_ub[0:groups].
            block_maxima(x_ub, amax_ub, low, high, quarters)
            S.mem_bar('VST_VLD')
            # Pass 2: scales and inverses (per_token_cast's rule), 64 blocks per register.
            scales(amax_ub, sf_ub, inv_ub, groups)
            S.mem_bar('VST_VLD')
            if e4m3_sf:  # the E4M3 scales' fp32 values (exact), 64 per register
                for q in T.serial(groups_padded // LANES):
                    S.vsts(scale_ub[q * LANES], S.vcvt(S.vld(sf_ub[q * LANES], dist='UNPK4_B8'), f32))
                S.mem_bar('VST_VLD')
            # Pass 3: narrow(x * inverse) back to fp32, times the scale, narrowed to x's dtype.
            for c in T.serial(chunks):
                back = round_trip(S.vmul(load_f32(x_ub, c), block_scalar(inv_ub, c, low, quarters)))
                store_f32(out_ub, c, S.vmul(back, block_scalar(scale_ub, c, low, quarters)))

    @T.prim_func
    def per_token_cast_and_cast_back_kernel(x: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype)):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bk,), in_dtype)
            out_ub = T.alloc_shared((bk,), in_dtype)
            amax_ub = T.alloc_shared((groups_padded,), f32)
            sf_ub = T.alloc_shared((groups_padded,), sf_dtype)
            inv_ub = T.alloc_shared((groups_padded,), f32)
            versions = {x_ub: stages, out_ub: stages, amax_ub: 1, sf_ub: 1, inv_ub: 1}
            scale_ub = sf_ub
            if e4m3_sf:
                scale_ub = T.alloc_shared((groups_padded,), f32)
                versions[scale_ub] = 1
            T.annotate_buffer_versions(versions)
            for task in T.Persistent([num_tokens * n_tiles], grid, cid, group_size=1, num_stages=stages):
                t = task // n_tiles
                j = task % n_tiles
                T.copy(x[t, j * bk : j * bk + bk], x_ub)
                round_trip_vf(x_ub, amax_ub, sf_ub, inv_ub, out_ub, scale_ub)
                T.copy(out_ub, x[t, j * bk : j * bk + bk])

    return per_token_cast_and_cast_back_kernel
