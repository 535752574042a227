"""mhc_pre_apply_mix_bwd: the gradients of mhc_pre_apply_mix_fwd, the streams' accumulated in place and the
mix's returned (TileKernels 2.1.0's mhc_pre_apply_mix_bwd)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._mhc_expand_apply_common import check_sizes
from .mhc_pre_apply_mix_kernel import choose_mhc_pre_apply_mix_config, get_mhc_pre_apply_mix_kernel

OP = Operator(
    'mhc_pre_apply_mix_bwd',
    tensor('o_grad', torch.bfloat16, 'T, H', aligned=True),
    tensor('x', torch.bfloat16, 'T, mhc, H', aligned=True),
    tensor('mix', torch.float32, 'T, mhc'),
    tensor('x_grad', torch.bfloat16, 'T, mhc, H', aligned=True, written='updated'),
    limits=check_sizes,
    choice=lambda x: {'direction': 'bwd', 'mhc': x.shape[1], 'hidden': x.shape[2]},
    choose_config=choose_mhc_pre_apply_mix_config,
    get_kernel=get_mhc_pre_apply_mix_kernel,
)


def _eager(o_grad, x, mix, x_grad):
    """Every check (or the fast path's), then the launch (none for T = 0: an empty mix_grad). Fast path, for
    T > 0: by (o_grad's and x's trailing sizes, CUDA index); the compiled entry checks the rest."""
    args = (o_grad, x, mix, x_grad)
    key = None
    shape = OP.fast_ok(*args)
    if shape is not None and shape[0]:
        key = (shape[1:], x.shape[1:], x.get_device())
    launcher, fast = OP.prepare(key, args)
    mix_grad = mix.new_empty(mix.shape)
    OP.finish(launcher, fast, key, (*args, mix_grad), args, empty=not x.shape[0])
    return mix_grad


def _fake(o_grad, x, mix, x_grad):
    return mix.new_empty(mix.shape)


@OP.public(_eager, returns='Tensor', fake=_fake)
def mhc_pre_apply_mix_bwd(
    o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor, x_grad: torch.Tensor
) -> torch.Tensor:
    """The gradients of o = sum over m of mix[t, m] * x[t, m, h] (mhc_pre_apply_mix_fwd), in fp32:

        x_grad[t, m, h] = bf16(x_grad[t, m, h] + mix[t, m] * o_grad[t, h])   (one fused multiply-add, in place)
        mix_grad[t, m] = sum over h of o_grad[t, h] * x[t, m, h]

    x_grad is accumulated into, as TileKernels does (the streams also get gradient from the residual path). The
    sum over h stays in one Ascend core or one CUDA thread block, in a fixed order, without atomics: the same
    bits on every run (the two backends' orders differ, so their mix_grad may differ in the last bits).

    Args:
        o_grad: (T, H) bf16, contiguous, 16-byte aligned: the gradient of o.
        x: (T, mhc_mult, H) bf16, contiguous, 16-byte aligned: the forward's streams. T >= 0 (T = 0: nothing
            launched), mhc_mult in 1 .. 8 (TileKernels' Ascend kernel: 4 only), H a positive multiple of 64,
            T * mhc_mult * H <= 2**30 (int32 indices).
        mix: (T, mhc_mult) fp32, contiguous: the forward's mix.
        x_grad: (T, mhc_mult, H) bf16, contiguous, 16-byte aligned, apart from every other argument: updated in
            place.

    Returns:
        mix_grad, a new (T, mhc_mult) fp32 tensor (as TileKernels).
    """
