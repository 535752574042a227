"""CUDA kernel of moe_topk_gate_backward (math and configuration: moe_topk_gate_backward_kernel.py).

One warp per token, `block_rows` warps per thread block. Lane l owns the experts l * V + j + 32 V c (V =
`cfg.vector` consecutive floats, one vector load / store each, chunks c) in registers. The slots: lane k (and k
+ 32) reads slot k's index, weight, gradient and gathered score into shared memory; after a warp barrier every
lane sums D and <g, w> over the slots in slot order (the Ascend kernel's order), lane k writes slot
k's dL/du; after another warp barrier (a warp's shared slots are its own) each lane adds, slot by slot in order,
the slots that name its experts (no atomics: run to run the same bits). Row sums over the experts (aux term,
softmax) are warp shuffles in a fixed pattern.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.
from ._scoring import WEIGHT_SUM_EPS
from ._scoring_grad import cuda_sqrtsoftplus_grad

WARP = 32


def cuda_moe_topk_gate_backward_kernel(cfg):
    """`cfg` is a MoeTopkGateBackwardConfig (backend "cuda")."""
    import tilelang.language as T

    f32, i32 = T.float32, T.int32
    E, K, aux, func = cfg.num_experts, cfg.num_topk, cfg.aux, cfg.scoring_func
    warps, V = cfg.block_rows, cfg.vector
    span = WARP * V  # experts of one chunk
    chunks = -(-E // span)
    ragged = E % span != 0  # some lanes' last vector lies past the last expert
    slot_rounds = -(-K // WARP)
    sqrtsoftplus_grad = cuda_sqrtsoftplus_grad()
    num_tokens = T.dynamic('num_tokens')
    num_seqs = T.dynamic('num_seqs')

    @T.macro
    def body(scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, grad_logits, scale):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            # A warp's shared slots are its own: warp barriers (below) order them, no block-wide barriers.
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            tid = T.get_thread_binding()
            warp = tid // WARP
            lane = tid % WARP
            row = block * warps + warp
            slot_expert = T.alloc_shared((warps, K), i32)
            slot_score = T.alloc_shared((warps, K), f32)
            slot_grad = T.alloc_shared((warps, K), f32)  # g * w, then the slot's dL/du
            u = T.alloc_local((chunks * V,), f32)
            grad_u = T.alloc_local((chunks * V,), f32)
            topk_sum = T.alloc_var(f32)
            dot = T.alloc_var(f32)
            index = T.alloc_var(T.int64)
            # 1. The slots.
            for s in T.unroll(slot_rounds):
                k = lane + s * WARP
                if row < num_tokens and k < K:
                    index = topk_idx[row, k]
                    if index >= 0 and index < E:
                        slot_expert[warp, k] = T.cast(index, i32)
                        slot_score[warp, k] = scores[row, index]
                        slot_grad[warp, k] = grad_topk_weights[row, k] * topk_weights[row, k]
                    else:
                        slot_expert[warp, k] = -1
                        slot_score[warp, k] = 0.0
                        slot_grad[warp, k] = 0.0
            # The scores of the lane's experts (their loads overlap the barrier's wait).
            if row < num_tokens:
                for c in T.unroll(chunks):
                    e0 = c * span + lane * V
                    if not ragged or e0 < E:
                        for j in T.vectorized(V):
                            u[c * V + j] = scores[row, e0 + j]
                    else:
                        for j in T.unroll(V):
                            u[c * V + j] = 0.0
            T.sync_warp()
            # 2. D and <g, w> in slot order (every lane alike), then lane k's slot dL/du.
            topk_sum = T.float32(0.0)
            dot = T.float32(0.0)
            for k in T.unroll(K):
                if slot_expert[warp, k] >= 0:
                    topk_sum = topk_sum + slot_score[warp, k]
                    dot = dot + slot_grad[warp, k]
            topk_sum = topk_sum + T.float32(WEIGHT_SUM_EPS)
            T.sync_warp()  # every lane has read the slots' g * w before they are overwritten
            for s in T.unroll(slot_rounds):
                k = lane + s * WARP
                if row < num_tokens and k < K:
                    slot_grad[warp, k] = T.if_then_else(
                        slot_expert[warp, k] >= 0, (scale * grad_topk_weights[row, k] - dot) / topk_sum, 0.0
                    )
            T.sync_warp()
            # 3. dL/du of the lane's experts: the slots that name them, in slot order.
            for i in T.unroll(chunks * V):
                grad_u[i] = 0.0
            for k in T.unroll(K):
                for c in T.unroll(chunks):
                    for j in T.unroll(V):
                        if slot_expert[warp, k] == c * span + lane * V + j:
                            grad_u[c * V + j] = grad_u[c * V + j] + slot_grad[warp, k]
            if row < num_tokens:
                if aux:
                    # The aux term, for tokens inside the mask: (h - <h, u> / sum(u)) / sum(u).
                    h = T.alloc_local((chunks * V,), f32)
                    score_total = T.alloc_var(f32)
                    aux_dot = T.alloc_var(f32)
                    seq = row // (num_tokens // num_seqs)
                    score_total = T.float32(0.0)
                    aux_dot = T.float32(0.0)
                    for c in T.unroll(chunks):
                        e0 = c * span + lane * V
                        if not ragged or e0 < E:
                            for j in T.vectorized(V):
                                h[c * V + j] = grad_scores_sum[seq, e0 + j]
                        else:
                            for j in T.unroll(V):
                                h[c * V + j] = 0.0
                    for i in T.unroll(chunks * V):
                        score_total = score_total + u[i]
                        aux_dot = aux_dot + h[i] * u[i]
                    score_total = T.warp_reduce_sum(score_total)
                    aux_dot = T.warp_reduce_sum(aux_dot)
                    if mask[row]:
                        inv_total = T.alloc_var(f32)
                        inv_total = T.float32(1.0) / score_total
                        for i in T.unroll(chunks * V):
                            grad_u[i] = grad_u[i] + (h[i] * inv_total - (aux_dot * inv_total) * inv_total)
                # 4. The chain rule through the scoring function, and the store.
                if func == 'softmax':
                    row_dot = T.alloc_var(f32)
                    row_dot = T.float32(0.0)
                    for i in T.unroll(chunks * V):
                        row_dot = row_dot + grad_u[i] * u[i]
                    row_dot = T.warp_reduce_sum(row_dot)
                for i in T.unroll(chunks * V):
                    if func == 'sqrtsoftplus':
                        grad_u[i] = grad_u[i] * sqrtsoftplus_grad(u[i])
                    elif func == 'sigmoid':
                        grad_u[i] = grad_u[i] * (u[i] * (1.0 - u[i]))
                    else:
                        grad_u[i] = u[i] * (grad_u[i] - row_dot)
                for c in T.unroll(chunks):
                    e0 = c * span + lane * V
                    if not ragged or e0 < E:
                        for j in T.vectorized(V):
                            grad_logits[row, e0 + j] = grad_u[c * V + j]

    if aux:

        @T.prim_func
        def moe_topk_gate_backward_kernel(
            scores: T.Tensor((num_tokens, E), f32),
            topk_idx: T.Tensor((num_tokens, K), T.int64),
            topk_weights: T.Tensor((num_tokens, K), f32),
            grad_topk_weights: T.Tensor((num_tokens, K), f32),
            mask: T.Tensor((num_tokens,), T.bool),
            grad_scores_sum: T.Tensor((num_seqs, E), f32),
            grad_logits: T.Tensor((num_tokens, E), f32),
            routed_scaling_factor: T.float32,
        ):
            body(scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, grad_logits,
                 routed_scaling_factor)  # fmt: skip

    else:

        @T.prim_func
        def moe_topk_gate_backward_kernel(
            scores: T.Tensor((num_tokens, E), f32),
            topk_idx: T.Tensor((num_tokens, K), T.int64),
            topk_weights: T.Tensor((num_tokens, K), f32),
            grad_topk_weights: T.Tensor((num_tokens, K), f32),
            grad_logits: T.Tensor((num_tokens, E), f32),
            routed_scaling_factor: T.float32,
        ):
            body(scores, topk_idx, topk_weights, grad_topk_weights, None, None, grad_logits, routed_scaling_factor)

    return moe_topk_gate_backward_kernel
