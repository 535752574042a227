"""per_token_cast_and_cast_back: x (T, H) cast per token to FP8 e4m3 or FP4 e2m1 and back, in place (fake
quantisation)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from . import _contract as contract
from .per_token_cast_and_cast_back_kernel import (
    choose_per_token_cast_and_cast_back_config,
    get_per_token_cast_and_cast_back_kernel,
    hidden_multiple,
)
from .per_token_cast_kernel import CAST_BLOCK_SIZES, FORMATS

_ACCESS_BYTES = 16  # the widest access of the CUDA kernel


def access_width(x: torch.Tensor) -> int:
    """Elements of the widest access (up to 16 bytes) that x's address and row stride are multiples of: the CUDA
    kernel's `vec` (its rows are read and written in place, so a misaligned x narrows the accesses, no copy)."""
    stride = x.stride(0) * x.element_size() if x.shape[0] > 1 else 0
    bits = x.data_ptr() | stride | _ACCESS_BYTES
    return (bits & -bits) // x.element_size()


def _options(name, H, fmt, num_per_channels, round_sf, use_e4m3_sf):
    contract.check_cast_format(name, fmt, FORMATS)
    contract.check_block(name, 'num_per_channels', num_per_channels, CAST_BLOCK_SIZES)
    contract.check_e4m3_sf(name, use_e4m3_sf, round_sf)
    contract.check_hidden(name, H, hidden_multiple(num_per_channels), f'num_per_channels {num_per_channels}')


def _choice(x, fmt, num_per_channels, round_sf, use_e4m3_sf, backend):
    return {
        'hidden': x.shape[1],
        'in_dtype': x.dtype,
        'block_size': num_per_channels,
        'round_sf': round_sf,
        'vec': access_width(x) if backend == 'cuda' else None,
        'fmt': fmt,
        'e4m3_sf': use_e4m3_sf,
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
    """Every check, then the launch. Fast path: by (H, dtype, CUDA index, fmt, block, scales, access width)."""
    args = (x, fmt, block, round_sf, e4m3_sf)
    key = None
    if (shape := OP.fast_ok(*args)) is not None and shape[0]:
        key = (shape[1], x.dtype, x.get_device(), fmt, block, round_sf, e4m3_sf, access_width(x))
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
    """Cast each row of x to FP8 e4m3 or FP4 e2m1 with one scale per block of `num_per_channels` channels and back,
    in place (TileKernels 2.1.0's call: the quantisation error a model trained for FP8 / FP4 sees). Per block, with
    per_token_cast's scale sf and inverse:

        x = x.dtype(fp32(narrow(fp32(x) * inverse)) * fp32(sf))

    narrow: per_token_cast's (e4m3 nearest even saturating at +-448, e2m1 nearest even on the FP4 grid saturating
    at +-6); bit for bit cast_back(per_token_cast(x, fmt, num_per_channels, round_sf=round_sf,
    use_e4m3_sf=use_e4m3_sf), x.dtype, (1, num_per_channels)).

    Args:
        x: (T, H) bf16 or fp32, the last dimension contiguous, any row stride (written in place); T >= 0 (T = 0:
            no launch), H a positive multiple of max(64, num_per_channels), T * H < 2**31.
        fmt: 'e4m3' or 'e2m1' (FP4).
        num_per_channels: 16, 32, 64 or 128.
        round_sf: power-of-two scales.
        use_e4m3_sf: E4M3 scales (NVFP4's with fmt 'e2m1' and 16 channels); not with round_sf.

    Returns:
        x (TileKernels returns None).
    """
