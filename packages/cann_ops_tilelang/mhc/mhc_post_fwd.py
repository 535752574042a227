"""mhc_post_fwd: the mHC post mapping (arXiv 2512.24880), out = x * post_layer_mix + comb_res_mix^T residual, per
token (TileKernels 2.1.0's call)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, tensor

from ._mhc_post_common import all_contiguous, as_rows, check_sizes
from .mhc_post_fwd_kernel import choose_mhc_post_fwd_config, get_mhc_post_fwd_kernel

# The contract, checked in the mechanism's order: types and dtypes (TypeError), shapes, layouts and sizes
# (ValueError), the out= buffer, then the device (RuntimeError). The shape symbols come from residual first.
OP = Operator(
    'mhc_post_fwd',
    tensor('x', torch.bfloat16, 'S, T, H'),
    tensor('residual', torch.bfloat16, 'S, T, M, H'),
    tensor('post_layer_mix', torch.float32, 'S, T, M, 1'),
    tensor('comb_res_mix', torch.float32, 'S, T, M, M'),
    out('out', torch.bfloat16, 'S, T, M, H'),
    shape_from='residual',
    limits=check_sizes,
    choice=lambda residual: {'mhc': residual.shape[2], 'hidden': residual.shape[3]},
    choose_config=choose_mhc_post_fwd_config,
    get_kernel=get_mhc_post_fwd_kernel,
)


def _eager(x, residual, post_layer_mix, comb_res_mix, out):
    """Every check, then the launch (also the torch.library ops' kernel). Fast path (no out=, contiguous tensors on
    a CUDA device): by the four input shapes and the device index, after a launch of the same key."""
    args = (x, residual, post_layer_mix, comb_res_mix, out)
    key = None
    if OP.fast_ok(*args) is not None and all_contiguous(residual, x, post_layer_mix, comb_res_mix):
        key = (residual.shape, x.shape, post_layer_mix.shape, comb_res_mix.shape, x.get_device())
    launcher, fast = OP.prepare(key, args)
    result = residual.new_empty(residual.shape) if out is None else out
    rows = as_rows(x, residual, post_layer_mix, comb_res_mix)
    launch_args = (*rows, result.view(rows[1].shape))
    OP.finish(launcher, fast, key, launch_args, args, empty=residual.numel() == 0)
    return result


def _fake(x, residual, post_layer_mix, comb_res_mix, out):
    """While torch traces (after the checks that need no memory): what `_eager` returns."""
    return residual.new_empty(residual.shape)


@OP.public(_eager, returns='Tensor', fake=_fake)
def mhc_post_fwd(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The mHC post mapping: per token, the layer output x spread over the M residual branches and added to the
    mixed residual streams,

        out[s, t, o, h] = post_layer_mix[s, t, o, 0] * x[s, t, h]
                          + sum_i comb_res_mix[s, t, i, o] * residual[s, t, i, h]

    in fp32, rounded once to bf16 (to nearest even).

    Args:
        x: (S, T, H) bf16, the layer's output.
        residual: (S, T, M, H) bf16, the M residual streams. M (mhc_mult) in 1..8, H a positive multiple of 64,
            S * T * M * H < 2**31 - 2**20; S * T = 0 is allowed (no launch).
        post_layer_mix: (S, T, M, 1) fp32.
        comb_res_mix: (S, T, M, M) fp32, indexed [input branch i, output branch o].
        out: optional (S, T, M, H) bf16 buffer, written and returned; it must not overlap an input.
        Every tensor contiguous, on one Ascend NPU or CUDA GPU (CPU tensors: only under the Ascend emulator).

    Returns:
        out, or a new (S, T, M, H) bf16 tensor.
    """
