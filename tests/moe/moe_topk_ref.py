"""PyTorch reference of moe_topk: the correctness oracle of its tests (exact: a selection, no arithmetic).

Never imported by runtime code.
"""

import torch


def stable_topk_ref(values: torch.Tensor, num_topk: int, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """(T, K) int64: each row's indices in descending order of value, ties to the lower index (a stable sort),
    -0.0 equal to +0.0, every NaN below every number and the NaNs among themselves by index; `excluded`
    (bool, values' shape) entries rank behind all others."""
    nan = values.isnan()
    order = torch.sort(values.masked_fill(nan, -torch.inf), dim=1, descending=True, stable=True).indices
    # Further stable sorts move the NaNs, then the excluded entries, behind the others, keeping each group's order.
    for last in (nan, excluded):
        if last is not None:
            order = order.gather(1, torch.sort(last.gather(1, order).to(torch.int8), dim=1, stable=True).indices)
    return order.new_empty((values.shape[0], num_topk)).copy_(order[:, :num_topk])  # row-major strides


def moe_topk_ref(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """topk_idx of moe_topk(scores, num_topk), computed in float64 (exact for fp32 scores)."""
    return stable_topk_ref(scores.double(), num_topk)
