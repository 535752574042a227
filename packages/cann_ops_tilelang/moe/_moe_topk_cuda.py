"""CUDA kernel of moe_topk (configuration and semantics: moe_topk_kernel.py).

`rows` warps per thread block, one row each: lane l loads its chunks of `vector` consecutive scores straight
into registers (16-byte loads where vector is 4, the warp's loads of a chunk contiguous), turns them into
order keys, runs the shared selection (_topk_select.py) and lane k stores the k-th index.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

from ._topk_select import KEY_TAKEN, WARP, make_select


def cuda_moe_topk_kernel(cfg):
    """`cfg` is a MoeTopkConfig (backend "cuda")."""
    import tilelang.language as T

    E, K, rows, vector, slots = cfg.num_experts, cfg.num_topk, cfg.rows, cfg.vector, cfg.slots
    order_key, slot_expert, select_topk = make_select(T)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def moe_topk_kernel(
        scores: T.Tensor((num_tokens, E), T.float32),
        topk_idx: T.Tensor((num_tokens, K), T.int64),
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows), threads=WARP * rows) as bx:
            tid = T.get_thread_binding()
            row = bx * rows + tid // WARP
            lane = tid % WARP
            values = T.alloc_local((slots,), T.float32)
            keys = T.alloc_local((slots,), T.int32)
            chosen = T.alloc_local((1,), T.int32)
            if row < num_tokens:  # the whole warp shares the row: its reductions stay uniform
                for c in T.unroll(slots // vector):
                    first = slot_expert(c * vector, lane, vector)
                    if first < E:  # vector divides E: a chunk is wholly in or out
                        for v in T.vectorized(vector):
                            values[c * vector + v] = scores[row, first + v]
                        for v in T.unroll(vector):
                            keys[c * vector + v] = order_key(values[c * vector + v])
                    else:
                        for v in T.unroll(vector):
                            keys[c * vector + v] = T.int32(KEY_TAKEN)
                select_topk(keys, slots, vector, K, lane, chosen)
                if lane < K:
                    topk_idx[row, lane] = T.cast(chosen[0], T.int64)

    return moe_topk_kernel
