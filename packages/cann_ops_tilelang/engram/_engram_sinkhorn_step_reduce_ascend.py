"""Ascend 950 kernel of engram_sinkhorn_step_reduce.

Math, summation order and config: engram_sinkhorn_step_reduce_kernel.py.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_step_reduce_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, the lane width from the Sinkhorn family's module.
from ._sinkhorn_common import LANES


def ascend_engram_sinkhorn_step_reduce_kernel(cfg):
    """`cfg` is an EngramSinkhornStepReduceConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    D, W, R, stages = cfg.head_dim, cfg.block_cols, cfg.block_rows, cfg.num_stages
    lanes = LANES
    C = W // lanes
    f32 = T.float32
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_sinkhorn_step_reduce_kernel(
        col_sumsq_partial: T.Tensor((num_partials, D), f32),
        col_sumsq: T.Tensor((D,), f32),
    ):
        with T.Kernel(cfg.num_tiles) as t:
            p_ub = T.alloc_shared((R, W), f32)
            acc_ub = T.alloc_shared((W,), f32)
            d0 = t * W
            with T.SimdVF():
                for c in T.serial(C):
                    T.simd.vsts(acc_ub[c * lanes], T.simd.vdup(0.0, f32))
            for k in T.Pipelined(T.ceildiv(num_partials, R), num_stages=stages):
                rows = T.min(R, num_partials - k * R)
                T.copy(col_sumsq_partial[k * R : k * R + rows, d0 : d0 + W], p_ub[0:rows, :])
                with T.SimdVF():
                    for c in T.serial(C):
                        s = T.simd.alloc_var(f32)
                        s = T.simd.vld(acc_ub[c * lanes])
                        for r in T.serial(rows):  # p in increasing order
                            s = T.simd.vadd(s, T.simd.vld(p_ub[r, c * lanes]))
                        T.simd.vsts(acc_ub[c * lanes], s)
            T.copy(acc_ub, col_sumsq[d0 : d0 + W])

    return engram_sinkhorn_step_reduce_kernel
