"""mhc_fn_normw_merge_bwd: the gradients of mhc_fn_normw_merge_fwd, accumulated in place, normw's gradient a
deterministic column sum (docs/mhc.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._norm_fn_common import check_fn_shape
from .mhc_fn_normw_merge_bwd_kernel import (
    choose_mhc_fn_normw_merge_bwd_config,
    get_mhc_fn_normw_merge_bwd_kernel,
)


class MhcFnNormwMergeBwdResult(NamedTuple):
    fn_grad: torch.Tensor  # (M3, K) fp32: the given buffer, updated
    normw_grad: torch.Tensor  # (K,) fp32: the given buffer, updated


def _limits(name, M3, K):  # the docstring's symbols
    check_fn_shape(name, M3, K)


OP = Operator(
    'mhc_fn_normw_merge_bwd',
    tensor('fn', torch.float32, 'M3, K'),
    tensor('normw', torch.float32, 'K'),
    tensor('out_fn_grad', torch.float32, 'M3, K'),
    tensor('fn_grad', torch.float32, 'M3, K', written='updated'),
    tensor('normw_grad', torch.float32, 'K', written='updated'),
    limits=_limits,
    choice=lambda fn: {'rows': fn.shape[0], 'hidden': fn.shape[1]},
    choose_config=choose_mhc_fn_normw_merge_bwd_config,
    get_kernel=get_mhc_fn_normw_merge_bwd_kernel,
)


def _eager(fn, normw, out_fn_grad, fn_grad, normw_grad) -> MhcFnNormwMergeBwdResult:
    """Every check, then the launch. Fast path: by (fn's shape, CUDA index), after what the entry cannot check."""
    args = (fn, normw, out_fn_grad, fn_grad, normw_grad)
    shape = OP.fast_ok(*args)
    if shape is not None:
        launcher = OP.fast.get((shape, fn.get_device()))
        if launcher is not None:
            OP.launch(launcher, args, args)
            return MhcFnNormwMergeBwdResult(fn_grad, normw_grad)
    launcher = OP.plan(*args)
    launcher.launch(*args)
    OP.remember((fn.shape, fn.get_device()), launcher)
    return MhcFnNormwMergeBwdResult(fn_grad, normw_grad)


@OP.public(_eager, result=MhcFnNormwMergeBwdResult)
def mhc_fn_normw_merge_bwd(
    fn: torch.Tensor,
    normw: torch.Tensor,
    out_fn_grad: torch.Tensor,
    fn_grad: torch.Tensor,
    normw_grad: torch.Tensor,
) -> MhcFnNormwMergeBwdResult:
    """The gradients of out_fn = fn * normw, added to the given buffers in place (TileKernels 2.1.0's call):

        fn_grad[m, k] += out_fn_grad[m, k] * normw[k]
        normw_grad[k] += sum over m of out_fn_grad[m, k] * fn[m, k]

    normw_grad's sum is deterministic: per column, from the given value, row after row in row order (no
    atomics), so a call gives the same bits on every run (fp32; the multiply-adds may be fused).

    Args:
        fn: (M3, K) fp32, contiguous: the forward's fn (M3 in [1, 80], K a positive multiple of 64,
            M3 * K < 2**31).
        normw: (K,) fp32, contiguous.
        out_fn_grad: (M3, K) fp32, contiguous: the gradient of out_fn.
        fn_grad: (M3, K) fp32, contiguous, apart from every other argument: accumulated into (zero it for
            the plain gradient).
        normw_grad: (K,) fp32, contiguous, apart from every other argument: accumulated into.

    Returns:
        MhcFnNormwMergeBwdResult(fn_grad, normw_grad): the given buffers (None in the reference library).
    """
