"""mhc_reduce_partials_and_rmsnorm_fwd: the split-K partials of mHC's prenorm GEMM reduced, then RMS-normalised
(docs/mhc.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._norm_fn_common import check_rms_scalars, check_rms_sizes
from .mhc_reduce_partials_and_rmsnorm_fwd_kernel import (
    choose_mhc_reduce_partials_and_rmsnorm_fwd_config,
    get_mhc_reduce_partials_and_rmsnorm_fwd_kernel,
)


class MhcReducePartialsAndRmsnormFwdResult(NamedTuple):
    out_mul: torch.Tensor  # (T, G, M3) fp32: the given buffer, written
    sqrsum: torch.Tensor  # (T, G) fp32: the given buffer, written
    out: torch.Tensor  # (T, M3) fp32: the given buffer, written


def _limits(name, S, T, G, M3):  # the docstring's symbols
    check_rms_sizes(name, S, T, G, M3)


def _rules(name, S, rms_group_size, rms_eps, n_splits):
    if n_splits != S:
        raise ValueError(f'{name}: n_splits ({n_splits}) must be the first size of out_mul_splitted ({S})')
    check_rms_scalars(name, rms_group_size, rms_eps)


OP = Operator(
    'mhc_reduce_partials_and_rmsnorm_fwd',
    tensor('out_mul_splitted', torch.float32, 'S, T, G, M3'),
    tensor('sqrsum_splitted', torch.float32, 'S, T, G'),
    tensor('out_mul', torch.float32, 'T, G, M3', written='written'),
    tensor('sqrsum', torch.float32, 'T, G', written='written'),
    tensor('out', torch.float32, 'T, M3', written='written'),
    scalar('rms_group_size', 'int'),
    scalar('rms_eps', 'float'),
    scalar('n_splits', 'int'),
    limits=_limits,
    extra=_rules,
    choice=lambda out_mul_splitted: {
        'mhc_mult3': out_mul_splitted.shape[3],
        'groups': out_mul_splitted.shape[2],
        'n_splits': out_mul_splitted.shape[0],
    },
    choose_config=choose_mhc_reduce_partials_and_rmsnorm_fwd_config,
    get_kernel=get_mhc_reduce_partials_and_rmsnorm_fwd_kernel,
)


def _eager(
    out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, out, rms_group_size, rms_eps, n_splits
) -> MhcReducePartialsAndRmsnormFwdResult:
    """Every check (or the fast path's), then the launch (none for T = 0). Fast path: by (S, G, M3, CUDA index),
    the token count being the kernel's runtime size, after what the entry cannot check (the scalars' values)."""
    args = (out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, out, rms_group_size, rms_eps, n_splits)
    result = MhcReducePartialsAndRmsnormFwdResult(out_mul, sqrsum, out)
    shape = OP.fast_ok(*args)
    launcher = None
    if shape is not None and shape[1] and n_splits == shape[0] and rms_group_size >= 1 and rms_eps >= 0:
        launcher = OP.fast.get((shape[0], shape[2:], out_mul_splitted.get_device()))
    if launcher is not None:
        OP.launch(launcher, (*args[:5], 1.0 / rms_group_size, float(rms_eps)), args)
        return result
    launcher = OP.plan(*args)
    S, T, G, M3 = out_mul_splitted.shape
    if not T:  # no token: nothing to write
        return result
    scalars = (1.0 / rms_group_size, float(rms_eps))
    if launcher.cfg.backend == 'ascend':  # rows of (token, group): 2-D tiles for the DMA
        launcher.launch(
            out_mul_splitted.view(S, T * G, M3), sqrsum_splitted.view(S, T * G), out_mul.view(T * G, M3),
            sqrsum.view(T * G), out, *scalars,
        )  # fmt: skip
        return result
    launcher.launch(*args[:5], *scalars)
    OP.remember((S, out_mul_splitted.shape[2:], out_mul_splitted.get_device()), launcher)
    return result


@OP.public(_eager, result=MhcReducePartialsAndRmsnormFwdResult)
def mhc_reduce_partials_and_rmsnorm_fwd(
    out_mul_splitted: torch.Tensor,
    sqrsum_splitted: torch.Tensor,
    out_mul: torch.Tensor,
    sqrsum: torch.Tensor,
    out: torch.Tensor,
    rms_group_size: int,
    rms_eps: float,
    n_splits: int,
) -> MhcReducePartialsAndRmsnormFwdResult:
    """The split-K partials of the prenorm GEMM reduced and RMS-normalised (TileKernels 2.1.0's call), in fp32.
    For token t, RMS group g, mix j:

        out_mul[t, g, j] = sum over s of out_mul_splitted[s, t, g, j]
        sqrsum[t, g]     = sum over s of sqrsum_splitted[s, t, g]
        out[t, j]        = sum over g of out_mul[t, g, j] / sqrt(sqrsum[t, g] / rms_group_size + rms_eps)

    The sums run in split order, then group order (no atomics): the same bits on every call.

    Args:
        out_mul_splitted: (S, T, G, M3) fp32, contiguous: the partial products x . fn of each split.
            T >= 0 tokens (T = 0 launches nothing), G in [1, 16] RMS groups, M3 in [1, 80] mixes
            (mhc_mult * (mhc_mult + 2), mhc_mult up to 8), S * (T + 1) * G * M3 (M3 rounded up to a
            multiple of 8) < 2**31.
        sqrsum_splitted: (S, T, G) fp32, contiguous: the partial sums of squares.
        out_mul: (T, G, M3) fp32, contiguous: written.
        sqrsum: (T, G) fp32, contiguous: written.
        out: (T, M3) fp32, contiguous: written. The three outputs apart from each other and the inputs.
        rms_group_size: int >= 1, the elements behind each sum of squares.
        rms_eps: finite float >= 0.
        n_splits: int, S (ValueError otherwise).

    Returns:
        MhcReducePartialsAndRmsnormFwdResult(out_mul, sqrsum, out): the given buffers (None in the reference
        library).
    """
