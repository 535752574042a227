"""Ascend 950 kernel of norm_forward and norm_forward_and_per_token_cast (math, config and the prim_func signature:
norm_forward_kernel.py).

Before the loop each core stages the weight through a small tile and keeps w * out_scale in fp32 for the whole
kernel. Then a persistent loop of whole rows over the vector cores: the row of x (and of residual) lands in UB,
and one SIMD VF computes, in 64-lane fp32 registers (bf16 widens exactly):

1. with residual: r = x + residual rounded to x's dtype, in place over x (residual_out goes back from there);
2. sum(r * r) in one register, folded (vcadd), rstd = 1 / sqrt(sum / H + eps) broadcast to every lane;
3. y = (r * rstd) * (w * out_scale), rounded to x's dtype, over the residual row (or in place over x);
4. the cast: per_token_cast's three passes over y (block maxima, scales, e4m3 data), with its macros (a short
   last block, H = 64 * odd with 128-channel blocks: the row's last register is a block of its own, as there).

Where the row's buffers do not fit UB beside the resident fp32 weight (cfg.weight_streamed: fp32 x with weight,
residual and the cast's bf16 output, H past 15296..16000) nothing is staged before the loop: the VF stops after
step 2 with rstd in UB, then for each staging tile of the weight a DMA of the tile and a VF doing step 3 over its
columns (w * out_scale in a register, the same fp32 products and roundings: the same bits), then a VF doing step
4 over the whole row. The weight is read once per row instead of once per core.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by norm_forward_kernel.py, never the other way round (no import circle): the config comes as `cfg`,
# the signature as `prim_func`.
from cann_ops_tilelang.quant._per_token_cast_ascend import ascend_quarter_masks_macro, ascend_row_macros
from cann_ops_tilelang.quant._scale_rules import UE8M0_PACK, ascend_cast_scales_macro
from cann_ops_tilelang.quant._tiling import divisors

from ._norm_common import LANES

WEIGHT_TILE = 1024  # elements of the weight staged per DMA before the loop (the staging buffer's size)


def ascend_weight_macros(T, *, hidden: int, dtype: str):
    """SIMD macros shared by the forward and the backward: `load_f32(buf, c)`, register c of a row buffer of
    `dtype` as fp32; `store_row(buf, c, v)`, an fp32 register into a row buffer of `dtype` (bf16 rounds to
    nearest even); `stage_weight(weight, stage_ub, w_ub, scale)`, the (hidden,) weight in GM times `scale` into
    the resident fp32 w_ub, through stage_ub (one tile, `staging_tile(hidden)` elements of `dtype`)."""
    S = T.simd
    tile = staging_tile(hidden)
    load_f32 = ascend_row_macros(T, in_dtype=dtype, block_size=LANES, chunks=hidden // LANES)[0]

    @T.macro
    def store_row(buf, c, v):
        if dtype == 'bfloat16':
            S.vsts(buf[c * LANES], S.vcvt(v, T.bfloat16), dist='PK_B32')
        else:
            S.vsts(buf[c * LANES], v)

    @T.macro
    def stage_weight(weight, stage_ub, w_ub, scale):
        for k in T.serial(hidden // tile):
            T.copy(weight[k * tile : k * tile + tile], stage_ub)
            with T.SimdVF():
                for c in T.serial(tile // LANES):
                    S.vsts(w_ub[k * tile + c * LANES], S.vmuls(load_f32(stage_ub, c), scale))

    return load_f32, store_row, stage_weight


def staging_tile(hidden: int) -> int:
    """Elements of the weight staged per DMA: the largest multiple of 64 up to WEIGHT_TILE dividing hidden."""
    return divisors(hidden, LANES, WEIGHT_TILE)[0]


def ascend_norm_forward_kernel(cfg, prim_func):
    """`cfg` is a NormForwardConfig (backend "ascend"); `prim_func` the signature builder forward_prim_func."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, dtype, grid, stages = cfg.hidden, cfg.dtype, cfg.num_cores, cfg.num_stages
    chunks = hidden // LANES
    bf16_rows = dtype == 'bfloat16'
    with_weight, with_residual, with_rstd, cast = cfg.with_weight, cfg.with_residual, cfg.with_rstd, cfg.cast
    writes_y, separate_bf16 = cfg.writes_y, cfg.separate_bf16
    bs = cfg.block_size if cast else LANES  # LANES: a placeholder the row macros need, unused without the cast
    groups = cfg.num_blocks
    groups_padded = -(-groups // LANES) * LANES
    sf_cols = cfg.sf_cols
    col_major = cfg.col_major_sf
    tile = staging_tile(hidden)
    tile_chunks = tile // LANES
    streamed = cfg.weight_streamed  # y per weight tile (no resident weight): see y_tile_vf

    load_f32, store_row, stage_weight = ascend_weight_macros(T, hidden=hidden, dtype=dtype)
    # The task is the row, so every register holds y: with a short last block (odd `chunks`, 128-channel blocks)
    # all of them are valid, and the last one is that block.
    valid_chunks = chunks if cfg.short_block else None
    _, block_maxima, block_scalar = ascend_row_macros(
        T, in_dtype=dtype, block_size=bs, chunks=chunks, valid_chunks=valid_chunks
    )
    quarter_masks = ascend_quarter_masks_macro(T)
    scales = ascend_cast_scales_macro(
        T, fmt='e4m3', round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=False
    )

    @T.macro
    def cast_passes(y_ub, amax_ub, inv_ub, sf_ub, data_ub):
        # per_token_cast's passes over y as stored (rounded to x's dtype): the same bytes as its kernel.
        low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-element block of a register
        every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
        high = S.pnot(low, every)
        quarters = quarter_masks() if bs == 16 else None
        S.mem_bar('VST_VLD')
        block_maxima(y_ub, amax_ub, low, high, quarters)
        S.mem_bar('VST_VLD')
        scales(amax_ub, sf_ub, inv_ub, groups)
        S.mem_bar('VST_VLD')
        for c in T.serial(chunks):
            scaled = S.vmul(load_f32(y_ub, c), block_scalar(inv_ub, c, low, quarters))
            S.vsts(data_ub[c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.macro
    def row_vf(x_ub, res_ub, y_ub, w_ub, st_ub, amax_ub, inv_ub, sf_ub, data_ub, bf_ub, eps, out_scale):
        with T.SimdVF():
            acc = S.alloc_var(f32)
            acc = S.vdup(0.0, f32)
            if with_residual:
                for c in T.serial(chunks):
                    r = S.vadd(load_f32(x_ub, c), load_f32(res_ub, c))
                    store_row(x_ub, c, r)
                    if not bf16_rows:
                        S.vmula(acc, r, r)
                S.mem_bar('VST_VLD')
            if bf16_rows or not with_residual:
                # bf16: the sum is of r rounded to bf16, read back from the row.
                for c in T.serial(chunks):
                    r = load_f32(x_ub, c)
                    S.vmula(acc, r, r)
            mean = S.vdiv(S.vcadd(acc), S.vdup(float(hidden), f32))  # lane 0
            rstd = S.vdiv(S.vdup(1.0, f32), S.vsqrt(S.vadds(mean, eps)))
            if with_rstd or streamed:  # streamed: the tiles' VFs take rstd from st_ub
                S.vsts(st_ub[0], rstd, dist='ONEPT_B32')
            if not streamed:
                rstd_all = S.vdupv(rstd)
                for c in T.serial(chunks):
                    y = S.vmul(load_f32(x_ub, c), rstd_all)
                    y = S.vmul(y, S.vld(w_ub[c * LANES])) if with_weight else S.vmuls(y, out_scale)
                    store_row(y_ub, c, y)
                    if separate_bf16:
                        S.vsts(bf_ub[c * LANES], S.vcvt(y, T.bfloat16), dist='PK_B32')
                if cast:
                    cast_passes(y_ub, amax_ub, inv_ub, sf_ub, data_ub)

    @T.macro
    def y_tile_vf(x_ub, y_ub, st_ub, stage_ub, bf_ub, k, out_scale):
        # weight_streamed: y over weight tile k (staged in stage_ub), the resident path's products and roundings.
        with T.SimdVF():
            rstd_all = S.vld(st_ub[0], dist='BRC_B32')
            for c in T.serial(tile_chunks):
                w = S.vmuls(load_f32(stage_ub, c), out_scale)
                y = S.vmul(S.vmul(load_f32(x_ub, k * tile_chunks + c), rstd_all), w)
                store_row(y_ub, k * tile_chunks + c, y)
                if separate_bf16:
                    S.vsts(bf_ub[(k * tile_chunks + c) * LANES], S.vcvt(y, T.bfloat16), dist='PK_B32')

    @T.macro
    def body(x, weight, residual, residual_out, out, rstd, data, sf, out_bf16, eps, out_scale, num_tokens):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((hidden,), dtype)
            versions = {x_ub: stages}
            st_ub = res_ub = w_ub = stage_ub = amax_ub = inv_ub = sf_ub = data_ub = bf_ub = None
            if with_residual:
                res_ub = T.alloc_shared((hidden,), dtype)
                versions[res_ub] = stages
            if with_rstd or streamed:
                st_ub = T.alloc_shared((8,), f32)  # rstd in element 0 (one 32-byte block)
                versions[st_ub] = stages
            if with_weight:
                if not streamed:
                    w_ub = T.alloc_shared((hidden,), f32)
                    versions[w_ub] = 1
                stage_ub = T.alloc_shared((tile,), dtype)
                versions[stage_ub] = 1
            if cast:
                amax_ub = T.alloc_shared((groups_padded,), f32)
                inv_ub = T.alloc_shared((groups_padded,), f32)
                sf_ub = T.alloc_shared((groups_padded,), cfg.sf_dtype)
                data_ub = T.alloc_shared((hidden,), T.float8_e4m3fn)
                versions.update({amax_ub: 1, inv_ub: 1, sf_ub: stages, data_ub: stages})
            if separate_bf16:
                bf_ub = T.alloc_shared((hidden,), T.bfloat16)
                versions[bf_ub] = stages
            T.annotate_buffer_versions(versions)
            y_ub = res_ub if with_residual else x_ub  # y over the residual row, or in place over x
            if with_weight and not streamed:
                stage_weight(weight, stage_ub, w_ub, out_scale)
            for t in T.Persistent([num_tokens], grid, cid, group_size=1, num_stages=stages):
                T.copy(x[t, 0:hidden], x_ub)
                if with_residual:
                    T.copy(residual[t, 0:hidden], res_ub)
                row_vf(x_ub, res_ub, y_ub, w_ub, st_ub, amax_ub, inv_ub, sf_ub, data_ub, bf_ub, eps, out_scale)
                if streamed:  # y tile by tile, each tile of the weight read into stage_ub; then the cast's passes
                    for k in T.serial(hidden // tile):
                        T.copy(weight[k * tile : k * tile + tile], stage_ub)
                        y_tile_vf(x_ub, y_ub, st_ub, stage_ub, bf_ub, k, out_scale)
                    if cast:
                        with T.SimdVF():
                            cast_passes(y_ub, amax_ub, inv_ub, sf_ub, data_ub)
                if with_residual:
                    T.copy(x_ub, residual_out[t, 0:hidden])
                if writes_y:
                    T.copy(y_ub, out[t, 0:hidden])
                if with_rstd:
                    T.copy(st_ub[0:1], rstd[t : t + 1])
                if cast:
                    T.copy(data_ub, data[t, 0:hidden])
                    if not col_major:
                        T.copy(sf_ub[0:sf_cols], sf[t, 0:sf_cols])
                    elif cfg.packed_ue8m0:  # the row's words, one 4-byte burst each, a row stride apart
                        T.copy(sf_ub[0:sf_cols], sf[0 : sf_cols // UE8M0_PACK, UE8M0_PACK * t : UE8M0_PACK * (t + 1)])
                    else:  # the row's scales, one burst each, a row stride apart
                        T.copy(sf_ub[0:sf_cols], sf[0:sf_cols, t])
                if separate_bf16:
                    T.copy(bf_ub, out_bf16[t, 0:hidden])

    return prim_func(T, cfg, body)
