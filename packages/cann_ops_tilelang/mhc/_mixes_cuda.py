"""CUDA kernels of the mix operators (math, kinds and config: _mixes_kernel.py).

A tile of `token_block` tokens is one contiguous run of token_block * width fp32 logits: thread t of a block
takes logits t, t + threads, ... of it, so consecutive threads read consecutive addresses (coalesced), and
writes each result to its segment's output. Forward: one block per tile. Backward: one block per partial
row, its tiles in order; the block puts dL/dz and dL/dz * x of a tile in shared memory, then thread j adds
column j over the tile's tokens in order (registers), and at the end thread k adds segment k's column sums
in column order: the same bits on every run.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

import types

from ._mixes_entries import mixes_entry


def mix_math(T, mhc_mult: int, num_scales: int):
    """The per-logit expressions of the mix forward, by name (one home: the mix kernels and the fused pre path's
    kernel, which must round alike): segment(j) (the scale index of column j), logit(x, mhc_scale, mhc_base, j)
    (z = x * scale + base), sigmoid(z), pre(z, eps) (sigmoid + eps, also the head mix) and post(z, post_mult)."""

    def sigmoid(z):
        return T.float32(1.0) / (T.float32(1.0) + T.exp(-z))

    def segment(j):
        """0 pre, 1 post, 2 comb (the head mix has one segment)."""
        return T.min(j // mhc_mult, num_scales - 1)

    def logit(x, mhc_scale, mhc_base, j):
        return x * mhc_scale[segment(j)] + mhc_base[j]

    def pre(z, eps):
        return sigmoid(z) + eps

    def post(z, post_mult):
        return sigmoid(z) * post_mult

    return types.SimpleNamespace(sigmoid=sigmoid, segment=segment, logit=logit, pre=pre, post=post)


def cuda_mhc_mixes_kernel(cfg):
    """`cfg` is a MhcMixesConfig (backend "cuda")."""
    import tilelang.language as T

    f32 = T.float32
    M, W, S, tb, nt = cfg.mhc_mult, cfg.width, cfg.num_scales, cfg.token_block, cfg.threads
    P = cfg.num_partials
    tile = tb * W  # logits of a tile
    steps = -(-tile // nt)  # logits per thread and tile
    num_tokens = T.dynamic('num_tokens')
    math = mix_math(T, M, S)
    sigmoid, segment = math.sigmoid, math.segment

    @T.macro
    def forward(x, mhc_scale, mhc_base, pre, post, comb, post_mult, eps):
        with T.Kernel(T.ceildiv(num_tokens, tb), threads=nt) as bx:
            tid = T.get_thread_binding()
            for r in T.unroll(steps):
                k = r * nt + tid
                t = bx * tb + k // W
                j = k % W
                if k < tile and t < num_tokens:
                    z = math.logit(x[t, j], mhc_scale, mhc_base, j)
                    if j < M:
                        pre[t, j] = math.pre(z, eps)
                    elif cfg.split:
                        if j < 2 * M:
                            post[t, j - M] = math.post(z, post_mult)
                        else:
                            comb[t, j - 2 * M] = z

    @T.macro
    def backward(pre_g, post_g, comb_g, x, post, mhc_scale, mhc_base, x_grad, scale_partial, base_partial, post_mult):
        with T.Kernel(P, threads=nt) as pid:
            tid = T.get_thread_binding()
            dz_s = T.alloc_shared((tile,), f32)
            dzx_s = T.alloc_shared((tile,), f32)
            col_s = T.alloc_shared((W,), f32)
            sums = T.alloc_local((2,), f32)  # thread j < W: column j's sums of dL/dz and dL/dz * x
            dz = T.alloc_local((1,), f32)
            sums[0] = T.float32(0.0)
            sums[1] = T.float32(0.0)
            # Every block runs the same trip count (its last tiles may lie past the tokens: zeros), so the
            # barriers stay uniform.
            for n in T.serial(T.ceildiv(T.ceildiv(num_tokens, tb), P)):
                for r in T.unroll(steps):
                    k = r * nt + tid
                    t = (n * P + pid) * tb + k // W
                    j = k % W
                    if k < tile:
                        if t < num_tokens:
                            xv = x[t, j]
                            if j < M:
                                s = sigmoid(xv * mhc_scale[0] + mhc_base[j])
                                dz[0] = pre_g[t, j] * s * (T.float32(1.0) - s)
                            elif cfg.split:
                                if j < 2 * M:
                                    p = post[t, j - M]
                                    dz[0] = post_g[t, j - M] * p * (T.float32(1.0) - p / post_mult)
                                else:
                                    dz[0] = comb_g[t, j - 2 * M]
                            x_grad[t, j] = dz[0] * mhc_scale[segment(j)]
                            dz_s[k] = dz[0]
                            dzx_s[k] = dz[0] * xv
                        else:
                            dz_s[k] = T.float32(0.0)
                            dzx_s[k] = T.float32(0.0)
                T.sync_threads()
                if tid < W:
                    for i in T.serial(tb):  # the tile's tokens in order
                        sums[0] += dz_s[i * W + tid]
                        sums[1] += dzx_s[i * W + tid]
                T.sync_threads()
            if tid < W:
                base_partial[pid, tid] = sums[0]
                col_s[tid] = sums[1]
            T.sync_threads()
            if tid < S:
                sums[1] = T.float32(0.0)
                for j in T.serial(W):  # segment tid's columns in order
                    if segment(j) == tid:
                        sums[1] += col_s[j]
                scale_partial[pid, tid] = sums[1]

    if cfg.kind != 'split_reduce':
        return mixes_entry(T, cfg, num_tokens, forward, backward)

    # 'split_reduce': thread j < W adds column j of the base partials, thread W + k scale k's, rows in order.
    @T.prim_func
    def mhc_pre_split_mixes_bwd_reduce_kernel(
        mhc_scale_grad_partial: T.Tensor((P, 3), f32),
        mhc_base_grad_partial: T.Tensor((P, W), f32),
        mhc_scale_grad: T.Tensor((3,), f32),
        mhc_base_grad: T.Tensor((W,), f32),
    ):
        with T.Kernel(1, threads=nt) as _block:
            tid = T.get_thread_binding()
            acc = T.alloc_local((1,), f32)
            if tid < W:
                acc[0] = mhc_base_grad_partial[0, tid]
                for p in T.serial(1, P):
                    acc[0] += mhc_base_grad_partial[p, tid]
                mhc_base_grad[tid] = acc[0]
            elif tid < W + 3:
                acc[0] = mhc_scale_grad_partial[0, tid - W]
                for p in T.serial(1, P):
                    acc[0] += mhc_scale_grad_partial[p, tid - W]
                mhc_scale_grad[tid - W] = acc[0]

    return mhc_pre_split_mixes_bwd_reduce_kernel
