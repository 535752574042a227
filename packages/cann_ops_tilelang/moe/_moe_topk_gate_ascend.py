"""Ascend 950 kernel of moe_topk_gate (configuration and semantics: moe_topk_gate_kernel.py).

The expert tables (bias, image_bias, to_physical_map, logical_count) go to UB once per core. A persistent loop
over blocks of `rows` tokens: the block's logits, token flags and fixed experts GM -> UB, a SIMT VF of
32 * rows threads running the row routine (_topk_select.make_gate_row) one token per 32 threads on UB, then
topk_idx, topk_weights, unmapped_topk_idx and scores UB -> GM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

from ._scoring import make_elementwise_scoring
from ._topk_select import WARP, gate_shapes, make_gate_row


def ascend_moe_topk_gate_kernel(cfg):
    """`cfg` is a MoeTopkGateConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    E, K, P, L, R = cfg.num_experts, cfg.num_topk, cfg.num_physical_topk, cfg.num_logical_experts, cfg.replicas
    rows, num_cores, stages = cfg.rows, cfg.num_cores, cfg.num_stages
    width = cfg.slots * WARP  # a UB row of logits or scores: whole lanes
    route_row = make_gate_row(T, cfg, make_elementwise_scoring(T, cfg.scoring_func))
    num_tokens = T.dynamic('num_tokens')
    shape = gate_shapes(cfg, num_tokens)

    @T.prim_func
    def moe_topk_gate_kernel(
        logits: T.Tensor(shape['logits'], T.float32),
        bias: T.Tensor(shape['bias'], T.float32),
        image_bias: T.Tensor(shape['image_bias'], T.float32),
        image_token_mask: T.Tensor(shape['image_token_mask'], T.bool),
        mask: T.Tensor(shape['mask'], T.bool),
        fix_routing_mask: T.Tensor(shape['fix_routing_mask'], T.bool),
        force_random: T.Tensor(shape['force_random'], T.bool),
        to_physical_map: T.Tensor(shape['to_physical_map'], T.int32),
        logical_count: T.Tensor(shape['logical_count'], T.int32),
        unmapped_topk_idx: T.Tensor(shape['unmapped_topk_idx'], T.int64),
        scores: T.Tensor(shape['scores'], T.float32),
        topk_idx: T.Tensor(shape['topk_idx'], T.int64),
        topk_weights: T.Tensor(shape['topk_weights'], T.float32),
        routed_scaling_factor: T.float32,
        ep_rank: T.int32,
    ):
        with T.Kernel(num_cores) as core_id:
            logits_ub = T.alloc_shared((rows, width), T.float32)
            idx_ub = T.alloc_shared((rows, P), T.int64)
            weights_ub = T.alloc_shared((rows, P), T.float32)
            # Placeholders where a tensor is absent: the routine never touches them.
            bias_ub = T.alloc_shared((1, width), T.float32) if cfg.has_bias else bias
            image_bias_ub = T.alloc_shared((1, width), T.float32) if cfg.has_image else image_bias
            image_ub = T.alloc_shared((rows,), T.bool) if cfg.has_image else image_token_mask
            mask_ub = T.alloc_shared((rows,), T.bool) if cfg.has_mask else mask
            fixed_ub = T.alloc_shared((rows,), T.bool) if cfg.has_fixed else fix_routing_mask
            random_ub = T.alloc_shared((rows,), T.bool) if cfg.has_random else force_random
            map_ub = T.alloc_shared((1, L * R), T.int32) if R else to_physical_map
            count_ub = T.alloc_shared((1, L), T.int32) if R else logical_count
            unmapped_ub = T.alloc_shared((rows, K), T.int64) if cfg.has_unmapped else unmapped_topk_idx
            scores_ub = T.alloc_shared((rows, width), T.float32) if cfg.has_scores else scores
            if cfg.has_bias:
                T.copy(bias, bias_ub[0:1, 0:E])
            if cfg.has_image:
                T.copy(image_bias, image_bias_ub[0:1, 0:E])
            if R:
                T.copy(to_physical_map, map_ub)
                T.copy(logical_count, count_ub)
            for block in T.Persistent([T.ceildiv(num_tokens, rows)], num_cores, core_id, group_size=1,
                                      num_stages=stages):  # fmt: skip
                start = block * rows
                count = T.min(rows, num_tokens - start)
                T.copy(logits[start : start + count, :], logits_ub[0:count, 0:E])
                if cfg.has_image:
                    T.copy(image_token_mask[start : start + count], image_ub[0:count])
                if cfg.has_mask:
                    T.copy(mask[start : start + count], mask_ub[0:count])
                if cfg.has_fixed:
                    T.copy(fix_routing_mask[start : start + count], fixed_ub[0:count])
                if cfg.has_random:
                    T.copy(force_random[start : start + count], random_ub[0:count])
                if cfg.has_unmapped:
                    T.copy(unmapped_topk_idx[start : start + count, :], unmapped_ub[0:count, :])
                with T.SimtVF(threads=WARP * rows):
                    tid = T.get_thread_binding(0)
                    row = tid // WARP
                    lane = tid % WARP
                    if row < count:  # the 32 threads of a token agree: their reductions stay uniform
                        masked = (not mask_ub[row]) if cfg.has_mask else False
                        random_token = random_ub[row] if cfg.has_random else False
                        fixed = fixed_ub[row] if cfg.has_fixed else False
                        is_image = image_ub[row] if cfg.has_image else False
                        route_row(lane, start + row, masked, random_token, fixed, is_image, logits_ub, row,
                                  bias_ub, image_bias_ub, unmapped_ub, row, map_ub, count_ub, scores_ub, row,
                                  idx_ub, weights_ub, row, routed_scaling_factor, ep_rank)  # fmt: skip
                T.copy(idx_ub[0:count, :], topk_idx[start : start + count, :])
                T.copy(weights_ub[0:count, :], topk_weights[start : start + count, :])
                if cfg.has_unmapped:
                    T.copy(unmapped_ub[0:count, :], unmapped_topk_idx[start : start + count, :])
                if cfg.has_scores:
                    T.copy(scores_ub[0:count, 0:E], scores[start : start + count, :])

    return moe_topk_gate_kernel
