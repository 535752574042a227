"""Ascend 950 kernels of mhc_expand_fwd / mhc_expand_bwd (math and config: mhc_expand_kernel.py).

A task is one token's block of `hidden_block` columns; tasks go round-robin over the vector cores
(T.Persistent, two buffer versions: the next task's load overlaps this one's work and stores).

- fwd: the x block lands in UB once and leaves it mhc_mult times, one store per stream: the copy is the DMA's,
  no vector work.
- bwd: the (mhc_mult, block) tile of o_grad lands in UB; per 64-lane chunk the streams are widened to fp32 and
  summed in stream order, rounded to bf16 and packed into the x_grad block, which goes back to GM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by mhc_expand_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ._mhc_expand_apply_common import ASCEND_LANES


def ascend_mhc_expand_kernel(cfg):
    """`cfg` is an MhcExpandConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    mhc, hidden, block, stages, num_cores = cfg.mhc, cfg.hidden, cfg.hidden_block, cfg.num_stages, cfg.num_cores
    blocks = hidden // block
    chunks = block // ASCEND_LANES
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')

    if cfg.direction == 'fwd':

        @T.prim_func
        def mhc_expand_fwd_kernel(
            x: T.Tensor((num_tokens, hidden), bf16),
            o: T.Tensor((num_tokens, mhc, hidden), bf16),
        ):
            with T.Kernel(num_cores) as cid:
                x_ub = T.alloc_shared((block,), bf16)
                T.annotate_buffer_versions({x_ub: stages})
                for task in T.Persistent([num_tokens * blocks], num_cores, cid, group_size=1, num_stages=stages):
                    t = task // blocks
                    h0 = (task % blocks) * block
                    T.copy(x[t, h0 : h0 + block], x_ub)
                    for m in T.unroll(mhc, explicit=True):
                        T.copy(x_ub, o[t, m, h0 : h0 + block])

        return mhc_expand_fwd_kernel

    @T.prim_func
    def mhc_expand_bwd_kernel(
        o_grad: T.Tensor((num_tokens, mhc, hidden), bf16),
        x_grad: T.Tensor((num_tokens, hidden), bf16),
    ):
        with T.Kernel(num_cores) as cid:
            g_ub = T.alloc_shared((mhc, block), bf16)
            s_ub = T.alloc_shared((block,), bf16)
            T.annotate_buffer_versions({g_ub: stages, s_ub: stages})
            for task in T.Persistent([num_tokens * blocks], num_cores, cid, group_size=1, num_stages=stages):
                t = task // blocks
                h0 = (task % blocks) * block
                T.copy(o_grad[t, :, h0 : h0 + block], g_ub)
                with T.SimdVF():
                    for c in T.serial(chunks):
                        col = c * ASCEND_LANES
                        acc = T.simd.alloc_var(f32)
                        acc = T.simd.vcvt(T.simd.vld(g_ub[0, col], dist='UNPK_B16'), f32)
                        for m in T.unroll(mhc - 1, explicit=True):
                            acc = T.simd.vadd(acc, T.simd.vcvt(T.simd.vld(g_ub[m + 1, col], dist='UNPK_B16'), f32))
                        T.simd.vsts(s_ub[col], T.simd.vcvt(acc, bf16), dist='PK_B32')
                T.copy(s_ub, x_grad[t, h0 : h0 + block])

    return mhc_expand_bwd_kernel
