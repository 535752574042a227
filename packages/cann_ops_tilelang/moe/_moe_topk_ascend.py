"""Ascend 950 kernel of moe_topk (configuration and semantics: moe_topk_kernel.py).

A persistent loop over blocks of `rows` rows on the vector cores: the block's scores GM -> UB in one DMA (rows
padded to 32 experts in UB, the padding never read), a SIMT VF of 32 * rows threads running the shared selection
(_topk_select.py) one row per 32 threads, lane k writing the k-th index to UB, then UB -> GM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

from ._topk_select import KEY_TAKEN, WARP, make_select


def ascend_moe_topk_kernel(cfg):
    """`cfg` is a MoeTopkConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    E, K, rows, slots = cfg.num_experts, cfg.num_topk, cfg.rows, cfg.slots
    num_cores, stages = cfg.num_cores, cfg.num_stages
    order_key, slot_expert, select_topk = make_select(T)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def moe_topk_kernel(
        scores: T.Tensor((num_tokens, E), T.float32),
        topk_idx: T.Tensor((num_tokens, K), T.int64),
    ):
        with T.Kernel(num_cores) as core_id:
            scores_ub = T.alloc_shared((rows, slots * WARP), T.float32)
            idx_ub = T.alloc_shared((rows, K), T.int64)
            for block in T.Persistent([T.ceildiv(num_tokens, rows)], num_cores, core_id, group_size=1,
                                      num_stages=stages):  # fmt: skip
                start = block * rows
                count = T.min(rows, num_tokens - start)
                T.copy(scores[start : start + count, :], scores_ub[0:count, 0:E])
                with T.SimtVF(threads=WARP * rows):
                    tid = T.get_thread_binding(0)
                    row = tid // WARP
                    lane = tid % WARP
                    keys = T.alloc_local((slots,), T.int32)
                    chosen = T.alloc_local((1,), T.int32)
                    if row < count:  # the 32 threads of a row agree: their reductions stay uniform
                        for i in T.unroll(slots):
                            expert = slot_expert(i, lane, 1)
                            keys[i] = T.int32(KEY_TAKEN)
                            if expert < E:
                                keys[i] = order_key(scores_ub[row, expert])
                        select_topk(keys, slots, 1, K, lane, chosen)
                        if lane < K:
                            idx_ub[row, lane] = T.cast(chosen[0], T.int64)
                T.copy(idx_ub[0:count, :], topk_idx[start : start + count, :])

    return moe_topk_kernel
