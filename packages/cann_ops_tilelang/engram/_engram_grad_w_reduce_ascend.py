"""Ascend 950 kernel of engram_grad_w_reduce (math, summation order and config: engram_grad_w_reduce_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_grad_w_reduce_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, and the lane width, which the config checks too, lives here.
LANES = 64  # fp32 lanes of one 256-byte Ascend vector register


def ascend_engram_grad_w_reduce_kernel(cfg):
    """`cfg` is an EngramGradWReduceConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    hc, hidden, W, R, stages = cfg.hc, cfg.hidden, cfg.block_cols, cfg.block_rows, cfg.num_stages
    n_d = hidden // W
    num_tiles = cfg.num_tiles
    lanes = LANES
    C = W // lanes
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_grad_w_reduce_kernel(
        grad_w_partial: T.Tensor((num_partials, hc, hidden), T.float32),
        weight_hidden: T.Tensor((hc, hidden), T.bfloat16),
        weight_embed: T.Tensor((hc, hidden), T.bfloat16),
        grad_weight_hidden: T.Tensor((hc, hidden), T.float32),
        grad_weight_embed: T.Tensor((hc, hidden), T.float32),
    ):
        with T.Kernel(num_tiles) as t:
            p_ub = T.alloc_shared((R, W), T.float32)
            acc_ub = T.alloc_shared((W,), T.float32)
            wh_ub = T.alloc_shared((W,), T.bfloat16)
            we_ub = T.alloc_shared((W,), T.bfloat16)
            gh_ub = T.alloc_shared((W,), T.float32)
            ge_ub = T.alloc_shared((W,), T.float32)
            h = t // n_d
            d0 = (t % n_d) * W
            T.copy(weight_hidden[h, d0 : d0 + W], wh_ub)
            T.copy(weight_embed[h, d0 : d0 + W], we_ub)
            T.copy(grad_weight_hidden[h, d0 : d0 + W], gh_ub)
            T.copy(grad_weight_embed[h, d0 : d0 + W], ge_ub)
            with T.SimdVF():
                for c in T.serial(C):
                    T.simd.vsts(acc_ub[c * lanes], T.simd.vdup(0.0, T.float32))
            for k in T.Pipelined(T.ceildiv(num_partials, R), num_stages=stages):
                rows = T.min(R, num_partials - k * R)
                T.copy(grad_w_partial[k * R : k * R + rows, h, d0 : d0 + W], p_ub[0:rows, :])
                with T.SimdVF():
                    for c in T.serial(C):
                        s = T.simd.alloc_var(T.float32)
                        s = T.simd.vld(acc_ub[c * lanes])
                        for r in T.serial(rows):
                            s = T.simd.vadd(s, T.simd.vld(p_ub[r, c * lanes]))
                        T.simd.vsts(acc_ub[c * lanes], s)
            with T.SimdVF():
                for c in T.serial(C):
                    s = T.simd.vld(acc_ub[c * lanes])
                    whv = T.simd.vcvt(T.simd.vld(wh_ub[c * lanes], dist='UNPK_B16'), T.float32)
                    wev = T.simd.vcvt(T.simd.vld(we_ub[c * lanes], dist='UNPK_B16'), T.float32)
                    gh = T.simd.vadd(T.simd.vld(gh_ub[c * lanes]), T.simd.vmul(s, wev))
                    ge = T.simd.vadd(T.simd.vld(ge_ub[c * lanes]), T.simd.vmul(s, whv))
                    T.simd.vsts(gh_ub[c * lanes], gh)
                    T.simd.vsts(ge_ub[c * lanes], ge)
            T.copy(gh_ub, grad_weight_hidden[h, d0 : d0 + W])
            T.copy(ge_ub, grad_weight_embed[h, d0 : d0 + W])

    return engram_grad_w_reduce_kernel
