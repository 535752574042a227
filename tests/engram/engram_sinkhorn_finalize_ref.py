"""Pure-PyTorch oracle of engram_sinkhorn_finalize (docs/engram.md). Tests only; never imported at
run time."""

from __future__ import annotations

import torch


def engram_sinkhorn_finalize_ref(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
    alpha: float,
    *,
    dtype=torch.float64,
) -> torch.Tensor:
    """alpha * (r / (||r M c|| per row + eps))[:, None] * M * c in `dtype` (fp64: the oracle), in the
    reference library's order of products. Inputs are not modified."""
    m, r, c = matrix.to(dtype), row_scale.to(dtype), col_scale.to(dtype)
    row_norm = torch.linalg.vector_norm(r[:, None] * m * c, dim=1)
    return alpha * (r / (row_norm + eps))[:, None] * m * c
