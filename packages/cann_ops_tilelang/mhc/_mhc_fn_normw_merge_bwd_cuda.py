"""CUDA kernel of mhc_fn_normw_merge_bwd (math, summation order and config: mhc_fn_normw_merge_bwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.


def cuda_mhc_fn_normw_merge_bwd_kernel(cfg, vec):
    """One thread block per column tile of block_cols: `row_groups` groups of block_cols / vec threads, each
    thread `vec` adjacent columns (16-byte accesses). Group k takes the k-th of `row_groups` consecutive row
    ranges; its threads load `batch` rows at a time before they compute and store them (loads in flight),
    update fn_grad and sum their rows of out_fn_grad * fn in registers in row order. The range sums then meet
    in shared memory and are added to normw_grad in range order: a fixed order, no atomics."""
    import tilelang.language as T

    rows, hidden, bc, groups, batch = cfg.rows, cfg.hidden, cfg.block_cols, cfg.row_groups, cfg.batch
    per_group = -(-rows // groups)  # rows of one range (the last may have fewer)
    lanes = bc // vec  # threads of one group
    f32 = T.float32

    @T.prim_func
    def mhc_fn_normw_merge_bwd_kernel(
        fn: T.Tensor((rows, hidden), f32),
        normw: T.Tensor((hidden,), f32),
        out_fn_grad: T.Tensor((rows, hidden), f32),
        fn_grad: T.Tensor((rows, hidden), f32),
        normw_grad: T.Tensor((hidden,), f32),
    ):
        with T.Kernel(hidden // bc, threads=cfg.threads) as bx:
            tid = T.get_thread_binding()
            group = tid // lanes
            lane_col = (tid % lanes) * vec
            col = bx * bc + lane_col
            w = T.alloc_local((vec,), f32)
            acc = T.alloc_local((vec,), f32)
            g = T.alloc_local((batch * vec,), f32)
            x = T.alloc_local((batch * vec,), f32)
            fg = T.alloc_local((batch * vec,), f32)
            sums = T.alloc_shared((groups, bc), f32)
            r_begin = group * per_group
            r_end = T.min(r_begin + per_group, rows)
            for j in T.vectorized(vec):
                w[j] = normw[col + j]
                acc[j] = 0.0
            for b in T.serial(T.ceildiv(per_group, batch)):
                for u in T.unroll(batch):
                    r = r_begin + b * batch + u
                    if r < r_end:
                        for j in T.vectorized(vec):
                            g[u * vec + j] = out_fn_grad[r, col + j]
                            x[u * vec + j] = fn[r, col + j]
                            fg[u * vec + j] = fn_grad[r, col + j]
                for u in T.unroll(batch):  # row order
                    r = r_begin + b * batch + u
                    if r < r_end:
                        for j in T.unroll(vec):
                            fg[u * vec + j] += g[u * vec + j] * w[j]
                            acc[j] += g[u * vec + j] * x[u * vec + j]
                        for j in T.vectorized(vec):
                            fn_grad[r, col + j] = fg[u * vec + j]
            for j in T.vectorized(vec):
                sums[group, lane_col + j] = acc[j]
            T.sync_threads()
            if group == 0:
                for j in T.vectorized(vec):
                    acc[j] = normw_grad[col + j]
                for k in T.unroll(groups):  # range order
                    for j in T.unroll(vec):
                        acc[j] += sums[k, lane_col + j]
                for j in T.vectorized(vec):
                    normw_grad[col + j] = acc[j]

    return mhc_fn_normw_merge_bwd_kernel
