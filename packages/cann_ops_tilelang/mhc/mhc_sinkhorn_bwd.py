"""mhc_sinkhorn_bwd: the gradient of mhc_sinkhorn_fwd at its logits, through every iteration, recomputing the
forward's iterates (TileKernels 2.1.0's call); deterministic."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from .mhc_sinkhorn_fwd import check_matrices, check_repeat
from .mhc_sinkhorn_kernel import MAX_REPEAT, choose_mhc_sinkhorn_config, get_mhc_sinkhorn_kernel


def _extra(name, x, repeat):
    check_matrices(name, 'x', x)
    check_repeat(name, repeat, MAX_REPEAT)  # the kernels keep 2 * repeat - 1 iterates per token on chip


OP = Operator(
    'mhc_sinkhorn_bwd',
    tensor('grad_output', torch.float32, like='x'),
    tensor('x', torch.float32),
    tensor('grad_input', torch.float32, like='x', written='written'),
    scalar('repeat', 'int'),
    scalar('eps', 'float'),
    extra=_extra,
    choice=lambda x, repeat: {'direction': 'bwd', 'mhc_mult': x.shape[-1], 'repeat': repeat},
    choose_config=choose_mhc_sinkhorn_config,
    get_kernel=get_mhc_sinkhorn_kernel,
)


def _eager(grad_output, x, grad_input, repeat, eps):
    """Every check (or the fast path's), then one launch over the tokens (none without tokens). Fast path: by
    (mhc_mult, repeat, CUDA index)."""
    args = (grad_output, x, grad_input, repeat, eps)
    shape = OP.fast_ok(*args)
    key = None if shape is None else (x.shape[-1], repeat, x.get_device())
    launcher, fast = OP.prepare(key, args)
    mm = x.shape[-1] ** 2
    launch_args = (grad_output.view(-1, mm), x.view(-1, mm), grad_input.view(-1, mm), float(eps))
    OP.finish(launcher, fast, key, launch_args, args, empty=not x.numel())
    return grad_input


@OP.public(_eager)
def mhc_sinkhorn_bwd(
    grad_output: torch.Tensor, x: torch.Tensor, grad_input: torch.Tensor, repeat: int, eps: float
) -> torch.Tensor:
    """The gradient of mhc_sinkhorn_fwd(x, ., repeat, eps) at the logits x, given grad_output at its result,
    written into grad_input. Per token, in fp32: the forward is recomputed and the input of each of its
    2 * repeat - 1 normalisation steps kept; then, from the last step back, a row (column) step with input P,
    d = row (column) sums of P + eps, takes g to (g - row (column) sums of g * P / d) / d; the softmax last,
    g -> S * (g - row sums of g * S) with S = softmax(x). Each thread owns a token and sums in a fixed order:
    bit-identical results from run to run.

    Args:
        grad_output: fp32 of x's shape, contiguous.
        x: (..., mhc_mult, mhc_mult) fp32 logits, contiguous, at least one leading dimension (the tokens: any
            count, 0 included), mhc_mult in 1..8, at most 2**30 elements.
        grad_input: fp32 of x's shape, contiguous, on x's device, overlapping neither input; written.
        repeat: in [1, 256] (the recomputed iterates of a token stay on chip: 2 * repeat - 1 matrices).
        eps: finite.

    Returns:
        grad_input (TileKernels returns None). Without tokens nothing is launched.
    """
