"""CUDA kernels of norm_backward (math, summation order, config and the prim_func signatures:
norm_backward_kernel.py).

Stage 'rows': `num_partials` persistent thread blocks; block b takes rows b, b + num_partials, ... in order.
Thread `tid` owns the row's 16-byte chunks tid, tid + threads, ... (norm_forward's layout): the weight and the
block's partial weight gradient stay in its registers for the whole kernel; per row every load is issued before
any use, sum(xhat * gw) is reduced by warp shuffles and one shared-memory step (its slots alternate by row
parity, so one barrier per row suffices), and each thread writes its own x_grad. After the last row the block
writes its partial to its row of `partials`. With rows_in_flight 2 the rows go in pairs held in two sets of
registers, and each row's loads are issued before the previous row is reduced and written, so its memory latency
overlaps that work; the arithmetic and its order are the same, so the results are the same bits.
Stage 'reduce': one thread per column sums the partials' column in block order, then adds weight_grad; its loads
of `reduce_loads` partial rows are issued at once.
Schedule fields off in every chosen configuration (docs/norm.md, "norm_backward at H 4096"): `row_groups` 2 makes
a block of two groups of `threads` threads, each a worker of the loop above on its own rows (worker 2 b + g of
2 num_partials; a named barrier per group, since their row counts may differ), the block's partial group 0's plus
group 1's through shared memory; the reduce's `threads` and `reduce_loads` set its blocks and its loads in flight;
`fused_reduce` ends the rows kernel with a grid barrier and the reduce's sums (same order), tiles of 32 columns
over the blocks, so that no second kernel runs.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by norm_backward_kernel.py, never the other way round (no import circle).
from ._norm_common import CUDA_CHUNK_BYTES, DTYPE_BYTES, cuda_assume_strides, row_strides

REDUCE_THREADS = 128  # columns per block of the reduce
_REDUCE_UNROLL = 8  # partial rows whose loads are in flight at once
_FUSED_TILE = 32  # fused_reduce: columns a block sums at a time (one warp's coalesced 128 bytes a partial row)


def cuda_norm_backward_kernel(cfg, prim_func):
    """`cfg` is a NormBackwardConfig (backend "cuda"); `prim_func` the signature builder backward_prim_func."""
    import tilelang.language as T

    f32 = T.float32
    hidden, dtype = cfg.hidden, cfg.dtype
    num_partials = cfg.num_partials
    with_weight, with_rog = cfg.with_weight, cfg.with_residual_out_grad

    # reduce_loads 0: the rule the chooser's kernels take; either way the adds stay in block order.
    unroll = cfg.reduce_loads or max(u for u in (1, 2, 4, _REDUCE_UNROLL) if num_partials % u == 0)

    @T.macro
    def sum_column(partials, weight_grad, acc, col):
        """weight_grad[col] (+)= the partials' column col summed in block order, `unroll` loads in flight: the one
        arithmetic of the stage 'reduce' and of fused_reduce, so both give the same bits."""
        acc[0] = 0.0
        for k in T.serial(num_partials // unroll):
            for u in T.unroll(unroll):
                acc[0] += partials[k * unroll + u, col]
        if cfg.accumulate:
            weight_grad[col] = T.cast(T.cast(weight_grad[col], f32) + acc[0], cfg.weight_grad_dtype)
        else:
            weight_grad[col] = T.cast(acc[0], cfg.weight_grad_dtype)

    if cfg.stage == 'reduce':
        cols = cfg.threads  # divides hidden (choose_norm_backward_config)

        @T.macro
        def reduce_body(partials, weight_grad):
            with T.Kernel(hidden // cols, threads=cols) as tile:
                tid = T.get_thread_binding()
                acc = T.alloc_local((1,), f32)
                col = tile * cols + tid
                sum_column(partials, weight_grad, acc, col)

        return prim_func(T, cfg, reduce_body)

    nt, nc = cfg.threads, cfg.chunks
    ve = CUDA_CHUNK_BYTES // DTYPE_BYTES[dtype]
    strides = row_strides(T, cfg, cfg.row_tensors)  # {} for contiguous rows
    guard = (hidden // ve) % nt != 0
    nw = nt // 32
    ng = cfg.row_groups
    inv_hidden = 1.0 / hidden

    @T.macro
    def load_weight(tid, weight, w_l, acc_l):
        # The weight (1 without one) in fp32 and a zero partial weight gradient, in registers for the whole kernel.
        for c in T.unroll(nc):
            col = (tid + c * nt) * ve
            for j in T.unroll(ve):
                acc_l[c * ve + j] = 0.0
                w_l[c * ve + j] = 1.0
            if with_weight and (not guard or col < hidden):
                for j in T.unroll(ve):
                    w_l[c * ve + j] = T.cast(weight[col + j], f32)

    @T.macro
    def load_row(tid, x, out_grad, rstd, residual_out_grad, x_l, g_l, r_l, rs, t):
        for c in T.unroll(nc):
            col = (tid + c * nt) * ve
            if not guard or col < hidden:
                for j in T.vectorized(ve):
                    x_l[c * ve + j] = x[t, col + j]
                for j in T.vectorized(ve):
                    g_l[c * ve + j] = out_grad[t, col + j]
                if with_rog:
                    for j in T.vectorized(ve):
                        r_l[c * ve + j] = residual_out_grad[t, col + j]
            else:
                for j in T.unroll(ve):
                    x_l[c * ve + j] = T.cast(0, dtype)
                    g_l[c * ve + j] = T.cast(0, dtype)
        rs[0] = rstd[t]

    @T.macro
    def block_sum(tid, group, dot, red, slot):
        # dot[0] summed over the row's threads in warp order: shuffles, then the warps' sums in shared slots.
        dot[0] = T.warp_reduce_sum(dot[0])
        if ng == 1:
            if tid % 32 == 0:
                red[slot, tid // 32] = dot[0]
            T.sync_threads()
            dot[0] = red[slot, 0]
            for q in T.unroll(1, nw):
                dot[0] += red[slot, q]
        else:
            # Each group its own slots and its own named barrier (its row count may differ from the other's).
            if tid % 32 == 0:
                red[group, slot, tid // 32] = dot[0]
            if group == 0:
                T.sync_threads(1, nt)
            else:
                T.sync_threads(2, nt)
            dot[0] = red[group, slot, 0]
            for q in T.unroll(1, nw):
                dot[0] += red[group, slot, q]

    @T.macro
    def finish_row(tid, group, x_grad, out_scale, w_l, acc_l, dot, red, x_l, g_l, r_l, rs, t, slot):
        # sum(xhat * gw) over the row's threads (shared slots `slot`), the partial weight gradient, x_grad of row t.
        dot[0] = 0.0
        for c in T.unroll(nc):
            for j in T.unroll(ve):
                xhat = T.cast(x_l[c * ve + j], f32) * rs[0]
                g = T.cast(g_l[c * ve + j], f32) * out_scale
                dot[0] += xhat * (g * w_l[c * ve + j])
                acc_l[c * ve + j] += xhat * g
        block_sum(tid, group, dot, red, slot)
        dot[0] = dot[0] * T.float32(inv_hidden)
        for c in T.unroll(nc):
            col = (tid + c * nt) * ve
            if not guard or col < hidden:
                for j in T.unroll(ve):
                    xhat = T.cast(x_l[c * ve + j], f32) * rs[0]
                    gw = T.cast(g_l[c * ve + j], f32) * out_scale * w_l[c * ve + j]
                    grad = (gw - xhat * dot[0]) * rs[0]
                    if with_rog:
                        grad = grad + T.cast(r_l[c * ve + j], f32)
                    r_l[c * ve + j] = T.cast(grad, dtype)
                for j in T.vectorized(ve):
                    x_grad[t, col + j] = r_l[c * ve + j]

    @T.macro
    def row_loop(tid, group, worker, workers, x, out_grad, rstd, residual_out_grad, x_grad, out_scale, w_l, acc_l,
                 dot, red, x_l, g_l, r_l, rs, num_tokens):  # fmt: skip
        # Rows worker, worker + workers, ... in order (a worker: the block, or one group of its rows).
        if cfg.rows_in_flight == 1:
            for i in T.serial(T.ceildiv(num_tokens - worker, workers)):
                t = worker + i * workers
                load_row(tid, x, out_grad, rstd, residual_out_grad, x_l, g_l, r_l, rs, t)
                finish_row(tid, group, x_grad, out_scale, w_l, acc_l, dot, red, x_l, g_l, r_l, rs, t, i % 2)
        else:
            # Rows in pairs, A (even i) and B (odd i), in two sets of registers: each row's loads are in
            # flight while the row before it is reduced and written. Same row order, same shared slots.
            x_b = T.alloc_local((nc * ve,), dtype)
            g_b = T.alloc_local((nc * ve,), dtype)
            r_b = T.alloc_local((nc * ve,), dtype)
            rs_b = T.alloc_local((1,), f32)
            if worker < num_tokens:
                load_row(tid, x, out_grad, rstd, residual_out_grad, x_l, g_l, r_l, rs, worker)
            for k in T.serial(T.ceildiv(T.ceildiv(num_tokens - worker, workers), 2)):
                t = worker + 2 * k * workers
                if t + workers < num_tokens:
                    load_row(tid, x, out_grad, rstd, residual_out_grad, x_b, g_b, r_b, rs_b, t + workers)
                finish_row(tid, group, x_grad, out_scale, w_l, acc_l, dot, red, x_l, g_l, r_l, rs, t, 0)
                if t + workers < num_tokens:  # uniform in the row's threads: the barrier inside is safe
                    if t + 2 * workers < num_tokens:
                        load_row(tid, x, out_grad, rstd, residual_out_grad, x_l, g_l, r_l, rs, t + 2 * workers)
                    finish_row(tid, group, x_grad, out_scale, w_l, acc_l, dot, red, x_b, g_b, r_b, rs_b, t + workers, 1)

    @T.macro
    def fused_reduce(partials, weight_grad, b):
        # After the grid barrier (every partial written): tiles of 32 columns over the blocks, each summed by the
        # block's first warp, one column a thread, in block order: the stage 'reduce''s arithmetic and order.
        T.sync_grid()
        lane = T.get_thread_binding()
        acc = T.alloc_local((1,), f32)
        for i in T.serial(T.ceildiv(hidden // _FUSED_TILE - b, num_partials)):
            col = (b + i * num_partials) * _FUSED_TILE + lane
            if lane < _FUSED_TILE:
                sum_column(partials, weight_grad, acc, col)

    @T.macro
    def rows_body(x, weight, out_grad, rstd, residual_out_grad, x_grad, partials, out_scale, num_tokens,
                  weight_grad=None):  # fmt: skip
        with T.Kernel(num_partials, threads=nt * ng) as b:
            if cfg.strided_rows:  # each row stride a whole number of 16-byte chunks, so the chunks stay vectors
                cuda_assume_strides(T, strides, ve)
            x_l = T.alloc_local((nc * ve,), dtype)
            g_l = T.alloc_local((nc * ve,), dtype)
            r_l = T.alloc_local((nc * ve,), dtype)  # residual_out_grad, then x_grad
            w_l = T.alloc_local((nc * ve,), f32)
            acc_l = T.alloc_local((nc * ve,), f32)  # the worker's partial weight gradient
            dot = T.alloc_local((1,), f32)
            rs = T.alloc_local((1,), f32)
            if ng == 1:
                tid = T.get_thread_binding()
                red = T.alloc_shared((2, nw), f32)
                load_weight(tid, weight, w_l, acc_l)
                row_loop(tid, 0, b, num_partials, x, out_grad, rstd, residual_out_grad, x_grad, out_scale, w_l,
                         acc_l, dot, red, x_l, g_l, r_l, rs, num_tokens)  # fmt: skip
                if with_weight:
                    for c in T.unroll(nc):
                        col = (tid + c * nt) * ve
                        if not guard or col < hidden:
                            for j in T.vectorized(ve):
                                partials[b, col + j] = acc_l[c * ve + j]
                    if cfg.fused_reduce:
                        fused_reduce(partials, weight_grad, b)
            else:
                # row_groups 2: group g of `nt` threads is worker 2 b + g of 2 num_partials (its rows in order);
                # the block's partial is group 0's plus group 1's (through shared memory): a fixed order.
                group = T.get_thread_binding() // nt
                tid = T.get_thread_binding() % nt
                red = T.alloc_shared((ng, 2, nw), f32)
                load_weight(tid, weight, w_l, acc_l)
                row_loop(tid, group, b * ng + group, num_partials * ng, x, out_grad, rstd, residual_out_grad,
                         x_grad, out_scale, w_l, acc_l, dot, red, x_l, g_l, r_l, rs, num_tokens)  # fmt: skip
                if with_weight:
                    merge = T.alloc_shared((hidden,), f32)
                    if group == 1:
                        for c in T.unroll(nc):
                            col = (tid + c * nt) * ve
                            if not guard or col < hidden:
                                for j in T.vectorized(ve):
                                    merge[col + j] = acc_l[c * ve + j]
                    T.sync_threads()  # both groups are past their rows
                    if group == 0:
                        for c in T.unroll(nc):
                            col = (tid + c * nt) * ve
                            if not guard or col < hidden:
                                for j in T.unroll(ve):
                                    acc_l[c * ve + j] += merge[col + j]
                                for j in T.vectorized(ve):
                                    partials[b, col + j] = acc_l[c * ve + j]
                    if cfg.fused_reduce:
                        fused_reduce(partials, weight_grad, b)

    return prim_func(T, cfg, rows_body, strides)
