"""engram_sinkhorn_finalize: the final row-normalised Sinkhorn matrix, scaled by alpha."""

from __future__ import annotations

import torch
from torch import Tensor

from cann_ops_tilelang.operator import Operator, out, scalar, tensor

from ._sinkhorn_contract import MAX_NUMEL, check_matrix_size
from .engram_sinkhorn_finalize_kernel import choose_engram_sinkhorn_finalize_config as _choose_config
from .engram_sinkhorn_finalize_kernel import get_engram_sinkhorn_finalize_kernel as _get_kernel

OP = Operator(
    'engram_sinkhorn_finalize',
    tensor('matrix', torch.float32, 'rows, head_dim', aligned=True),
    tensor('row_scale', torch.float32, 'rows'),
    tensor('col_scale', torch.float32, 'head_dim', aligned=True),
    scalar('eps', 'float'),
    scalar('alpha', 'float'),
    out('out', torch.float32, 'rows, head_dim', aligned=True),
    limits=check_matrix_size,
    choice=lambda matrix: {'head_dim': matrix.shape[1]},
    choose_config=_choose_config,
    get_kernel=_get_kernel,
)


def _eager(matrix, row_scale, col_scale, eps, alpha, out) -> torch.Tensor:
    """Every check, then the launch. Fast path: by (head_dim, CUDA index)."""
    shape = OP.fast_ok(matrix, row_scale, col_scale, eps, alpha, out)
    if shape is not None and 0 < shape[0] * shape[1] <= MAX_NUMEL:
        launcher = OP.fast.get((shape[1], matrix.get_device()))
        if launcher is not None:
            result = torch.empty_like(matrix, memory_format=torch.contiguous_format)  # no size list to parse
            args = (matrix, row_scale, col_scale, result, eps, alpha)
            OP.launch(launcher, args, (matrix, row_scale, col_scale, eps, alpha, None))
            return result
    launcher = OP.plan(matrix, row_scale, col_scale, eps, alpha, out)
    result = matrix.new_empty(matrix.shape) if out is None else out  # fp32, its device
    if matrix.shape[0]:  # rows = 0: nothing to launch
        launcher.launch(matrix, row_scale, col_scale, result, float(eps), float(alpha))
        if out is None:
            OP.remember((matrix.shape[1], matrix.get_device()), launcher)
    return result


@OP.public(_eager, returns='Tensor', fake=lambda matrix, *_: matrix.new_empty(matrix.shape))
def engram_sinkhorn_finalize(
    matrix: Tensor, row_scale: Tensor, col_scale: Tensor, eps: float, alpha: float, out: Tensor | None = None
) -> Tensor:
    """alpha * (row_scale / (||I||_2 per row + eps))[:, None] * matrix * col_scale[None, :],
    with I = row_scale[:, None] * matrix * col_scale[None, :].

    Args:
        matrix: (rows, head_dim) fp32, contiguous, 16-byte aligned; any rows >= 0, head_dim a multiple of
            64 up to 8192.
        row_scale: (rows,) fp32, contiguous. Not modified.
        col_scale: (head_dim,) fp32, contiguous, 16-byte aligned.
        eps: a finite float added to each row norm.
        alpha: a finite float scaling the result.
        out: optional (rows, head_dim) fp32 contiguous, 16-byte aligned buffer on the same device, not
            overlapping any input (positional, as in the reference library).

    Returns:
        (rows, head_dim) fp32 (`out` when given). rows = 0 returns without a launch.

    The products run in the reference's order, ((alpha * r') * M) * c with r' the correctly rounded
    quotient; only the row norm is an fp32 sum in another order than torch's. The norm of a row is the
    one engram_sinkhorn_step computes for it (same accumulation), so alpha times the row_scale that the
    step stores reproduces this operator's scale bit for bit.
    """
