"""Ascend 950 kernel of engram_fused_weight (math and config: engram_fused_weight_kernel.py).

A persistent loop over (branch, column block) tasks on the vector cores: both bf16 rows to UB,
one SIMD pass widens and multiplies them, the fp32 product goes back to GM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_fused_weight_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, and the lane width, which the config checks too, lives here.
LANES = 64  # fp32 lanes of one 256-byte Ascend vector register


def ascend_engram_fused_weight_kernel(cfg):
    """`cfg` is an EngramFusedWeightConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    hc, hidden, blk, stages = cfg.hc, cfg.hidden, cfg.block, cfg.num_stages
    n_d = hidden // blk
    num_tasks = cfg.num_tasks
    grid = min(cfg.num_cores, num_tasks)
    lanes = LANES

    @T.prim_func
    def engram_fused_weight_kernel(
        weight_hidden: T.Tensor((hc, hidden), T.bfloat16),
        weight_embed: T.Tensor((hc, hidden), T.bfloat16),
        out: T.Tensor((hc, hidden), T.float32),
    ):
        with T.Kernel(grid) as cid:
            a_ub = T.alloc_shared((blk,), T.bfloat16)
            b_ub = T.alloc_shared((blk,), T.bfloat16)
            o_ub = T.alloc_shared((blk,), T.float32)
            T.annotate_buffer_versions({a_ub: stages, b_ub: stages, o_ub: stages})
            for t in T.Persistent([num_tasks], grid, cid, group_size=1, num_stages=stages):
                h = t // n_d
                d0 = (t % n_d) * blk
                T.copy(weight_hidden[h, d0 : d0 + blk], a_ub)
                T.copy(weight_embed[h, d0 : d0 + blk], b_ub)
                with T.SimdVF():
                    for c in T.serial(blk // lanes):
                        av = T.simd.vcvt(T.simd.vld(a_ub[c * lanes], dist='UNPK_B16'), T.float32)
                        bv = T.simd.vcvt(T.simd.vld(b_ub[c * lanes], dist='UNPK_B16'), T.float32)
                        T.simd.vsts(o_ub[c * lanes], T.simd.vmul(av, bv))
                T.copy(o_ub, out[h, d0 : d0 + blk])

    return engram_fused_weight_kernel
