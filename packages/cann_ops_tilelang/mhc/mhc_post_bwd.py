"""mhc_post_bwd: the gradients of mhc_post_fwd (TileKernels 2.1.0's call), deterministic."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._mhc_post_common import all_contiguous, as_rows, check_sizes
from .mhc_post_bwd_kernel import choose_mhc_post_bwd_config, get_mhc_post_bwd_kernel


class MhcPostBwdResult(NamedTuple):
    d_x: torch.Tensor  # (S, T, H) bf16
    d_residual: torch.Tensor  # (S, T, M, H) bf16
    d_post_layer_mix: torch.Tensor  # (S, T, M, 1) fp32
    d_comb_res_mix: torch.Tensor  # (S, T, M, M) fp32


OP = Operator(
    'mhc_post_bwd',
    tensor('x', torch.bfloat16, 'S, T, H'),
    tensor('residual', torch.bfloat16, 'S, T, M, H'),
    tensor('post_layer_mix', torch.float32, 'S, T, M, 1'),
    tensor('comb_res_mix', torch.float32, 'S, T, M, M'),
    tensor('d_o', torch.bfloat16, 'S, T, M, H'),
    shape_from='residual',
    limits=check_sizes,
    choice=lambda residual: {'mhc': residual.shape[2], 'hidden': residual.shape[3]},
    choose_config=choose_mhc_post_bwd_config,
    get_kernel=get_mhc_post_bwd_kernel,
)


def _new_results(x, residual, post_layer_mix, comb_res_mix) -> MhcPostBwdResult:
    """The four gradients, uninitialised, shaped as their inputs (contiguous)."""
    return tuple.__new__(
        MhcPostBwdResult,
        (
            x.new_empty(x.shape),
            residual.new_empty(residual.shape),
            post_layer_mix.new_empty(post_layer_mix.shape),
            comb_res_mix.new_empty(comb_res_mix.shape),
        ),
    )


def _eager(x, residual, post_layer_mix, comb_res_mix, d_o) -> MhcPostBwdResult:
    """Every check, then the launch (also the torch.library op's kernel). Fast path (contiguous tensors on a CUDA
    device): by the five input shapes and the device index, after a launch of the same key."""
    args = (x, residual, post_layer_mix, comb_res_mix, d_o)
    key = None
    if OP.fast_ok(*args) is not None and all_contiguous(residual, x, post_layer_mix, comb_res_mix, d_o):
        key = (residual.shape, x.shape, post_layer_mix.shape, comb_res_mix.shape, d_o.shape, x.get_device())
    launcher, fast = OP.prepare(key, args)
    result = _new_results(x, residual, post_layer_mix, comb_res_mix)
    rows = as_rows(x, residual, post_layer_mix, comb_res_mix)
    launch_args = (*rows, d_o.view(rows[1].shape), *as_rows(*result))
    OP.finish(launcher, fast, key, launch_args, args, empty=residual.numel() == 0)
    return result


def _fake(x, residual, post_layer_mix, comb_res_mix, d_o):
    """While torch traces (after the checks that need no memory): the tensors `_eager` returns."""
    return tuple(_new_results(x, residual, post_layer_mix, comb_res_mix))


@OP.public(_eager, returns='(Tensor, Tensor, Tensor, Tensor)', result=MhcPostBwdResult, fake=_fake)
def mhc_post_bwd(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    d_o: torch.Tensor,
) -> MhcPostBwdResult:
    """The gradients of mhc_post_fwd for the output gradient d_o, per token (s, t), in fp32:

        d_x[h]                = sum_o d_o[o, h] * post_layer_mix[o, 0]
        d_residual[i, h]      = sum_o comb_res_mix[i, o] * d_o[o, h]
        d_post_layer_mix[o, 0] = sum_h d_o[o, h] * x[h]
        d_comb_res_mix[i, o]  = sum_h residual[i, h] * d_o[o, h]

    The sums over h are taken in one fixed order on one core or thread block (no atomics): the results are the
    same bits from run to run.

    Args:
        x, residual, post_layer_mix, comb_res_mix: the forward's inputs, as mhc_post_fwd takes them: (S, T, H) bf16,
            (S, T, M, H) bf16, (S, T, M, 1) fp32, (S, T, M, M) fp32; M in 1..8, H a positive multiple of 64,
            S * T * M * H < 2**31 - 2**20, S * T = 0 allowed (no launch).
        d_o: (S, T, M, H) bf16, the gradient of the forward's output.
        Every tensor contiguous, on one Ascend NPU or CUDA GPU (CPU tensors: only under the Ascend emulator).

    Returns:
        MhcPostBwdResult(d_x, d_residual, d_post_layer_mix, d_comb_res_mix), a tuple in the peer's order:
        (S, T, H) bf16, (S, T, M, H) bf16 (rounded once to nearest even), (S, T, M, 1) fp32, (S, T, M, M) fp32.
    """
