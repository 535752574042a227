"""CUDA kernel of moe_topk_gate (configuration and semantics: moe_topk_gate_kernel.py).

`rows` warps per thread block, one token each, straight from global memory: the row routine
(_topk_select.make_gate_row) loads the token's logits into registers (16-byte loads where E % 4 == 0), scores,
ranks and selects them with warp reductions, and lane k writes slot k. No shared memory, no atomics.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

from ._scoring import make_elementwise_scoring
from ._topk_select import WARP, gate_shapes, make_gate_row


def cuda_moe_topk_gate_kernel(cfg):
    """`cfg` is a MoeTopkGateConfig (backend "cuda")."""
    import tilelang.language as T

    rows = cfg.rows
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
        with T.Kernel(T.ceildiv(num_tokens, rows), threads=WARP * rows) as bx:
            tid = T.get_thread_binding()
            token = bx * rows + tid // WARP
            lane = tid % WARP
            if token < num_tokens:  # the whole warp shares the token: its reductions stay uniform
                masked = (not mask[token]) if cfg.has_mask else False
                random_token = force_random[token] if cfg.has_random else False
                fixed = fix_routing_mask[token] if cfg.has_fixed else False
                is_image = image_token_mask[token] if cfg.has_image else False
                route_row(lane, token, masked, random_token, fixed, is_image, logits, token, bias, image_bias,
                          unmapped_topk_idx, token, to_physical_map, logical_count, scores, token, topk_idx,
                          topk_weights, token, routed_scaling_factor, ep_rank)  # fmt: skip

    return moe_topk_gate_kernel
