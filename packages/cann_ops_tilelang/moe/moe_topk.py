"""moe_topk: the stable top-k experts of each token, scores (T, E) fp32 -> topk_idx (T, K) int64
(TileKernels 2.1.0's `topk_gate`)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, scalar, tensor
from cann_ops_tilelang.validation import ALIGN_BYTES

from .moe_topk_kernel import MAX_ELEMENTS, check_topk_sizes, choose_moe_topk_config, get_moe_topk_kernel


def _limits(name, T, E):
    if T * E > MAX_ELEMENTS:
        raise ValueError(f'{name}: scores must have at most {MAX_ELEMENTS} elements (int32 offsets), got {T} x {E}')


def _check_topk(name, scores, num_topk):
    check_topk_sizes(name, scores.shape[1], num_topk)


# The contract, checked in the mechanism's order: types and dtypes (TypeError), layouts and sizes (ValueError),
# the out= buffer, then the device (RuntimeError: an Ascend NPU or a CUDA GPU, every tensor on one device).
OP = Operator(
    'moe_topk',
    tensor('scores', torch.float32, 'T, E'),
    scalar('num_topk', 'int'),
    out('out', torch.int64, 'T, num_topk'),
    limits=_limits,
    extra=_check_topk,
    choice=lambda scores, num_topk: {
        'num_experts': scores.shape[1],
        'num_topk': num_topk,
        'aligned': scores.data_ptr() % ALIGN_BYTES == 0,
    },
    choose_config=choose_moe_topk_config,
    get_kernel=get_moe_topk_kernel,
)


def _eager(scores, num_topk, out):
    """A call on real tensors (also the kernel of the torch.library forms): every check, then the launch. Fast
    path, without out=: by (E, K, the alignment of scores, CUDA index); T = 0 takes the checked path and launches
    nothing."""
    args = (scores, num_topk, out)
    key = None
    if out is None:
        shape = OP.fast_ok(*args)
        if shape is not None and shape[0]:
            key = (shape[1], num_topk, scores.data_ptr() % ALIGN_BYTES == 0, scores.get_device())
    launcher, fast = OP.prepare(key, args)
    result = scores.new_empty(scores.shape[0], num_topk, dtype=torch.int64) if out is None else out
    OP.finish(launcher, fast, key, (scores, result), args, empty=not scores.shape[0])
    return result


def _fake(scores, num_topk, out):
    """While torch traces (after the checks that need no memory): what `_eager` returns."""
    return scores.new_empty(scores.shape[0], num_topk, dtype=torch.int64)


@OP.public(_eager, returns='Tensor', fake=_fake)
def moe_topk(scores: torch.Tensor, num_topk: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The num_topk experts of each token in descending order of score, ties to the lower expert index:

        topk_idx[t] = torch.sort(scores[t], descending=True, stable=True).indices[:num_topk]

    with two rules the sort leaves open: -0.0 equals +0.0, and a NaN ranks below every number, -inf included
    (NaNs among themselves by index). No host sync and no device assert: a NaN is a value like any other.

    Args:
        scores: (T, E) fp32, contiguous, 1 <= E <= 512, T >= 0 (T = 0: an empty result, no launch),
            T * E < 2**31.
        num_topk: K, 1 <= K <= min(E, 32) (one lane of a warp per result).
        out: optional (T, K) int64 buffer, contiguous, on scores' device, not overlapping scores.

    Returns:
        topk_idx (T, K) int64 (`out` when given), each row K distinct expert indices.
    """
