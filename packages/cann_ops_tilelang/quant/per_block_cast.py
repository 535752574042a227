"""per_block_cast and its two halves: x (T, H) -> FP8 e4m3 or FP4 (e2m1) data with one scale factor per block of bt
tokens by bc channels; the scales only; the data from given scales."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, outs, scalar, tensor

from . import _contract as contract
from ._eager import cast_eager
from ._quant_tensor import QuantTensor
from .per_block_cast_kernel import (
    BLOCK_CHANNELS,
    BLOCK_TOKENS,
    FORMATS,
    choose_per_block_cast_config,
    get_per_block_cast_kernel,
    hidden_multiple,
)


def sf_layout(
    num_tokens: int, hidden: int, block_size, packed: bool, e4m3_sf: bool = False
) -> tuple[tuple[int, int], torch.dtype]:
    """(shape, dtype) of the scale factors: fp32 (ceil(T / bt), H / bc), E4M3 bytes of that shape float8_e4m3fn,
    or UE8M0 bytes packed four per int32."""
    shape, dtype = contract.sf_layout(num_tokens, hidden, tuple(block_size), packed)
    return shape, contract.E4M3_SF_DTYPE if e4m3_sf else dtype


def _sf_result(x, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf):
    """(shape, dtype) of sf, with its strides when column-major (contract.scale_result of its ceil(T / bt) rows,
    the token blocks)."""
    layout = sf_layout(*x.shape, block_size, use_packed_ue8m0, use_e4m3_sf)
    return contract.scale_result(layout, use_tma_aligned_col_major_sf, x.device)


def _options(name, H, fmt, block_size, round_sf, use_packed_ue8m0, use_e4m3_sf):
    """The rules of the three calls (use_tma_aligned_col_major_sf: any bool; per_block_cast_with_precomputed_sf
    refuses True)."""
    contract.check_cast_format(name, fmt, FORMATS)
    if len(block_size) != 2:
        raise ValueError(f'{name}: block_size must be (tokens, channels), got {block_size}')
    bt, bc = block_size
    contract.check_block(name, 'block_size[0] (tokens per scale)', bt, BLOCK_TOKENS)
    contract.check_block(name, 'block_size[1] (channels per scale)', bc, BLOCK_CHANNELS)
    contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    contract.check_e4m3_sf(name, use_e4m3_sf, round_sf)
    contract.check_hidden(name, H, hidden_multiple(bc), f'{bc} channels per scale')


def _precomputed_options(name, x, fmt, block_size, sf, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                         use_e4m3_sf):  # fmt: skip
    _options(name, x.shape[1], fmt, block_size, round_sf, use_packed_ue8m0, use_e4m3_sf)
    if use_tma_aligned_col_major_sf:
        raise ValueError(
            f'{name}: use_tma_aligned_col_major_sf=True is not supported: the given scales are read row-major (as '
            'TileKernels 2.1.0 reads them)'
        )
    contract.check_given_scales(name, sf, x.shape, block_size, use_packed_ue8m0,
                                f'one per block of {tuple(block_size)}')  # fmt: skip
    wanted = contract.E4M3_SF_DTYPE if use_e4m3_sf else torch.float32
    if sf.dtype != wanted:
        raise TypeError(f'{name}: sf must have dtype {wanted} with use_e4m3_sf={use_e4m3_sf}, got {sf.dtype}')


def _choice(mode):
    def choice(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf):
        return {
            'hidden': x.shape[1],
            'in_dtype': x.dtype,
            'block_tokens': block_size[0],
            'block_channels': block_size[1],
            'round_sf': round_sf,
            'packed_ue8m0': use_packed_ue8m0,
            'mode': mode,
            'fmt': fmt,
            'e4m3_sf': use_e4m3_sf,
            'col_major_sf': use_tma_aligned_col_major_sf,
        }

    return choice


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
    scalar('use_e4m3_sf', 'bool'),
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
    results=lambda x, fmt, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf: (
        contract.data_layout(*x.shape, fmt),
        _sf_result(x, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf),
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
    results=lambda x, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf: (
        _sf_result(x, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf),
    ),
    **_COMMON,
)
PRECOMPUTED = Operator(
    'per_block_cast_with_precomputed_sf',
    X,
    scalar('fmt', 'str'),
    scalar('block_size', 'ints'),
    tensor('sf', (torch.float32, contract.E4M3_SF_DTYPE), None),
    *_FLAGS,
    out('out'),
    extra=_precomputed_options,
    choice=_choice('precomputed'),
    results=lambda x, fmt: (contract.data_layout(*x.shape, fmt),),
    **_COMMON,
)


@OP.public(cast_eager(OP, 'cast', 'block_size', col_major=True), result=QuantTensor)
def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QuantTensor:
    """Cast x to FP8 e4m3 or FP4 e2m1 with one scale factor per block of block_size = (bt, bc) tokens by channels
    (TileKernels 2.1.0's call; DeepSeek-V3's weights use (128, 128)). For a block with absolute maximum a (over
    its rows that exist: T need not be a multiple of bt), m the format's largest value (448 / 6) and
    c = max(a, floor) (TileKernels' floors: e4m3 1e-4, E4M3 scales m * 2**-9, FP4 with fp32 scales 6 * 2**-126):

        sf = c / m, data = narrow(x * (m / c))
        round_sf: sf = 2 ** ceil(log2(c / m)), data = narrow(x * 2 ** -log2(sf))
        use_e4m3_sf: sf = e4m3(c / m) (nearest even, saturating at 448), data = narrow(x * (1 / fp32(sf)))

    narrow: e4m3 to nearest even, saturating at +-448; e2m1 to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6},
    saturating at +-6 (values past 6, +-inf and NaN give +-6).

    Args:
        x: (T, H) bf16 or fp32, contiguous; T >= 0 (T = 0: empty results, no launch), H a positive multiple of
            max(64, bc), T * H < 2**31.
        fmt: 'e4m3' (FP8) or 'e2m1' (FP4: two codes a byte, element 2 i in the low nibble of byte i).
        block_size: (bt, bc), each 16, 32, 64 or 128 (16 x 16 with use_e4m3_sf: NVFP4's 2-D weight blocks).
        use_tma_aligned_col_major_sf: sf column-major, as TMA-loading FP8 GEMMs (DeepGEMM) read it: the same
            shape and values, strides (1, R_pad), a view buf[:, :R].T of a (K, R_pad) buffer, R = ceil(T / bt) the
            scale rows (token blocks); R_pad is R rounded up to 16 bytes of sf's dtype on CUDA (4 fp32 / int32, 16
            E4M3), R on Ascend (TileKernels' rule per backend; T = 0: strides (1, 0)).
        round_sf: power-of-two scale factors.
        use_packed_ue8m0: with round_sf, the scale factors as UE8M0 exponent bytes, byte k of a row for channel
            block k, packed four per int32 (zero padding).
        use_e4m3_sf: the scale factors as float8_e4m3fn (not with round_sf; beyond TileKernels, whose
            per_block_cast has no such option: placed before `out` as in its per_token_cast). A block maximum
            past 448 * m saturates its scale at 448, so its data saturates too.
        out: optional (data, sf) buffers of the result's shapes and dtypes, on x's device, not overlapping x or each
            other; data contiguous, sf contiguous or, with use_tma_aligned_col_major_sf, of the strides above
            (ValueError otherwise; TileKernels refuses a given buffer with that option).

    Returns:
        QuantTensor(data, sf): data (T, H) float8_e4m3fn, or FP4 (T, H / 2) int8; sf (ceil(T / bt), H / bc) fp32
        or float8_e4m3fn, or with use_packed_ue8m0 (ceil(T / bt), ceil(H / bc / 4)) int32. Both backends give the
        same bytes for the same input. Special values as per_token_cast: -0.0 stays -0.0 (FP4: code 8); an inf
        in a block makes its fp32 / UE8M0 scale inf, its values +-0 and the inf NaN (FP4: +-6 of either sign);
        with E4M3 scales the scale saturates at 448 and the inf at +-448 / +-6; NaN in a block gives unspecified
        values (as TileKernels).
    """


@SF_ONLY.public(cast_eager(SF_ONLY, 'sf_only', 'block_size', col_major=True), returns='Tensor')
def per_block_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out_sf: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scale factors of per_block_cast (same arguments and rules, column-major scales included; the format `fmt`
    sets m and the floor), without the data: x is read once and only sf is written. out_sf: an optional buffer of
    sf's shape, dtype and layout."""


@PRECOMPUTED.public(cast_eager(PRECOMPUTED, 'precomputed', 'block_size'), returns='Tensor')
def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The data of per_block_cast from given scale factors: data = narrow(x * (1 / fp32(sf))) per block (IEEE
    reciprocal; e4m3 clamped to +-448 then to nearest even, FP4 e2m1 as per_block_cast), for sf (ceil(T / bt),
    H / bc) contiguous, fp32, or float8_e4m3fn with use_e4m3_sf (e.g. from per_block_cast_with_sf_only). round_sf
    does not change the result (the inverse is 1 / sf either way); use_packed_ue8m0 and
    use_tma_aligned_col_major_sf are not supported (ValueError; the peer refuses them too). A scale of 0 gives
    inverse inf: the block's values become +-448 (FP4 +-6) and its zeros NaN (FP4 +-6). out: an optional buffer of
    the data's shape and dtype ((T, H) float8_e4m3fn, or FP4 (T, H / 2) int8)."""
