"""per_token_cast_and_cast_back: x (T, H) cast per token to FP8 e4m3 and back, in place (fake quantisation)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from . import _contract as contract
from .per_token_cast_and_cast_back_kernel import (
    choose_per_token_cast_and_cast_back_config,
    get_per_token_cast_and_cast_back_kernel,
    hidden_multiple,
)
from .per_token_cast_kernel import BLOCK_SIZES

_ACCESS_BYTES = 16  # the widest access of the CUDA kernel


def access_width(x: torch.Tensor) -> int:
    """Elements of the widest access (up to 16 bytes) that x's address and row stride are multiples of: the CUDA
    kernel's `vec` (its rows are read and written in place, so a misaligned x narrows the accesses, no copy)."""
    stride = x.stride(0) * x.element_size() if x.shape[0] > 1 else 0
    bits = x.data_ptr() | stride | _ACCESS_BYTES
    return (bits & -bits) // x.element_size()


def _options(name, H, fmt, num_per_channels, use_e4m3_sf):
    contract.check_format(name, fmt)
    contract.check_block(name, 'num_per_channels', num_per_channels, BLOCK_SIZES)
    contract.check_unsupported(name, use_e4m3_sf=use_e4m3_sf)
    contract.check_hidden(name, H, hidden_multiple(num_per_channels), f'num_per_channels {num_per_channels}')


def _choice(x, num_per_channels, round_sf, backend):
    return {
        'hidden': x.shape[1],
        'in_dtype': x.dtype,
        'block_size': num_per_channels,
        'round_sf': round_sf,
        'vec': access_width(x) if backend == 'cuda' else None,
    }


OP = Operator(
    'per_token_cast_and_cast_back',
    tensor('x', (torch.bfloat16, torch.float32), 'T, H', layout='rows', written='updated'),
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    scalar('round_sf', 'bool'),
    scalar('use_e4m3_sf', 'bool'),
    limits=lambda name, T, H: contract.check_numel(name, T, H),
    extra=_options,
    choice=_choice,
    choose_config=choose_per_token_cast_and_cast_back_config,
    get_kernel=get_per_token_cast_and_cast_back_kernel,
)


def _eager(x, fmt, block, round_sf, e4m3_sf) -> torch.Tensor:
    """Every check, then the launch. Fast path: by (H, dtype, CUDA index, block, round_sf, access width)."""
    args = (x, fmt, block, round_sf, e4m3_sf)
    key = None
    if fmt == contract.FP8_FORMAT and not e4m3_sf and (shape := OP.fast_ok(*args)) is not None and shape[0]:
        key = (shape[1], x.dtype, x.get_device(), block, round_sf, access_width(x))
    launcher, fast = OP.prepare(key, args)
    OP.finish(launcher, fast, key, (x,), args, empty=not x.shape[0])
    return x


@OP.public(_eager)
def per_token_cast_and_cast_back(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    round_sf: bool = False,
    use_e4m3_sf: bool = False,
) -> torch.Tensor:
    """Cast each row of x to FP8 e4m3 with one scale per block of `num_per_channels` channels and back, in place
    (TileKernels 2.1.0's call: the quantisation error a model trained for FP8 sees). Per block, with per_token_cast's
    scale sf and inverse:

        x = x.dtype(fp32(e4m3(fp32(x) * inverse)) * sf)          (nearest even, saturating at +-448)

    Args:
        x: (T, H) bf16 or fp32, the last dimension contiguous, any row stride (written in place); T >= 0 (T = 0:
            no launch), H a positive multiple of max(64, num_per_channels), T * H < 2**31.
        fmt: 'e4m3' (TileKernels' 'e2m1', FP4, is not supported yet: ValueError).
        num_per_channels: 32, 64 or 128 (TileKernels' 16 is not supported yet: ValueError).
        round_sf: power-of-two scales.
        use_e4m3_sf: only False is supported yet (ValueError).

    Returns:
        x (TileKernels returns None).
    """
