"""CUDA kernel of mhc_multilayer_recompute (configuration and generator: mhc_multilayer_recompute_kernel.py).

A flat grid over (token, 8-column chunk), mhc_post_fwd's: a thread reads its chunk of the first residual's M rows
once (16-byte loads) and keeps the residual in registers from layer to layer; per layer it reads its chunk of the
layer output and the token's mixes (the same addresses across the warp's threads of one token: from L1), issued
cfg.prefetch layers ahead of the layer's arithmetic, and writes its chunk of the layer input and of the residual.
The expressions are mhc_pre_apply_mix_fwd's and mhc_post_fwd's (the layer input summed from +0 over the streams,
the residual from post * output), so the results equal those operators called layer by layer, bit for bit. No
shared memory, no barrier.

The signature has LAYERS_PER_LAUNCH slots per list, the Ascend kernel's; the slots past the configuration's layers
are one-element placeholders, never touched.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

from ._mhc_multilayer_common import LAYERS_PER_LAUNCH, argument_shapes
from ._mhc_post_common import CUDA_VEC


def cuda_mhc_multilayer_recompute_kernel(cfg):
    """`cfg` is a MhcMultilayerRecomputeConfig (backend "cuda")."""
    import tilelang.language as T

    M, hidden, threads = cfg.mhc, cfg.hidden, cfg.threads
    L, L_post = cfg.layers, cfg.post_layers
    ve = CUDA_VEC
    per_row = hidden // ve  # chunks of one token row
    mm = M * M
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')
    shape = argument_shapes(cfg, num_tokens)
    steps = list(range(L + cfg.prefetch))  # step k: the reads of layer k, the computation of layer k - prefetch

    @T.macro
    def load(k, pre, lo, post, comb, w, x_l, mix, t, col):
        """Layer k's reads besides the residual: its pre mixes, and for a post layer its output chunk and mixes
        (comb row-major [i, o], then post)."""
        for m in T.unroll(M):
            w[m] = pre[t, m]
        if k < L_post:
            for j in T.vectorized(ve):
                x_l[j] = lo[t, col + j]
            for q in T.unroll(mm):
                mix[q] = comb[t, q]
            for o in T.unroll(M):
                mix[mm + o] = post[t, o]

    @T.macro
    def layer(k, r_l, w, x_l, mix, li, res, next_l, t, col):
        """Layer k of the thread's chunk from its loaded reads: its input from r_l, and for a post layer the next
        residual in next_l."""
        li_l = T.alloc_local((ve,), bf16)
        for j in T.unroll(ve):  # mhc_pre_apply_mix_fwd: from +0, stream by stream
            acc = T.alloc_var(f32)
            acc = T.float32(0.0)
            for m in T.unroll(M):
                acc += w[m] * T.cast(r_l[m * ve + j], f32)
            li_l[j] = T.cast(acc, bf16)
        for j in T.vectorized(ve):
            li[t, col + j] = li_l[j]
        if k < L_post:
            for o in T.unroll(M):  # mhc_post_fwd: from post * output, then the streams in order
                for j in T.unroll(ve):
                    out = T.alloc_var(f32)
                    out = mix[mm + o] * T.cast(x_l[j], f32)
                    for i in T.unroll(M):
                        out += mix[i * M + o] * T.cast(r_l[i * ve + j], f32)
                    next_l[o * ve + j] = T.cast(out, bf16)
            for o in T.unroll(M):
                for j in T.vectorized(ve):
                    res[t, o, col + j] = next_l[o * ve + j]

    @T.prim_func
    def mhc_multilayer_recompute_kernel(
        initial_residual: T.Tensor((num_tokens, M, hidden), bf16),
        pre0: T.Tensor(shape['pre'][0], f32),
        pre1: T.Tensor(shape['pre'][1], f32),
        pre2: T.Tensor(shape['pre'][2], f32),
        pre3: T.Tensor(shape['pre'][3], f32),
        lo0: T.Tensor(shape['layer_output'][0], bf16),
        lo1: T.Tensor(shape['layer_output'][1], bf16),
        lo2: T.Tensor(shape['layer_output'][2], bf16),
        lo3: T.Tensor(shape['layer_output'][3], bf16),
        post0: T.Tensor(shape['post'][0], f32),
        post1: T.Tensor(shape['post'][1], f32),
        post2: T.Tensor(shape['post'][2], f32),
        post3: T.Tensor(shape['post'][3], f32),
        comb0: T.Tensor(shape['comb'][0], f32),
        comb1: T.Tensor(shape['comb'][1], f32),
        comb2: T.Tensor(shape['comb'][2], f32),
        comb3: T.Tensor(shape['comb'][3], f32),
        li0: T.Tensor(shape['layer_input'][0], bf16),
        li1: T.Tensor(shape['layer_input'][1], bf16),
        li2: T.Tensor(shape['layer_input'][2], bf16),
        li3: T.Tensor(shape['layer_input'][3], bf16),
        res0: T.Tensor(shape['residual'][0], bf16),
        res1: T.Tensor(shape['residual'][1], bf16),
        res2: T.Tensor(shape['residual'][2], bf16),
        res3: T.Tensor(shape['residual'][3], bf16),
    ):
        with T.Kernel(T.ceildiv(num_tokens * per_row, threads), threads=threads) as bx:
            tid = T.get_thread_binding()
            # The residual of each layer in registers: the first, then one a post layer; each layer's other reads
            # in registers of its own, loaded cfg.prefetch layers ahead of its computation.
            r = [T.alloc_local((M * ve,), bf16) for _ in range(LAYERS_PER_LAUNCH + 1)]
            w = [T.alloc_local((M,), f32) for _ in range(LAYERS_PER_LAUNCH)]
            x_l = [T.alloc_local((ve,), bf16) for _ in range(LAYERS_PER_LAUNCH)]
            mix = [T.alloc_local((mm + M,), f32) for _ in range(LAYERS_PER_LAUNCH)]
            args = [(pre0, lo0, post0, comb0, li0, res0), (pre1, lo1, post1, comb1, li1, res1),
                    (pre2, lo2, post2, comb2, li2, res2), (pre3, lo3, post3, comb3, li3, res3)]  # fmt: skip
            chunk = bx * threads + tid
            if chunk < num_tokens * per_row:
                t = chunk // per_row
                col = (chunk % per_row) * ve
                for i in T.unroll(M):
                    for j in T.vectorized(ve):
                        r[0][i * ve + j] = initial_residual[t, i, col + j]
                for k in steps:  # a Python list: unrolled as the kernel is built
                    # The tensors straight from `args`: a name bound to a parameter here would rename it (the
                    # host's argument checks go by name).
                    if k < L:
                        load(k, args[k][0], args[k][1], args[k][2], args[k][3], w[k], x_l[k], mix[k], t, col)
                    if k >= cfg.prefetch:
                        c = k - cfg.prefetch
                        layer(c, r[c], w[c], x_l[c], mix[c], args[c][4], args[c][5], r[c + 1], t, col)

    return mhc_multilayer_recompute_kernel
