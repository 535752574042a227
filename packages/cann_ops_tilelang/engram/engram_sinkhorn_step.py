"""engram_sinkhorn_step: one row normalisation of the Sinkhorn iterate, with per-worker column partials."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from cann_ops_tilelang._torch_library import op, traced
from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import Launcher, launch_or_explain
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_contiguous,
    check_finite_float,
    check_shape,
    check_tensor,
    may_overlap,
)

from .engram_sinkhorn_step_kernel import (
    HEAD_DIM_ALIGN,
    MAX_HEAD_DIM,
    EngramSinkhornStepConfig,
    choose_engram_sinkhorn_step_config,
    get_engram_sinkhorn_step_kernel,
)

_NAME = 'engram_sinkhorn_step'
MAX_NUMEL = 2**31 - 1  # int32 element indices of the matrix


class EngramSinkhornStepResult(NamedTuple):
    row_norm: torch.Tensor  # (rows,) fp32: ||r_i * M_i * c||_2 before this step's update
    col_sumsq_partial: torch.Tensor  # (P, head_dim) fp32: per-worker column sums of squares of the new iterate


def check_sinkhorn_matrix(name: str, matrix, row_scale, col_scale, eps, *, memory=True) -> tuple[int, int, float]:
    """The (matrix, row_scale, col_scale, eps) contract shared with engram_sinkhorn_finalize: fp32,
    contiguous, (rows, head_dim) / (rows,) / (head_dim,), head_dim a multiple of 64 up to 8192, the matrix
    and col_scale 16-byte aligned (memory=False: fake tensors, not checked here). Returns (rows, head_dim, eps)."""
    check_tensor('matrix', matrix, dtype=torch.float32, ndim=2)
    check_tensor('row_scale', row_scale, dtype=torch.float32, ndim=1)
    check_tensor('col_scale', col_scale, dtype=torch.float32, ndim=1)
    rows, head_dim = matrix.shape
    if head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f'{name}: head_dim must be a positive multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}, got {head_dim}'
        )
    if matrix.numel() > MAX_NUMEL:
        raise ValueError(f'{name}: matrix must have at most 2**31 - 1 elements, got {matrix.numel()}')
    check_shape('row_scale', row_scale, (rows,))
    check_shape('col_scale', col_scale, (head_dim,))
    for arg, value in (('matrix', matrix), ('row_scale', row_scale), ('col_scale', col_scale)):
        check_contiguous(arg, value)
    check_aligned('matrix', matrix, memory=memory)
    check_aligned('col_scale', col_scale, memory=memory)
    return rows, head_dim, check_finite_float('eps', eps)


# One launcher per (device, backend, head_dim): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (head_dim, CUDA device index): found there, a call whose operands pass sinkhorn_operands_fast leaves the
# rest of the checks to the entry and the explanation of a rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}


def sinkhorn_operands_fast(matrix, row_scale, col_scale, eps) -> bool:
    """What check_sinkhorn_matrix checks that a launcher's entry cannot (Launcher.checks_arguments), shared
    with engram_sinkhorn_finalize's fast path: plain tensors on a GPU, a 2-D matrix with 1 to MAX_NUMEL
    elements, the matrix and col_scale aligned, eps a finite float. False: the full way decides."""
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


def _check(matrix, row_scale, col_scale, eps, *, memory) -> tuple[str, int, int, float]:
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); (backend, rows,
    head_dim, eps)."""
    rows, head_dim, eps = check_sinkhorn_matrix(_NAME, matrix, row_scale, col_scale, eps, memory=memory)
    for name, value in (('matrix', matrix), ('col_scale', col_scale)):
        if may_overlap(row_scale, value, memory=memory):
            raise ValueError(f'{_NAME}: row_scale (updated in place) must not alias the input {name}')
    return require_accelerator(matrix, row_scale, col_scale), rows, head_dim, eps


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _launcher(backend, device, head_dim) -> Launcher:
    key = (device, backend, head_dim)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_sinkhorn_step_config(backend=backend, head_dim=head_dim, num_cores=get_num_cores(device))
        launcher = _LAUNCHERS[key] = Launcher(get_engram_sinkhorn_step_kernel, cfg, device)
    return launcher


