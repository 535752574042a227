"""per_channel_cast: x (T, H), or a per-token quantised x, -> FP8 e4m3 data with one scale factor per channel and
block of tokens (the operand of a weight gradient's GEMM, which reduces over tokens)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, outs, quant, scalar

from . import _contract as contract
from ._quant_tensor import QuantTensor
from .per_channel_cast_kernel import (
    BLOCK_TOKENS,
    IN_BLOCK_CHANNELS,
    choose_per_channel_cast_config,
    get_per_channel_cast_kernel,
    hidden_multiple,
)

_PLAIN_DTYPES = (torch.bfloat16, torch.float32)


def sf_layout(num_tokens: int, hidden: int, block_tokens: int, packed: bool) -> tuple[tuple[int, int], torch.dtype]:
    """(shape, dtype) of the scale factors: fp32 (ceil(T / bt), H); or UE8M0 bytes packed along the tokens, four
    token blocks per int32 word of a channel (ceil(ceil(T / bt) / 4), H)."""
    return contract.sf_layout(num_tokens, hidden, (block_tokens, 1), packed)


def _results(x, num_per_tokens, use_packed_ue8m0):
    data = x if isinstance(x, torch.Tensor) else x[0]
    return (tuple(data.shape), torch.float8_e4m3fn), sf_layout(*data.shape, num_per_tokens, use_packed_ue8m0)


def _options(name, x_data, x_sf, H, T, fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0):
    contract.check_format(name, fmt)
    contract.check_block(name, 'num_per_tokens', num_per_tokens, BLOCK_TOKENS)
    contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    if x_sf is None:
        if x_data.dtype not in _PLAIN_DTYPES:
            raise TypeError(f'{name}: x must be bf16 or fp32, or a quantised tensor (data, sf), got {x_data.dtype}')
        if num_per_channels is not None:
            raise ValueError(f'{name}: num_per_channels is for a quantised x (data, sf), got {num_per_channels}')
        contract.check_hidden(name, H, hidden_multiple(None), 'whole vector registers')
        return
    if x_data.dtype != torch.float8_e4m3fn:
        raise TypeError(f'{name}: x[0] of a quantised x must be float8_e4m3fn, got {x_data.dtype}')
    if num_per_channels is None:
        raise ValueError(f'{name}: a quantised x (data, sf) needs num_per_channels, its scale block')
    contract.check_block(name, 'num_per_channels', num_per_channels, IN_BLOCK_CHANNELS)
    contract.check_hidden(name, H, hidden_multiple(num_per_channels), f'num_per_channels {num_per_channels}')
    # fp32 and E4M3 scales: one per token and channel block; UE8M0: packed four per int32.
    shape, _ = contract.sf_layout(T, H, (1, num_per_channels), x_sf.dtype == contract.PACKED_SF_DTYPE)
    if x_sf.shape != shape:
        raise ValueError(f'{name}: x[1] must have shape {shape} ({x_sf.dtype} scales), got {tuple(x_sf.shape)}')
    if x_sf.stride(0) != shape[1] and shape[0] > 1:
        raise ValueError(f'{name}: x[1] must be contiguous (row-major scales), got strides {x_sf.stride()}')


OP = Operator(
    'per_channel_cast',
    quant(
        'x',
        (*_PLAIN_DTYPES, torch.float8_e4m3fn),
        'T, H',
        sf_dtype=(torch.float32, contract.PACKED_SF_DTYPE, contract.E4M3_SF_DTYPE),
        plain=True,
    ),
    scalar('fmt', 'str'),
    scalar('num_per_tokens', 'int'),
    scalar('round_sf', 'bool'),
    scalar('num_per_channels', 'int', optional=True),
    scalar('use_packed_ue8m0', 'bool'),
    outs('out', 'data', 'sf'),
    limits=lambda name, T, H: contract.check_numel(name, T, H),
    extra=_options,
    choice=lambda x, num_per_tokens, round_sf, use_packed_ue8m0, num_per_channels: {
        'hidden': (x if isinstance(x, torch.Tensor) else x[0]).shape[1],
        'in_dtype': (x if isinstance(x, torch.Tensor) else x[0]).dtype,
        'block_tokens': num_per_tokens,
        'round_sf': round_sf,
        'packed_ue8m0': use_packed_ue8m0,
        'in_block_channels': None if isinstance(x, torch.Tensor) else num_per_channels,
        'in_packed_ue8m0': not isinstance(x, torch.Tensor) and x[1].dtype == contract.PACKED_SF_DTYPE,
        'in_e4m3_sf': not isinstance(x, torch.Tensor) and x[1].dtype == contract.E4M3_SF_DTYPE,
    },
    results=_results,
    choose_config=choose_per_channel_cast_config,
    get_kernel=get_per_channel_cast_kernel,
)


def _eager(x, fmt, num_per_tokens, round_sf, num_per_channels, packed, out) -> QuantTensor:
    """Every check, then the launch. Fast path (a plain x, without out=): by (H, dtype, CUDA index, block, scale
    format)."""
    args = (x, fmt, num_per_tokens, round_sf, num_per_channels, packed, out)
    key = None
    if type(x) is torch.Tensor and out is None and num_per_channels is None and fmt == contract.FP8_FORMAT:
        shape = OP.fast_ok(*args)
        if shape is not None and shape[0]:
            key = (shape[1], x.dtype, x.get_device(), num_per_tokens, round_sf, packed)
    launcher, fast = OP.prepare(key, args)
    data = x if isinstance(x, torch.Tensor) else x[0]
    if out is None:
        result, sf = (data.new_empty(s, dtype=d) for s, d in _results(x, num_per_tokens, packed))
    else:
        result, sf = out
    sf_bytes = sf.view(torch.uint8) if packed else sf
    if isinstance(x, torch.Tensor):
        launch_args = (x, result, sf_bytes)
    else:
        x_sf = x[1].view(torch.uint8) if x[1].dtype == contract.PACKED_SF_DTYPE else x[1]
        launch_args = (data, x_sf, result, sf_bytes)
    OP.finish(launcher, fast, key, launch_args, args, empty=not data.shape[0])
    return QuantTensor(result, sf)


@OP.public(_eager, result=QuantTensor)
def per_channel_cast(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    num_per_channels: int | None = None,
    use_packed_ue8m0: bool = False,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QuantTensor:
    """Cast x to FP8 e4m3 with one scale factor per channel h and block of `num_per_tokens` tokens (TileKernels
    2.1.0's call). For the block's |x| maximum a over its tokens that exist (T need not be a multiple),
    c = max(a, 1e-4):

        sf = c / 448, data = e4m3(x / sf)                      (to nearest even, saturating at +-448)
        round_sf: sf = 2 ** ceil(log2(c / 448)), data = e4m3(x * 2 ** -log2(sf))

    Args:
        x: (T, H) bf16 or fp32, contiguous; or a per-token quantised tensor (data, sf) to rescale: data (T, H)
            float8_e4m3fn, sf (T, H / num_per_channels) fp32 or float8_e4m3fn (E4M3 scales, which TileKernels
            takes on CUDA only), or (T, ceil(H / num_per_channels / 4)) int32 packed UE8M0 (per_token_cast's
            layouts), decoded as fp32(data) * fp32(sf). T >= 0 (T = 0: empty results, no launch), H a positive
            multiple of 64 (and of num_per_channels), T * H < 2**31.
        fmt: 'e4m3', as TileKernels (ValueError otherwise). FP4 ('e2m1') would pack two channels a byte, but the
            GEMM this cast feeds reduces over the tokens, along which an FP4 operand must be packed.
        num_per_tokens: tokens per scale factor, 32 or 128.
        round_sf: power-of-two scale factors.
        num_per_channels: the channel block of a quantised x's scales, 32 or 128; None for a bf16 / fp32 x.
        use_packed_ue8m0: with round_sf, the scale factors as UE8M0 exponent bytes packed along the tokens:
            byte j of word [r, h] is the scale of token block 4 r + j for channel h (zero for blocks past the end).
        out: optional (data, sf) buffers of the result's shapes and dtypes, contiguous, on x's device, not
            overlapping the inputs or each other.

    Returns:
        QuantTensor(data, sf): data (T, H) float8_e4m3fn; sf (ceil(T / num_per_tokens), H) fp32, or with
        use_packed_ue8m0 (ceil(ceil(T / num_per_tokens) / 4), H) int32. Both backends give the same bytes for the
        same input. Special values as per_token_cast.
    """
