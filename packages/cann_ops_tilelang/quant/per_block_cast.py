"""per_block_cast and its two halves: x (T, H) -> FP8 e4m3 data with one scale factor per block of bt tokens by
bc channels; the scales only; the data from given scales."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, outs, scalar, tensor

from . import _contract as contract
from ._eager import cast_eager
from ._quant_tensor import QuantTensor
from .per_block_cast_kernel import (
    BLOCK_CHANNELS,
    BLOCK_TOKENS,
    choose_per_block_cast_config,
    get_per_block_cast_kernel,
    hidden_multiple,
)


def _options(name, H, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0):
    contract.check_format(name, fmt)
    if len(block_size) != 2:
        raise ValueError(f'{name}: block_size must be (tokens, channels), got {block_size}')
    bt, bc = block_size
    contract.check_block(name, 'block_size[0] (tokens per scale)', bt, BLOCK_TOKENS)
    contract.check_block(name, 'block_size[1] (channels per scale)', bc, BLOCK_CHANNELS)
    contract.check_unsupported(name, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf)
    contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    contract.check_hidden(name, H, hidden_multiple(bc), f'{bc} channels per scale')


def _precomputed_options(name, x, fmt, block_size, sf, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0):
    _options(name, x.shape[1], fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    contract.check_given_scales(name, sf, x.shape, block_size, use_packed_ue8m0,
                                f'one per block of {tuple(block_size)}')  # fmt: skip


def _choice(mode):
    def choice(x, block_size, round_sf, use_packed_ue8m0):
        return {
            'hidden': x.shape[1],
            'in_dtype': x.dtype,
            'block_tokens': block_size[0],
            'block_channels': block_size[1],
            'round_sf': round_sf,
            'packed_ue8m0': use_packed_ue8m0,
            'mode': mode,
        }

    return choice


def _data(x):
    return tuple(x.shape), torch.float8_e4m3fn


X = tensor('x', (torch.bfloat16, torch.float32), 'T, H')
_COMMON = dict(
    limits=lambda name, T, H: contract.check_numel(name, T, H),
    choose_config=choose_per_block_cast_config,
    get_kernel=get_per_block_cast_kernel,
)
_FLAGS = (
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
)
OP = Operator(
    'per_block_cast',
    X,
    scalar('fmt', 'str'),
    scalar('block_size', 'ints'),
    *_FLAGS,
    outs('out', 'data', 'sf'),
    extra=_options,
    choice=_choice('cast'),
    results=lambda x, block_size, use_packed_ue8m0: (
        _data(x),
        contract.sf_layout(*x.shape, block_size, use_packed_ue8m0),
    ),
    **_COMMON,
)
SF_ONLY = Operator(
    'per_block_cast_with_sf_only',
    X,
    scalar('fmt', 'str'),
    scalar('block_size', 'ints'),
    *_FLAGS,
    out('out_sf'),
    extra=_options,
    choice=_choice('sf_only'),
    results=lambda x, block_size, use_packed_ue8m0: (contract.sf_layout(*x.shape, block_size, use_packed_ue8m0),),
    **_COMMON,
)
PRECOMPUTED = Operator(
    'per_block_cast_with_precomputed_sf',
    X,
    scalar('fmt', 'str'),
    scalar('block_size', 'ints'),
    tensor('sf', torch.float32, None),
    *_FLAGS,
    out('out'),
    extra=_precomputed_options,
    choice=_choice('precomputed'),
    results=lambda x: (_data(x),),
    **_COMMON,
)


@OP.public(cast_eager(OP, 'cast', 'block_size'), result=QuantTensor)
def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QuantTensor:
    """Cast x to FP8 e4m3 with one scale factor per block of block_size = (bt, bc) tokens by channels
    (TileKernels 2.1.0's call; DeepSeek-V3's weights use (128, 128)). For a block with absolute maximum a (over
    its rows that exist: T need not be a multiple of bt), c = max(a, 1e-4):

        sf = c / 448, data = e4m3(x / sf)                      (to nearest even, saturating at +-448)
        round_sf: sf = 2 ** ceil(log2(c / 448)), data = e4m3(x * 2 ** -log2(sf))

    Args:
        x: (T, H) bf16 or fp32, contiguous; T >= 0 (T = 0: empty results, no launch), H a positive multiple of
            max(64, bc), T * H < 2**31.
        fmt: 'e4m3' (TileKernels' 'e2m1', FP4, is not supported yet: ValueError).
        block_size: (bt, bc), each 32, 64 or 128.
        use_tma_aligned_col_major_sf: only False is supported yet (ValueError).
        round_sf: power-of-two scale factors.
        use_packed_ue8m0: with round_sf, the scale factors as UE8M0 exponent bytes, byte k of a row for channel
            block k, packed four per int32 (zero padding).
        out: optional (data, sf) buffers of the result's shapes and dtypes, contiguous, on x's device, not
            overlapping x or each other.

    Returns:
        QuantTensor(data, sf): data (T, H) float8_e4m3fn; sf (ceil(T / bt), H / bc) fp32, or with use_packed_ue8m0
        (ceil(T / bt), ceil(H / bc / 4)) int32. Both backends give the same bytes for the same input. Special
        values as per_token_cast.
    """


@SF_ONLY.public(cast_eager(SF_ONLY, 'sf_only', 'block_size'), returns='Tensor')
def per_block_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out_sf: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scale factors of per_block_cast (same arguments and rules), without the data: x is read once and
    only sf is written. out_sf: an optional buffer of sf's shape and dtype."""


@PRECOMPUTED.public(cast_eager(PRECOMPUTED, 'precomputed', 'block_size'), returns='Tensor')
def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The data of per_block_cast from given scale factors: data = e4m3(x * (1 / sf)) per block (IEEE
    reciprocal, to nearest even, saturating at +-448), for sf (ceil(T / bt), H / bc) fp32, contiguous (e.g. from
    per_block_cast_with_sf_only). round_sf does not change the result (the inverse is 1 / sf either way);
    use_packed_ue8m0 is not supported (ValueError). A scale of 0 gives inverse inf: the block's values become
    +-448 and its zeros NaN. out: an optional (T, H) float8_e4m3fn buffer."""
