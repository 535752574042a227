"""engram_sinkhorn_step_reduce: the column sums of squares from engram_sinkhorn_step's partials, reproducibly."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._sinkhorn_contract import MAX_HEAD_DIM, check_head_dim
from .engram_sinkhorn_step_reduce_kernel import choose_engram_sinkhorn_step_reduce_config as _choose_config
from .engram_sinkhorn_step_reduce_kernel import get_engram_sinkhorn_step_reduce_kernel as _get_kernel

MAX_PARTIALS = 2**31 // MAX_HEAD_DIM  # int32 element indices of the partials


def _limits(name, P, head_dim):  # the docstring's symbols
    check_head_dim(name, head_dim)
    if P > MAX_PARTIALS:
        raise ValueError(f'{name}: at most {MAX_PARTIALS} partials, got {P}')


OP = Operator(
    'engram_sinkhorn_step_reduce',
    tensor('col_sumsq_partial', torch.float32, 'P, head_dim', aligned=True),
    tensor('col_sumsq', torch.float32, 'head_dim', aligned=True, written='written'),
    limits=_limits,
    choice=lambda col_sumsq_partial: {'head_dim': col_sumsq_partial.shape[1]},
    choose_config=_choose_config,
    get_kernel=_get_kernel,
)


def _eager(parts, sums) -> torch.Tensor:
    """Every check, then the launch. Fast path: by (head_dim, CUDA index), after what the entry cannot check."""
    shape = OP.fast_ok(parts, sums)
    if shape is not None and 0 < shape[0] <= MAX_PARTIALS:
        launcher = OP.fast.get((shape[1:], parts.get_device()))
        if launcher is not None:
            OP.launch(launcher, (parts, sums), (parts, sums))
            return sums
    launcher = OP.plan(parts, sums)
    if parts.shape[0] == 0:  # the empty sum
        return sums.zero_()
    launcher.launch(parts, sums)
    OP.remember((parts.shape[1:], parts.get_device()), launcher)
    return sums


@OP.public(_eager)
def engram_sinkhorn_step_reduce(col_sumsq_partial: torch.Tensor, col_sumsq: torch.Tensor) -> torch.Tensor:
    """col_sumsq <- sum over p of col_sumsq_partial[p], in place, in a fixed order.

    Args:
        col_sumsq_partial: (P, head_dim) fp32, contiguous, 16-byte aligned; any P >= 0 (P = 0 writes zeros
            without a launch), head_dim a multiple of 64 up to 8192.
        col_sumsq: (head_dim,) fp32, contiguous, 16-byte aligned, not overlapping the partials (ValueError).

    Returns col_sumsq (None in the reference library). The fp32 additions run in an order fixed by the device's
    configuration (Ascend: sequential over p; CUDA: eight consecutive segments of p, each sequential, then added
    in order): repeated calls are bit-identical, a few ulps of the sum from torch's order.
    """
