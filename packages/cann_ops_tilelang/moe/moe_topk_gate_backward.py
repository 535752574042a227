"""moe_topk_gate_backward: the router's logit gradient from its top-k weights' gradient (TileKernels'
`moe_topk_gate_backward`), for the sqrtsoftplus, sigmoid and softmax scoring functions."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, scalar, tensor

from ._scoring import SCORING_FUNCS  # the forward's (moe_topk_gate) scoring functions
from .moe_topk_gate_backward_kernel import (
    MAX_EXPERTS,
    MAX_TOPK,
    choose_moe_topk_gate_backward_config,
    get_moe_topk_gate_backward_kernel,
)

# The kernels index a (T, E) tensor with int32.
MAX_ELEMENTS = 2**31 - 1


def _check_sizes(name, T, E, K):
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f'{name}: scores must have 1..{MAX_EXPERTS} columns (routed experts), got {E}')
    if not 1 <= K <= min(E, MAX_TOPK):
        raise ValueError(f'{name}: topk_idx must have 1..min(num_experts, {MAX_TOPK}) = {min(E, MAX_TOPK)} columns, '
                         f'got {K}')  # fmt: skip
    if T * E > MAX_ELEMENTS:
        raise ValueError(f'{name}: scores must have at most {MAX_ELEMENTS} elements, got {T} x {E}')


def _check_options(name, scoring_func, mask, grad_scores_sum, T, E):
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f'{name}: scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}')
    if (mask is None) != (grad_scores_sum is None):
        raise ValueError(f'{name}: mask and grad_scores_sum must be given together or both be None')
    if grad_scores_sum is None:
        return
    if grad_scores_sum.dim() != 2 or grad_scores_sum.shape[1] != E or grad_scores_sum.shape[0] < 1:
        raise ValueError(f'{name}: grad_scores_sum must have shape (num_seqs, {E}) with num_seqs >= 1, '
                         f'got {tuple(grad_scores_sum.shape)}')  # fmt: skip
    if T % grad_scores_sum.shape[0]:
        raise ValueError(f'{name}: the token count {T} must be a multiple of num_seqs = {grad_scores_sum.shape[0]} '
                         '(the rows of grad_scores_sum)')  # fmt: skip


OP = Operator(
    'moe_topk_gate_backward',
    tensor('scores', torch.float32, 'T, E'),
    tensor('topk_idx', torch.int64, 'T, K'),
    tensor('topk_weights', torch.float32, 'T, K'),
    tensor('grad_topk_weights', torch.float32, 'T, K'),
    scalar('routed_scaling_factor', 'float'),
    scalar('scoring_func', 'str'),
    tensor('mask', torch.bool, 'T', optional=True),
    tensor('grad_scores_sum', torch.float32, optional=True),  # (S, E): its shape rules are _check_options'
    out('out', torch.float32, 'T, E'),
    limits=_check_sizes,
    extra=_check_options,
    choice=lambda scores, topk_idx, scoring_func, grad_scores_sum: {
        'num_experts': scores.shape[1],
        'num_topk': topk_idx.shape[1],
        'scoring_func': scoring_func,
        'aux': grad_scores_sum is not None,
    },
    choose_config=choose_moe_topk_gate_backward_config,
    get_kernel=get_moe_topk_gate_backward_kernel,
)


def _divides(grad_scores_sum, num_tokens) -> bool:
    return grad_scores_sum.dim() == 2 and grad_scores_sum.shape[0] > 0 and num_tokens % grad_scores_sum.shape[0] == 0


def _eager(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask,
           grad_scores_sum, out):  # fmt: skip
    """Every check, then the launch (also the torch.library ops' kernel). Fast path, without out=: by (E, K,
    scoring_func, aux, CUDA index); an empty input takes the checked path and launches nothing."""
    args = (scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask,
            grad_scores_sum, out)  # fmt: skip
    key = None
    if out is None:
        shape = OP.fast_ok(*args)
        aux = grad_scores_sum is not None
        # The compiled entry checks dtypes and shapes, not that S divides T: that call takes the checked path.
        if shape is not None and shape[0] and (not aux or _divides(grad_scores_sum, shape[0])):
            key = (shape[1], topk_idx.shape[-1], scoring_func, aux, mask is not None, scores.get_device())
    launcher, fast = OP.prepare(key, args)
    result = scores.new_empty(scores.shape) if out is None else out
    if grad_scores_sum is None:
        launch_args = (scores, topk_idx, topk_weights, grad_topk_weights, result, float(routed_scaling_factor))
    else:
        launch_args = (scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, result,
                       float(routed_scaling_factor))  # fmt: skip
    OP.finish(launcher, fast, key, launch_args, args, empty=not scores.shape[0])
    return result


@OP.public(_eager, returns='Tensor', fake=lambda scores, *_: scores.new_empty(scores.shape))
def moe_topk_gate_backward(
    scores: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    grad_topk_weights: torch.Tensor,
    routed_scaling_factor: float,
    scoring_func: str = 'sqrtsoftplus',
    mask: torch.Tensor | None = None,
    grad_scores_sum: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gradient of the router's logits (TileKernels 2.1.0's `moe_topk_gate_backward`, with more scoring
    functions). With u = scores[t], the valid slots k (0 <= topk_idx[t, k] < E; -1, and any index outside the
    range, is a masked slot that contributes nothing), D = sum_k u[idx_k] + 1e-20, s = routed_scaling_factor,
    g = grad_topk_weights[t], w = topk_weights[t] (the forward's s * u[idx_k] / D):

        dL/du[e] = sum over the slots k naming e of (s * g_k - <g, w>) / D      (duplicates add up, slot order)
        with mask and grad_scores_sum h:  dL/du += (h[seq] - <h[seq], u> / sum(u)) / sum(u)  where mask[t],
            seq = t // (T / S)  (the gradient of the aux loss's per-sequence sums of u / sum(u))
        grad_logits = the chain rule through scoring_func, from u alone:
            'sqrtsoftplus' (u = sqrt(softplus(l))): du/dl = (1 - exp(-u^2)) / (2u), 0 at u = 0 (a series for small u)
            'sigmoid' (u = sigmoid(l)): du/dl = u (1 - u)
            'softmax' (u = softmax(l) over the E experts): dl = u * (du - <du, u>)
        Without the aux term, for sqrtsoftplus and sigmoid, an expert that no valid slot names gets exactly 0,
        whatever its score (dL/du is 0 there; the score is not read).

    Deterministic: no atomics; the same inputs give the same bits run to run, and the route term is summed in
    the same order on both backends.

    Args:
        scores: (T, E) fp32, contiguous: the forward's scores u (without bias). E in 1..512. T >= 0 (T = 0: an empty
            result, no launch), T * E < 2**31.
        topk_idx: (T, K) int64, contiguous: the logical routed experts, -1 for a masked slot. K in 1..min(E, 64)
            (the peer: up to 32).
        topk_weights, grad_topk_weights: (T, K) fp32, contiguous: the forward's routed weights and their gradient.
        routed_scaling_factor: a finite float.
        scoring_func: 'sqrtsoftplus' (default), 'sigmoid' or 'softmax' (ValueError otherwise).
        mask: optional (T,) bool, contiguous: the tokens the aux loss counts (True). Given with grad_scores_sum.
        grad_scores_sum: optional (S, E) fp32, contiguous: the gradient of the aux loss's per-sequence sums; S >= 1
            divides T. Given with mask (ValueError when only one is).
        out: optional (T, E) fp32 buffer, contiguous, on the same device, not overlapping the inputs.

    Returns:
        grad_logits (T, E) fp32 (`out` when given). Non-finite inputs are not checked (no host sync, no device-side
        check): they stay within their token's row, where IEEE arithmetic takes them (a NaN or inf score of a
        chosen expert makes D, and so the row's routed gradient, NaN or 0; an inf gradient gives inf or NaN).
        The other tokens' rows are unaffected.
    """
