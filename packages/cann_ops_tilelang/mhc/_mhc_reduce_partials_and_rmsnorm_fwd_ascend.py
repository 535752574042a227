"""Ascend 950 kernel of mhc_reduce_partials_and_rmsnorm_fwd (math, order, config:
mhc_reduce_partials_and_rmsnorm_fwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import types

from ._norm_fn_common import LANES, padded_row


def rms_routines(T):
    """The per-value pieces of the reduction on 64-lane registers, by name (one home: this kernel and the fused
    pre path's kernel, which must round alike): add_partial(total, part), a split's partial added to the running
    sum (split order, from +0.0); inverse_rms(q, one, inv_group_size, eps), 1 / sqrt(q * inv_group_size + eps)
    of the summed squares q (one: a register of 1.0); add_normalised(o, mixes, rs), o += mixes * rs, the group
    sum's fused multiply-add (from +0.0)."""

    def add_partial(total, part):
        return T.simd.vadd(total, part)

    def inverse_rms(q, one, inv_group_size, eps):
        return T.simd.vdiv(one, T.simd.vsqrt(T.simd.vadds(T.simd.vmuls(q, inv_group_size), eps)))

    def add_normalised(o, mixes, rs):
        return T.simd.vmula(o, mixes, rs)

    return types.SimpleNamespace(add_partial=add_partial, inverse_rms=inverse_rms, add_normalised=add_normalised)


def ascend_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg):
    """A task is `tokens` tokens, that is tokens x groups rows of mhc_mult3 mixes. The tensors come flattened
    to rows (out_mul_splitted (S, rows, M3), sqrsum_splitted (S, rows), out_mul (rows, M3), sqrsum (rows,)).
    UB rows are padded to 32 bytes so that every row starts where a vector load may; whole tiles are summed
    as flat 64-lane registers (the padding lanes carry whatever UB holds and are never stored to GM). Then
    1/rms per row, and per token the group sum of the rows scaled by their 1/rms, stored under a lane mask
    of the row's width. The tail task computes on stale rows past the last token and stores only real ones.
    """
    import tilelang.ascend.language as T

    m3, groups, splits, tb = cfg.mhc_mult3, cfg.groups, cfg.n_splits, cfg.tokens
    cores, stages = cfg.num_cores, cfg.num_stages
    w = padded_row(m3)  # UB row
    rb = tb * groups  # rows of one task
    flat = rb * w // LANES  # registers of a whole tile (rb and w are multiples of 8)
    rbp = -(-rb // LANES) * LANES  # per-row scalars, in whole registers
    spill = -(-LANES // w)  # rows past the tile that a register load from its last row reaches
    nreg = -(-w // LANES)  # registers of one row
    f32, i32 = T.float32, T.int32
    num_tokens = T.dynamic('num_tokens')
    num_rows = T.dynamic('num_rows')  # num_tokens * groups
    rms = rms_routines(T)

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_fwd_kernel(
        out_mul_splitted: T.Tensor((splits, num_rows, m3), f32),
        sqrsum_splitted: T.Tensor((splits, num_rows), f32),
        out_mul: T.Tensor((num_rows, m3), f32),
        sqrsum: T.Tensor((num_rows,), f32),
        out: T.Tensor((num_tokens, m3), f32),
        inv_group_size: T.float32,
        eps: T.float32,
    ):
        with T.Kernel(cores) as cid:
            part_ub = T.alloc_shared((rb, w), f32)
            sqp_ub = T.alloc_shared((rbp,), f32)
            acc_ub = T.alloc_shared((rb + spill, w), f32)
            sq_ub = T.alloc_shared((rbp,), f32)
            rstd_ub = T.alloc_shared((rbp,), f32)
            out_ub = T.alloc_shared((tb, w), f32)
            T.annotate_buffer_versions({part_ub: stages, sqp_ub: stages, acc_ub: 1, sq_ub: 1, rstd_ub: 1, out_ub: 1})
            for task in T.Persistent([T.ceildiv(num_tokens, tb)], cores, cid, group_size=1, num_stages=stages):
                t0 = task * tb
                vt = T.min(tb, num_tokens - t0)
                r0 = t0 * groups
                vr = vt * groups
                with T.SimdVF():
                    zero = T.simd.vdup(0.0, f32)
                    for i in T.serial(flat):
                        T.simd.vsts(acc_ub[i * LANES // w, i * LANES % w], zero)
                    for i in T.serial(rbp // LANES):
                        T.simd.vsts(sq_ub[i * LANES], zero)
                for s in T.serial(splits):  # split order: the summation order of the contract
                    T.copy(out_mul_splitted[s, r0 : r0 + vr, :], part_ub[0:vr, 0:m3])
                    T.copy(sqrsum_splitted[s, r0 : r0 + vr], sqp_ub[0:vr])
                    with T.SimdVF():
                        for i in T.serial(flat):
                            a = T.simd.alloc_var(f32)
                            a = T.simd.vld(acc_ub[i * LANES // w, i * LANES % w])
                            a = rms.add_partial(a, T.simd.vld(part_ub[i * LANES // w, i * LANES % w]))
                            T.simd.vsts(acc_ub[i * LANES // w, i * LANES % w], a)
                        for i in T.serial(rbp // LANES):
                            q = T.simd.alloc_var(f32)
                            q = T.simd.vld(sq_ub[i * LANES])
                            q = rms.add_partial(q, T.simd.vld(sqp_ub[i * LANES]))
                            T.simd.vsts(sq_ub[i * LANES], q)
                with T.SimdVF():
                    one = T.simd.vdup(1.0, f32)
                    lane = T.simd.vci(T.int32(0), i32)
                    for i in T.serial(rbp // LANES):
                        q = T.simd.vld(sq_ub[i * LANES])
                        rstd = rms.inverse_rms(q, one, inv_group_size, eps)
                        T.simd.vsts(rstd_ub[i * LANES], rstd)
                    # The 1/rms stores land before the broadcast loads below read them.
                    T.simd.mem_bar('VST_VLD')
                    for c in T.unroll(nreg, explicit=True):
                        keep = T.simd.vcmps(lane, T.min(LANES, w - c * LANES), op='lt')
                        for t in T.serial(tb):
                            o = T.simd.alloc_var(f32)
                            o = T.simd.vdup(0.0, f32)
                            for g in T.serial(groups):  # group order
                                rs = T.simd.vld(rstd_ub[t * groups + g], dist='BRC_B32')
                                rms.add_normalised(o, T.simd.vld(acc_ub[t * groups + g, c * LANES]), rs)
                            T.simd.vsts(out_ub[t, c * LANES], o, keep)
                T.copy(acc_ub[0:vr, 0:m3], out_mul[r0 : r0 + vr, :])
                T.copy(sq_ub[0:vr], sqrsum[r0 : r0 + vr])
                T.copy(out_ub[0:vt, 0:m3], out[t0 : t0 + vt, :])

    return mhc_reduce_partials_and_rmsnorm_fwd_kernel
