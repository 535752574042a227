"""engram_sinkhorn_step_reduce: the column sums of squares from engram_sinkhorn_step's partials, reproducibly."""

from __future__ import annotations

import functools

import torch

from cann_ops_tilelang._torch_library import op, traced
from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import Launcher, launch_or_explain
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_contiguous,
    check_shape,
    check_tensor,
    may_overlap,
)

from .engram_sinkhorn_step_kernel import HEAD_DIM_ALIGN, MAX_HEAD_DIM
from .engram_sinkhorn_step_reduce_kernel import (
    EngramSinkhornStepReduceConfig,
    choose_engram_sinkhorn_step_reduce_config,
    get_engram_sinkhorn_step_reduce_kernel,
)

_NAME = 'engram_sinkhorn_step_reduce'
MAX_PARTIALS = 2**31 // MAX_HEAD_DIM  # int32 element indices of the partials


# One launcher per (device, backend, head_dim): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (col_sumsq_partial.shape[1:], CUDA device index): found there, a call checks in Python only what the entry
# cannot (argument types, the number of partials, alignment, the overlap) and leaves the explanation of a
# rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}


def _check(col_sumsq_partial, col_sumsq, *, memory) -> str:
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); the backend."""
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
        check_aligned(name, value, memory=memory)
    if may_overlap(col_sumsq, col_sumsq_partial, memory=memory):
        raise ValueError(f'{_NAME}: col_sumsq (written in place) must not alias the input col_sumsq_partial')
    return require_accelerator(col_sumsq_partial, col_sumsq)


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _launcher(backend, col_sumsq) -> Launcher:
    device = col_sumsq.device
    head_dim = col_sumsq.shape[0]
    key = (device, backend, head_dim)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_sinkhorn_step_reduce_config(
            backend=backend, head_dim=head_dim, num_cores=get_num_cores(device)
        )
        launcher = _LAUNCHERS[key] = Launcher(get_engram_sinkhorn_step_reduce_kernel, cfg, device)
    return launcher


def _eager(col_sumsq_partial, col_sumsq) -> None:
    """The call on real tensors: every check, then the launch (also the torch.library op's kernel)."""
    if (
        type(col_sumsq_partial) in PLAIN_TENSOR_TYPES
        and type(col_sumsq) in PLAIN_TENSOR_TYPES
        and col_sumsq_partial.is_cuda
        and col_sumsq_partial.dim() == 2
    ):
        shape = col_sumsq_partial.shape
        launcher = _CHECKED.get((shape[1:], col_sumsq_partial.get_device()))
        partial_start, sum_start = col_sumsq_partial.data_ptr(), col_sumsq.data_ptr()
        if (
            launcher is not None
            and 0 < shape[0] <= MAX_PARTIALS
            and not (partial_start | sum_start) % ALIGN_BYTES
            and not (
                partial_start < sum_start + col_sumsq.nbytes and sum_start < partial_start + col_sumsq_partial.nbytes
            )
        ):
            launch_or_explain(launcher, (col_sumsq_partial, col_sumsq), _check_real, col_sumsq_partial, col_sumsq)
            return
    launcher = _launcher(_check(col_sumsq_partial, col_sumsq, memory=True), col_sumsq)
    if col_sumsq_partial.shape[0] == 0:  # the empty sum
        col_sumsq.zero_()
        return
    launcher.launch(col_sumsq_partial, col_sumsq)
    if launcher.checks_arguments:
        _CHECKED[(col_sumsq_partial.shape[1:], col_sumsq_partial.get_device())] = launcher


def _fake(col_sumsq_partial, col_sumsq) -> None:
    """While torch traces: the checks that need no memory (the op writes col_sumsq in place)."""
    _check(col_sumsq_partial, col_sumsq, memory=False)


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
    if traced(col_sumsq_partial):  # torch.compile, fake tensors, make_fx: the torch.library op (_torch_ops.py)
        _check(col_sumsq_partial, col_sumsq, memory=False)
        op('engram_sinkhorn_step_reduce')(col_sumsq_partial, col_sumsq)
    else:
        _eager(col_sumsq_partial, col_sumsq)
    return col_sumsq


def engram_sinkhorn_step_reduce_config(
    col_sumsq_partial: torch.Tensor, col_sumsq: torch.Tensor
) -> EngramSinkhornStepReduceConfig:
    """The kernel configuration engram_sinkhorn_step_reduce launches for these arguments (validated alike;
    no launch)."""
    return _launcher(_check(col_sumsq_partial, col_sumsq, memory=True), col_sumsq).cfg
