"""mhc_pre_split_mixes_bwd: the gradients of mhc_pre_split_mixes_fwd, the shared scales' and base's reduced over
the tokens in two deterministic passes (TileKernels 2.1.0's call; docs/mhc.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._mixes_kernel import choose_mhc_mixes_config, get_mhc_mixes_kernel
from .mhc_pre_split_mixes_fwd import check_split_shapes


class MhcPreSplitMixesBwdResult(NamedTuple):
    input_mixes_grad: torch.Tensor  # (T, M * (M + 2))
    mhc_scale_grad: torch.Tensor  # (3,)
    mhc_base_grad: torch.Tensor  # (M * (M + 2),)


def _extra(name, mhc_post_mult_value):
    if mhc_post_mult_value == 0:
        raise ValueError(f'{name}: mhc_post_mult_value must be nonzero (post_layer_mix / mhc_post_mult_value is the '
                         'sigmoid the gradient needs)')  # fmt: skip


OP = Operator(
    'mhc_pre_split_mixes_bwd',
    tensor('pre_layer_mix_grad', torch.float32, 'T, M'),
    tensor('post_layer_mix_grad', torch.float32, 'T, M'),
    tensor('comb_res_mix_grad', torch.float32, 'T, M * M'),
    tensor('input_mixes', torch.float32, 'T, W'),
    tensor('post_layer_mix', torch.float32, 'T, M'),
    tensor('mhc_scale', torch.float32, '3'),
    tensor('mhc_base', torch.float32, 'W'),
    tensor('input_mixes_grad', torch.float32, 'T, W', written='written'),
    tensor('mhc_scale_grad', torch.float32, '3', written='written'),
    tensor('mhc_base_grad', torch.float32, 'W', written='written'),
    scalar('mhc_post_mult_value', 'float'),
    limits=check_split_shapes,
    extra=_extra,
    choice=lambda pre_layer_mix_grad: {'kind': 'split_bwd', 'mhc_mult': pre_layer_mix_grad.shape[1]},
    choose_config=choose_mhc_mixes_config,
    get_kernel=get_mhc_mixes_kernel,
)


def _eager(pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale,
           mhc_base, input_mixes_grad, mhc_scale_grad, mhc_base_grad,
           mhc_post_mult_value) -> MhcPreSplitMixesBwdResult:  # fmt: skip
    """Every check (or the fast path's), then the two passes: per-worker partial sums (and the input gradient),
    their sum in worker order. For 0 tokens: zero parameter gradients, no launch. Fast path, for tokens: by (M,
    CUDA index), whose entry is the pair of launchers."""
    args = (pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale,
            mhc_base, input_mixes_grad, mhc_scale_grad, mhc_base_grad, mhc_post_mult_value)  # fmt: skip
    shape = OP.fast_ok(*args)
    key = entry = None
    if shape is not None and shape[0]:
        key = (shape[1], input_mixes.get_device())
        entry = OP.fast.get(key)
    if entry is None:
        rows = OP.plan(*args)
        reduce = OP.launcher(rows.cfg.backend, rows.device, kind='split_reduce', mhc_mult=rows.cfg.mhc_mult)
    else:
        rows, reduce = entry
    if not input_mixes.shape[0]:
        mhc_scale_grad.zero_()
        mhc_base_grad.zero_()
        return MhcPreSplitMixesBwdResult(input_mixes_grad, mhc_scale_grad, mhc_base_grad)
    num_partials = rows.cfg.num_partials
    scale_partial = input_mixes.new_empty(num_partials, 3)
    base_partial = input_mixes.new_empty(num_partials, input_mixes.shape[1])
    launch_args = (*args[:8], scale_partial, base_partial, float(mhc_post_mult_value))
    if entry is not None:
        OP.launch(rows, launch_args, args)
    else:
        rows.launch(*launch_args)
        if key is not None:
            OP.remember(key, rows, (rows, reduce))
    reduce.launch(scale_partial, base_partial, mhc_scale_grad, mhc_base_grad)
    return MhcPreSplitMixesBwdResult(input_mixes_grad, mhc_scale_grad, mhc_base_grad)


@OP.public(_eager, result=MhcPreSplitMixesBwdResult)
def mhc_pre_split_mixes_bwd(
    pre_layer_mix_grad: torch.Tensor,
    post_layer_mix_grad: torch.Tensor,
    comb_res_mix_grad: torch.Tensor,
    input_mixes: torch.Tensor,
    post_layer_mix: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    input_mixes_grad: torch.Tensor,
    mhc_scale_grad: torch.Tensor,
    mhc_base_grad: torch.Tensor,
    mhc_post_mult_value: float,
) -> MhcPreSplitMixesBwdResult:
    """The gradients of mhc_pre_split_mixes_fwd. Per token t and column c of input_mixes, in fp32, dL/dz:

        pre  (c = j < M):       pre_layer_mix_grad[t, j] * s * (1 - s),  s = sigmoid(z[t, j]) recomputed
        post (c = M + j):       post_layer_mix_grad[t, j] * p * (1 - p / mhc_post_mult_value),  p = post_layer_mix[t, j]
        comb (c = 2M + k):      comb_res_mix_grad[t, k]

        input_mixes_grad[t, c] = dL/dz[t, c] * mhc_scale[segment(c)]
        mhc_base_grad[c]       = sum over t of dL/dz[t, c]
        mhc_scale_grad[s]      = sum over t and the columns c of segment s of dL/dz[t, c] * input_mixes[t, c]

    The parameter gradients are written (not accumulated), in two passes without atomics: one partial row per
    worker (Ascend vector core / CUDA SM), its token tiles in order, then the rows added in worker order: the
    same bits on every run.

    Args:
        pre_layer_mix_grad, post_layer_mix_grad: (T, M) fp32; comb_res_mix_grad: (T, M * M) fp32; M = mhc_mult
            in 1 .. 8, T >= 0, T * M * (M + 2) <= 2**30.
        input_mixes: (T, M * (M + 2)) fp32: the forward's input; post_layer_mix: (T, M) fp32, its output.
        mhc_scale: (3,) fp32; mhc_base: (M * (M + 2),) fp32.
        input_mixes_grad: (T, M * (M + 2)) fp32 buffer, written.
        mhc_scale_grad: (3,) fp32 buffer, written (zeros for T = 0).
        mhc_base_grad: (M * (M + 2),) fp32 buffer, written (zeros for T = 0).
        mhc_post_mult_value: the forward's, finite and nonzero.
        Every tensor contiguous, on one device; the buffers apart from every other argument.

    Returns:
        MhcPreSplitMixesBwdResult(input_mixes_grad, mhc_scale_grad, mhc_base_grad): the written buffers (the peer
        returns None).
    """
