"""Ascend 950 kernel of mhc_reduce_partials_and_rmsnorm_bwd (math and config:
mhc_reduce_partials_and_rmsnorm_bwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
from ._norm_fn_common import LANES, padded_row


def ascend_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg):
    """A task is `tokens` tokens: their out_grad rows, their tokens x groups rows of out_mul and sqrsum land in
    UB (rows padded to 32 bytes; the tensors come flattened to (token, group) rows). 1/rms of every row in
    whole registers first; then per row the scaled gradient row (stored under the row's lane mask) and the
    masked lane sum of out_grad * out_mul (vcadd), which gives sqrsum_grad in lane 0. The tail task
    computes on stale rows past the last token and stores only real ones."""
    import tilelang.ascend.language as T

    m3, groups, tb, cores, stages = cfg.mhc_mult3, cfg.groups, cfg.tokens, cfg.num_cores, cfg.num_stages
    w = padded_row(m3)  # UB row
    rb = tb * groups  # (token, group) rows of one task
    rbp = -(-rb // LANES) * LANES  # per-row scalars, in whole registers
    spill = -(-LANES // w)  # rows past a tile that a register load from its last row reaches
    nreg = -(-w // LANES)  # registers of one row
    f32, i32 = T.float32, T.int32
    num_tokens = T.dynamic('num_tokens')
    num_rows = T.dynamic('num_rows')  # num_tokens * groups

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_bwd_kernel(
        out_grad: T.Tensor((num_tokens, m3), f32),
        out_mul: T.Tensor((num_rows, m3), f32),
        sqrsum: T.Tensor((num_rows,), f32),
        out_mul_grad: T.Tensor((num_rows, m3), f32),
        sqrsum_grad: T.Tensor((num_rows,), f32),
        inv_group_size: T.float32,
        eps: T.float32,
        eps_times_group_size: T.float32,
    ):
        with T.Kernel(cores) as cid:
            og_ub = T.alloc_shared((tb + spill, w), f32)
            om_ub = T.alloc_shared((rb + spill, w), f32)
            sq_ub = T.alloc_shared((rbp,), f32)
            rstd_ub = T.alloc_shared((rbp,), f32)
            omg_ub = T.alloc_shared((rb, w), f32)
            sqg_ub = T.alloc_shared((rbp,), f32)
            T.annotate_buffer_versions(
                {og_ub: stages, om_ub: stages, sq_ub: stages, rstd_ub: 1, omg_ub: stages, sqg_ub: stages}
            )
            for task in T.Persistent([T.ceildiv(num_tokens, tb)], cores, cid, group_size=1, num_stages=stages):
                t0 = task * tb
                vt = T.min(tb, num_tokens - t0)
                r0 = t0 * groups
                vr = vt * groups
                T.copy(out_grad[t0 : t0 + vt, :], og_ub[0:vt, 0:m3])
                T.copy(out_mul[r0 : r0 + vr, :], om_ub[0:vr, 0:m3])
                T.copy(sqrsum[r0 : r0 + vr], sq_ub[0:vr])
                with T.SimdVF():
                    one = T.simd.vdup(1.0, f32)
                    lane = T.simd.vci(T.int32(0), i32)
                    for i in T.serial(rbp // LANES):
                        q = T.simd.vld(sq_ub[i * LANES])
                        rstd = T.simd.vdiv(one, T.simd.vsqrt(T.simd.vadds(T.simd.vmuls(q, inv_group_size), eps)))
                        T.simd.vsts(rstd_ub[i * LANES], rstd)
                    # The 1/rms stores land before the broadcast loads below read them.
                    T.simd.mem_bar('VST_VLD')
                    for t in T.serial(tb):
                        for g in T.serial(groups):
                            k = t * groups + g
                            rs = T.simd.vld(rstd_ub[k], dist='BRC_B32')
                            dot = T.simd.alloc_var(f32)
                            dot = T.simd.vdup(0.0, f32)
                            for c in T.unroll(nreg, explicit=True):  # mix order
                                keep = T.simd.vcmps(lane, T.min(LANES, m3 - c * LANES), op='lt')
                                og = T.simd.vld(og_ub[t, c * LANES])
                                T.simd.vsts(omg_ub[k, c * LANES], T.simd.vmul(og, rs), keep)
                                prod = T.simd.vmul(og, T.simd.vld(om_ub[k, c * LANES]))
                                dot = T.simd.vadd(dot, T.simd.vcadd(prod, keep))
                            q = T.simd.vld(sq_ub[k], dist='BRC_B32')
                            den = T.simd.vadds(q, eps_times_group_size)
                            sg = T.simd.vmuls(T.simd.vdiv(T.simd.vmul(dot, rs), den), -0.5)
                            T.simd.vsts(sqg_ub[k], sg, dist='ONEPT_B32')
                T.copy(omg_ub[0:vr, 0:m3], out_mul_grad[r0 : r0 + vr, :])
                T.copy(sqg_ub[0:vr], sqrsum_grad[r0 : r0 + vr])

    return mhc_reduce_partials_and_rmsnorm_bwd_kernel
