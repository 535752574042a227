"""mhc_expand_bwd: the gradient of mhc_expand_fwd, the sum of a token's mhc_mult stream gradients (TileKernels
2.1.0's expand_to_mhc_bwd, renamed with the domain first)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._mhc_expand_apply_common import check_sizes
from .mhc_expand_kernel import choose_mhc_expand_config, get_mhc_expand_kernel

OP = Operator(
    'mhc_expand_bwd',
    tensor('o_grad', torch.bfloat16, 'T, mhc, H', aligned=True),
    tensor('x_grad', torch.bfloat16, 'T, H', aligned=True, written='written'),
    limits=check_sizes,
    choice=lambda o_grad: {'direction': 'bwd', 'mhc': o_grad.shape[1], 'hidden': o_grad.shape[2]},
    choose_config=choose_mhc_expand_config,
    get_kernel=get_mhc_expand_kernel,
)


def _eager(o_grad, x_grad):
    """Every check (or the fast path's), then the launch (none for T = 0). Fast path, for T > 0: by (o_grad's
    trailing sizes, CUDA index); the compiled entry checks the rest."""
    args = (o_grad, x_grad)
    key = None
    shape = OP.fast_ok(*args)
    if shape is not None and shape[0]:
        key = (shape[1:], o_grad.get_device())
    launcher, fast = OP.prepare(key, args)
    OP.finish(launcher, fast, key, args, args, empty=not o_grad.shape[0])
    return x_grad


@OP.public(_eager)
def mhc_expand_bwd(o_grad: torch.Tensor, x_grad: torch.Tensor) -> torch.Tensor:
    """x_grad[t, h] = bf16(sum over m of o_grad[t, m, h]): the streams summed in order m = 0 .. mhc_mult - 1 in
    fp32, rounded once to bf16 (nearest even). No reduction crosses a thread or a core: the same bits on every
    run, and on both backends.

    Args:
        o_grad: (T, mhc_mult, H) bf16, contiguous, 16-byte aligned. T >= 0 (T = 0: nothing launched), mhc_mult
            in 1 .. 8 (TileKernels' Ascend kernel: 4 only), H a positive multiple of 64, T * mhc_mult * H <= 2**30
            (int32 indices).
        x_grad: (T, H) bf16, contiguous, 16-byte aligned, apart from o_grad: overwritten (not accumulated into),
            as TileKernels does.

    Returns:
        x_grad, the written buffer (TileKernels returns None).
    """
