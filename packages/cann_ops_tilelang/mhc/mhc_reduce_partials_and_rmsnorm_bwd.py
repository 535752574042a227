"""mhc_reduce_partials_and_rmsnorm_bwd: the gradients of mhc_reduce_partials_and_rmsnorm_fwd's RMS step with
respect to the reduced products and sums of squares (docs/mhc.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._norm_fn_common import check_rms_scalars, check_rms_sizes
from .mhc_reduce_partials_and_rmsnorm_bwd_kernel import (
    choose_mhc_reduce_partials_and_rmsnorm_bwd_config,
    get_mhc_reduce_partials_and_rmsnorm_bwd_kernel,
)


class MhcReducePartialsAndRmsnormBwdResult(NamedTuple):
    out_mul_grad: torch.Tensor  # (T, G, M3) fp32: the given buffer, written
    sqrsum_grad: torch.Tensor  # (T, G) fp32: the given buffer, written


def _limits(name, T, G, M3):  # the docstring's symbols
    check_rms_sizes(name, 1, T, G, M3)


def _rules(name, rms_group_size, rms_eps):
    check_rms_scalars(name, rms_group_size, rms_eps)


OP = Operator(
    'mhc_reduce_partials_and_rmsnorm_bwd',
    tensor('out_grad', torch.float32, 'T, M3'),
    tensor('out_mul', torch.float32, 'T, G, M3'),
    tensor('sqrsum', torch.float32, 'T, G'),
    tensor('out_mul_grad', torch.float32, 'T, G, M3', written='written'),
    tensor('sqrsum_grad', torch.float32, 'T, G', written='written'),
    scalar('rms_group_size', 'int'),
    scalar('rms_eps', 'float'),
    limits=_limits,
    extra=_rules,
    choice=lambda out_mul: {'mhc_mult3': out_mul.shape[2], 'groups': out_mul.shape[1]},
    choose_config=choose_mhc_reduce_partials_and_rmsnorm_bwd_config,
    get_kernel=get_mhc_reduce_partials_and_rmsnorm_bwd_kernel,
)


def _scalars(rms_group_size, rms_eps) -> tuple[float, float, float]:
    """The kernels' runtime scalars: 1 / rms_group_size, rms_eps, rms_eps * rms_group_size."""
    return 1.0 / rms_group_size, float(rms_eps), float(rms_eps) * rms_group_size


def _eager(
    out_grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad, rms_group_size, rms_eps
) -> MhcReducePartialsAndRmsnormBwdResult:
    """Every check (or the fast path's), then the launch (none for T = 0). Fast path: by (G, M3, CUDA index), the
    token count being the kernel's runtime size, after what the entry cannot check (the scalars' values)."""
    args = (out_grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad, rms_group_size, rms_eps)
    result = MhcReducePartialsAndRmsnormBwdResult(out_mul_grad, sqrsum_grad)
    shape = OP.fast_ok(*args)
    launcher = None
    if shape is not None and shape[0] and rms_group_size >= 1 and rms_eps >= 0:
        launcher = OP.fast.get((out_mul.shape[1:], out_grad.get_device()))
    if launcher is not None:
        OP.launch(launcher, (*args[:5], *_scalars(rms_group_size, rms_eps)), args)
        return result
    launcher = OP.plan(*args)
    T, G, M3 = out_mul.shape
    if not T:  # no token: nothing to write
        return result
    scalars = _scalars(rms_group_size, rms_eps)
    if launcher.cfg.backend == 'ascend':  # rows of (token, group): 2-D tiles for the DMA
        launcher.launch(
            out_grad, out_mul.view(T * G, M3), sqrsum.view(T * G), out_mul_grad.view(T * G, M3),
            sqrsum_grad.view(T * G), *scalars,
        )  # fmt: skip
        return result
    launcher.launch(*args[:5], *scalars)
    OP.remember((out_mul.shape[1:], out_grad.get_device()), launcher)
    return result


@OP.public(_eager, result=MhcReducePartialsAndRmsnormBwdResult)
def mhc_reduce_partials_and_rmsnorm_bwd(
    out_grad: torch.Tensor,
    out_mul: torch.Tensor,
    sqrsum: torch.Tensor,
    out_mul_grad: torch.Tensor,
    sqrsum_grad: torch.Tensor,
    rms_group_size: int,
    rms_eps: float,
) -> MhcReducePartialsAndRmsnormBwdResult:
    """The gradients of mhc_reduce_partials_and_rmsnorm_fwd's out with respect to its out_mul and sqrsum
    (TileKernels 2.1.0's call), in fp32. For token t, RMS group g, with
    rstd = 1 / sqrt(sqrsum[t, g] / rms_group_size + rms_eps):

        out_mul_grad[t, g, j] = out_grad[t, j] * rstd
        sqrsum_grad[t, g]     = -0.5 * rstd / (sqrsum[t, g] + rms_eps * rms_group_size)
                                * sum over j of out_grad[t, j] * out_mul[t, g, j]

    The gradients of the partials are these, the same for every split (the forward's sums are linear).
    Each sum runs in mix order within one task or thread (no atomics): the same bits on every call.

    Args:
        out_grad: (T, M3) fp32, contiguous: the gradient of out. T >= 0 (T = 0 launches nothing), M3 in
            [1, 80] (mhc_mult up to 8), T * G * M3 (M3 rounded up to a multiple of 8) < 2**31.
        out_mul: (T, G, M3) fp32, contiguous: the forward's out_mul, G in [1, 16].
        sqrsum: (T, G) fp32, contiguous: the forward's sqrsum.
        out_mul_grad: (T, G, M3) fp32, contiguous: written.
        sqrsum_grad: (T, G) fp32, contiguous: written. Both apart from each other and the inputs.
        rms_group_size: int >= 1, the forward's.
        rms_eps: finite float >= 0, the forward's.

    Returns:
        MhcReducePartialsAndRmsnormBwdResult(out_mul_grad, sqrsum_grad): the given buffers (None in the
        reference library).
    """
