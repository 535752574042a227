"""engram_sinkhorn_step_reduce: the column sums of squares from engram_sinkhorn_step's partials, reproducibly."""

from __future__ import annotations

import torch

from cann_ops_tilelang.config import require_accelerator
from cann_ops_tilelang.operator import Operator, traced
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_contiguous,
    check_shape,
    check_tensor,
    may_overlap,
)

from ._sinkhorn_contract import MAX_HEAD_DIM, check_head_dim
from .engram_sinkhorn_step_reduce_kernel import choose_engram_sinkhorn_step_reduce_config as _choose_config
from .engram_sinkhorn_step_reduce_kernel import get_engram_sinkhorn_step_reduce_kernel as _get_kernel

MAX_PARTIALS = 2**31 // MAX_HEAD_DIM  # int32 element indices of the partials


def _check(col_sumsq_partial, col_sumsq, *, memory=True) -> str:
    """The backend of valid arguments."""
    check_tensor('col_sumsq_partial', col_sumsq_partial, dtype=torch.float32, ndim=2)
    check_tensor('col_sumsq', col_sumsq, dtype=torch.float32, ndim=1)
    num_partials, head_dim = col_sumsq_partial.shape
    check_head_dim(OP.name, head_dim)
    if num_partials > MAX_PARTIALS:
        raise ValueError(f'{OP.name}: at most {MAX_PARTIALS} partials, got {num_partials}')
    check_shape('col_sumsq', col_sumsq, (head_dim,))
    for name, value in (('col_sumsq_partial', col_sumsq_partial), ('col_sumsq', col_sumsq)):
        check_contiguous(name, value)
        check_aligned(name, value, memory=memory)
    if may_overlap(col_sumsq, col_sumsq_partial, memory=memory):
        raise ValueError(f'{OP.name}: col_sumsq (written in place) must not alias the input col_sumsq_partial')
    return require_accelerator(col_sumsq_partial, col_sumsq)


OP = Operator('engram_sinkhorn_step_reduce', _check, _choose_config, _get_kernel)


def _plan(col_sumsq_partial, col_sumsq):
    return OP.launcher(OP.check(col_sumsq_partial, col_sumsq), col_sumsq.device, head_dim=col_sumsq.shape[0])


def _eager(parts, sums) -> None:
    """Every check, then the launch. Fast path: by (head_dim, CUDA index), after what the entry cannot check."""
    if type(parts) in PLAIN_TENSOR_TYPES and type(sums) in PLAIN_TENSOR_TYPES and parts.is_cuda and parts.dim() == 2:
        shape, p, s = parts.shape, parts.data_ptr(), sums.data_ptr()
        launcher = OP.fast.get((shape[1:], parts.get_device())) if 0 < shape[0] <= MAX_PARTIALS else None
        # aligned, and the two spans apart: s - len(parts) < p < s + len(sums) is their overlap
        if launcher is not None and not ((p | s) % ALIGN_BYTES or s - parts.nbytes < p < s + sums.nbytes):
            OP.launch(launcher, (parts, sums), parts, sums)
            return
    launcher = _plan(parts, sums)
    if parts.shape[0] == 0:  # the empty sum
        sums.zero_()
        return
    launcher.launch(parts, sums)
    OP.remember((parts.shape[1:], parts.get_device()), launcher)


def _fake(parts, sums) -> None:
    OP.check(parts, sums, memory=False)  # while torch traces: the checks that need no memory


_reduce = OP.define(
    'engram_sinkhorn_step_reduce', '(Tensor col_sumsq_partial, Tensor(a!) col_sumsq) -> ()', _eager, _fake
)


@OP.public(_plan)
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
    if traced(col_sumsq_partial):
        OP.check(col_sumsq_partial, col_sumsq, memory=False)
        _reduce(col_sumsq_partial, col_sumsq)
    else:
        _eager(col_sumsq_partial, col_sumsq)
    return col_sumsq
