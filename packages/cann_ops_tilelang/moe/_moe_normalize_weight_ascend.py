"""Ascend 950 kernel of moe_normalize_weight (math and configuration: moe_normalize_weight_kernel.py).

A persistent loop over tiles of `block_rows` token rows on the vector cores: the tile's rows land in UB with a
32-byte row pitch (the DMA's granule), then one SIMD pass per row: one register load, the masked tree sum
(vcadd), + 1e-20, a division by its broadcast, a masked store of the K quotients and of the denominator.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.
from ._scoring import WEIGHT_SUM_EPS

ASCEND_LANES = 64  # fp32 lanes of one 256-byte vector register
_ROW_ALIGN = 8  # fp32 elements per 32 bytes: UB row pitch granule


def ascend_moe_normalize_weight_kernel(cfg):
    """`cfg` is a MoeNormalizeWeightConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    num_topk, block_rows, num_cores, stages = cfg.num_topk, cfg.block_rows, cfg.num_cores, cfg.num_stages
    pitch = -(-num_topk // _ROW_ALIGN) * _ROW_ALIGN
    # A full-register load of the last row reads ASCEND_LANES floats from its start: rows of slack behind it.
    slack_rows = -(-ASCEND_LANES // pitch) - 1
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def moe_normalize_weight_kernel(
        topk_weights: T.Tensor((num_tokens, num_topk), f32),
        denominator: T.Tensor((num_tokens,), f32),
        normalized_weights: T.Tensor((num_tokens, num_topk), f32),
    ):
        with T.Kernel(num_cores) as core_id:
            weights_ub = T.alloc_shared((block_rows + slack_rows, pitch), f32)
            normalized_ub = T.alloc_shared((block_rows + slack_rows, pitch), f32)
            denominator_ub = T.alloc_shared((block_rows,), f32)
            for task in T.Persistent(
                [T.ceildiv(num_tokens, block_rows)], num_cores, core_id, group_size=1, num_stages=stages
            ):
                row0 = task * block_rows
                rows = T.min(block_rows, num_tokens - row0)
                T.copy(topk_weights[row0 : row0 + rows, :], weights_ub[:rows, :num_topk])
                with T.SimdVF():
                    in_row = S.vcmps(S.vci(0, T.int32), num_topk, op='lt')  # lanes 0..K-1 (bit layout of fp32 too)
                    for r in T.serial(rows):
                        weights = S.vld(weights_ub[r, 0])
                        total = S.vadds(S.vcadd(weights, in_row), WEIGHT_SUM_EPS)  # lane 0: the denominator
                        S.vsts(denominator_ub[r], total, dist='ONEPT_B32')
                        S.vsts(normalized_ub[r, 0], S.vdiv(weights, S.vdupv(total)), in_row)
                T.copy(denominator_ub[:rows], denominator[row0 : row0 + rows])
                T.copy(normalized_ub[:rows, :num_topk], normalized_weights[row0 : row0 + rows, :])

    return moe_normalize_weight_kernel
