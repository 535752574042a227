"""engram_sinkhorn_step_reduce: the column sums of squares from engram_sinkhorn_step's partials, reproducibly."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.validation import check_aligned, check_contiguous, check_shape, check_tensor, may_overlap

from .engram_sinkhorn_step_kernel import HEAD_DIM_ALIGN, MAX_HEAD_DIM
from .engram_sinkhorn_step_reduce_kernel import (
    EngramSinkhornStepReduceConfig,
    choose_engram_sinkhorn_step_reduce_config,
    get_engram_sinkhorn_step_reduce_kernel,
)

_NAME = 'engram_sinkhorn_step_reduce'
MAX_PARTIALS = 2**31 // MAX_HEAD_DIM  # int32 element indices of the partials


class _Plan(NamedTuple):
    cfg: EngramSinkhornStepReduceConfig
    device: torch.device
    num_partials: int


def _plan(col_sumsq_partial, col_sumsq) -> _Plan:
    """Validate the arguments and choose the kernel configuration (no allocation, no launch)."""
    check_tensor('col_sumsq_partial', col_sumsq_partial, dtype=torch.float32, ndim=2)
    check_tensor('col_sumsq', col_sumsq, dtype=torch.float32, ndim=1)
    num_partials, head_dim = col_sumsq_partial.shape
    if head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f'{_NAME}: head_dim must be a positive multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}, got {head_dim}'
        )
    if num_partials > MAX_PARTIALS:
        raise ValueError(f'{_NAME}: at most {MAX_PARTIALS} partials, got {num_partials}')
    check_shape('col_sumsq', col_sumsq, (head_dim,))
    for name, value in (('col_sumsq_partial', col_sumsq_partial), ('col_sumsq', col_sumsq)):
        check_contiguous(name, value)
        check_aligned(name, value)
    if may_overlap(col_sumsq, col_sumsq_partial):
        raise ValueError(f'{_NAME}: col_sumsq (written in place) must not alias the input col_sumsq_partial')

    backend = require_accelerator(col_sumsq_partial, col_sumsq)
    device = col_sumsq.device
    cfg = choose_engram_sinkhorn_step_reduce_config(backend=backend, head_dim=head_dim, num_cores=get_num_cores(device))
    return _Plan(cfg, device, num_partials)


def engram_sinkhorn_step_reduce(col_sumsq_partial: torch.Tensor, col_sumsq: torch.Tensor) -> torch.Tensor:
    """col_sumsq <- sum over p of col_sumsq_partial[p], in place, in a fixed order.

    Args:
        col_sumsq_partial: (P, head_dim) fp32, contiguous, 16-byte aligned; any P >= 0 (P = 0 writes zeros
            without a launch), head_dim a multiple of 64 up to 8192.
        col_sumsq: (head_dim,) fp32, contiguous, 16-byte aligned; overwritten, so it must not overlap the
            partials (ValueError).

    Returns:
        col_sumsq (the reference library returns None; the updated buffer is returned here for chaining).

    The fp32 additions run in an order fixed by the kernel configuration of the device (sequential over p
    on Ascend; eight consecutive segments of p, each sequential, then added in order, on CUDA), so repeated
    calls are bit-identical; the result is a few ulps of the sum from torch's own summation order.
    """
    cfg, device, num_partials = _plan(col_sumsq_partial, col_sumsq)
    if num_partials == 0:  # the empty sum
        return col_sumsq.zero_()

    launch_kernel(get_engram_sinkhorn_step_reduce_kernel, cfg, device, col_sumsq_partial, col_sumsq)
    return col_sumsq


def engram_sinkhorn_step_reduce_config(
    col_sumsq_partial: torch.Tensor, col_sumsq: torch.Tensor
) -> EngramSinkhornStepReduceConfig:
    """The kernel configuration engram_sinkhorn_step_reduce launches for these arguments (validated alike;
    no launch)."""
    return _plan(col_sumsq_partial, col_sumsq).cfg
