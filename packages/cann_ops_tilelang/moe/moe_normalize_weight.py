"""moe_normalize_weight: a token's top-k routing weights divided by their sum (TileKernels' `normalize_weight`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, outs, tensor

from .moe_normalize_weight_kernel import (
    MAX_TOPK,
    choose_moe_normalize_weight_config,
    get_moe_normalize_weight_kernel,
)

# The kernels index a (T, K) tensor with int32.
MAX_ELEMENTS = 2**31 - 1


class NormalizedWeights(NamedTuple):
    """What moe_normalize_weight returns (a tuple, as TileKernels' (denominator, normalized_weights))."""

    denominator: torch.Tensor
    normalized_weights: torch.Tensor


def _check_sizes(name, T, K):
    if not 1 <= K <= MAX_TOPK:
        raise ValueError(f'{name}: topk_weights must have 1..{MAX_TOPK} columns (top-k), got {K}')
    if T * K > MAX_ELEMENTS:
        raise ValueError(f'{name}: topk_weights must have at most {MAX_ELEMENTS} elements, got {T} x {K}')


OP = Operator(
    'moe_normalize_weight',
    tensor('topk_weights', torch.float32, 'T, K'),
    outs('out', 'denominator', 'normalized_weights'),
    limits=_check_sizes,
    results=lambda topk_weights: (
        ((topk_weights.shape[0],), torch.float32),
        (tuple(topk_weights.shape), torch.float32),
    ),
    choice=lambda topk_weights: {'num_topk': topk_weights.shape[1]},  # one launcher per device, backend and K
    choose_config=choose_moe_normalize_weight_config,
    get_kernel=get_moe_normalize_weight_kernel,
)


def _eager(topk_weights, out):
    """Every check, then the launch (also the torch.library ops' kernel). Fast path, without out=: by (K, CUDA
    index); an empty input takes the checked path and launches nothing."""
    key = None
    if out is None:
        shape = OP.fast_ok(topk_weights, out)
        if shape is not None and shape[0]:
            key = (shape[1], topk_weights.get_device())
    launcher, fast = OP.prepare(key, (topk_weights, out))
    if out is None:
        denominator = topk_weights.new_empty(topk_weights.shape[:1])
        normalized = topk_weights.new_empty(topk_weights.shape)
    else:
        denominator, normalized = out
    args = (topk_weights, out)
    OP.finish(launcher, fast, key, (topk_weights, denominator, normalized), args, empty=not topk_weights.shape[0])
    return NormalizedWeights(denominator, normalized)


@OP.public(_eager, result=NormalizedWeights)
def moe_normalize_weight(
    topk_weights: torch.Tensor, *, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> NormalizedWeights:
    """Normalise each token's top-k weights to sum to one (TileKernels 2.1.0's `normalize_weight`):

        denominator[t] = sum_k topk_weights[t, k] + 1e-20
        normalized_weights[t, k] = topk_weights[t, k] / denominator[t]

    The sum is a binary tree over k (positions 2i and 2i + 1, then pairs of those), the same on both backends;
    the quotient one IEEE fp32 division.

    Args:
        topk_weights: (T, K) fp32, contiguous, on an Ascend NPU or a CUDA GPU; T >= 0 (T = 0: empty results, no
            launch), K in 1..64 (the peer: up to 32; the Ascend kernel holds a row in one 64-lane vector
            register), T * K < 2**31 (int32 indices). Any values: a row of zeros gives denominator 1e-20 and
            weights 0; a NaN in a row makes its denominator and all its weights NaN; an inf (and no NaN) gives
            denominator inf, weights 0 for the finite entries and NaN for the inf ones; no sign is required
            (a sum near zero gives large weights).
        out: optional (denominator, normalized_weights) buffers, (T,) and (T, K) fp32, contiguous, on the same
            device, not overlapping topk_weights or each other.

    Returns:
        NormalizedWeights(denominator (T,), normalized_weights (T, K)), fp32 (the buffers of `out` when given).
    """
