"""CUDA kernel of moe_topk_gate_backward (math and configuration: moe_topk_gate_backward_kernel.py).

One warp per token, `block_rows` warps per thread block; a warp's shared memory is its own (warp barriers
only). Lane l owns the experts l * V + j + 32 V c (V = `cfg.vector` consecutive floats, one vector access each,
chunks c) and the slots l + 32 s (registers).

1. Lane k reads slot k's index, g and w. Where the kernel needs the whole scores row (below), every lane loads its
   experts of the row into registers and into the warp's row in shared memory, from which step 2 reads the slots'
   scores: no load waits for another. Otherwise lane k gathers slot k's score from global memory and every lane
   zeroes its experts of the row.
2. D and <g, w> in slot order by warp shuffles (the Ascend kernel's order; every lane gets them); lane k's delta
   (with the whole row, every lane first zeroes its experts of the shared row: it now takes dL/du).
3. The first slot naming an expert adds the deltas of every slot naming it, in slot order (no atomics: run to run
   the same bits), and writes the sum into the row. Which slots name the same expert: one warp vote
   (`match_any_sync`) for K <= 32, a compare loop over the slots in shared memory above.
4. Each lane reads its experts' dL/du back a vector at a time, adds the aux term, applies the chain rule, stores.

Without the aux term, for sqrtsoftplus and sigmoid, dL/dl is zero wherever dL/du is: step 3 writes the
chain-ruled value of the named experts (their score is the gathered one) and the scores row is not read at all,
so the kernel moves the output and the slots only. The aux term and softmax need the whole row (its sums).
Row sums are warp shuffles in a fixed pattern. One token per warp makes the whole-row kernel instruction-bound:
the configuration caps registers (`min_blocks`) so that more warps fit an SM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.
from ._scoring import WEIGHT_SUM_EPS
from ._scoring_grad import cuda_sqrtsoftplus_grad, reads_scores_row

WARP = 32


def cuda_row_floats(num_experts: int, vector: int, scoring_func: str, aux: bool) -> int:
    """Floats of the row a lane keeps in registers from step 1 to step 4: its scores (whole row) and h (aux)."""
    per_row = -(-num_experts // (WARP * vector)) * vector
    return per_row * ((1 if reads_scores_row(aux, scoring_func) else 0) + (1 if aux else 0))


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
    def zero_lane_experts(route, warp, lane):
        for c in T.unroll(chunks):
            e0 = c * span + lane * V
            if not ragged or e0 < E:
                for j in T.vectorized(V):
                    route[warp, e0 + j] = 0.0

    @T.macro
    def add_aux(grad_u, h, c, inside, inv_total, aux_dot):
        """The aux term of chunk c's vector, for tokens inside the mask: (h - <h, u> / sum(u)) / sum(u)."""
        if inside:
            for j in T.unroll(V):
                grad_u[j] = grad_u[j] + (h[c * V + j] * inv_total - (aux_dot * inv_total) * inv_total)

    @T.macro
    def body(scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, grad_logits, scale):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            # A warp's shared slots and row are its own: warp barriers (below) order them, no block-wide barriers.
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            if cfg.min_blocks:
                T.annotate_min_blocks_per_sm(cfg.min_blocks)
            tid = T.get_thread_binding()
            warp = tid // WARP
            lane = tid % WARP
            row = block * warps + warp
            slot_expert = T.alloc_shared((warps, K), i32)  # step 3's duplicate search where K > 32
            slot_delta = T.alloc_shared((warps, K), f32)
            route = T.alloc_shared((warps, E), f32)  # the token's dL/du before the aux term
            # Lane k's slots k + 32 s: expert (-1: masked), score u[expert], g and g * w (0 where masked).
            expert = T.alloc_local((slot_rounds,), i32)
            score = T.alloc_local((slot_rounds,), f32)
            grad = T.alloc_local((slot_rounds,), f32)
            weighted = T.alloc_local((slot_rounds,), f32)
            topk_sum = T.alloc_var(f32)
            dot = T.alloc_var(f32)
            acc = T.alloc_var(f32)
            first = T.alloc_var(i32)
            index = T.alloc_var(T.int64)
            # 1. The slots (a warp past the last token holds masked slots), and the row.
            for s in T.unroll(slot_rounds):
                k = lane + s * WARP
                expert[s] = -1
                score[s] = 0.0
                grad[s] = 0.0
                weighted[s] = 0.0
                if row < num_tokens and k < K:
                    index = topk_idx[row, k]
                    if index >= 0 and index < E:
                        expert[s] = T.cast(index, i32)
                        grad[s] = grad_topk_weights[row, k]
                        weighted[s] = grad[s] * topk_weights[row, k]
                        if not whole_row:
                            score[s] = scores[row, index]
                if slot_rounds > 1 and k < K:
                    slot_expert[warp, k] = expert[s]
            if not whole_row:
                zero_lane_experts(route, warp, lane)
            if whole_row:
                # The row into registers and into the warp's shared row (step 2 reads the slots' scores there),
                # with the aux term's h and mask: no load depends on another.
                u = T.alloc_local((chunks * V,), f32)
                if aux:
                    h = T.alloc_local((chunks * V,), f32)
                    inside = T.alloc_var(T.bool)
                    seq = T.alloc_var(i32)
                if row < num_tokens:
                    if aux:  # both non-negative: a truncating division, once
                        seq = T.truncdiv(row, T.truncdiv(num_tokens, num_seqs))
                    for c in T.unroll(chunks):
                        e0 = c * span + lane * V
                        if not ragged or e0 < E:
                            for j in T.vectorized(V):
                                u[c * V + j] = scores[row, e0 + j]
                            for j in T.vectorized(V):
                                route[warp, e0 + j] = u[c * V + j]
                            if aux:
                                for j in T.vectorized(V):
                                    h[c * V + j] = grad_scores_sum[seq, e0 + j]
                        else:
                            for j in T.unroll(V):
                                u[c * V + j] = 0.0
                                if aux:
                                    h[c * V + j] = 0.0
                    if aux:
                        inside = mask[row]
            T.sync_warp()
            # 2. D and <g, w> in slot order, by shuffles (every lane alike; a masked slot adds +0, which leaves the
            # sums' bits as skipping it would: they start at +0), then lane k's slot delta.
            if whole_row:
                for s in T.unroll(slot_rounds):
                    if expert[s] >= 0:
                        score[s] = route[warp, expert[s]]
            topk_sum = T.float32(0.0)
            dot = T.float32(0.0)
            for k in T.unroll(K):
                topk_sum = topk_sum + T.shfl_sync(score[k // WARP], k % WARP)
                dot = dot + T.shfl_sync(weighted[k // WARP], k % WARP)
            topk_sum = topk_sum + T.float32(WEIGHT_SUM_EPS)
            if whole_row:
                T.sync_warp()  # every lane has read its slots' scores from the row before it is zeroed
                zero_lane_experts(route, warp, lane)
            for s in T.unroll(slot_rounds):
                k = lane + s * WARP
                if k < K:
                    slot_delta[warp, k] = T.if_then_else(expert[s] >= 0, (scale * grad[s] - dot) / topk_sum, 0.0)
            # 3. The first slot naming an expert sums, in slot order from +0, the deltas of all slots naming it.
            if slot_rounds == 1:
                # The lanes naming the lane's expert, in one warp vote (every lane takes part).
                same = T.alloc_var(T.uint32)
                same = T.match_any_sync(expert[0])
                T.sync_warp()
                below = (T.uint32(1) << T.cast(lane, T.uint32)) - T.uint32(1)  # the lanes of the earlier slots
                if row < num_tokens and expert[0] >= 0 and (same & below) == T.uint32(0):
                    acc = T.float32(0.0)
                    for j in T.unroll(K):
                        if ((same >> T.uint32(j)) & T.uint32(1)) != T.uint32(0):
                            acc = acc + slot_delta[warp, j]
                    if whole_row:
                        route[warp, expert[0]] = acc
                    else:  # the chain rule here: the score of the expert is the slot's
                        route[warp, expert[0]] = chain(acc, score[0])
            else:
                T.sync_warp()
                for s in T.unroll(slot_rounds):
                    k = lane + s * WARP
                    if row < num_tokens and k < K and expert[s] >= 0:
                        acc = T.float32(0.0)
                        first = 1
                        for j in T.unroll(K):
                            if slot_expert[warp, j] == expert[s]:
                                acc = acc + slot_delta[warp, j]
                                if j < k:
                                    first = 0
                        if first == 1:
                            if whole_row:
                                route[warp, expert[s]] = acc
                            else:
                                route[warp, expert[s]] = chain(acc, score[s])
            T.sync_warp()
            # 4. The lane's experts, a vector at a time (no row of dL/du in registers): dL/du back from the shared
            # row, the aux term, the chain rule, the store.
            if row < num_tokens:
                if aux:
                    score_total = T.alloc_var(f32)
                    aux_dot = T.alloc_var(f32)
                    inv_total = T.alloc_var(f32)
                    score_total = T.float32(0.0)
                    aux_dot = T.float32(0.0)
                    for i in T.unroll(chunks * V):
                        score_total = score_total + u[i]
                        aux_dot = aux_dot + h[i] * u[i]
                    score_total = T.warp_reduce_sum(score_total)
                    aux_dot = T.warp_reduce_sum(aux_dot)
                    inv_total = T.float32(1.0) / score_total
                grad_u = T.alloc_local((V,), f32)
                if func == 'softmax':
                    row_dot = T.alloc_var(f32)
                    row_dot = T.float32(0.0)
                # softmax: a first pass for <dL/du, u>, then the pass that stores; otherwise the storing pass only
                for storing in (False, True) if func == 'softmax' else (True,):
                    for c in T.unroll(chunks):
                        e0 = c * span + lane * V
                        if not ragged or e0 < E:
                            for j in T.vectorized(V):
                                grad_u[j] = route[warp, e0 + j]
                            if aux:
                                add_aux(grad_u, h, c, inside, inv_total, aux_dot)
                            if not storing:
                                for j in T.unroll(V):
                                    row_dot = row_dot + grad_u[j] * u[c * V + j]
                            else:
                                if func == 'softmax':
                                    for j in T.unroll(V):
                                        grad_u[j] = u[c * V + j] * (grad_u[j] - row_dot)
                                elif whole_row:
                                    for j in T.unroll(V):
                                        grad_u[j] = chain(grad_u[j], u[c * V + j])
                                for j in T.vectorized(V):
                                    grad_logits[row, e0 + j] = grad_u[j]
                    if not storing:
                        row_dot = T.warp_reduce_sum(row_dot)

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
