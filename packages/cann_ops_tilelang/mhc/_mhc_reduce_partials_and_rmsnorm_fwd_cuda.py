"""CUDA kernel of mhc_reduce_partials_and_rmsnorm_fwd (math, order, config:
mhc_reduce_partials_and_rmsnorm_fwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

import types


def rms_routines(T, splits: int):
    """The per-(token, group, mix) pieces of the reduction, by name (one home: this kernel and the fused pre path's
    kernel, which must round alike): split_sums(q, m, out_mul_splitted, sqrsum_splitted, t, g, j), the macro that
    sums the partials in split order from +0.0 into q[0] (squares) and m[0] (the mix), unrolled so that the loads
    are in flight together; normalised(m, q, inv_group_size, eps), the expression m / sqrt(q / size + eps)."""

    @T.macro
    def split_sums(q, m, out_mul_splitted, sqrsum_splitted, t, g, j):
        q[0] = 0.0
        m[0] = 0.0
        for s in T.unroll(splits):  # split order
            q[0] += sqrsum_splitted[s, t, g]
            m[0] += out_mul_splitted[s, t, g, j]

    def normalised(m, q, inv_group_size, eps):
        return m * T.rsqrt(q * inv_group_size + eps)

    return types.SimpleNamespace(split_sums=split_sums, normalised=normalised)


def cuda_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg):
    """One thread block per `tokens` tokens, one thread per (token, mix): adjacent threads read adjacent mixes
    of a partial row (coalesced), the n_splits loads of a sum unrolled so that they are in flight together.
    Every thread of a token sums that token's squares itself (the same loads, from cache), so no thread waits
    on another; the mix-0 thread stores sqrsum."""
    import tilelang.language as T

    m3, groups, splits, tb, nt = cfg.mhc_mult3, cfg.groups, cfg.n_splits, cfg.tokens, cfg.threads
    per_block = tb * m3
    f32 = T.float32
    num_tokens = T.dynamic('num_tokens')
    rms = rms_routines(T, splits)

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_fwd_kernel(
        out_mul_splitted: T.Tensor((splits, num_tokens, groups, m3), f32),
        sqrsum_splitted: T.Tensor((splits, num_tokens, groups), f32),
        out_mul: T.Tensor((num_tokens, groups, m3), f32),
        sqrsum: T.Tensor((num_tokens, groups), f32),
        out: T.Tensor((num_tokens, m3), f32),
        inv_group_size: T.float32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tb), threads=nt) as bx:
            tid = T.get_thread_binding()
            m = T.alloc_local((1,), f32)
            q = T.alloc_local((1,), f32)
            o = T.alloc_local((1,), f32)
            for it in T.serial(T.ceildiv(per_block, nt)):
                e = it * nt + tid
                t = bx * tb + e // m3
                j = e % m3
                if e < per_block and t < num_tokens:
                    o[0] = 0.0
                    for g in T.serial(groups):  # group order
                        rms.split_sums(q, m, out_mul_splitted, sqrsum_splitted, t, g, j)
                        out_mul[t, g, j] = m[0]
                        if j == 0:
                            sqrsum[t, g] = q[0]
                        o[0] += rms.normalised(m[0], q[0], inv_group_size, eps)
                    out[t, j] = o[0]

    return mhc_reduce_partials_and_rmsnorm_fwd_kernel