def _eager(matrix, row_scale, col_scale, eps) -> EngramSinkhornStepResult:
    """The call on real tensors: every check, then the launch (also the torch.library op's kernel)."""
    if sinkhorn_operands_fast(matrix, row_scale, col_scale, eps):
        rows, head_dim = matrix.shape
        launcher = _CHECKED.get((head_dim, matrix.get_device()))
        if launcher is not None:
            row_norm = torch.empty_like(row_scale, memory_format=torch.contiguous_format)  # no size list to parse
            col_sumsq_partial = matrix.new_empty((launcher.cfg.num_partials, head_dim))
            launch_or_explain(
                launcher,
                (matrix, row_scale, col_scale, row_norm, col_sumsq_partial, eps),
                _check_real,
                matrix,
                row_scale,
                col_scale,
                eps,
            )
            return EngramSinkhornStepResult(row_norm, col_sumsq_partial)
    backend, rows, head_dim, eps = _check(matrix, row_scale, col_scale, eps, memory=True)
    launcher = _launcher(backend, matrix.device, head_dim)
    cfg, device = launcher.cfg, launcher.device
    row_norm = matrix.new_empty((rows,))  # fp32, its device
    if rows == 0:  # no rows: every worker's partial is the empty sum
        return EngramSinkhornStepResult(
            row_norm, torch.zeros((cfg.num_partials, head_dim), dtype=torch.float32, device=device)
        )
    col_sumsq_partial = matrix.new_empty((cfg.num_partials, head_dim))
    launcher.launch(matrix, row_scale, col_scale, row_norm, col_sumsq_partial, eps)
    if launcher.checks_arguments:
        _CHECKED[(head_dim, matrix.get_device())] = launcher
    return EngramSinkhornStepResult(row_norm, col_sumsq_partial)


def _fake(matrix, row_scale, col_scale, eps) -> EngramSinkhornStepResult:
    """While torch traces: the checks that need no memory, then (rows,) and (P, head_dim) fp32, P the
    device's (a device query on the first trace for a device)."""
    backend, rows, head_dim, _ = _check(matrix, row_scale, col_scale, eps, memory=False)
    # int(): sizes may be symbolic while torch traces with dynamic shapes
    num_partials = _launcher(backend, matrix.device, int(head_dim)).cfg.num_partials
    return EngramSinkhornStepResult(
        torch.empty((rows,), dtype=torch.float32, device=matrix.device),
        torch.empty((num_partials, head_dim), dtype=torch.float32, device=matrix.device),
    )


def engram_sinkhorn_step(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
) -> EngramSinkhornStepResult:
    """Normalise the rows of the iterate I = r[:, None] * M * c[None, :] once.

        row_norm = ||I||_2 over each row (before the update)
        row_scale <- row_scale / (row_norm + eps)                         (in place)
        col_sumsq_partial[p] = sum over the rows of worker p of (r'[:, None] * M * c[None, :]) ** 2

    Args:
        matrix: (rows, head_dim) fp32, contiguous, 16-byte aligned; any rows >= 0, head_dim a multiple of
            64 up to 8192 (the reference library: a multiple of 256).
        row_scale: (rows,) fp32, contiguous; updated in place, so it must not overlap matrix or col_scale.
        col_scale: (head_dim,) fp32, contiguous, 16-byte aligned.
        eps: a finite float added to each row norm.

    Returns:
        EngramSinkhornStepResult(row_norm, col_sumsq_partial), a tuple: row_norm (rows,) fp32 and
        col_sumsq_partial (P, head_dim) fp32, P fixed by the kernel for the device (the vector cores on Ascend,
        two per SM on CUDA). Its sum over p (engram_sinkhorn_step_reduce) is the column sum of squares.
        rows = 0 gives zero partials without a launch.

    row_scale' is the correctly rounded fp32 quotient of row_scale and fl(row_norm + eps); the norms and the
    partials are fp32 sums in another order than torch's (a few ulps of the sum apart).
    """
    if traced(matrix):  # torch.compile, fake tensors, make_fx: the torch.library op (_torch_ops.py)
        _check(matrix, row_scale, col_scale, eps, memory=False)
        return EngramSinkhornStepResult(*op('engram_sinkhorn_step')(matrix, row_scale, col_scale, float(eps)))
    return _eager(matrix, row_scale, col_scale, eps)


def engram_sinkhorn_step_config(
    matrix: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, eps: float
) -> EngramSinkhornStepConfig:
    """The kernel configuration engram_sinkhorn_step launches for these arguments (validated alike; no launch)."""
    backend, _, head_dim, _ = _check(matrix, row_scale, col_scale, eps, memory=True)
    return _launcher(backend, matrix.device, head_dim).cfg
