"""per_token_cast: x (T, H) -> FP8 e4m3 data and one scale factor per token and block of channels."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, outs, scalar, tensor

from . import _contract as contract
from ._eager import cast_eager
from ._quant_tensor import QuantTensor
from .per_token_cast_kernel import BLOCK_SIZES, choose_per_token_cast_config, get_per_token_cast_kernel, hidden_multiple


def sf_layout(num_tokens: int, hidden: int, block: int, packed: bool) -> tuple[tuple[int, int], torch.dtype]:
    """(shape, dtype) of the scale factors: fp32 (T, H / block), or UE8M0 bytes packed four per int32."""
    return contract.sf_layout(num_tokens, hidden, (1, block), packed)


def _results(x, num_per_channels, use_packed_ue8m0):
    """(shape, dtype) of data and sf."""
    return (tuple(x.shape), torch.float8_e4m3fn), sf_layout(*x.shape, num_per_channels, use_packed_ue8m0)


def _options(name, H, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
             use_e4m3_sf, stochastic_cast):  # fmt: skip
    contract.check_format(name, fmt)
    contract.check_block(name, 'num_per_channels', num_per_channels, BLOCK_SIZES)
    contract.check_unsupported(
        name, x_block_size=x_block_size, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
        use_e4m3_sf=use_e4m3_sf, stochastic_cast=stochastic_cast,
    )  # fmt: skip
    contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    contract.check_hidden(name, H, hidden_multiple(num_per_channels), f'num_per_channels {num_per_channels}')


def _choice(mode):
    def choice(x, num_per_channels, round_sf, use_packed_ue8m0):
        return {
            'hidden': x.shape[1],
            'in_dtype': x.dtype,
            'block_size': num_per_channels,
            'round_sf': round_sf,
            'packed_ue8m0': use_packed_ue8m0,
            'mode': mode,
        }

    return choice


def _half_options(name, H, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                  use_e4m3_sf):  # fmt: skip
    _options(name, H, fmt, num_per_channels, None, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
             use_e4m3_sf, False)  # fmt: skip


def _precomputed_options(name, x, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf, round_sf,
                         use_packed_ue8m0, use_e4m3_sf):  # fmt: skip
    _half_options(name, x.shape[1], fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                  use_e4m3_sf)  # fmt: skip
    contract.check_given_scales(name, sf, x.shape, (1, num_per_channels), use_packed_ue8m0,
                                f'one per token and block of {num_per_channels}')  # fmt: skip


X = tensor('x', (torch.bfloat16, torch.float32), 'T, H')
_LIMITS = {'limits': lambda name, T, H: contract.check_numel(name, T, H)}
_KERNEL = {'choose_config': choose_per_token_cast_config, 'get_kernel': get_per_token_cast_kernel}
OP = Operator(
    'per_token_cast',
    X,
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    scalar('x_block_size', 'ints', optional=True),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('use_e4m3_sf', 'bool'),
    scalar('stochastic_cast', 'bool'),
    outs('out', 'data', 'sf'),
    extra=_options,
    choice=_choice('cast'),
    results=_results,
    **_LIMITS,
    **_KERNEL,
)
SF_ONLY = Operator(
    'per_token_cast_with_sf_only',
    X,
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('use_e4m3_sf', 'bool'),
    out('out_sf'),
    extra=_half_options,
    choice=_choice('sf_only'),
    results=lambda x, num_per_channels, use_packed_ue8m0: (sf_layout(*x.shape, num_per_channels, use_packed_ue8m0),),
    **_LIMITS,
    **_KERNEL,
)
PRECOMPUTED = Operator(
    'per_token_cast_with_precomputed_sf',
    X,
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    tensor('sf', torch.float32, None),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('use_e4m3_sf', 'bool'),
    out('out'),
    extra=_precomputed_options,
    choice=_choice('precomputed'),
    results=lambda x: ((tuple(x.shape), torch.float8_e4m3fn),),
    **_LIMITS,
    **_KERNEL,
)


@OP.public(cast_eager(OP, 'cast', 'num_per_channels'), result=QuantTensor)
def per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    stochastic_cast: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QuantTensor:
    """Cast each row of x to FP8 e4m3 with one scale factor per block of `num_per_channels` channels
    (TileKernels 2.1.0's call). For a block with absolute maximum a, c = max(a, 1e-4):

        sf = c / 448, data = e4m3(x / sf)                      (to nearest even, saturating at +-448)
        round_sf: sf = 2 ** ceil(log2(c / 448)), data = e4m3(x * 2 ** -log2(sf))

    Args:
        x: (T, H) bf16 or fp32, contiguous; T >= 0 (T = 0: empty results, no launch), H a positive multiple of
            max(64, num_per_channels), T * H < 2**31.
        fmt: 'e4m3' (TileKernels' 'e2m1', FP4, is not supported yet: ValueError).
        num_per_channels: channels per scale factor, 32, 64 or 128.
        round_sf: power-of-two scale factors.
        use_packed_ue8m0: with round_sf, the scale factors as UE8M0 exponent bytes, byte k of a row for block k,
            packed four per int32 (zero padding).
        x_block_size, use_tma_aligned_col_major_sf, use_e4m3_sf, stochastic_cast: TileKernels' options for
            pre-quantised inputs, column-major and E4M3 scale factors and stochastic rounding; only their defaults
            are supported yet (ValueError otherwise).
        out: optional (data, sf) buffers of the result's shapes and dtypes, contiguous, on x's device, not
            overlapping x or each other.

    Returns:
        QuantTensor(data, sf), a tuple: data (T, H) float8_e4m3fn; sf (T, H / num_per_channels) fp32, or with
        use_packed_ue8m0 (T, ceil(H / num_per_channels / 4)) int32. Both backends give the same bytes for the same
        input. -0.0 stays -0.0; an inf in a block makes its scale inf and its values NaN (of either sign) and
        +-0; NaN in a block gives unspecified values (as TileKernels).
    """


@SF_ONLY.public(cast_eager(SF_ONLY, 'sf_only', 'num_per_channels'), returns='Tensor')
def per_token_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out_sf: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scale factors of per_token_cast (same arguments and rules; TileKernels 2.1.0's call), without the
    data: x is read once and only sf is written. out_sf: an optional buffer of sf's shape and dtype."""


@PRECOMPUTED.public(cast_eager(PRECOMPUTED, 'precomputed', 'num_per_channels'), returns='Tensor')
def per_token_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The data of per_token_cast from given scale factors (TileKernels 2.1.0's call): data = e4m3(x * (1 / sf))
    per block (IEEE reciprocal, to nearest even, saturating at +-448), for sf (T, H / num_per_channels) fp32,
    contiguous. round_sf does not change the result; use_packed_ue8m0 is not supported (ValueError). A scale of
    0 gives inverse inf: the block's values become +-448 and its zeros NaN. out: an optional (T, H)
    float8_e4m3fn buffer."""
