"""Ascend 950 kernel of mhc_multilayer_recompute (configuration and generator: mhc_multilayer_recompute_kernel.py).

A task is (token t, hidden tile h0); a core takes tasks round-robin. Per task the first residual's tile (M, tile)
lands in UB once; then, layer by layer, one SIMD VF per layer computes the layer input (the pre mix over the
residual's M rows) and, for a post layer, the next residual (the post mix of the layer output plus the comb mix
of the residual's rows), both packed to bf16 in UB; the next layer reads that residual from UB, not from GM. Each
layer's input and residual go back to GM. Every layer has buffers of its own, so no VF writes a buffer that a DMA
of the same task may still be reading. The instruction sequences per 64-lane vector are mhc_pre_apply_mix_fwd's
and mhc_post_fwd's, so the results equal those operators called layer by layer, bit for bit.

The signature has LAYERS_PER_LAUNCH slots per list; the slots past the configuration's layers are one-element
placeholders, never touched.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

from ._mhc_multilayer_common import LAYERS_PER_LAUNCH, argument_shapes
from ._mhc_post_common import ASCEND_LANES
from ._mhc_post_fwd_ascend import _padded


def ascend_mhc_multilayer_recompute_kernel(cfg):
    """`cfg` is a MhcMultilayerRecomputeConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    M, hidden, tile, num_cores = cfg.mhc, cfg.hidden, cfg.tile, cfg.num_cores
    L, L_post = cfg.layers, cfg.post_layers
    lanes = ASCEND_LANES
    n_tiles = hidden // tile
    chunks = tile // lanes
    mm = M * M
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')
    shape = argument_shapes(cfg, num_tokens)

    @T.macro
    def layer(k, r_ub, pre, li, lo, post, comb, res, w_ub, p_ub, c_ub, lo_ub, li_ub, next_ub, t, h0):
        # w_ub, p_ub, c_ub, lo_ub, li_ub: the launch's buffers, row k this layer's
        """Layer k of the task (t, h0): its input from r_ub, and for a post layer the next residual in next_ub."""
        with T.Task():
            T.copy(pre[t, 0:M], w_ub[k, 0:M])
            if k < L_post:
                T.copy(post[t, 0:M], p_ub[k, 0:M])
                T.copy(comb[t, 0:mm], c_ub[k, 0:mm])
                T.copy(lo[t, h0 : h0 + tile], lo_ub[k, :])
        with T.SimdVF():
            w = T.simd.alloc_local((M,), f32)
            for m in T.unroll(M, explicit=True):
                w[m] = T.simd.vld(w_ub[k, m], dist='BRC_B32')
            rows = T.simd.alloc_local((M,), f32)
            for c in T.serial(chunks):
                col = c * lanes
                for i in T.unroll(M, explicit=True):
                    rows[i] = T.simd.vcvt(T.simd.vld(r_ub[i, col], dist='UNPK_B16'), f32)
                acc = T.simd.alloc_var(f32)  # mhc_pre_apply_mix_fwd's order
                acc = T.simd.vmul(rows[0], w[0])
                for m in T.unroll(M - 1, explicit=True):
                    T.simd.vmula(acc, rows[m + 1], w[m + 1])
                T.simd.vsts(li_ub[k, col], T.simd.vcvt(acc, bf16), dist='PK_B32')
                if k < L_post:  # mhc_post_fwd's order
                    xv = T.simd.vcvt(T.simd.vld(lo_ub[k, col], dist='UNPK_B16'), f32)
                    for o in T.unroll(M, explicit=True):
                        out = T.simd.alloc_var(f32)
                        out = T.simd.vmul(xv, T.simd.vld(p_ub[k, o], dist='BRC_B32'))
                        for i in T.unroll(M, explicit=True):
                            T.simd.vmula(out, rows[i], T.simd.vld(c_ub[k, i * M + o], dist='BRC_B32'))
                        T.simd.vsts(next_ub[o, col], T.simd.vcvt(out, bf16), dist='PK_B32')
        with T.Task():
            T.copy(li_ub[k, :], li[t, h0 : h0 + tile])
            if k < L_post:
                T.copy(next_ub, res[t, :, h0 : h0 + tile])

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
        with T.Kernel(num_cores) as cid:
            # Residual buffers: the first one, then one a post layer; the rest one a layer.
            r0 = T.alloc_shared((M, tile), bf16)
            r1 = T.alloc_shared((M, tile), bf16)
            r2 = T.alloc_shared((M, tile), bf16)
            r3 = T.alloc_shared((M, tile), bf16)
            r4 = T.alloc_shared((M, tile), bf16)
            w_ub = T.alloc_shared((LAYERS_PER_LAUNCH, _padded(M)), f32)
            p_ub = T.alloc_shared((LAYERS_PER_LAUNCH, _padded(M)), f32)
            c_ub = T.alloc_shared((LAYERS_PER_LAUNCH, _padded(mm)), f32)
            lo_ub = T.alloc_shared((LAYERS_PER_LAUNCH, tile), bf16)
            li_ub = T.alloc_shared((LAYERS_PER_LAUNCH, tile), bf16)
            for n in T.serial(T.ceildiv(num_tokens * n_tiles - cid, num_cores)):
                task = n * num_cores + cid
                t = task // n_tiles
                h0 = (task % n_tiles) * tile
                with T.Task():
                    T.copy(initial_residual[t, :, h0 : h0 + tile], r0)
                layer(0, r0, pre0, li0, lo0, post0, comb0, res0, w_ub, p_ub, c_ub, lo_ub, li_ub, r1, t, h0)  # fmt: skip
                if L > 1:
                    layer(1, r1, pre1, li1, lo1, post1, comb1, res1, w_ub, p_ub, c_ub, lo_ub,
                          li_ub, r2, t, h0)  # fmt: skip
                if L > 2:
                    layer(2, r2, pre2, li2, lo2, post2, comb2, res2, w_ub, p_ub, c_ub, lo_ub,
                          li_ub, r3, t, h0)  # fmt: skip
                if L > 3:
                    layer(3, r3, pre3, li3, lo3, post3, comb3, res3, w_ub, p_ub, c_ub, lo_ub,
                          li_ub, r4, t, h0)  # fmt: skip

    return mhc_multilayer_recompute_kernel
