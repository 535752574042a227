"""Ascend 950 kernel of mhc_post_bwd (configuration and generator: mhc_post_bwd_kernel.py).

A core takes tokens round-robin (t = cid, cid + P, ...) and walks each token's hidden tiles in order. Per tile,
one SIMD VF computes the d_x and d_residual tiles (bf16, back to GM) and adds the tile's products into 64-lane
fp32 accumulators in UB: M for d_post_layer_mix (d_o[o] * x) and M * M for d_comb_res_mix (residual[i] * d_o[o]).
The accumulators are read at the start of the VF and written at its end, each row once (no store-to-load in a
VF). After the last tile one VF folds each accumulator's lanes (vcadd) into the token's M + M * M values. Every
sum has one fixed order: the results are the same bits run to run and core to core.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

from ._mhc_post_common import ASCEND_LANES
from ._mhc_post_fwd_ascend import _padded


def ascend_mhc_post_bwd_kernel(cfg):
    """`cfg` is a MhcPostBwdConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    mhc, hidden, tile, num_cores = cfg.mhc, cfg.hidden, cfg.tile, cfg.num_cores
    lanes = ASCEND_LANES
    n_tiles = hidden // tile
    chunks = tile // lanes
    mm = mhc * mhc
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')

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
        post_flat = T.reshape(post_layer_mix, (num_tokens * mhc,))
        comb_flat = T.reshape(comb_res_mix, (num_tokens * mm,))
        d_post_flat = T.reshape(d_post_layer_mix, (num_tokens * mhc,))
        d_comb_flat = T.reshape(d_comb_res_mix, (num_tokens * mm,))
        with T.Kernel(num_cores) as cid:
            x_ub = T.alloc_shared((tile,), bf16)
            r_ub = T.alloc_shared((mhc, tile), bf16)
            g_ub = T.alloc_shared((mhc, tile), bf16)  # d_o
            dx_ub = T.alloc_shared((tile,), bf16)
            dr_ub = T.alloc_shared((mhc, tile), bf16)
            p_ub = T.alloc_shared((_padded(mhc),), f32)
            c_ub = T.alloc_shared((_padded(mm),), f32)
            acc_ub = T.alloc_shared((mm + mhc, lanes), f32)  # rows i * M + o: d_comb; mm + o: d_post
            dp_ub = T.alloc_shared((_padded(mhc),), f32)
            dc_ub = T.alloc_shared((_padded(mm),), f32)
            # A plain round-robin loop: the hidden tiles of a token run in order on its core.
            for k in T.serial(T.ceildiv(num_tokens - cid, num_cores)):
                t = k * num_cores + cid
                with T.Task():
                    T.copy(post_flat[t * mhc : t * mhc + mhc], p_ub[0:mhc])
                    T.copy(comb_flat[t * mm : t * mm + mm], c_ub[0:mm])
                with T.SimdVF():
                    zero = T.simd.vdup(0.0, f32)
                    for r in T.unroll(mm + mhc, explicit=True):
                        T.simd.vsts(acc_ub[r, 0], zero)
                for d in T.serial(n_tiles):
                    h0 = d * tile
                    with T.Task():
                        T.copy(x[t, h0 : h0 + tile], x_ub)
                        T.copy(residual[t, :, h0 : h0 + tile], r_ub)
                        T.copy(d_o[t, :, h0 : h0 + tile], g_ub)
                    with T.SimdVF():
                        mix = T.simd.alloc_local((mhc,), f32)
                        acc = T.simd.alloc_local((mhc,), f32)
                        g = T.simd.alloc_local((mhc,), f32)
                        # d_x = sum_o d_o[o] * post[o]; d_post[o] += d_o[o] * x
                        for o in T.unroll(mhc, explicit=True):
                            mix[o] = T.simd.vld(p_ub[o], dist='BRC_B32')
                            acc[o] = T.simd.vld(acc_ub[mm + o, 0])
                        for c in T.serial(chunks):
                            col = c * lanes
                            xv = T.simd.vcvt(T.simd.vld(x_ub[col], dist='UNPK_B16'), f32)
                            dx = T.simd.alloc_var(f32)
                            dx = T.simd.vdup(0.0, f32)
                            for o in T.unroll(mhc, explicit=True):
                                g[o] = T.simd.vcvt(T.simd.vld(g_ub[o, col], dist='UNPK_B16'), f32)
                                T.simd.vmula(dx, g[o], mix[o])
                                T.simd.vmula(acc[o], g[o], xv)
                            T.simd.vsts(dx_ub[col], T.simd.vcvt(dx, bf16), dist='PK_B32')
                        for o in T.unroll(mhc, explicit=True):
                            T.simd.vsts(acc_ub[mm + o, 0], acc[o])
                        # per input branch i: d_residual[i] = sum_o comb[i, o] * d_o[o]; d_comb[i, o] += res[i] * d_o[o]
                        for i in T.unroll(mhc, explicit=True):
                            for o in T.unroll(mhc, explicit=True):
                                mix[o] = T.simd.vld(c_ub[i * mhc + o], dist='BRC_B32')
                                acc[o] = T.simd.vld(acc_ub[i * mhc + o, 0])
                            for c in T.serial(chunks):
                                col = c * lanes
                                rv = T.simd.vcvt(T.simd.vld(r_ub[i, col], dist='UNPK_B16'), f32)
                                dr = T.simd.alloc_var(f32)
                                dr = T.simd.vdup(0.0, f32)
                                for o in T.unroll(mhc, explicit=True):
                                    g[o] = T.simd.vcvt(T.simd.vld(g_ub[o, col], dist='UNPK_B16'), f32)
                                    T.simd.vmula(dr, g[o], mix[o])
                                    T.simd.vmula(acc[o], rv, g[o])
                                T.simd.vsts(dr_ub[i, col], T.simd.vcvt(dr, bf16), dist='PK_B32')
                            for o in T.unroll(mhc, explicit=True):
                                T.simd.vsts(acc_ub[i * mhc + o, 0], acc[o])
                    with T.Task():
                        T.copy(dx_ub, d_x[t, h0 : h0 + tile])
                        T.copy(dr_ub, d_residual[t, :, h0 : h0 + tile])
                with T.SimdVF():
                    for r in T.unroll(mm, explicit=True):
                        T.simd.vsts(dc_ub[r], T.simd.vcadd(T.simd.vld(acc_ub[r, 0])), dist='ONEPT_B32')
                    for o in T.unroll(mhc, explicit=True):
                        T.simd.vsts(dp_ub[o], T.simd.vcadd(T.simd.vld(acc_ub[mm + o, 0])), dist='ONEPT_B32')
                with T.Task():
                    T.copy(dc_ub[0:mm], d_comb_flat[t * mm : t * mm + mm])
                    T.copy(dp_ub[0:mhc], d_post_flat[t * mhc : t * mhc + mhc])

    return mhc_post_bwd_kernel
