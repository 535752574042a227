"""CUDA kernel of mhc_post_bwd (configuration and generator: mhc_post_bwd_kernel.py).

One thread block a token: each thread owns `chunks` 16-byte column chunks of the row (chunk c at column
(tid + c * threads) * 8, coalesced across the warp), reads x, the M residual and the M d_o chunks once, writes
its d_x and d_residual chunks, and keeps M * M + M fp32 partial sums of the mix gradients. Those are reduced in
one fixed order (a warp's butterfly, then the warps in index order through shared memory): no atomics, the same
bits run to run.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

from ._mhc_post_common import CUDA_VEC


def cuda_mhc_post_bwd_kernel(cfg):
    """`cfg` is a MhcPostBwdConfig (backend "cuda")."""
    import tilelang.language as T

    mhc, hidden, threads, nc = cfg.mhc, cfg.hidden, cfg.threads, cfg.chunks
    ve = CUDA_VEC
    warps = threads // 32
    mm = mhc * mhc
    sums = mm + mhc  # d_comb (i * M + o), then d_post (mm + o)
    guard = (hidden // ve) % threads != 0  # some threads' last chunk is past the row
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')

    @T.macro
    def _chunk(x_l, r_l, g_l, dx_l, dr_l, comb, post, acc, d_x, d_residual, t, col):
        """One chunk of every row at column `col`, loaded into x_l, r_l, g_l: its d_x and d_residual stored, its
        products added to the partial sums `acc`."""
        for j in T.unroll(ve):
            xf = T.cast(x_l[j], f32)
            dx = T.alloc_var(f32)
            dx = 0.0
            for o in T.unroll(mhc):
                gf = T.cast(g_l[o * ve + j], f32)
                dx += gf * post[o]
                acc[mm + o] += gf * xf
            dx_l[j] = T.cast(dx, bf16)
            for i in T.unroll(mhc):
                rf = T.cast(r_l[i * ve + j], f32)
                dr = T.alloc_var(f32)
                dr = 0.0
                for o in T.unroll(mhc):
                    gf = T.cast(g_l[o * ve + j], f32)
                    dr += comb[i * mhc + o] * gf
                    acc[i * mhc + o] += rf * gf
                dr_l[i * ve + j] = T.cast(dr, bf16)
        for j in T.vectorized(ve):
            d_x[t, col + j] = dx_l[j]
        for i in T.unroll(mhc):
            for j in T.vectorized(ve):
                d_residual[t, i, col + j] = dr_l[i * ve + j]

    @T.prim_func
    def mhc_post_bwd_kernel(
        x: T.Tensor((num_tokens, hidden), bf16),
        residual: T.Tensor((num_tokens, mhc, hidden), bf16),
        post_layer_mix: T.Tensor((num_tokens, mhc), f32),
        comb_res_mix: T.Tensor((num_tokens, mhc, mhc), f32),
        d_o: T.Tensor((num_tokens, mhc, hidden), bf16),
        d_x: T.Tensor((num_tokens, hidden), bf16),
        d_residual: T.Tensor((num_tokens, mhc, hidden), bf16),
        d_post_layer_mix: T.Tensor((num_tokens, mhc), f32),
        d_comb_res_mix: T.Tensor((num_tokens, mhc, mhc), f32),
    ):
        with T.Kernel(num_tokens, threads=threads) as t:
            tid = T.get_thread_binding()
            if cfg.min_blocks:
                T.annotate_min_blocks_per_sm(cfg.min_blocks)
            x_l = T.alloc_local((ve,), bf16)
            r_l = T.alloc_local((mhc * ve,), bf16)
            g_l = T.alloc_local((mhc * ve,), bf16)
            dx_l = T.alloc_local((ve,), bf16)
            dr_l = T.alloc_local((mhc * ve,), bf16)
            comb = T.alloc_local((mm,), f32)
            post = T.alloc_local((mhc,), f32)
            acc = T.alloc_local((sums,), f32)
            red = T.alloc_shared((sums, warps), f32)
            for k in T.unroll(mm):
                comb[k] = comb_res_mix[t, k // mhc, k % mhc]
            for o in T.unroll(mhc):
                post[o] = post_layer_mix[t, o]
            for k in T.unroll(sums):
                acc[k] = 0.0
            if cfg.pipelined:
                width = threads * ve  # the columns of one chunk of every thread
                xs = T.alloc_shared((width,), bf16)
                rs = T.alloc_shared((mhc, width), bf16)
                gs = T.alloc_shared((mhc, width), bf16)
                for c in T.Pipelined(nc, num_stages=cfg.pipelined):
                    T.copy(x[t, c * width], xs, disable_tma=True)
                    T.copy(residual[t, 0, c * width], rs, disable_tma=True)
                    T.copy(d_o[t, 0, c * width], gs, disable_tma=True)
                    for j in T.vectorized(ve):
                        x_l[j] = xs[tid * ve + j]
                    for i in T.unroll(mhc):
                        for j in T.vectorized(ve):
                            r_l[i * ve + j] = rs[i, tid * ve + j]
                    for o in T.unroll(mhc):
                        for j in T.vectorized(ve):
                            g_l[o * ve + j] = gs[o, tid * ve + j]
                    _chunk(x_l, r_l, g_l, dx_l, dr_l, comb, post, acc, d_x, d_residual, t, c * width + tid * ve)
            else:
                for c in T.unroll(nc):
                    col = (tid + c * threads) * ve
                    if not guard or col < hidden:
                        for j in T.vectorized(ve):
                            x_l[j] = x[t, col + j]
                        for i in T.unroll(mhc):
                            for j in T.vectorized(ve):
                                r_l[i * ve + j] = residual[t, i, col + j]
                        for o in T.unroll(mhc):
                            for j in T.vectorized(ve):
                                g_l[o * ve + j] = d_o[t, o, col + j]
                        _chunk(x_l, r_l, g_l, dx_l, dr_l, comb, post, acc, d_x, d_residual, t, col)
            for k in T.unroll(sums):
                total = T.warp_reduce_sum(acc[k])
                if tid % 32 == 0:
                    red[k, tid // 32] = total
            T.sync_threads()
            for r in T.unroll(-(-sums // threads)):
                k = tid + r * threads
                if k < sums:
                    s = T.alloc_var(f32)
                    s = red[k, 0]
                    for w in T.unroll(1, warps):
                        s += red[k, w]
                    if k < mm:
                        d_comb_res_mix[t, k // mhc, k % mhc] = s
                    else:
                        d_post_layer_mix[t, k - mm] = s

    return mhc_post_bwd_kernel
