"""engram_sinkhorn_finalize: the final row-normalised Sinkhorn matrix, scaled by alpha."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cann_ops_tilelang.config import require_accelerator
from cann_ops_tilelang.operator import Operator, traced
from cann_ops_tilelang.validation import check_aligned, check_finite_float, check_out

from ._sinkhorn_contract import check_sinkhorn_matrix, sinkhorn_operands_fast
from .engram_sinkhorn_finalize_kernel import choose_engram_sinkhorn_finalize_config as _choose_config
from .engram_sinkhorn_finalize_kernel import get_engram_sinkhorn_finalize_kernel as _get_kernel


def _check(matrix, row_scale, col_scale, eps, alpha, out, *, memory=True) -> tuple[str, int, int, float, float]:
    """(backend, rows, head_dim, eps, alpha) of valid arguments."""
    rows, head_dim, eps = check_sinkhorn_matrix(OP.name, matrix, row_scale, col_scale, eps, memory=memory)
    alpha = check_finite_float('alpha', alpha)
    if out is not None:
        inputs = {'matrix': matrix, 'row_scale': row_scale, 'col_scale': col_scale}
        check_out(
            'out', out, shape=matrix.shape, dtype=torch.float32, device=matrix.device, inputs=inputs, memory=memory
        )
        check_aligned('out', out, memory=memory)
    tensors = (matrix, row_scale, col_scale) if out is None else (matrix, row_scale, col_scale, out)
    return require_accelerator(*tensors), rows, head_dim, eps, alpha


OP = Operator('engram_sinkhorn_finalize', _check, _choose_config, _get_kernel)


def _plan(matrix, row_scale, col_scale, eps, alpha, out=None):
    backend, _, head_dim, _, _ = OP.check(matrix, row_scale, col_scale, eps, alpha, out)
    return OP.launcher(backend, matrix.device, head_dim=head_dim)


def _eager(matrix, row_scale, col_scale, eps, alpha, out) -> torch.Tensor:
    """Every check, then the launch. Fast path: by (head_dim, CUDA index)."""
    if (
        out is None
        and type(alpha) is float
        and -math.inf < alpha < math.inf
        and sinkhorn_operands_fast(matrix, row_scale, col_scale, eps)
    ):
        launcher = OP.fast.get((matrix.shape[1], matrix.get_device()))
        if launcher is not None:
            result = torch.empty_like(matrix, memory_format=torch.contiguous_format)  # no size list to parse
            args = (matrix, row_scale, col_scale, result, eps, alpha)
            OP.launch(launcher, args, matrix, row_scale, col_scale, eps, alpha, None)
            return result
    backend, rows, head_dim, eps, alpha = OP.check(matrix, row_scale, col_scale, eps, alpha, out)
    launcher = OP.launcher(backend, matrix.device, head_dim=head_dim)
    result = matrix.new_empty((rows, head_dim)) if out is None else out  # fp32, its device
    if rows:  # rows = 0: nothing to launch
        launcher.launch(matrix, row_scale, col_scale, result, eps, alpha)
        if out is None:
            OP.remember((head_dim, matrix.get_device()), launcher)
    return result


def _fake(matrix, row_scale, col_scale, eps, alpha, out=None) -> torch.Tensor | None:
    """While torch traces: the checks that need no memory, then the (rows, head_dim) fp32 result (None with out=)."""
    OP.check(matrix, row_scale, col_scale, eps, alpha, out, memory=False)
    return matrix.new_empty(matrix.shape) if out is None else None


_SIGNATURE = 'Tensor matrix, Tensor row_scale, Tensor col_scale, float eps, float alpha'
_functional = OP.define('engram_sinkhorn_finalize', f'({_SIGNATURE}) -> Tensor', lambda *a: _eager(*a, None), _fake)
_into_out = OP.define('engram_sinkhorn_finalize_out', f'({_SIGNATURE}, Tensor(a!) out) -> ()', _eager, _fake)


@OP.public(_plan)
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
    if not traced(matrix):
        return _eager(matrix, row_scale, col_scale, eps, alpha, out)
    OP.check(matrix, row_scale, col_scale, eps, alpha, out, memory=False)
    if out is None:
        return _functional(matrix, row_scale, col_scale, float(eps), float(alpha))
    _into_out(matrix, row_scale, col_scale, float(eps), float(alpha), out)
    return out
