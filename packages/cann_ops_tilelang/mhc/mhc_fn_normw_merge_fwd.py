"""mhc_fn_normw_merge_fwd: the RMSNorm weight merged into mHC's mix projection, out_fn = fn * normw (docs/mhc.md)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._norm_fn_common import check_fn_shape
from .mhc_fn_normw_merge_fwd_kernel import (
    choose_mhc_fn_normw_merge_fwd_config,
    get_mhc_fn_normw_merge_fwd_kernel,
)


def _limits(name, M3, K):  # the docstring's symbols
    check_fn_shape(name, M3, K)


OP = Operator(
    'mhc_fn_normw_merge_fwd',
    tensor('fn', torch.float32, 'M3, K'),
    tensor('normw', torch.float32, 'K'),
    tensor('out_fn', torch.float32, 'M3, K', written='written'),
    limits=_limits,
    choice=lambda fn: {'rows': fn.shape[0], 'hidden': fn.shape[1]},
    choose_config=choose_mhc_fn_normw_merge_fwd_config,
    get_kernel=get_mhc_fn_normw_merge_fwd_kernel,
)


def _eager(fn, normw, out_fn) -> torch.Tensor:
    """Every check, then the launch. Fast path: by (fn's shape, CUDA index), after what the entry cannot check."""
    shape = OP.fast_ok(fn, normw, out_fn)
    if shape is not None:
        launcher = OP.fast.get((shape, fn.get_device()))
        if launcher is not None:
            OP.launch(launcher, (fn, normw, out_fn), (fn, normw, out_fn))
            return out_fn
    launcher = OP.plan(fn, normw, out_fn)
    launcher.launch(fn, normw, out_fn)
    OP.remember((fn.shape, fn.get_device()), launcher)
    return out_fn


@OP.public(_eager)
def mhc_fn_normw_merge_fwd(fn: torch.Tensor, normw: torch.Tensor, out_fn: torch.Tensor) -> torch.Tensor:
    """out_fn[m, k] = fn[m, k] * normw[k], written in place (TileKernels 2.1.0's call), exact in fp32.

    Args:
        fn: (M3, K) fp32, contiguous: the mix projection, M3 = mhc_mult * (mhc_mult + 2) rows (any M3 in
            [1, 80], mhc_mult up to 8) over K = mhc_mult * hidden columns, K a positive multiple of 64,
            M3 * K < 2**31.
        normw: (K,) fp32, contiguous: the RMSNorm weight of the flattened residual streams.
        out_fn: (M3, K) fp32, contiguous, apart from fn and normw (ValueError): written.

    Returns out_fn (None in the reference library).
    """
