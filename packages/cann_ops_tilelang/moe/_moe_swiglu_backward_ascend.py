"""Ascend 950 kernel of moe_swiglu_backward and moe_swiglu_backward_and_per_token_cast (math and configuration:
moe_swiglu_backward_kernel.py).

A persistent loop over tokens on the vector cores. Per token the scalar unit finds whether the slot is padding
(_swiglu_backward_common.token_kept_macro) and its weight; then, per column tile, both halves of x (fp8 with their
scales), act_x_grad land in UB and one SIMD VF computes in fp32 the two gradient tiles, act_out and the lanes of
the weight gradient, which stay in UB from tile to tile and are summed (vcadd) into weight_grad[t] after each tile.
With the cast the VF then makes per_token_cast's three passes over the fp32 gradient tiles (block maxima, scales
and inverses, data), with its macros (quant/_per_token_cast_ascend.py, quant/_scale_rules.py). Padding slots:
every value is selected to zero, their scales are zeroed by the scalar unit.

Straddling blocks (cfg.straddles: H = 64 * odd, 128-channel blocks, one block across the halves): the task is the
token's row (one tile of H channels a half); x's scales land as one row, the gate and up gradients side by side in
one fp32 row of 2 H, and the cast's passes run over that row, so the block across the halves takes its maximum over
the gate's last register and the up's first, as per_token_cast's rows do.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by moe_swiglu_backward_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ..quant._per_token_cast_ascend import ascend_row_macros
from ..quant._scale_rules import LANES, ascend_cast_scales_macro
from ._swiglu_backward_common import argument_shapes, token_kept_macro, x_grad_sf_type


def ascend_moe_swiglu_backward_kernel(cfg):
    """`cfg` is a MoeSwigluBackwardConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32, i32 = T.float32, T.int32
    hidden, bk, n_tiles, stages, grid = cfg.hidden, cfg.block_k, cfg.num_col_tiles, cfg.num_stages, cfg.num_cores
    x_dtype, grad_dtype, out_dtype = cfg.x_dtype, cfg.grad_dtype, cfg.out_dtype
    cast, with_weight, use_clamp, recompute = cfg.cast, cfg.with_weight, cfg.use_clamp, cfg.do_recompute
    bs, groups, num_blocks, sf_dtype = cfg.block_size, cfg.groups_per_tile, cfg.num_blocks, cfg.sf_dtype
    row_blocks = cfg.row_blocks
    chunks = bk // LANES
    straddles = cfg.straddles
    # The cast's row: a half tile, or with straddling blocks the 2 H row (the gate's registers, then the up's).
    cast_chunks, cast_groups = (2 * chunks, cfg.row_blocks) if straddles else (chunks, groups)
    sf_len = cfg.sf_cols if straddles else groups  # scales one task stores (packed: to a whole word)
    groups_padded = max(-(-sf_len // LANES) * LANES, LANES)  # whole registers of scales
    kept = token_kept_macro(T, num_experts=cfg.num_experts, alignment=cfg.alignment) if cfg.num_experts else None

    num_tokens = T.dynamic('num_tokens')
    shapes = argument_shapes(T, cfg, num_tokens)
    sf_type = x_grad_sf_type(T, cfg, shapes, num_tokens)
    col_major, packed_sf = cfg.col_major_sf, cfg.packed_ue8m0

    if cast:
        _, block_maxima, block_scalar = ascend_row_macros(T, in_dtype='float32', block_size=bs, chunks=cast_chunks)
        scales = ascend_cast_scales_macro(
            T, fmt='e4m3', round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=False
        )

    @T.macro
    def load(buf, c):
        """Register c of a bf16 / fp32 tile as fp32 (bf16 widens exactly)."""
        if buf.dtype == 'bfloat16':
            return S.vcvt(S.vld(buf[c * LANES], dist='UNPK_B16'), f32)
        return S.vld(buf[c * LANES])

    @T.macro
    def load_x(buf, sf_ub, c, sf_register, low):
        """Register c of a half tile of x as fp32: fp8 data times its block's scale (one fp32 product), the scale
        that of register `sf_register` of sf_ub's row (c, or with straddling blocks the register in the 2 H row)."""
        if cast:
            return S.vmul(S.vcvt(S.vld(buf[c * LANES], dist='UNPK4_B8'), f32), block_scalar(sf_ub, sf_register, low))
        return load(buf, c)

    @T.macro
    def store(buf, c, value):
        if buf.dtype == 'bfloat16':
            S.vsts(buf[c * LANES], S.vcvt(value, T.bfloat16), dist='PK_B32')
        else:
            S.vsts(buf[c * LANES], value)

    @T.macro
    def quantise(grad32_ub, amax_ub, sf_ub, inv_ub, fp8_ub, low, high):
        """per_token_cast's passes over one fp32 half tile (straddling blocks: the 2 H row): block maxima, scales
        and inverses, e4m3 data."""
        block_maxima(grad32_ub, amax_ub, low, high)
        S.mem_bar('VST_VLD')
        scales(amax_ub, sf_ub, inv_ub, cast_groups)
        S.mem_bar('VST_VLD')
        for c in T.serial(cast_chunks):
            scaled = S.vmul(S.vld(grad32_ub[c * LANES]), block_scalar(inv_ub, c, low))
            S.vsts(fp8_ub[c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.macro
    def tile_vf(j, ub, weight, keep, routed_scaling_factor, clamp_value):
        with T.SimdVF():
            one = S.vdup(1.0, f32)
            zero = S.vdup(0.0, f32)
            scale = S.vdup(weight, f32)
            token = S.vcmps(S.vdup(keep, i32), 0, op='ne')  # every lane false on a padding slot
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-channel block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            if with_weight:
                # The lanes' sums of g * act, carried from tile to tile in UB (fresh on the first tile).
                acc = S.alloc_var(f32)
                acc = S.vsel(zero, S.vld(ub['acc'][0]), S.vcmps(S.vdup(j, i32), 0, op='eq'))
            for c in T.serial(chunks):
                a = load_x(ub['x'], ub['x_sf'], c, c, low)
                b = load_x(ub['y'], ub['y_sf'], c, chunks + c if straddles else c, low)
                g = load(ub['grad'], c)
                if use_clamp:
                    a_cut = S.vcmps(a, clamp_value, op='gt')
                    b_cut = S.vcmps(S.vabs(b), clamp_value, op='gt')
                    a = S.vmins(a, clamp_value)
                    b = S.vmins(S.vmaxs(b, -clamp_value), clamp_value)
                s = S.vdiv(one, S.vadds(S.vexp(S.vneg(a)), 1.0))
                act = S.vmul(S.vmul(a, s), b)
                gws = S.vmul(S.vmul(g, scale), s)
                da = S.vmul(S.vmul(gws, b), S.vadd(one, S.vmul(a, S.vsub(one, s))))
                db = S.vmul(gws, a)
                if use_clamp:
                    da = S.vsel(zero, da, a_cut)
                    db = S.vsel(zero, db, b_cut)
                da = S.vsel(da, zero, token)
                db = S.vsel(db, zero, token)
                store(ub['x_grad'], c, da)
                store(ub['y_grad'], c, db)
                if cast and straddles:  # the 2 H row: the up half after the gate's H channels
                    S.vsts(ub['x_grad32'][c * LANES], da)
                    S.vsts(ub['x_grad32'][(chunks + c) * LANES], db)
                elif cast:
                    S.vsts(ub['x_grad32'][c * LANES], da)
                    S.vsts(ub['y_grad32'][c * LANES], db)
                if with_weight:
                    S.vmula(acc, g, S.vsel(act, zero, token))
                if recompute:
                    store(ub['act'], c, S.vsel(S.vmul(act, scale), zero, token))
            if with_weight:
                S.vsts(ub['acc'][0], acc)
                total = S.vsel(S.vmuls(S.vcadd(acc), routed_scaling_factor), zero, token)
                S.vsts(ub['weight_grad'][0], total, dist='ONEPT_B32')
            if cast:
                S.mem_bar('VST_VLD')
                quantise(ub['x_grad32'], ub['amax'], ub['x_grad_sf'], ub['inv'], ub['x_grad_fp8'], low, high)
            if cast and not straddles:
                S.mem_bar('VST_VLD')
                quantise(ub['y_grad32'], ub['amax'], ub['y_grad_sf'], ub['inv'], ub['y_grad_fp8'], low, high)

    @T.prim_func
    def moe_swiglu_backward_kernel(
        x: T.Tensor(shapes['x'], x_dtype),
        x_sf: T.Tensor(shapes['x_sf'], f32),
        act_x_grad: T.Tensor(shapes['act_x_grad'], grad_dtype),
        topk_weights: T.Tensor(shapes['topk_weights'], f32),
        psum: T.Tensor(shapes['psum'], i32),
        x_grad: T.Tensor(shapes['x_grad'], out_dtype),
        weight_grad: T.Tensor(shapes['weight_grad'], f32),
        act_out: T.Tensor(shapes['act_out'], out_dtype),
        x_grad_fp8: T.Tensor(shapes['x_grad_fp8'], T.float8_e4m3fn),
        x_grad_sf: sf_type,
        routed_scaling_factor: f32,
        clamp_value: f32,
    ):
        with T.Kernel(grid) as cid:
            ub = {
                'x': T.alloc_shared((bk,), x_dtype),
                'y': T.alloc_shared((bk,), x_dtype),
                'grad': T.alloc_shared((bk,), grad_dtype),
                'x_grad': T.alloc_shared((bk,), out_dtype),
                'y_grad': T.alloc_shared((bk,), out_dtype),
                'x_sf': None,
                'y_sf': None,
            }
            versions = {ub[k]: stages for k in ('x', 'y', 'grad', 'x_grad', 'y_grad')}
            if with_weight:
                ub['acc'] = T.alloc_shared((LANES,), f32)
                ub['weight_grad'] = T.alloc_shared((LANES,), f32)
                versions[ub['acc']] = 1
                versions[ub['weight_grad']] = stages
            if recompute:
                ub['act'] = T.alloc_shared((bk,), out_dtype)
                versions[ub['act']] = stages
            if cast and straddles:
                # One row each: x's scales (the up half's block after the gate's), the cast's 2 H row.
                ub['x_sf'] = ub['y_sf'] = T.alloc_shared((groups_padded,), f32)
                ub['x_grad_sf'] = T.alloc_shared((groups_padded,), sf_dtype)
                ub['x_grad_fp8'] = T.alloc_shared((2 * bk,), T.float8_e4m3fn)
                for k in ('x_sf', 'x_grad_sf', 'x_grad_fp8'):
                    versions[ub[k]] = stages
                for k, size in (('x_grad32', 2 * bk), ('amax', groups_padded), ('inv', groups_padded)):
                    ub[k] = T.alloc_shared((size,), f32)
                    versions[ub[k]] = 1
            elif cast:
                for k in ('x_sf', 'y_sf'):
                    ub[k] = T.alloc_shared((groups_padded,), f32)
                    versions[ub[k]] = stages
                for k in ('x_grad_sf', 'y_grad_sf'):
                    ub[k] = T.alloc_shared((groups_padded,), sf_dtype)
                    versions[ub[k]] = stages
                for k in ('x_grad_fp8', 'y_grad_fp8'):
                    ub[k] = T.alloc_shared((bk,), T.float8_e4m3fn)
                    versions[ub[k]] = stages
                # Vector-local scratch: no DMA reads or writes it.
                for k, size in (('x_grad32', bk), ('y_grad32', bk), ('amax', groups_padded), ('inv', groups_padded)):
                    ub[k] = T.alloc_shared((size,), f32)
                    versions[ub[k]] = 1
            T.annotate_buffer_versions(versions)
            for t in T.Persistent([num_tokens], grid, cid, group_size=1, num_stages=stages):
                keep = 1
                if kept is not None:
                    keep = kept(psum, t)
                weight = T.alloc_var(f32)
                weight = 1.0
                if with_weight:
                    weight = topk_weights[t] * routed_scaling_factor
                for j in T.serial(n_tiles):
                    col = j * bk
                    T.copy(x[t, col : col + bk], ub['x'])
                    T.copy(x[t, hidden + col : hidden + col + bk], ub['y'])
                    if cast and straddles:  # the row (j = 0)
                        T.copy(x_sf[t, 0:row_blocks], ub['x_sf'][0:row_blocks])
                    elif cast:
                        sf_col = j * groups
                        T.copy(x_sf[t, sf_col : sf_col + groups], ub['x_sf'][0:groups])
                        T.copy(x_sf[t, num_blocks + sf_col : num_blocks + sf_col + groups], ub['y_sf'][0:groups])
                    T.copy(act_x_grad[t, col : col + bk], ub['grad'])
                    tile_vf(j, ub, weight, keep, routed_scaling_factor, clamp_value)
                    T.copy(ub['x_grad'], x_grad[t, col : col + bk])
                    T.copy(ub['y_grad'], x_grad[t, hidden + col : hidden + col + bk])
                    if recompute:
                        T.copy(ub['act'], act_out[t, col : col + bk])
                    if cast and straddles:  # the row (j = 0): its data, its scales (packed: to a whole word)
                        T.copy(ub['x_grad_fp8'], x_grad_fp8[t, 0 : 2 * hidden])
                        if keep == 0:
                            for k in T.serial(sf_len):
                                ub['x_grad_sf'][k] = T.cast(0, sf_dtype)
                        if not col_major:
                            T.copy(ub['x_grad_sf'][0:sf_len], x_grad_sf[t, 0:sf_len])
                        elif packed_sf:
                            T.copy(ub['x_grad_sf'][0:sf_len], x_grad_sf[0 : sf_len // 4, 4 * t : 4 * t + 4])
                        else:
                            T.copy(ub['x_grad_sf'][0:sf_len], x_grad_sf[0:sf_len, t])
                    elif cast:
                        T.copy(ub['x_grad_fp8'], x_grad_fp8[t, col : col + bk])
                        T.copy(ub['y_grad_fp8'], x_grad_fp8[t, hidden + col : hidden + col + bk])
                        if keep == 0:
                            # A padding slot's scales are 0 (TileKernels'), not the floor's.
                            for k in T.serial(groups):
                                ub['x_grad_sf'][k] = T.cast(0, sf_dtype)
                                ub['y_grad_sf'][k] = T.cast(0, sf_dtype)
                        sf_col = j * groups
                        for half, name in ((0, 'x_grad_sf'), (1, 'y_grad_sf')):
                            first = half * num_blocks + sf_col
                            if not col_major:
                                T.copy(ub[name][0:groups], x_grad_sf[t, first : first + groups])
                            elif packed_sf:  # whole words (config: groups and num_blocks multiples of 4), a burst each
                                word, words = first // 4, groups // 4
                                T.copy(ub[name][0:groups], x_grad_sf[word : word + words, 4 * t : 4 * t + 4])
                            else:  # the tile's scales, one burst each, a row stride apart
                                T.copy(ub[name][0:groups], x_grad_sf[first : first + groups, t])
                if with_weight:
                    T.copy(ub['weight_grad'][0:1], weight_grad[t : t + 1])

    return moe_swiglu_backward_kernel
