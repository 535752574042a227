"""PyTorch reference of mhc_sinkhorn_fwd: the correctness oracle of its tests (never imported by runtime code).

Computed in float64 from the fp32 logits, so that the kernels' fp32 rounding is the only difference.
"""

import torch


def mhc_sinkhorn_fwd_ref(comb_res_mix: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """Sinkhorn of each (..., m, m) matrix: row softmax + eps, a column step, then repeat - 1 (row, column) steps,
    each dividing by the sums + eps. float64 in, float64 out (autograd flows through it)."""
    x = comb_res_mix.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x
