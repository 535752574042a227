"""CUDA kernel of engram_sinkhorn_finalize (math and config: engram_sinkhorn_finalize_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_finalize_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`; the family's shared code comes from _sinkhorn_common.py.
from ._sinkhorn_common import CUDA_VEC, cuda_row_macros


def cuda_engram_sinkhorn_finalize_kernel(cfg):
    """`cfg` is an EngramSinkhornFinalizeConfig (backend "cuda")."""
    import tilelang.language as T

    D, W, G, nc, R = cfg.head_dim, cfg.rows_per_task, cfg.group_threads, cfg.chunks, cfg.rows_in_flight
    nt = cfg.threads
    nw = max(1, G // 32)  # warps per row group
    ve = CUDA_VEC
    L = nc * ve  # floats of one row per thread
    guard = (D // ve) % G != 0  # some threads' last chunk lies past the row
    f32 = T.float32
    rows = T.dynamic('rows')
    load_col_scale, row_sumsq = cuda_row_macros(cfg)

    @T.prim_func
    def engram_sinkhorn_finalize_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        out: T.Tensor((rows, D), f32),
        eps: T.float32,
        alpha: T.float32,
    ):
        # Block b holds rows b * W * R + r * W + w (r < R) for its W row groups: R rows per group, all
        # loaded before any is reduced (R independent reductions), the column scale loaded once for them.
        with T.Kernel(T.ceildiv(rows, W * R), threads=nt) as b:
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            tid = T.get_thread_binding()
            lane = tid % G
            w = tid // G
            c_l = T.alloc_local((L,), f32)
            m_l = T.alloc_local((R * L,), f32)
            rs_l = T.alloc_local((R,), f32)
            ss = T.alloc_local((R,), f32)
            tot = T.alloc_local((R,), f32)
            s = T.alloc_var(f32)
            red = T.alloc_shared((1, R, W, nw), f32)
            load_col_scale(c_l, col_scale, lane)
            # Rows past the last are zeros and are not stored; the barrier of a group wider than a warp
            # is outside every row condition, so all threads of the block reach it.
            for r in T.unroll(R):
                if (b * R + r) * W + w < rows:
                    for k in T.unroll(nc):
                        col = (lane + k * G) * ve
                        if not guard or col < D:
                            for j in T.vectorized(ve):
                                m_l[r * L + k * ve + j] = matrix[(b * R + r) * W + w, col + j]
                        else:
                            for j in T.unroll(ve):
                                m_l[r * L + k * ve + j] = 0.0
                    rs_l[r] = row_scale[(b * R + r) * W + w]
                else:
                    for e in T.unroll(L):
                        m_l[r * L + e] = 0.0
                    rs_l[r] = 0.0
            # The step's accumulation of each row's norm (its macro: same order, same bits).
            row_sumsq(tot, ss, rs_l, m_l, c_l, red, 0, w, lane)
            for r in T.unroll(R):
                if (b * R + r) * W + w < rows:
                    s = alpha * (rs_l[r] / (T.sqrt(tot[r]) + eps))
                    for k in T.unroll(nc):
                        col = (lane + k * G) * ve
                        if not guard or col < D:
                            for j in T.vectorized(ve):
                                out[(b * R + r) * W + w, col + j] = (s * m_l[r * L + k * ve + j]) * c_l[k * ve + j]

    return engram_sinkhorn_finalize_kernel
