"""mhc_pre_apply_mix_fwd: a token's mhc_mult residual streams mixed into the layer input by its pre-layer mix
(TileKernels 2.1.0's mhc_pre_apply_mix_fwd)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._mhc_expand_apply_common import check_sizes
from .mhc_pre_apply_mix_kernel import choose_mhc_pre_apply_mix_config, get_mhc_pre_apply_mix_kernel

OP = Operator(
    'mhc_pre_apply_mix_fwd',
    tensor('x', torch.bfloat16, 'T, mhc, H', aligned=True),
    tensor('mix', torch.float32, 'T, mhc'),
    tensor('o', torch.bfloat16, 'T, H', aligned=True, written='written'),
    limits=check_sizes,
    choice=lambda x: {'direction': 'fwd', 'mhc': x.shape[1], 'hidden': x.shape[2]},
    choose_config=choose_mhc_pre_apply_mix_config,
    get_kernel=get_mhc_pre_apply_mix_kernel,
)


def _eager(x, mix, o):
    """Every check (or the fast path's), then the launch (none for T = 0). Fast path, for T > 0: by (x's
    trailing sizes, CUDA index); the compiled entry checks the rest."""
    args = (x, mix, o)
    key = None
    shape = OP.fast_ok(*args)
    if shape is not None and shape[0]:
        key = (shape[1:], x.get_device())
    launcher, fast = OP.prepare(key, args)
    OP.finish(launcher, fast, key, args, args, empty=not x.shape[0])
    return o


@OP.public(_eager)
def mhc_pre_apply_mix_fwd(x: torch.Tensor, mix: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """o[t, h] = bf16(sum over m of mix[t, m] * x[t, m, h]), in fp32: mix[t, 0] * x[t, 0, h] first, then one fused
    multiply-add per further stream in order, rounded once to bf16 (nearest even).

    Args:
        x: (T, mhc_mult, H) bf16, contiguous, 16-byte aligned: the residual streams. T >= 0 (T = 0: nothing
            launched), mhc_mult in 1 .. 8 (TileKernels' Ascend kernel: 4 only), H a positive multiple of 64,
            T * mhc_mult * H <= 2**30 (int32 indices).
        mix: (T, mhc_mult) fp32, contiguous: the pre-layer mix (mhc_pre_split_mixes_fwd's pre_layer_mix viewed
            as (T, mhc_mult)).
        o: (T, H) bf16, contiguous, 16-byte aligned, apart from x and mix: written in place.

    Returns:
        o, the written buffer (TileKernels returns None).
    """
