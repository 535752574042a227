"""The Sinkhorn operators' shared contract: head_dim (all three), the (matrix, row_scale, col_scale, eps)
operands of engram_sinkhorn_step and engram_sinkhorn_finalize, and their fast-path form."""

from __future__ import annotations

import math

import torch

from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_contiguous,
    check_finite_float,
    check_shape,
    check_tensor,
)

from ._sinkhorn_common import HEAD_DIM_ALIGN, MAX_HEAD_DIM  # the kernels' limits

MAX_NUMEL = 2**31 - 1  # int32 element indices of the matrix


def check_head_dim(name: str, head_dim: int) -> None:
    """head_dim a multiple of 64 in 64..8192, else ValueError."""
    if head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f'{name}: head_dim must be a positive multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}, got {head_dim}'
        )


def check_sinkhorn_matrix(name: str, matrix, row_scale, col_scale, eps, *, memory=True) -> tuple[int, int, float]:
    """fp32, contiguous, (rows, head_dim) / (rows,) / (head_dim,), the matrix and col_scale 16-byte aligned
    (memory=False: fake tensors, not checked here), eps a finite float. Returns (rows, head_dim, eps)."""
    check_tensor('matrix', matrix, dtype=torch.float32, ndim=2)
    check_tensor('row_scale', row_scale, dtype=torch.float32, ndim=1)
    check_tensor('col_scale', col_scale, dtype=torch.float32, ndim=1)
    rows, head_dim = matrix.shape
    check_head_dim(name, head_dim)
    if matrix.numel() > MAX_NUMEL:
        raise ValueError(f'{name}: matrix must have at most 2**31 - 1 elements, got {matrix.numel()}')
    check_shape('row_scale', row_scale, (rows,))
    check_shape('col_scale', col_scale, (head_dim,))
    for arg, value in (('matrix', matrix), ('row_scale', row_scale), ('col_scale', col_scale)):
        check_contiguous(arg, value)
    check_aligned('matrix', matrix, memory=memory)
    check_aligned('col_scale', col_scale, memory=memory)
    return rows, head_dim, check_finite_float('eps', eps)


def sinkhorn_operands_fast(matrix, row_scale, col_scale, eps) -> bool:
    """What check_sinkhorn_matrix checks that a launcher's entry cannot (Launcher.checks_arguments): plain
    tensors on a GPU, a 2-D matrix with 1 to MAX_NUMEL elements, the matrix and col_scale aligned, eps a
    finite float. False: the full way decides."""
    return (
        type(matrix) in PLAIN_TENSOR_TYPES
        and type(row_scale) in PLAIN_TENSOR_TYPES
        and type(col_scale) in PLAIN_TENSOR_TYPES
        and matrix.is_cuda
        and matrix.dim() == 2
        and type(eps) is float
        and -math.inf < eps < math.inf
        and 0 < matrix.numel() <= MAX_NUMEL
        and not (matrix.data_ptr() | col_scale.data_ptr()) % ALIGN_BYTES
    )
