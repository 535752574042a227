"""Ascend 950 kernel of engram_sinkhorn_momentum_update (math and config: engram_sinkhorn_momentum_update_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_momentum_update_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, and the lane width (the Sinkhorn family's, _sinkhorn_common.py), which the config
# checks too, comes from the family module.
from ._sinkhorn_common import LANES


def ascend_engram_sinkhorn_momentum_update_kernel(cfg):
    """`cfg` is an EngramSinkhornMomentumUpdateConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    blk, stages, nesterov = cfg.block, cfg.num_stages, cfg.nesterov
    grid = cfg.num_cores
    lanes = LANES
    f32, bf16 = T.float32, T.bfloat16
    gdt = bf16 if cfg.grad_dtype == 'bfloat16' else f32
    mdt = bf16 if cfg.momentum_dtype == 'bfloat16' else f32
    numel = T.dynamic('numel')

    def load_f32(ub, dt, offset):
        if dt == bf16:
            return T.simd.vcvt(T.simd.vld(ub[offset], dist='UNPK_B16'), f32)
        return T.simd.vld(ub[offset])

    @T.prim_func
    def engram_sinkhorn_momentum_update_kernel(
        grad: T.Tensor((numel,), gdt),
        momentum_buffer: T.Tensor((numel,), mdt),
        sinkhorn_input: T.Tensor((numel,), f32),
        beta1: T.float32,
        one_minus_beta1: T.float32,
    ):
        with T.Kernel(grid) as cid:
            g_ub = T.alloc_shared((blk,), gdt)
            m_ub = T.alloc_shared((blk,), mdt)  # m, then m' in place
            o_ub = T.alloc_shared((blk,), f32)
            T.annotate_buffer_versions({g_ub: stages, m_ub: stages, o_ub: stages})
            for task in T.Persistent([T.ceildiv(numel, blk)], grid, cid, group_size=1, num_stages=stages):
                e0 = task * blk
                valid = T.min(blk, numel - e0)
                T.copy(grad[e0 : e0 + valid], g_ub[0:valid])
                T.copy(momentum_buffer[e0 : e0 + valid], m_ub[0:valid])
                with T.SimdVF():
                    beta = T.simd.vdup(beta1, f32)
                    # Whole registers over the valid part: the lanes past `valid` in the last register hold
                    # stale UB data and are computed but never copied out.
                    for c in T.serial(T.ceildiv(valid, lanes)):
                        gv = load_f32(g_ub, gdt, c * lanes)
                        mv = load_f32(m_ub, mdt, c * lanes)
                        mn = T.simd.alloc_var(f32)
                        mn = T.simd.vmuls(gv, one_minus_beta1)  # s
                        T.simd.vmula(mn, mv, beta)  # m' = s + m * b, fused
                        if mdt == bf16:
                            T.simd.vsts(m_ub[c * lanes], T.simd.vcvt(mn, bf16), dist='PK_B32')
                        else:
                            T.simd.vsts(m_ub[c * lanes], mn)
                        if nesterov:
                            nv = T.simd.alloc_var(f32)
                            nv = T.simd.vmuls(gv, one_minus_beta1)  # s again
                            T.simd.vmula(nv, mn, beta)  # s + m' * b, fused
                            T.simd.vsts(o_ub[c * lanes], nv)
                        else:
                            T.simd.vsts(o_ub[c * lanes], mn)
                T.copy(m_ub[0:valid], momentum_buffer[e0 : e0 + valid])
                T.copy(o_ub[0:valid], sinkhorn_input[e0 : e0 + valid])

    return engram_sinkhorn_momentum_update_kernel
