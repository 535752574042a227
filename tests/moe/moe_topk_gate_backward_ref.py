"""PyTorch references of moe_topk_gate_backward: the float64 oracle of its tests, and the forward math it is the
gradient of (its tests check the oracle against torch.autograd through that forward).

Tests only; never imported at run time.
"""

import torch

WEIGHT_SUM_EPS = 1e-20  # the operator's guard, restated here so that a change to it fails the tests


def scoring_ref(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """u = scoring_func(logits), float64 (differentiable)."""
    logits = logits.double()
    if scoring_func == 'sqrtsoftplus':
        return torch.nn.functional.softplus(logits).sqrt()
    if scoring_func == 'sigmoid':
        return torch.sigmoid(logits)
    if scoring_func == 'softmax':
        return torch.softmax(logits, dim=-1)
    raise ValueError(scoring_func)


def _valid(topk_idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    return (topk_idx >= 0) & (topk_idx < num_experts)


def routed_weights_ref(scores, topk_idx, routed_scaling_factor):
    """The forward's w_k = s * u[idx_k] / (sum over valid slots of u[idx_k] + 1e-20), 0 on a masked slot."""
    valid = _valid(topk_idx, scores.shape[1])
    chosen = scores.gather(1, topk_idx.clamp(0, scores.shape[1] - 1)) * valid
    return routed_scaling_factor * chosen / (chosen.sum(dim=1, keepdim=True) + WEIGHT_SUM_EPS)


def aux_sums_ref(scores, mask, num_seqs):
    """The aux loss's per-sequence sums over the masked-in tokens of u / sum(u): (S, E)."""
    normalized = scores / scores.sum(dim=1, keepdim=True) * mask[:, None]
    return normalized.reshape(num_seqs, -1, scores.shape[1]).sum(dim=1)


def forward_loss_ref(logits, topk_idx, routed_scaling_factor, scoring_func, grad_topk_weights, mask=None,
                     grad_scores_sum=None):  # fmt: skip
    """A scalar whose gradient with respect to logits is what the operator computes: <w, g> plus, with the aux
    term, <aux sums, h>."""
    scores = scoring_ref(logits, scoring_func)
    loss = (routed_weights_ref(scores, topk_idx, routed_scaling_factor) * grad_topk_weights.double()).sum()
    if grad_scores_sum is not None:
        loss = loss + (aux_sums_ref(scores, mask, grad_scores_sum.shape[0]) * grad_scores_sum.double()).sum()
    return loss


def moe_topk_gate_backward_ref(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor,
                               scoring_func='sqrtsoftplus', mask=None, grad_scores_sum=None):  # fmt: skip
    """grad_logits in float64, from the formulas (not autograd): the route term scattered with duplicates adding
    up, the aux term where mask, the scoring function's derivative written in u."""
    u = scores.double()
    num_tokens, num_experts = u.shape
    valid = _valid(topk_idx, num_experts)
    idx = topk_idx.clamp(0, num_experts - 1)
    g = grad_topk_weights.double() * valid
    w = topk_weights.double() * valid
    topk_sum = (u.gather(1, idx) * valid).sum(dim=1, keepdim=True) + WEIGHT_SUM_EPS
    route = (routed_scaling_factor * g - (g * w).sum(dim=1, keepdim=True)) / topk_sum * valid
    grad_u = torch.zeros_like(u).scatter_add_(1, idx, route)
    if grad_scores_sum is not None:
        h = grad_scores_sum.double().repeat_interleave(num_tokens // grad_scores_sum.shape[0], dim=0)
        total = u.sum(dim=1, keepdim=True)
        term = (h - (h * u).sum(dim=1, keepdim=True) / total) / total
        grad_u = grad_u + torch.where(mask[:, None], term, 0.0)
    if scoring_func == 'sqrtsoftplus':
        return grad_u * torch.where(u > 0, -torch.expm1(-u * u) / (2 * u), 0.0)
    if scoring_func == 'sigmoid':
        return grad_u * u * (1 - u)
    return u * (grad_u - (grad_u * u).sum(dim=1, keepdim=True))
