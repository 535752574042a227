"""PyTorch references of moe_normalize_weight: the float64 oracle of its tests, and the kernels' fp32 order.

Tests only; never imported at run time.
"""

import torch

WEIGHT_SUM_EPS = 1e-20  # the operator's guard, restated here so that a change to it fails the tests


def moe_normalize_weight_ref(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(denominator, topk_weights / denominator) in float64, denominator = sum over k + 1e-20."""
    weights = topk_weights.double()
    denominator = weights.sum(dim=1) + WEIGHT_SUM_EPS
    return denominator, weights / denominator[:, None]


def moe_normalize_weight_fp32_ref(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' fp32 arithmetic step by step: the binary tree of sums over k (positions 2i and 2i + 1, then
    pairs of those; zero padding to a power of two), + 1e-20, one IEEE division per element."""
    tree = topk_weights.float().cpu()
    width = 1 << (tree.shape[1] - 1).bit_length()
    tree = torch.nn.functional.pad(tree, (0, width - tree.shape[1]))
    while tree.shape[1] > 1:
        tree = tree[:, 0::2] + tree[:, 1::2]
    denominator = tree[:, 0] + torch.tensor(WEIGHT_SUM_EPS, dtype=torch.float32)
    return denominator, topk_weights.float().cpu() / denominator[:, None]
