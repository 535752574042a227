"""engram_sinkhorn_step: one row normalisation of the Sinkhorn iterate, with per-worker column partials."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import backend_of
from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._sinkhorn_contract import MAX_NUMEL, check_matrix_size
from .engram_sinkhorn_step_kernel import choose_engram_sinkhorn_step_config, get_engram_sinkhorn_step_kernel


class EngramSinkhornStepResult(NamedTuple):
    row_norm: torch.Tensor  # (rows,) fp32: ||r_i * M_i * c||_2 before this step's update
    col_sumsq_partial: torch.Tensor  # (P, head_dim) fp32: per-worker column sums of squares of the new iterate


OP = Operator(
    'engram_sinkhorn_step',
    tensor('matrix', torch.float32, 'rows, head_dim', aligned=True),
    tensor('row_scale', torch.float32, 'rows', written='updated'),
    tensor('col_scale', torch.float32, 'head_dim', aligned=True),
    scalar('eps', 'float'),
    limits=check_matrix_size,
    choice=lambda matrix: {'head_dim': int(matrix.shape[1])},  # int(): symbolic while torch traces
    choose_config=choose_engram_sinkhorn_step_config,
    get_kernel=get_engram_sinkhorn_step_kernel,
)


def _eager(matrix, row_scale, col_scale, eps) -> EngramSinkhornStepResult:
    """Every check, then the launch. Fast path: by (head_dim, CUDA index)."""
    shape = OP.fast_ok(matrix, row_scale, col_scale, eps)
    if shape is not None and 0 < shape[0] * shape[1] <= MAX_NUMEL:
        head_dim = shape[1]
        launcher = OP.fast.get((head_dim, matrix.get_device()))
        if launcher is not None:
            row_norm = torch.empty_like(row_scale, memory_format=torch.contiguous_format)  # no size list to parse
            partial = matrix.new_empty(launcher.cfg.num_partials, head_dim)
            args = (matrix, row_scale, col_scale, row_norm, partial, eps)
            OP.launch(launcher, args, (matrix, row_scale, col_scale, eps))
            return EngramSinkhornStepResult(row_norm, partial)
    launcher = OP.plan(matrix, row_scale, col_scale, eps)
    rows, head_dim = matrix.shape
    row_norm = matrix.new_empty(rows)  # fp32, its device
    # rows = 0: no launch, every worker's partial is the empty sum
    partial = (matrix.new_empty if rows else matrix.new_zeros)((launcher.cfg.num_partials, head_dim))
    if rows:
        launcher.launch(matrix, row_scale, col_scale, row_norm, partial, float(eps))
        OP.remember((head_dim, matrix.get_device()), launcher)
    return EngramSinkhornStepResult(row_norm, partial)


def _fake(matrix, row_scale, col_scale, eps) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows,) and (P, head_dim) fp32, P the device's (a device query on the first trace for a device)."""
    # (after the mechanism's memory-free check, so the device has a backend)
    num_partials = OP.launcher(backend_of(matrix.device), matrix.device, head_dim=int(matrix.shape[1])).cfg.num_partials
    return matrix.new_empty(matrix.shape[:1]), matrix.new_empty(num_partials, matrix.shape[1])


@OP.public(_eager, returns='(Tensor, Tensor)', result=EngramSinkhornStepResult, fake=_fake)
def engram_sinkhorn_step(
    matrix: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, eps: float
) -> EngramSinkhornStepResult:
    """Normalise the rows of the iterate I = r[:, None] * M * c[None, :] once.

        row_norm = ||I||_2 over each row (before the update)
        row_scale <- row_scale / (row_norm + eps)                         (in place)
        col_sumsq_partial[p] = sum over the rows of worker p of (r'[:, None] * M * c[None, :]) ** 2

    Args:
        matrix: (rows, head_dim) fp32, contiguous, 16-byte aligned; any rows >= 0 (0: zero partials, no
            launch), head_dim a multiple of 64 up to 8192 (the reference library: a multiple of 256).
        row_scale: (rows,) fp32, contiguous; updated in place, so it must not overlap matrix or col_scale.
        col_scale: (head_dim,) fp32, contiguous, 16-byte aligned.
        eps: a finite float added to each row norm.

    Returns:
        EngramSinkhornStepResult(row_norm (rows,) fp32, col_sumsq_partial (P, head_dim) fp32), a tuple; P is
        fixed by the kernel for the device (the vector cores on Ascend, two per SM on CUDA), and the sum over p
        (engram_sinkhorn_step_reduce) is the column sum of squares.

    row_scale' is the correctly rounded fp32 quotient of row_scale and fl(row_norm + eps); the norms and the
    partials are fp32 sums in another order than torch's (a few ulps of the sum apart).
    """
