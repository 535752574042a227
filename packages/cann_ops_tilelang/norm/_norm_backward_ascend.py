"""Ascend 950 kernels of norm_backward (math, summation order, config and the prim_func signatures:
norm_backward_kernel.py).

Stage 'rows': before the loop each core keeps the weight in fp32 and zeroes its partial weight gradient (both
resident in UB). A persistent loop of whole rows over the vector cores: x, out_grad (and residual_out_grad) and
rstd land in UB; one SIMD VF makes two passes in 64-lane fp32 registers: the first sums xhat * gw (one register,
folded by vcadd) and adds xhat * g to the partial, the second writes x_grad over the out_grad row. A row too
wide for UB goes in column pieces, each read once per pass (cfg.pieces). After the loop the core's partial goes
to its row of `partials`.
Stage 'reduce': a task per tile of columns sums the partials' rows of the tile in core order (R rows per DMA),
then adds weight_grad where it accumulates.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by norm_backward_kernel.py, never the other way round (no import circle).
from cann_ops_tilelang.quant._tiling import divisors

from ._norm_common import LANES
from ._norm_forward_ascend import ascend_weight_macros, staging_tile

REDUCE_COLS = 512  # columns of one reduce task (at most)
REDUCE_ROWS = 16  # partial rows per DMA of the reduce


def ascend_norm_backward_kernel(cfg, prim_func):
    """`cfg` is a NormBackwardConfig (backend "ascend"); `prim_func` the signature builder backward_prim_func."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, dtype, grid, stages = cfg.hidden, cfg.dtype, cfg.num_cores, cfg.num_stages
    chunks = hidden // LANES
    with_weight, with_rog = cfg.with_weight, cfg.with_residual_out_grad
    load_f32, store_row, stage_weight = ascend_weight_macros(T, hidden=hidden, dtype=dtype)

    if cfg.stage == 'reduce':
        cols = divisors(hidden, LANES, REDUCE_COLS)[0]
        rows = min(REDUCE_ROWS, cfg.num_partials)
        num_partials = cfg.num_partials
        wg_load, wg_store = ascend_weight_macros(T, hidden=hidden, dtype=cfg.weight_grad_dtype)[:2]

        @T.macro
        def reduce_body(partials, weight_grad):
            with T.Kernel(hidden // cols) as tile:
                p_ub = T.alloc_shared((rows, cols), f32)
                acc_ub = T.alloc_shared((cols,), f32)
                wg_ub = T.alloc_shared((cols,), cfg.weight_grad_dtype)
                c0 = tile * cols
                if cfg.accumulate:
                    T.copy(weight_grad[c0 : c0 + cols], wg_ub)
                with T.SimdVF():
                    for c in T.serial(cols // LANES):
                        S.vsts(acc_ub[c * LANES], S.vdup(0.0, f32))
                for k in T.serial(-(-num_partials // rows)):
                    count = T.min(rows, num_partials - k * rows)
                    T.copy(partials[k * rows : k * rows + count, c0 : c0 + cols], p_ub[0:count, :])
                    with T.SimdVF():
                        for c in T.serial(cols // LANES):
                            s = S.alloc_var(f32)
                            s = S.vld(acc_ub[c * LANES])
                            for r in T.serial(count):
                                s = S.vadd(s, S.vld(p_ub[r, c * LANES]))
                            S.vsts(acc_ub[c * LANES], s)
                with T.SimdVF():
                    for c in T.serial(cols // LANES):
                        total = S.vld(acc_ub[c * LANES])
                        if cfg.accumulate:
                            total = S.vadd(wg_load(wg_ub, c), total)
                        wg_store(wg_ub, c, total)
                T.copy(wg_ub, weight_grad[c0 : c0 + cols])

        return prim_func(T, cfg, reduce_body)

    tile = staging_tile(hidden)

    @T.macro
    def row_vf(x_ub, g_ub, rog_ub, st_ub, w_ub, acc_ub, out_scale):
        with T.SimdVF():
            rstd = S.vld(st_ub[0], dist='BRC_B32')
            dot = S.alloc_var(f32)
            dot = S.vdup(0.0, f32)
            for c in T.serial(chunks):
                xhat = S.vmul(load_f32(x_ub, c), rstd)
                g = S.vmuls(load_f32(g_ub, c), out_scale)
                if with_weight:
                    S.vmula(dot, xhat, S.vmul(g, S.vld(w_ub[c * LANES])))
                    partial = S.alloc_var(f32)
                    partial = S.vld(acc_ub[c * LANES])
                    S.vmula(partial, xhat, g)
                    S.vsts(acc_ub[c * LANES], partial)
                else:
                    S.vmula(dot, xhat, g)
            mean = S.vdupv(S.vdiv(S.vcadd(dot), S.vdup(float(hidden), f32)))
            for c in T.serial(chunks):
                xhat = S.vmul(load_f32(x_ub, c), rstd)
                gw = S.vmuls(load_f32(g_ub, c), out_scale)
                if with_weight:
                    gw = S.vmul(gw, S.vld(w_ub[c * LANES]))
                grad = S.vmul(S.vsub(gw, S.vmul(xhat, mean)), rstd)
                if with_rog:
                    grad = S.vadd(grad, load_f32(rog_ub, c))
                store_row(g_ub, c, grad)

    # A row whose buffers do not fit UB whole goes in pieces (cfg.pieces): the first pass over the pieces sums
    # xhat * gw into one register, kept in dot_ub between pieces, and adds to the partial; the second reads each
    # piece again and writes its x_grad. The register sums the same chunks in the same order as row_vf: the bits
    # of the whole-row kernel.
    pieces = cfg.pieces
    width = hidden // pieces
    piece_chunks = width // LANES

    @T.macro
    def first_pass_vf(x_ub, g_ub, st_ub, w_ub, acc_ub, dot_ub, p, out_scale):
        with T.SimdVF():
            rstd = S.vld(st_ub[0], dist='BRC_B32')
            dot = S.alloc_var(f32)
            dot = S.vld(dot_ub[0])
            for c in T.serial(piece_chunks):
                xhat = S.vmul(load_f32(x_ub, c), rstd)
                g = S.vmuls(load_f32(g_ub, c), out_scale)
                if with_weight:
                    column = (p * piece_chunks + c) * LANES
                    S.vmula(dot, xhat, S.vmul(g, S.vld(w_ub[column])))
                    partial = S.alloc_var(f32)
                    partial = S.vld(acc_ub[column])
                    S.vmula(partial, xhat, g)
                    S.vsts(acc_ub[column], partial)
                else:
                    S.vmula(dot, xhat, g)
            S.vsts(dot_ub[0], dot)

    @T.macro
    def second_pass_vf(x_ub, g_ub, rog_ub, st_ub, w_ub, dot_ub, p, out_scale):
        with T.SimdVF():
            rstd = S.vld(st_ub[0], dist='BRC_B32')
            mean = S.vdupv(S.vdiv(S.vcadd(S.vld(dot_ub[0])), S.vdup(float(hidden), f32)))
            for c in T.serial(piece_chunks):
                xhat = S.vmul(load_f32(x_ub, c), rstd)
                gw = S.vmuls(load_f32(g_ub, c), out_scale)
                if with_weight:
                    gw = S.vmul(gw, S.vld(w_ub[(p * piece_chunks + c) * LANES]))
                grad = S.vmul(S.vsub(gw, S.vmul(xhat, mean)), rstd)
                if with_rog:
                    grad = S.vadd(grad, load_f32(rog_ub, c))
                store_row(g_ub, c, grad)

    @T.macro
    def rows_body(x, weight, out_grad, rstd, residual_out_grad, x_grad, partials, out_scale, num_tokens):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((width,), dtype)
            g_ub = T.alloc_shared((width,), dtype)  # out_grad, then x_grad
            st_ub = T.alloc_shared((8,), f32)  # rstd in element 0 (one 32-byte block)
            versions = {x_ub: stages, g_ub: stages, st_ub: stages}
            rog_ub = w_ub = acc_ub = stage_ub = dot_ub = None
            if with_rog:
                rog_ub = T.alloc_shared((width,), dtype)
                versions[rog_ub] = stages
            if with_weight:
                w_ub = T.alloc_shared((hidden,), f32)
                acc_ub = T.alloc_shared((hidden,), f32)
                stage_ub = T.alloc_shared((tile,), dtype)
                versions.update({w_ub: 1, acc_ub: 1, stage_ub: 1})
            if pieces > 1:
                dot_ub = T.alloc_shared((LANES,), f32)  # the first pass's register between pieces
                versions[dot_ub] = 1
            T.annotate_buffer_versions(versions)
            if with_weight:
                stage_weight(weight, stage_ub, w_ub, 1.0)
                with T.SimdVF():
                    for c in T.serial(chunks):
                        S.vsts(acc_ub[c * LANES], S.vdup(0.0, f32))
            for t in T.Persistent([num_tokens], grid, cid, group_size=1, num_stages=stages):
                if pieces == 1:
                    T.copy(x[t, 0:hidden], x_ub)
                    T.copy(out_grad[t, 0:hidden], g_ub)
                    T.copy(rstd[t : t + 1], st_ub[0:1])
                    if with_rog:
                        T.copy(residual_out_grad[t, 0:hidden], rog_ub)
                    row_vf(x_ub, g_ub, rog_ub, st_ub, w_ub, acc_ub, out_scale)
                    T.copy(g_ub, x_grad[t, 0:hidden])
                else:
                    T.copy(rstd[t : t + 1], st_ub[0:1])
                    with T.SimdVF():
                        S.vsts(dot_ub[0], S.vdup(0.0, f32))
                    for p in T.serial(pieces):
                        T.copy(x[t, p * width : p * width + width], x_ub)
                        T.copy(out_grad[t, p * width : p * width + width], g_ub)
                        first_pass_vf(x_ub, g_ub, st_ub, w_ub, acc_ub, dot_ub, p, out_scale)
                    for p in T.serial(pieces):
                        T.copy(x[t, p * width : p * width + width], x_ub)
                        T.copy(out_grad[t, p * width : p * width + width], g_ub)
                        if with_rog:
                            T.copy(residual_out_grad[t, p * width : p * width + width], rog_ub)
                        second_pass_vf(x_ub, g_ub, rog_ub, st_ub, w_ub, dot_ub, p, out_scale)
                        T.copy(g_ub, x_grad[t, p * width : p * width + width])
            if with_weight:
                T.copy(acc_ub, partials[cid, 0:hidden])

    return prim_func(T, cfg, rows_body)
