"""Ascend 950 kernel of engram_sinkhorn_finalize (math and config: engram_sinkhorn_finalize_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_finalize_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`; the family's shared code comes from _sinkhorn_common.py.
from ._sinkhorn_common import LANES, ascend_accumulators


def ascend_engram_sinkhorn_finalize_kernel(cfg):
    """`cfg` is an EngramSinkhornFinalizeConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    D, R, stages = cfg.head_dim, cfg.rows_per_task, cfg.num_stages
    grid = cfg.num_cores
    lanes = LANES
    nchunk = D // lanes
    A = ascend_accumulators(D)
    rp = max(8, R)  # per-row scales padded to 32 bytes
    f32 = T.float32
    rows = T.dynamic('rows')

    @T.prim_func
    def engram_sinkhorn_finalize_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        out: T.Tensor((rows, D), f32),
        eps: T.float32,
        alpha: T.float32,
    ):
        with T.Kernel(grid) as cid:
            c_ub = T.alloc_shared((D,), f32)
            m_ub = T.alloc_shared((R, D), f32)  # M, then the output in place
            rs_ub = T.alloc_shared((rp,), f32)
            T.annotate_buffer_versions({c_ub: 1, m_ub: stages, rs_ub: stages})
            T.copy(col_scale, c_ub)
            for task in T.Persistent([T.ceildiv(rows, R)], grid, cid, group_size=1, num_stages=stages):
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
                        s = T.simd.vmuls(T.simd.vdiv(sc, T.simd.vadds(nrm, eps)), alpha)
                        sb = T.simd.vdupv(s)
                        # Each chunk is loaded before it is overwritten and never loaded again: no barrier.
                        for c in T.serial(nchunk):
                            mv = T.simd.vld(m_ub[i, c * lanes])
                            y = T.simd.vmul(T.simd.vmul(sb, mv), T.simd.vld(c_ub[c * lanes]))
                            T.simd.vsts(m_ub[i, c * lanes], y)
                T.copy(m_ub[0:valid, :], out[r0 : r0 + valid, :])

    return engram_sinkhorn_finalize_kernel
