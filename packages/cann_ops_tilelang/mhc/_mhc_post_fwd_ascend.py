"""Ascend 950 kernel of mhc_post_fwd (configuration and generator: mhc_post_fwd_kernel.py).

A task is (token t, hidden tile d); tasks go round-robin over the vector cores (T.Persistent, `stages` buffer
versions, so the DMA of the next task overlaps the vector work of this one). Per task the x tile (tile,), the
residual tile (M, tile), the M * M comb_res_mix and the M post_layer_mix values of t land in UB; one vector
pass per 64-column chunk computes the M output rows in fp32 registers and packs them to bf16 in UB, which
then goes back to GM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

from ._mhc_post_common import ASCEND_LANES

# Mix values (M * M + M broadcast registers) kept in registers across the chunks up to this count (M <= 4);
# beyond it they are broadcast from UB where used, which costs loads but no register spills.
HOISTED_MIXES = 20


def _padded(count: int) -> int:
    """fp32 elements rounded up to a 32-byte UB block."""
    return -(-count // 8) * 8


def ascend_mhc_post_fwd_kernel(cfg):
    """`cfg` is a MhcPostFwdConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    mhc, hidden, tile, stages, num_cores = cfg.mhc, cfg.hidden, cfg.tile, cfg.stages, cfg.num_cores
    lanes = ASCEND_LANES
    n_tiles = hidden // tile
    chunks = tile // lanes
    mm = mhc * mhc
    hoist = mm + mhc <= HOISTED_MIXES
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def mhc_post_fwd_kernel(
        x: T.Tensor((num_tokens, hidden), bf16),
        residual: T.Tensor((num_tokens, mhc, hidden), bf16),
        post_layer_mix: T.Tensor((num_tokens, mhc), f32),
        comb_res_mix: T.Tensor((num_tokens, mhc, mhc), f32),
        out: T.Tensor((num_tokens, mhc, hidden), bf16),
    ):
        # The mixes as flat rows: one contiguous DMA per token each.
        post_flat = T.reshape(post_layer_mix, (num_tokens * mhc,))
        comb_flat = T.reshape(comb_res_mix, (num_tokens * mm,))
        with T.Kernel(num_cores) as cid:
            x_ub = T.alloc_shared((tile,), bf16)
            r_ub = T.alloc_shared((mhc, tile), bf16)
            o_ub = T.alloc_shared((mhc, tile), bf16)
            p_ub = T.alloc_shared((_padded(mhc),), f32)
            c_ub = T.alloc_shared((_padded(mm),), f32)
            T.annotate_buffer_versions({x_ub: stages, r_ub: stages, o_ub: stages, p_ub: stages, c_ub: stages})
            for task in T.Persistent([num_tokens * n_tiles], num_cores, cid, group_size=1, num_stages=stages):
                t = task // n_tiles
                h0 = (task % n_tiles) * tile
                with T.Task():
                    T.copy(post_flat[t * mhc : t * mhc + mhc], p_ub[0:mhc])
                    T.copy(comb_flat[t * mm : t * mm + mm], c_ub[0:mm])
                    T.copy(x[t, h0 : h0 + tile], x_ub)
                    T.copy(residual[t, :, h0 : h0 + tile], r_ub)
                with T.SimdVF():
                    mix = T.simd.alloc_local((mm + mhc if hoist else 1,), f32)
                    if hoist:
                        for k in T.unroll(mm, explicit=True):
                            mix[k] = T.simd.vld(c_ub[k], dist='BRC_B32')
                        for o in T.unroll(mhc, explicit=True):
                            mix[mm + o] = T.simd.vld(p_ub[o], dist='BRC_B32')
                    res = T.simd.alloc_local((mhc,), f32)
                    for c in T.serial(chunks):
                        col = c * lanes
                        xv = T.simd.vcvt(T.simd.vld(x_ub[col], dist='UNPK_B16'), f32)
                        for i in T.unroll(mhc, explicit=True):
                            res[i] = T.simd.vcvt(T.simd.vld(r_ub[i, col], dist='UNPK_B16'), f32)
                        for o in T.unroll(mhc, explicit=True):
                            acc = T.simd.alloc_var(f32)
                            if hoist:
                                acc = T.simd.vmul(xv, mix[mm + o])
                                for i in T.unroll(mhc, explicit=True):
                                    T.simd.vmula(acc, res[i], mix[i * mhc + o])
                            else:
                                acc = T.simd.vmul(xv, T.simd.vld(p_ub[o], dist='BRC_B32'))
                                for i in T.unroll(mhc, explicit=True):
                                    T.simd.vmula(acc, res[i], T.simd.vld(c_ub[i * mhc + o], dist='BRC_B32'))
                            T.simd.vsts(o_ub[o, col], T.simd.vcvt(acc, bf16), dist='PK_B32')
                with T.Task():
                    T.copy(o_ub, out[t, :, h0 : h0 + tile])

    return mhc_post_fwd_kernel
