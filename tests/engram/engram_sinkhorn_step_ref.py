"""Pure-PyTorch oracles of engram_sinkhorn_step (docs/engram.md). Tests only; never imported at run time."""

from __future__ import annotations

from typing import NamedTuple

import torch


class SinkhornStepRef(NamedTuple):
    row_norm: torch.Tensor  # (rows,)
    row_scale: torch.Tensor  # (rows,), the updated scale
    col_sumsq: torch.Tensor  # (head_dim,), the sum over p of the partials


def engram_sinkhorn_step_ref(
    matrix: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, eps: float, *, dtype=torch.float64
) -> SinkhornStepRef:
    """The spec's step in `dtype` (fp64: the oracle; fp32: torch's own evaluation). Inputs are not modified."""
    m, r, c = matrix.to(dtype), row_scale.to(dtype), col_scale.to(dtype)
    row_norm = torch.linalg.vector_norm(r[:, None] * m * c, dim=1)
    r_new = r / (row_norm + eps)
    col_sumsq = (r_new[:, None] * m * c).square().sum(0)
    return SinkhornStepRef(row_norm, r_new, col_sumsq)


def col_sumsq_for_scale(matrix: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor) -> torch.Tensor:
    """fp64 column sums of squares of (r[:, None] * M) * c for a given (already updated) row scale."""
    return ((row_scale.double()[:, None] * matrix.double()) * col_scale.double()).square().sum(0)
