"""Ascend 950 kernels of mhc_pre_apply_mix_fwd / mhc_pre_apply_mix_bwd (math and config:
mhc_pre_apply_mix_kernel.py).

- fwd: a task is one token's block of `hidden_block` columns; tasks go round-robin over the vector cores
  (T.Persistent, two buffer versions). The token's mix row and its (mhc_mult, block) x tile land in UB; per
  64-lane chunk the streams are widened to fp32 and combined, mix[0] * x[0] first, then one fused multiply-add
  per further stream, rounded to bf16 and packed into o's block.
- bwd: a core takes tokens cid, cid + cores, ... (its mix_grad rows are its own sums) and walks each token's
  row in hidden blocks: o_grad's block and the x and x_grad tiles land in UB, x_grad gets mix * o_grad added
  (one fma, rounded to bf16) and goes back, and per stream 64 lane sums of o_grad * x (in UB between blocks)
  grow in column order; the lane tree (vcadd) then gives mix_grad[t, m].
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by mhc_pre_apply_mix_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ._mhc_expand_apply_common import ASCEND_LANES, MAX_MHC_MULT


def fwd_block(T, mhc: int, block: int):
    """The forward's block as a macro (one home: this kernel and the fused pre path's kernel, which must round
    alike): mix_block(x_ub, weight, o_ub), inside a SIMD VF, mixes a token's (mhc, block) bf16 tile x_ub into
    o_ub (block,), weight(m) being the UB element of the token's mix m (broadcast to every lane): per 64-lane
    chunk the streams widened to fp32, mix[0] * x[0], then one fused multiply-add per further stream, rounded
    to bf16."""
    f32, bf16 = T.float32, T.bfloat16
    chunks = block // ASCEND_LANES
    lanes = ASCEND_LANES

    @T.macro
    def mix_block(x_ub, weight, o_ub):
        w = T.simd.alloc_local((mhc,), f32)
        for m in T.unroll(mhc, explicit=True):
            w[m] = T.simd.vld(weight(m), dist='BRC_B32')
        for c in T.serial(chunks):
            col = c * lanes
            acc = T.simd.alloc_var(f32)
            acc = T.simd.vmul(T.simd.vcvt(T.simd.vld(x_ub[0, col], dist='UNPK_B16'), f32), w[0])
            for m in T.unroll(mhc - 1, explicit=True):
                xm = T.simd.vcvt(T.simd.vld(x_ub[m + 1, col], dist='UNPK_B16'), f32)
                T.simd.vmula(acc, xm, w[m + 1])
            T.simd.vsts(o_ub[col], T.simd.vcvt(acc, bf16), dist='PK_B32')

    return mix_block


def ascend_mhc_pre_apply_mix_kernel(cfg):
    """`cfg` is an MhcPreApplyMixConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    mhc, hidden, block, stages, num_cores = cfg.mhc, cfg.hidden, cfg.hidden_block, cfg.num_stages, cfg.num_cores
    blocks = hidden // block
    chunks = block // ASCEND_LANES
    lanes = ASCEND_LANES
    f32, bf16 = T.float32, T.bfloat16
    row = MAX_MHC_MULT  # a token's mix (or mix_grad) row in UB, padded to 32 bytes
    num_tokens = T.dynamic('num_tokens')

    if cfg.direction == 'fwd':
        mix_block = fwd_block(T, mhc, block)

        @T.prim_func
        def mhc_pre_apply_mix_fwd_kernel(
            x: T.Tensor((num_tokens, mhc, hidden), bf16),
            mix: T.Tensor((num_tokens, mhc), f32),
            o: T.Tensor((num_tokens, hidden), bf16),
        ):
            with T.Kernel(num_cores) as cid:
                x_ub = T.alloc_shared((mhc, block), bf16)
                w_ub = T.alloc_shared((row,), f32)
                o_ub = T.alloc_shared((block,), bf16)
                T.annotate_buffer_versions({x_ub: stages, w_ub: stages, o_ub: stages})
                for task in T.Persistent([num_tokens * blocks], num_cores, cid, group_size=1, num_stages=stages):
                    t = task // blocks
                    h0 = (task % blocks) * block
                    T.copy(mix[t, 0:mhc], w_ub[0:mhc])
                    T.copy(x[t, :, h0 : h0 + block], x_ub)
                    with T.SimdVF():
                        mix_block(x_ub, lambda m: w_ub[m], o_ub)
                    T.copy(o_ub, o[t, h0 : h0 + block])

        return mhc_pre_apply_mix_fwd_kernel

    @T.prim_func
    def mhc_pre_apply_mix_bwd_kernel(
        o_grad: T.Tensor((num_tokens, hidden), bf16),
        x: T.Tensor((num_tokens, mhc, hidden), bf16),
        mix: T.Tensor((num_tokens, mhc), f32),
        x_grad: T.Tensor((num_tokens, mhc, hidden), bf16),
        mix_grad: T.Tensor((num_tokens, mhc), f32),
    ):
        with T.Kernel(num_cores) as cid:
            g_ub = T.alloc_shared((block,), bf16)
            x_ub = T.alloc_shared((mhc, block), bf16)
            xg_ub = T.alloc_shared((mhc, block), bf16)
            w_ub = T.alloc_shared((row,), f32)
            acc_ub = T.alloc_shared((mhc, lanes), f32)  # per stream, the 64 lane sums of o_grad * x so far
            mg_ub = T.alloc_shared((row,), f32)
            T.annotate_buffer_versions({g_ub: stages, x_ub: stages, xg_ub: stages})
            # A plain loop over the core's tokens: a token's blocks must stay on one core (its mix_grad sums).
            for k in T.serial(T.ceildiv(num_tokens - cid, num_cores)):
                t = k * num_cores + cid
                T.copy(mix[t, 0:mhc], w_ub[0:mhc])
                with T.SimdVF():
                    zero = T.simd.vdup(0.0, f32)
                    for m in T.unroll(mhc, explicit=True):
                        T.simd.vsts(acc_ub[m, 0], zero)
                for b in T.serial(blocks):
                    h0 = b * block
                    with T.Task():
                        T.copy(o_grad[t, h0 : h0 + block], g_ub)
                        T.copy(x[t, :, h0 : h0 + block], x_ub)
                        T.copy(x_grad[t, :, h0 : h0 + block], xg_ub)
                    with T.SimdVF():
                        for m in T.unroll(mhc, explicit=True):
                            w = T.simd.vld(w_ub[m], dist='BRC_B32')
                            acc = T.simd.alloc_var(f32)
                            acc = T.simd.vld(acc_ub[m, 0])
                            # Each x_grad chunk is loaded before it is overwritten and never loaded again.
                            for c in T.serial(chunks):
                                col = c * lanes
                                g = T.simd.vcvt(T.simd.vld(g_ub[col], dist='UNPK_B16'), f32)
                                xm = T.simd.vcvt(T.simd.vld(x_ub[m, col], dist='UNPK_B16'), f32)
                                xg = T.simd.alloc_var(f32)
                                xg = T.simd.vcvt(T.simd.vld(xg_ub[m, col], dist='UNPK_B16'), f32)
                                T.simd.vmula(xg, g, w)
                                T.simd.vsts(xg_ub[m, col], T.simd.vcvt(xg, bf16), dist='PK_B32')
                                T.simd.vmula(acc, g, xm)
                            T.simd.vsts(acc_ub[m, 0], acc)
                    T.copy(xg_ub, x_grad[t, :, h0 : h0 + block])
                with T.SimdVF():
                    for m in T.unroll(mhc, explicit=True):
                        T.simd.vsts(mg_ub[m], T.simd.vcadd(T.simd.vld(acc_ub[m, 0])), dist='ONEPT_B32')
                T.copy(mg_ub[0:mhc], mix_grad[t, 0:mhc])

    return mhc_pre_apply_mix_bwd_kernel
