"""CUDA kernel of moe_topk_gate_backward (math and configuration: moe_topk_gate_backward_kernel.py).

One warp per token, `block_rows` warps per thread block; a warp's shared memory is its own (warp barriers
only). Lane l owns the experts l * V + j + 32 V c (V = `cfg.vector` consecutive floats, one vector access each,
chunks c).

1. Lane k (and k + 32) reads slot k's index, weight, gradient and gathered score into shared memory, and every
   lane zeroes its experts of the warp's row of dL/du in shared memory.
2. Every lane sums D and <g, w> over the slots in slot order (the Ascend kernel's order); lane k writes slot k's
   delta.
3. Lane k, for the first slot naming its expert, adds the deltas of every slot naming that expert in slot order
   (no atomics: run to run the same bits) and writes the sum into the row.
4. Each lane reads its experts' dL/du back, adds the aux term, applies the chain rule and stores.

Without the aux term, for sqrtsoftplus and sigmoid, dL/dl is zero wherever dL/du is: step 3 writes the
chain-ruled value of the named experts (their score is the gathered one) and the scores row is not read at all,
so the kernel moves the output and the slots only. The aux term and softmax need the whole row (its sums):
the row is loaded in step 1, overlapping the barriers. Row sums are warp shuffles in a fixed pattern.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.
from ._scoring import WEIGHT_SUM_EPS
from ._scoring_grad import cuda_sqrtsoftplus_grad, reads_scores_row

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
    whole_row = reads_scores_row(aux, func)
    sqrtsoftplus_grad = cuda_sqrtsoftplus_grad()
    num_tokens = T.dynamic('num_tokens')
    num_seqs = T.dynamic('num_seqs')

    def chain(grad, u):
        """dL/dl from dL/du and u, elementwise (sqrtsoftplus, sigmoid)."""
        if func == 'sqrtsoftplus':
            return grad * sqrtsoftplus_grad(u)
        return grad * (u * (1.0 - u))

    @T.macro
    def body(scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, grad_logits, scale):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            # A warp's shared slots and row are its own: warp barriers (below) order them, no block-wide barriers.
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            tid = T.get_thread_binding()
            warp = tid // WARP
            lane = tid % WARP
            row = block * warps + warp
            slot_expert = T.alloc_shared((warps, K), i32)
            slot_score = T.alloc_shared((warps, K), f32)
            slot_grad = T.alloc_shared((warps, K), f32)  # g * w, then the slot's delta
            route = T.alloc_shared((warps, E), f32)  # the token's dL/du before the aux term
            grad_u = T.alloc_local((chunks * V,), f32)
            topk_sum = T.alloc_var(f32)
            dot = T.alloc_var(f32)
            acc = T.alloc_var(f32)
            first = T.alloc_var(i32)
            index = T.alloc_var(T.int64)
            # 1. The slots, and the lane's experts of the row zeroed.
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
            for c in T.unroll(chunks):
                e0 = c * span + lane * V
                if not ragged or e0 < E:
                    for j in T.vectorized(V):
                        route[warp, e0 + j] = 0.0
            if whole_row:
                # The row (and the aux term's h and mask) loaded here: the loads overlap the barriers' waits.
                u = T.alloc_local((chunks * V,), f32)
                if aux:
                    h = T.alloc_local((chunks * V,), f32)
                    inside = T.alloc_var(T.bool)
                if row < num_tokens:
                    for c in T.unroll(chunks):
                        e0 = c * span + lane * V
                        if not ragged or e0 < E:
                            for j in T.vectorized(V):
                                u[c * V + j] = scores[row, e0 + j]
                            if aux:
                                for j in T.vectorized(V):
                                    h[c * V + j] = grad_scores_sum[row // (num_tokens // num_seqs), e0 + j]
                        else:
                            for j in T.unroll(V):
                                u[c * V + j] = 0.0
                                if aux:
                                    h[c * V + j] = 0.0
                    if aux:
                        inside = mask[row]
            T.sync_warp()
            # 2. D and <g, w> in slot order (every lane alike), then lane k's slot delta.
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
            # 3. The first slot naming an expert sums, in slot order from +0, the deltas of all slots naming it.
            for s in T.unroll(slot_rounds):
                k = lane + s * WARP
                if row < num_tokens and k < K and slot_expert[warp, k] >= 0:
                    acc = T.float32(0.0)
                    first = 1
                    for j in T.unroll(K):
                        if slot_expert[warp, j] == slot_expert[warp, k]:
                            acc = acc + slot_grad[warp, j]
                            if j < k:
                                first = 0
                    if first == 1:
                        if whole_row:
                            route[warp, slot_expert[warp, k]] = acc
                        else:  # the chain rule here: the score of the expert is the slot's
                            route[warp, slot_expert[warp, k]] = chain(acc, slot_score[warp, k])
            T.sync_warp()
            # 4. The lane's experts: dL/du back from the row, the aux term, the chain rule, the store.
            if row < num_tokens:
                for c in T.unroll(chunks):
                    e0 = c * span + lane * V
                    if not ragged or e0 < E:
                        for j in T.vectorized(V):
                            grad_u[c * V + j] = route[warp, e0 + j]
                    else:
                        for j in T.unroll(V):
                            grad_u[c * V + j] = 0.0
                if aux:
                    # The aux term, for tokens inside the mask: (h - <h, u> / sum(u)) / sum(u).
                    score_total = T.alloc_var(f32)
                    aux_dot = T.alloc_var(f32)
                    score_total = T.float32(0.0)
                    aux_dot = T.float32(0.0)
                    for i in T.unroll(chunks * V):
                        score_total = score_total + u[i]
                        aux_dot = aux_dot + h[i] * u[i]
                    score_total = T.warp_reduce_sum(score_total)
                    aux_dot = T.warp_reduce_sum(aux_dot)
                    if inside:
                        inv_total = T.alloc_var(f32)
                        inv_total = T.float32(1.0) / score_total
                        for i in T.unroll(chunks * V):
                            grad_u[i] = grad_u[i] + (h[i] * inv_total - (aux_dot * inv_total) * inv_total)
                if func == 'softmax':
                    row_dot = T.alloc_var(f32)
                    row_dot = T.float32(0.0)
                    for i in T.unroll(chunks * V):
                        row_dot = row_dot + grad_u[i] * u[i]
                    row_dot = T.warp_reduce_sum(row_dot)
                    for i in T.unroll(chunks * V):
                        grad_u[i] = u[i] * (grad_u[i] - row_dot)
                elif whole_row:
                    for i in T.unroll(chunks * V):
                        grad_u[i] = chain(grad_u[i], u[i])
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
