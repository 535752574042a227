"""Ascend 950 kernel of per_token_cast_and_cast_back (math and config: per_token_cast_and_cast_back_kernel.py).

A persistent loop over (token, column tile) tasks on the vector cores, `cfg.num_stages` buffer versions so that
the DMAs of the next task overlap the vector work of this one. Per task the row slice (row stride dynamic) lands
in UB and one SIMD VF makes three passes over it, in fp32 (bf16 widens exactly, UNPK_B16 loads):
  - the absolute maximum of each block (a masked reduction per 32-, 64- or 128-element block);
  - the fp32 scales and their inverses, 64 blocks per register (the shared rule, _scale_rules.py);
  - per 64 elements: x * inverse narrowed to float8_e4m3fn (nearest even, saturating; one byte in the low byte
    of each 32-bit lane, PART_P0), widened back to fp32 from the same part (exact) in the register, times the
    block's scale, then the fp32 store, or vcvt fp32 -> bf16 (nearest even, non-saturating) and a packing
    store of the low halves.
The round-tripped slice goes back to the same place in GM (x in place: tasks own disjoint slices).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_and_cast_back_kernel.py, never the other way round (no import circle).
from ._per_token_cast_ascend import ascend_row_macros
from ._scale_rules import LANES, ascend_scales_macro


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
    scales = ascend_scales_macro(T, round_sf=cfg.round_sf, packed_ue8m0=False)

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
    def round_trip_vf(x_ub, amax_ub, sf_ub, inv_ub, out_ub):
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-element block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            # Pass 1: |x| maxima, one per block, into amax_ub[0:groups].
            block_maxima(x_ub, amax_ub, low, high)
            S.mem_bar('VST_VLD')
            # Pass 2: fp32 scales and inverses (the shared rule), 64 blocks per register.
            scales(amax_ub, sf_ub, inv_ub, groups)
            S.mem_bar('VST_VLD')
            # Pass 3: e4m3(x * inverse) back to fp32, times the scale, narrowed to x's dtype.
            for c in T.serial(chunks):
                q = S.vcvt(S.vmul(load_f32(x_ub, c), block_scalar(inv_ub, c, low)), T.float8_e4m3fn)
                store_f32(out_ub, c, S.vmul(S.vcvt(q, f32), block_scalar(sf_ub, c, low)))

    @T.prim_func
    def per_token_cast_and_cast_back_kernel(x: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype)):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bk,), in_dtype)
            out_ub = T.alloc_shared((bk,), in_dtype)
            amax_ub = T.alloc_shared((groups_padded,), f32)
            sf_ub = T.alloc_shared((groups_padded,), f32)
            inv_ub = T.alloc_shared((groups_padded,), f32)
            T.annotate_buffer_versions({x_ub: stages, out_ub: stages, amax_ub: 1, sf_ub: 1, inv_ub: 1})
            for task in T.Persistent([num_tokens * n_tiles], grid, cid, group_size=1, num_stages=stages):
                t = task // n_tiles
                j = task % n_tiles
                T.copy(x[t, j * bk : j * bk + bk], x_ub)
                round_trip_vf(x_ub, amax_ub, sf_ub, inv_ub, out_ub)
                T.copy(out_ub, x[t, j * bk : j * bk + bk])

    return per_token_cast_and_cast_back_kernel
