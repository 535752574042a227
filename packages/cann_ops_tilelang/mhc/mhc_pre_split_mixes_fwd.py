"""mhc_pre_split_mixes_fwd: a layer's mixes of the mHC residual streams from its logits, split into the pre, post
and comb (residual) mixes (TileKernels 2.1.0's call; docs/mhc.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._mixes_common import check_elements, check_mhc_mult, split_width
from ._mixes_kernel import choose_mhc_mixes_config, get_mhc_mixes_kernel


class MhcPreSplitMixesFwdResult(NamedTuple):
    pre_layer_mix: torch.Tensor  # (T, M)
    post_layer_mix: torch.Tensor  # (T, M)
    comb_res_mix: torch.Tensor  # (T, M * M)


def check_split_shapes(name, T, W, M):
    """The split mixes' sizes: M from the (T, M) mixes, input_mixes' width M * (M + 2)."""
    check_mhc_mult(name, M, 'pre_layer_mix.shape[1]')
    if split_width(M) != W:
        raise ValueError(
            f'{name}: input_mixes.shape[1] must be mhc_mult * (mhc_mult + 2) = {split_width(M)} for mhc_mult {M} '
            f'(pre_layer_mix.shape[1]), got {W}'
        )
    check_elements(name, 'input_mixes', T, W)


OP = Operator(
    'mhc_pre_split_mixes_fwd',
    tensor('input_mixes', torch.float32, 'T, W'),
    tensor('mhc_scale', torch.float32, '3'),
    tensor('mhc_base', torch.float32, 'W'),
    tensor('pre_layer_mix', torch.float32, 'T, M', written='written'),
    tensor('post_layer_mix', torch.float32, 'T, M', written='written'),
    tensor('comb_res_mix', torch.float32, 'T, M * M', written='written'),
    scalar('mhc_post_mult_value', 'float'),
    scalar('mhc_pre_eps', 'float'),
    limits=check_split_shapes,
    choice=lambda pre_layer_mix: {'kind': 'split_fwd', 'mhc_mult': pre_layer_mix.shape[1]},
    choose_config=choose_mhc_mixes_config,
    get_kernel=get_mhc_mixes_kernel,
)


def _eager(input_mixes, mhc_scale, mhc_base, pre_layer_mix, post_layer_mix, comb_res_mix, mhc_post_mult_value,
           mhc_pre_eps) -> MhcPreSplitMixesFwdResult:  # fmt: skip
    """Every check (or the fast path's), then one launch; none for 0 tokens. Fast path, for tokens: by (W,
    CUDA index)."""
    args = (input_mixes, mhc_scale, mhc_base, pre_layer_mix, post_layer_mix, comb_res_mix, mhc_post_mult_value,
            mhc_pre_eps)  # fmt: skip
    shape = OP.fast_ok(*args)
    key = (shape[1], input_mixes.get_device()) if shape is not None and shape[0] else None
    launcher, fast = OP.prepare(key, args)
    launch_args = (*args[:6], float(mhc_post_mult_value), float(mhc_pre_eps))
    OP.finish(launcher, fast, key, launch_args, args, empty=not input_mixes.shape[0])
    return MhcPreSplitMixesFwdResult(pre_layer_mix, post_layer_mix, comb_res_mix)


@OP.public(_eager, result=MhcPreSplitMixesFwdResult)
def mhc_pre_split_mixes_fwd(
    input_mixes: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    pre_layer_mix: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    mhc_post_mult_value: float,
    mhc_pre_eps: float,
) -> MhcPreSplitMixesFwdResult:
    """A layer's mixes from its logits, per token t, in fp32. A row of input_mixes holds M pre, M post and M * M
    comb logits; each takes its segment's scale and its column's base, z = x * mhc_scale[segment] + mhc_base:

        pre_layer_mix[t, j]  = sigmoid(z[t, j]) + mhc_pre_eps                      j < M
        post_layer_mix[t, j] = sigmoid(z[t, M + j]) * mhc_post_mult_value          j < M
        comb_res_mix[t, k]   = z[t, 2M + k]                                        k < M * M (row-major M x M)

    Args:
        input_mixes: (T, M * (M + 2)) fp32, contiguous; M = mhc_mult in 1 .. 8 (pre_layer_mix.shape[1]),
            T >= 0 (0: nothing is launched), T * M * (M + 2) <= 2**30 (int32 indices).
        mhc_scale: (3,) fp32, contiguous: the pre, post and comb scales.
        mhc_base: (M * (M + 2),) fp32, contiguous.
        pre_layer_mix, post_layer_mix: (T, M) fp32 buffers, written.
        comb_res_mix: (T, M * M) fp32 buffer, written.
        mhc_post_mult_value, mhc_pre_eps: finite floats.
        The buffers: contiguous, on input_mixes' device, apart from every other argument.

    Returns:
        MhcPreSplitMixesFwdResult(pre_layer_mix, post_layer_mix, comb_res_mix): the written buffers (the peer
        returns None).
    """
