"""Ascend 950 kernel of moe_topk_gate_backward (math and configuration: moe_topk_gate_backward_kernel.py).

A persistent loop over tiles of `block_rows` tokens on the vector cores. Per tile: the scores rows, the int64
indices (as int32 pairs), the weights and their gradients (with the aux term: the mask bytes and the rows of
grad_scores_sum the tile's sequences need) land in UB. A scalar pass per token walks its K slots in order: the
slot's expert (-1 unless 0 <= index < E), the sums D and <g, w> and each slot's dL/du (UB arrays). Then one SIMD
pass per token and 64-expert register: dL/du as the sum of the slots that name each lane's expert (slot order, a
compare and select per slot: no scatter, no atomics), the aux term, the scoring function's chain rule (without
the aux term, for sqrtsoftplus and sigmoid, on the named experts' scores only: 0 elsewhere, as on CUDA).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.
from ._scoring import WEIGHT_SUM_EPS
from ._scoring_grad import ascend_sqrtsoftplus_grad, reads_scores_row

ASCEND_LANES = 64  # fp32 lanes of one 256-byte vector register
_ROW_ALIGN = 8  # 4-byte elements per 32 bytes: UB row pitch granule of the DMA


def _aligned(n: int, to: int) -> int:
    return -(-n // to) * to


def ascend_row_bytes(num_experts: int, num_topk: int, aux: bool) -> int:
    """UB bytes one token row takes in one buffer version (the chooser sizes tiles with it)."""
    experts = _aligned(num_experts, ASCEND_LANES)
    slots = _aligned(num_topk, _ROW_ALIGN)
    return 4 * (experts * (3 if aux else 2) + _aligned(2 * num_topk, _ROW_ALIGN) + 4 * slots) + (1 if aux else 0)


def ascend_moe_topk_gate_backward_kernel(cfg):
    """`cfg` is a MoeTopkGateBackwardConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32, i32 = T.float32, T.int32
    E, K, aux, func = cfg.num_experts, cfg.num_topk, cfg.aux, cfg.scoring_func
    rows_per_task, num_cores, stages = cfg.block_rows, cfg.num_cores, cfg.num_stages
    padded = _aligned(E, ASCEND_LANES)
    chunks = padded // ASCEND_LANES
    ragged = padded != E  # the last register holds lanes past the last expert: masked out of every sum
    idx_pitch = _aligned(2 * K, _ROW_ALIGN)
    slot_pitch = _aligned(K, _ROW_ALIGN)
    sqrtsoftplus_grad = ascend_sqrtsoftplus_grad()
    whole_row = reads_scores_row(aux, func)
    num_tokens = T.dynamic('num_tokens')
    num_seqs = T.dynamic('num_seqs')

    @T.macro
    def body(scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, grad_logits, scale):
        with T.Kernel(num_cores) as core_id:
            scores_ub = T.alloc_shared((rows_per_task, padded), f32)
            grad_ub = T.alloc_shared((rows_per_task, padded), f32)
            idx_ub = T.alloc_shared((rows_per_task, idx_pitch), i32)
            weights_ub = T.alloc_shared((rows_per_task, slot_pitch), f32)
            grad_weights_ub = T.alloc_shared((rows_per_task, slot_pitch), f32)
            slot_expert_ub = T.alloc_shared((rows_per_task, slot_pitch), i32)
            slot_grad_ub = T.alloc_shared((rows_per_task, slot_pitch), f32)
            idx_pairs = T.view(topk_idx, (num_tokens, 2 * K), i32)  # little-endian: low word first
            if aux:
                mask_ub = T.alloc_shared((_aligned(rows_per_task, 32),), T.bool)
                aux_grad_ub = T.alloc_shared((rows_per_task, padded), f32)
                seq_row_ub = T.alloc_shared((rows_per_task,), i32)  # the row of aux_grad_ub of each token
            for task in T.Persistent(
                [T.ceildiv(num_tokens, rows_per_task)], num_cores, core_id, group_size=1, num_stages=stages
            ):
                row0 = task * rows_per_task
                rows = T.min(rows_per_task, num_tokens - row0)
                T.copy(scores[row0 : row0 + rows, :], scores_ub[:rows, :E])
                T.copy(idx_pairs[row0 : row0 + rows, :], idx_ub[:rows, : 2 * K])
                T.copy(topk_weights[row0 : row0 + rows, :], weights_ub[:rows, :K])
                T.copy(grad_topk_weights[row0 : row0 + rows, :], grad_weights_ub[:rows, :K])
                if aux:
                    tokens_per_seq = num_tokens // num_seqs
                    seq0 = row0 // tokens_per_seq
                    seq_count = (row0 + rows - 1) // tokens_per_seq - seq0 + 1
                    T.copy(mask[row0 : row0 + rows], mask_ub[:rows])
                    T.copy(grad_scores_sum[seq0 : seq0 + seq_count, :], aux_grad_ub[:seq_count, :E])
                # The slots, token by token in slot order (scalar): D, <g, w>, each slot's dL/du.
                for r in T.serial(rows):
                    topk_sum = T.alloc_var(f32)
                    dot = T.alloc_var(f32)
                    topk_sum = T.float32(0.0)
                    dot = T.float32(0.0)
                    for k in T.serial(K):
                        low = idx_ub[r, 2 * k]
                        # 0 <= index < E: the high word 0 and the low word in range
                        valid = idx_ub[r, 2 * k + 1] == 0 and low >= 0 and low < E
                        slot_expert_ub[r, k] = T.if_then_else(valid, low, -1)
                        if valid:
                            topk_sum = topk_sum + scores_ub[r, low]
                            dot = dot + grad_weights_ub[r, k] * weights_ub[r, k]
                    topk_sum = topk_sum + T.float32(WEIGHT_SUM_EPS)
                    for k in T.serial(K):
                        slot_grad_ub[r, k] = T.if_then_else(
                            slot_expert_ub[r, k] >= 0, (scale * grad_weights_ub[r, k] - dot) / topk_sum, 0.0
                        )
                    if aux:
                        seq_row_ub[r] = (row0 + r) // tokens_per_seq - seq0
                with T.SimdVF():
                    lanes = S.vci(0, i32)
                    zero = S.vdup(0.0, f32)
                    for r in T.serial(rows):
                        if aux:
                            # sum(u) and <h, u> over the experts; the aux term only for tokens inside the mask.
                            score_total = S.alloc_var(f32)
                            aux_dot = S.alloc_var(f32)
                            score_total = zero
                            aux_dot = zero
                            for c in T.serial(chunks):
                                in_row = S.vcmps(S.vadds(lanes, c * ASCEND_LANES), E, op='lt')
                                u = S.vld(scores_ub[r, c * ASCEND_LANES])
                                h = S.vld(aux_grad_ub[seq_row_ub[r], c * ASCEND_LANES])
                                if ragged:
                                    u = S.vsel(u, zero, in_row)
                                    h = S.vsel(h, zero, in_row)
                                score_total = S.vadd(score_total, S.vcadd(u))
                                aux_dot = S.vadd(aux_dot, S.vcadd(S.vmul(h, u)))
                            inv_total = S.vdupv(S.vdiv(S.vdup(1.0, f32), score_total))
                            aux_bias = S.vmul(S.vmul(S.vdupv(aux_dot), inv_total), inv_total)
                            inside = S.vcmps(S.vdup(T.cast(mask_ub[r], i32), i32), 0, op='ne')
                        if func == 'softmax':
                            row_dot = S.alloc_var(f32)
                            row_dot = zero
                        for c in T.serial(chunks):
                            experts = S.vadds(lanes, c * ASCEND_LANES)
                            grad_u = S.alloc_var(f32)
                            grad_u = zero
                            u = S.vld(scores_ub[r, c * ASCEND_LANES])
                            if not whole_row:  # the named experts' scores, 0 elsewhere (reads_scores_row)
                                named_u = S.alloc_var(f32)
                                named_u = zero
                            for k in T.serial(K):
                                hit = S.vcmps(experts, slot_expert_ub[r, k], op='eq')
                                grad_u = S.vadd(grad_u, S.vsel(S.vdup(slot_grad_ub[r, k], f32), zero, hit))
                                if not whole_row:
                                    named_u = S.vsel(u, named_u, hit)
                            if not whole_row:
                                u = named_u
                            if aux:
                                h = S.vld(aux_grad_ub[seq_row_ub[r], c * ASCEND_LANES])
                                term = S.vsub(S.vmul(h, inv_total), aux_bias)
                                grad_u = S.vadd(grad_u, S.vsel(term, zero, inside))
                            if func == 'sqrtsoftplus':
                                S.vsts(grad_ub[r, c * ASCEND_LANES], S.vmul(grad_u, sqrtsoftplus_grad(u)))
                            elif func == 'sigmoid':
                                S.vsts(
                                    grad_ub[r, c * ASCEND_LANES], S.vmul(grad_u, S.vmul(u, S.vsub(S.vdup(1.0, f32), u)))
                                )
                            else:
                                S.vsts(grad_ub[r, c * ASCEND_LANES], grad_u)
                                in_row = S.vcmps(experts, E, op='lt')
                                row_dot = S.vadd(row_dot, S.vcadd(S.vmul(grad_u, u), in_row))
                        if func == 'softmax':
                            # dl = u * (du - <du, u>): a second pass over the stored du.
                            S.mem_bar('VST_VLD')
                            row_dot_all = S.vdupv(row_dot)
                            for c in T.serial(chunks):
                                grad_u = S.vld(grad_ub[r, c * ASCEND_LANES])
                                u = S.vld(scores_ub[r, c * ASCEND_LANES])
                                S.vsts(grad_ub[r, c * ASCEND_LANES], S.vmul(u, S.vsub(grad_u, row_dot_all)))
                T.copy(grad_ub[:rows, :E], grad_logits[row0 : row0 + rows, :])

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
