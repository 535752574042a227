"""CUDA kernel of engram_sinkhorn_step (math and config: engram_sinkhorn_step_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_step_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`; the family's shared code comes from _sinkhorn_common.py, and the register model,
# which the config chooser uses too, lives here.
from cann_ops_tilelang.kernel_target import CUDA_REGS_PER_SM

from ._sinkhorn_common import CUDA_VEC, cuda_row_macros

CUDA_BLOCKS_PER_SM = 2


def _cuda_regs_estimate(chunks: int, rows_in_flight: int = 1, stages: int = 2) -> int:
    """Registers per thread: the column scale and the column sums ((chunks * 4) floats each), the
    rows in flight (rows_in_flight row buffers, twice that when the next ones are prefetched, with their
    row scales and sums), plus addressing; rounded up to the allocation unit of 8 (ptxas -v on sm_90a, the
    chosen layouts: 128 registers at head_dim 256, estimate 128; 230 at head_dim 512, estimate 224; both
    leave two blocks per SM resident)."""
    buffers = rows_in_flight * stages
    return -(-(4 * chunks * (2 + buffers) + 2 * buffers + 24) // 8) * 8


def cuda_engram_sinkhorn_step_kernel(cfg):
    """`cfg` is an EngramSinkhornStepConfig (backend "cuda")."""
    import tilelang.language as T

    D, P, W, G, nc = cfg.head_dim, cfg.num_partials, cfg.rows_per_task, cfg.group_threads, cfg.chunks
    R, S = cfg.rows_in_flight, cfg.num_stages
    nt = cfg.threads
    nw = max(1, G // 32)  # warps per row group
    ve = CUDA_VEC
    L = nc * ve  # floats of one row per thread
    guard = (D // ve) % G != 0  # some threads' last chunk lies past the row
    f32 = T.float32
    rows = T.dynamic('rows')
    load_col_scale, row_sumsq = cuda_row_macros(cfg)

    @T.macro
    def load_rows(dst, dst_rs, matrix, row_scale, it, lo, w, lane, cnt):
        # The R rows j = it * R + r of group w (rows lo + w + j * W); rows past the group's last are zeros.
        for r in T.unroll(R):
            j = it * R + r
            if j < cnt:
                for k in T.unroll(nc):
                    col = (lane + k * G) * ve
                    if not guard or col < D:
                        for v in T.vectorized(ve):
                            dst[r * L + k * ve + v] = matrix[lo + w + j * W, col + v]
                    else:
                        for v in T.unroll(ve):
                            dst[r * L + k * ve + v] = 0.0
                dst_rs[r] = row_scale[lo + w + j * W]
            else:
                for e in T.unroll(L):
                    dst[r * L + e] = 0.0
                dst_rs[r] = 0.0

    @T.prim_func
    def engram_sinkhorn_step_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        row_norm: T.Tensor((rows,), f32),
        col_sumsq_partial: T.Tensor((P, D), f32),
        eps: T.float32,
    ):
        with T.Kernel(P, threads=nt) as b:
            # `red` alternates by iteration parity, so the one barrier per iteration is all it needs.
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            if CUDA_BLOCKS_PER_SM * nt * _cuda_regs_estimate(nc, R, S) <= CUDA_REGS_PER_SM:
                # Both blocks of an SM resident (the partials assume one wave), without spills: the
                # chooser sizes W so that the estimate fits; a variant that does not is left to ptxas.
                T.annotate_min_blocks_per_sm(CUDA_BLOCKS_PER_SM)
            tid = T.get_thread_binding()
            lane = tid % G
            w = tid // G
            c_l = T.alloc_local((L,), f32)
            m_l = T.alloc_local((R * L,), f32)
            rs_l = T.alloc_local((R,), f32)
            m_n = T.alloc_local((R * L if S > 1 else 1,), f32)
            rs_n = T.alloc_local((R if S > 1 else 1,), f32)
            a_l = T.alloc_local((L,), f32)
            ss = T.alloc_local((R,), f32)
            tot = T.alloc_local((R,), f32)
            nrm = T.alloc_var(f32)
            rsn = T.alloc_var(f32)
            acc = T.alloc_var(f32)
            red = T.alloc_shared((2, R, W, nw), f32)
            comb = T.alloc_shared((W if W > 1 else 1, D), f32)
            load_col_scale(c_l, col_scale, lane)
            for e in T.unroll(L):
                a_l[e] = 0.0
            # Block b owns rows [lo, lo + n): rows // P or rows // P + 1 of them; group w takes every W-th
            # (cnt rows), R of them per iteration, in row order: the order of each column sum is the same
            # for every R and S (and as with one row at a time).
            q = rows // P
            rem = rows % P
            lo = b * q + T.min(b, rem)
            n = q + T.if_then_else(b < rem, 1, 0)
            cnt = T.max(T.ceildiv(n - w, W), 0)
            # One trip count for the whole block (group 0 has the most rows): the barrier of a row group
            # wider than a warp is reached by every thread; groups past their last row skip the updates.
            iters = T.ceildiv(T.ceildiv(n, W), R)
            if S > 1:
                # Software pipelining: the next R rows of this group are loaded (m_n, rs_n) before the
                # current R are reduced, so up to 2 R rows per group are in flight.
                load_rows(m_n, rs_n, matrix, row_scale, 0, lo, w, lane, cnt)
            for it in T.serial(iters):
                if S > 1:
                    for e in T.unroll(R * L):
                        m_l[e] = m_n[e]
                    for r in T.unroll(R):
                        rs_l[r] = rs_n[r]
                    if it + 1 < iters:
                        load_rows(m_n, rs_n, matrix, row_scale, it + 1, lo, w, lane, cnt)
                else:
                    load_rows(m_l, rs_l, matrix, row_scale, it, lo, w, lane, cnt)
                # R independent sums and warp reductions (each row's in the one fixed order).
                row_sumsq(tot, ss, rs_l, m_l, c_l, red, it % 2, w, lane)
                for r in T.unroll(R):
                    if it * R + r < cnt:
                        row = lo + w + (it * R + r) * W
                        nrm = T.sqrt(tot[r])
                        rsn = rs_l[r] / (nrm + eps)
                        if lane == 0:
                            row_norm[row] = nrm
                            row_scale[row] = rsn
                        for e in T.unroll(L):
                            y = (rsn * m_l[r * L + e]) * c_l[e]
                            a_l[e] += y * y
            if W == 1:
                for k in T.unroll(nc):
                    col = (lane + k * G) * ve
                    if not guard or col < D:
                        for j in T.vectorized(ve):
                            col_sumsq_partial[b, col + j] = a_l[k * ve + j]
            else:
                # W groups of one block: add their sums in the fixed order w = 0, 1, ..., W - 1.
                for k in T.unroll(nc):
                    col = (lane + k * G) * ve
                    if not guard or col < D:
                        for j in T.vectorized(ve):
                            comb[w, col + j] = a_l[k * ve + j]
                T.sync_threads()
                for k in T.serial(T.ceildiv(D, nt)):
                    col = k * nt + tid
                    if col < D:
                        acc = comb[0, col]
                        for w2 in T.unroll(1, W):
                            acc += comb[w2, col]
                        col_sumsq_partial[b, col] = acc

    return engram_sinkhorn_step_kernel
