"""The Sinkhorn operators' shared limits: head_dim (all three) and the matrix's element count."""

from __future__ import annotations

from ._sinkhorn_common import HEAD_DIM_ALIGN, MAX_HEAD_DIM  # the kernels' limits

MAX_NUMEL = 2**31 - 1  # int32 element indices of the matrix


def check_head_dim(name: str, head_dim: int) -> None:
    """head_dim a multiple of 64 in 64..8192, else ValueError."""
    if head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f'{name}: head_dim must be a positive multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}, got {head_dim}'
        )


def check_matrix_size(name: str, rows: int, head_dim: int) -> None:
    """The limits of engram_sinkhorn_step's and engram_sinkhorn_finalize's (rows, head_dim) matrix."""
    check_head_dim(name, head_dim)
    if rows * head_dim > MAX_NUMEL:
        raise ValueError(f'{name}: matrix must have at most 2**31 - 1 elements, got {rows * head_dim}')
