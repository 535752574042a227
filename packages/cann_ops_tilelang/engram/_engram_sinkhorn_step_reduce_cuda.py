"""CUDA kernel of engram_sinkhorn_step_reduce.

Math, summation order and config: engram_sinkhorn_step_reduce_kernel.py.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_step_reduce_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, and the access width lives here.
CUDA_VEC = 4  # fp32 elements of one 16-byte access


def cuda_engram_sinkhorn_step_reduce_kernel(cfg):
    """`cfg` is an EngramSinkhornStepReduceConfig (backend "cuda")."""
    import tilelang.language as T

    D, W, S, U = cfg.head_dim, cfg.block_cols, cfg.num_segments, cfg.block_rows
    ve = CUDA_VEC
    tpc = W // ve  # threads per segment row of the block
    nt = tpc * S
    guard = D % W != 0  # the last block's columns run past head_dim
    f32 = T.float32
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_sinkhorn_step_reduce_kernel(
        col_sumsq_partial: T.Tensor((num_partials, D), f32),
        col_sumsq: T.Tensor((D,), f32),
    ):
        with T.Kernel(cfg.num_tiles, threads=nt) as b:
            tid = T.get_thread_binding()
            seg = tid // tpc
            col = b * W + (tid % tpc) * ve
            acc = T.alloc_local((ve,), f32)
            buf = T.alloc_local((U * ve,), f32)
            sums = T.alloc_shared((S, W), f32)
            seg_len = T.ceildiv(num_partials, S)
            p0 = seg * seg_len
            p1 = T.min(p0 + seg_len, num_partials)
            for j in T.unroll(ve):
                acc[j] = 0.0
            if not guard or col < D:
                # U independent loads, then U sequential adds: rows past the segment load as +0.0, which
                # leaves the sum unchanged (it starts at +0.0, so it is never -0.0).
                for i in T.serial(T.ceildiv(p1 - p0, U)):
                    for u in T.unroll(U):
                        p = p0 + i * U + u
                        if p < p1:
                            for j in T.vectorized(ve):
                                buf[u * ve + j] = col_sumsq_partial[p, col + j]
                        else:
                            for j in T.unroll(ve):
                                buf[u * ve + j] = 0.0
                    for u in T.unroll(U):
                        for j in T.unroll(ve):
                            acc[j] += buf[u * ve + j]
                for j in T.vectorized(ve):
                    sums[seg, (tid % tpc) * ve + j] = acc[j]
            T.sync_threads()
            if seg == 0 and (not guard or col < D):
                for s in T.unroll(1, S):  # segment order
                    for j in T.unroll(ve):
                        acc[j] += sums[s, (tid % tpc) * ve + j]
                for j in T.vectorized(ve):
                    col_sumsq[col + j] = acc[j]

    return engram_sinkhorn_step_reduce_kernel
