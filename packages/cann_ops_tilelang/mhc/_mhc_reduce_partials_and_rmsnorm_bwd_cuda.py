"""CUDA kernel of mhc_reduce_partials_and_rmsnorm_bwd (math and config:
mhc_reduce_partials_and_rmsnorm_bwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.


def cuda_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg):
    """One thread block per `tokens` tokens, one thread per (token, group, mix): adjacent threads touch adjacent
    elements (coalesced). The mix-0 thread of a row also sums out_grad * out_mul over the row in mix order
    (loads the row's other threads bring into cache) and stores sqrsum_grad."""
    import tilelang.language as T

    m3, groups, tb, nt = cfg.mhc_mult3, cfg.groups, cfg.tokens, cfg.threads
    row = groups * m3
    per_block = tb * row
    f32 = T.float32
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_bwd_kernel(
        out_grad: T.Tensor((num_tokens, m3), f32),
        out_mul: T.Tensor((num_tokens, groups, m3), f32),
        sqrsum: T.Tensor((num_tokens, groups), f32),
        out_mul_grad: T.Tensor((num_tokens, groups, m3), f32),
        sqrsum_grad: T.Tensor((num_tokens, groups), f32),
        inv_group_size: T.float32,
        eps: T.float32,
        eps_times_group_size: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tb), threads=nt) as bx:
            tid = T.get_thread_binding()
            rstd = T.alloc_local((1,), f32)
            dot = T.alloc_local((1,), f32)
            for it in T.serial(T.ceildiv(per_block, nt)):
                e = it * nt + tid
                t = bx * tb + e // row
                g = e % row // m3
                j = e % m3
                if e < per_block and t < num_tokens:
                    rstd[0] = T.rsqrt(sqrsum[t, g] * inv_group_size + eps)
                    out_mul_grad[t, g, j] = out_grad[t, j] * rstd[0]
                    if j == 0:
                        dot[0] = 0.0
                        for i in T.serial(m3):  # mix order
                            dot[0] += out_grad[t, i] * out_mul[t, g, i]
                        sqrsum_grad[t, g] = dot[0] * rstd[0] / (sqrsum[t, g] + eps_times_group_size) * -0.5

    return mhc_reduce_partials_and_rmsnorm_bwd_kernel
