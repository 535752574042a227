"""mhc_expand_fwd: a token's hidden row copied onto its mhc_mult residual streams (TileKernels 2.1.0's
expand_to_mhc_fwd, renamed with the domain first)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, tensor

from ._mhc_expand_apply_common import check_sizes
from .mhc_expand_kernel import choose_mhc_expand_config, get_mhc_expand_kernel

OP = Operator(
    'mhc_expand_fwd',
    tensor('x', torch.bfloat16, 'T, H', aligned=True),
    tensor('o', torch.bfloat16, 'T, mhc, H', aligned=True, written='written'),
    limits=check_sizes,
    choice=lambda o: {'direction': 'fwd', 'mhc': o.shape[1], 'hidden': o.shape[2]},
    choose_config=choose_mhc_expand_config,
    get_kernel=get_mhc_expand_kernel,
)


def _eager(x, o):
    """Every check (or the fast path's), then the launch (none for T = 0). Fast path, for T > 0: by (x's and o's
    trailing sizes, CUDA index); the compiled entry checks the rest."""
    args = (x, o)
    key = None
    shape = OP.fast_ok(*args)
    if shape is not None and shape[0]:
        key = (shape[1:], o.shape[1:], x.get_device())
    launcher, fast = OP.prepare(key, args)
    OP.finish(launcher, fast, key, args, args, empty=not x.shape[0])
    return o


@OP.public(_eager)
def mhc_expand_fwd(x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """o[t, m, h] = x[t, h] for every stream m: the residual stream of a token copied onto its mhc_mult streams
    (bit-exact).

    Args:
        x: (T, H) bf16, contiguous, 16-byte aligned. T >= 0 (T = 0: nothing launched), H a positive multiple of 64.
        o: (T, mhc_mult, H) bf16, contiguous, 16-byte aligned, apart from x: written in place. mhc_mult in 1 .. 8
            (TileKernels' Ascend kernel: 4 only); T * mhc_mult * H <= 2**30 (int32 indices).

    Returns:
        o, the written buffer (TileKernels returns None).
    """
