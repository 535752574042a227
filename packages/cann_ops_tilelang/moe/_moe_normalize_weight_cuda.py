"""CUDA kernel of moe_normalize_weight (math and configuration: moe_normalize_weight_kernel.py).

One thread per token row, `block_rows` rows per thread block: a warp reads 32 consecutive rows, one contiguous
span (coalesced), each thread its K floats in registers; the sum is the Ascend kernel's tree (pairs of
positions, then pairs of pairs), over the row zero-padded to a power of two (+0 changes no sum).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.
from ._scoring import WEIGHT_SUM_EPS


def cuda_moe_normalize_weight_kernel(cfg):
    """`cfg` is a MoeNormalizeWeightConfig (backend "cuda")."""
    import tilelang.language as T

    f32 = T.float32
    num_topk, threads = cfg.num_topk, cfg.block_rows
    levels = (num_topk - 1).bit_length()
    width = 1 << levels  # the tree's leaves
    # Vector loads and stores where K allows (pairs at least: a row starts 8-byte aligned), else element by element.
    row_loop = T.vectorized if num_topk % 2 == 0 else T.unroll
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def moe_normalize_weight_kernel(
        topk_weights: T.Tensor((num_tokens, num_topk), f32),
        denominator: T.Tensor((num_tokens,), f32),
        normalized_weights: T.Tensor((num_tokens, num_topk), f32),
    ):
        with T.Kernel(T.ceildiv(num_tokens, threads), threads=threads) as block:
            row = block * threads + T.get_thread_binding()
            weights = T.alloc_local((num_topk,), f32)
            tree = T.alloc_local((width,), f32)
            total = T.alloc_var(f32)
            if row < num_tokens:
                for k in row_loop(num_topk):
                    weights[k] = topk_weights[row, k]
                for k in T.unroll(width):
                    tree[k] = T.if_then_else(k < num_topk, weights[T.min(k, num_topk - 1)], T.float32(0.0))
                for level in T.unroll(levels):
                    for i in T.unroll(width // 2):
                        if i < (width >> (level + 1)):
                            tree[(2 * i) << level] = tree[(2 * i) << level] + tree[((2 * i + 1) << level)]
                total = tree[0] + T.float32(WEIGHT_SUM_EPS)
                denominator[row] = total
                for k in row_loop(num_topk):
                    normalized_weights[row, k] = weights[k] / total

    return moe_normalize_weight_kernel
