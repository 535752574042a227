"""engram_sinkhorn_finalize: the final row-normalised Sinkhorn matrix, scaled by alpha."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.validation import check_aligned, check_finite_float, check_out

from .engram_sinkhorn_finalize_kernel import (
    EngramSinkhornFinalizeConfig,
    choose_engram_sinkhorn_finalize_config,
    get_engram_sinkhorn_finalize_kernel,
)
from .engram_sinkhorn_step import check_sinkhorn_matrix

_NAME = 'engram_sinkhorn_finalize'


class _Plan(NamedTuple):
    cfg: EngramSinkhornFinalizeConfig
    device: torch.device
    rows: int
    eps: float
    alpha: float


def _plan(matrix, row_scale, col_scale, eps, alpha, out) -> _Plan:
    """Validate the arguments and choose the kernel configuration (no allocation, no launch)."""
    rows, head_dim, eps = check_sinkhorn_matrix(_NAME, matrix, row_scale, col_scale, eps)
    alpha = check_finite_float('alpha', alpha)
    if out is not None:
        check_out(
            'out',
            out,
            shape=(rows, head_dim),
            dtype=torch.float32,
            device=matrix.device,
            inputs={'matrix': matrix, 'row_scale': row_scale, 'col_scale': col_scale},
        )
        check_aligned('out', out)

    tensors = (matrix, row_scale, col_scale) if out is None else (matrix, row_scale, col_scale, out)
    backend = require_accelerator(*tensors)
    device = matrix.device

    cfg = choose_engram_sinkhorn_finalize_config(backend=backend, head_dim=head_dim, num_cores=get_num_cores(device))
    return _Plan(cfg, device, rows, eps, alpha)


def engram_sinkhorn_finalize(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
    alpha: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
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
    cfg, device, rows, eps, alpha = _plan(matrix, row_scale, col_scale, eps, alpha, out)
    result = torch.empty((rows, cfg.head_dim), dtype=torch.float32, device=device) if out is None else out
    if rows == 0:
        return result

    launch_kernel(get_engram_sinkhorn_finalize_kernel, cfg, device, matrix, row_scale, col_scale, result, eps, alpha)
    return result


def engram_sinkhorn_finalize_config(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
    alpha: float,
    out: torch.Tensor | None = None,
) -> EngramSinkhornFinalizeConfig:
    """The kernel configuration engram_sinkhorn_finalize launches for these arguments (validated alike; no
    launch)."""
    return _plan(matrix, row_scale, col_scale, eps, alpha, out).cfg
