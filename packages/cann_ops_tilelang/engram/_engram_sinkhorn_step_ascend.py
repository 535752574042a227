"""Ascend 950 kernel of engram_sinkhorn_step (math and config: engram_sinkhorn_step_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_step_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`; the family's shared code comes from _sinkhorn_common.py.
from ._sinkhorn_common import LANES, ascend_accumulators


def ascend_engram_sinkhorn_step_kernel(cfg):
    """`cfg` is an EngramSinkhornStepConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    D, P, R, stages = cfg.head_dim, cfg.num_partials, cfg.rows_per_task, cfg.num_stages
    lanes = LANES
    nchunk = D // lanes
    A = ascend_accumulators(D)
    rp = max(8, R)  # per-row stats rows padded to 32 bytes
    f32 = T.float32
    rows = T.dynamic('rows')

    @T.prim_func
    def engram_sinkhorn_step_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        row_norm: T.Tensor((rows,), f32),
        col_sumsq_partial: T.Tensor((P, D), f32),
        eps: T.float32,
    ):
        with T.Kernel(P) as cid:
            c_ub = T.alloc_shared((D,), f32)
            acc_ub = T.alloc_shared((D,), f32)  # this core's column sums of squares
            m_ub = T.alloc_shared((R, D), f32)
            rs_ub = T.alloc_shared((rp,), f32)
            nrm_ub = T.alloc_shared((rp,), f32)
            rsn_ub = T.alloc_shared((rp,), f32)
            T.annotate_buffer_versions(
                {c_ub: 1, acc_ub: 1, m_ub: stages, rs_ub: stages, nrm_ub: stages, rsn_ub: stages}
            )
            T.copy(col_scale, c_ub)
            with T.SimdVF():
                for c in T.serial(nchunk):
                    T.simd.vsts(acc_ub[c * lanes], T.simd.vdup(0.0, f32))
            for task in T.Persistent([T.ceildiv(rows, R)], P, cid, group_size=1, num_stages=stages):
                r0 = task * R
                valid = T.min(R, rows - r0)
                T.copy(matrix[r0 : r0 + valid, :], m_ub[0:valid, :])
                T.copy(row_scale[r0 : r0 + valid], rs_ub[0:valid])
                with T.SimdVF():
                    for i in T.serial(valid):
                        sc = T.simd.vld(rs_ub[i], dist='BRC_B32')
                        acc = T.simd.alloc_local((A,), f32)
                        for a in T.unroll(A, explicit=True):
                            acc[a] = T.simd.vdup(0.0, f32)
                        for g in T.serial(nchunk // A):
                            for a in T.unroll(A, explicit=True):
                                off = (g * A + a) * lanes
                                x = T.simd.vmul(T.simd.vmul(sc, T.simd.vld(m_ub[i, off])), T.simd.vld(c_ub[off]))
                                T.simd.vmula(acc[a], x, x)
                        if A == 4:
                            acc[0] = T.simd.vadd(T.simd.vadd(acc[0], acc[2]), T.simd.vadd(acc[1], acc[3]))
                        elif A == 2:
                            acc[0] = T.simd.vadd(acc[0], acc[1])
                        nrm = T.simd.vsqrt(T.simd.vcadd(acc[0]))
                        rsn = T.simd.vdiv(sc, T.simd.vadds(nrm, eps))
                        T.simd.vsts(nrm_ub[i], nrm, dist='ONEPT_B32')
                        T.simd.vsts(rsn_ub[i], rsn, dist='ONEPT_B32')
                        rb = T.simd.vdupv(rsn)
                        # The previous row's acc_ub stores must land before this row loads them.
                        T.simd.mem_bar('VST_VLD')
                        for c in T.serial(nchunk):
                            mv = T.simd.vld(m_ub[i, c * lanes])
                            y = T.simd.vmul(T.simd.vmul(rb, mv), T.simd.vld(c_ub[c * lanes]))
                            s = T.simd.alloc_var(f32)
                            s = T.simd.vld(acc_ub[c * lanes])
                            T.simd.vmula(s, y, y)
                            T.simd.vsts(acc_ub[c * lanes], s)
                T.copy(nrm_ub[0:valid], row_norm[r0 : r0 + valid])
                T.copy(rsn_ub[0:valid], row_scale[r0 : r0 + valid])
            # Every vector store of acc_ub done before the store to GM (cores without tasks write zeros).
            T.ascend_pipe_barrier('PIPE_ALL')
            T.copy(acc_ub, col_sumsq_partial[cid, :])

    return engram_sinkhorn_step_kernel
