"""per_token_cast: x (T, H) -> FP8 e4m3 or FP4 (e2m1) data and one scale factor per token and block of channels."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, outs, scalar, tensor
from cann_ops_tilelang.validation import check_row_starts, is_strided

from . import _contract as contract
from ._eager import cast_eager, kernel_sf
from ._quant_tensor import QuantTensor
from .cast_back import X as QUANTISED_X
from .cast_back import cast_back, check_quantised, kernel_choice, kernel_x_sf, logical_hidden, sf_col_major
from .cast_kernel import SEED_LIMIT
from .per_token_cast_kernel import (
    CAST_BLOCK_SIZES,
    CAST_HIDDEN_UNIT,
    FORMATS,
    choose_per_token_cast_config,
    choose_per_token_recast_config,
    few_tokens,
    get_per_token_cast_kernel,
    get_per_token_recast_kernel,
)


def sf_layout(
    num_tokens: int, hidden: int, block: int, packed: bool, e4m3_sf: bool = False
) -> tuple[tuple[int, int], torch.dtype]:
    """(shape, dtype) of the scale factors: fp32 (T, H / block), E4M3 bytes (T, H / block) float8_e4m3fn, or UE8M0
    bytes packed four per int32."""
    shape, dtype = contract.sf_layout(num_tokens, hidden, (1, block), packed)
    return shape, contract.E4M3_SF_DTYPE if e4m3_sf else dtype


def _sf_result(x, num_per_channels, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf, shape=None):
    """(shape, dtype) of sf, with its strides when column-major (contract.scale_result); `shape`: x's logical
    (T, H) where x is not a plain tensor."""
    layout = sf_layout(*(shape or x.shape), num_per_channels, use_packed_ue8m0, use_e4m3_sf)
    return contract.scale_result(layout, use_tma_aligned_col_major_sf, x.device)


def _results(x, fmt, num_per_channels, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf):
    """(shape, dtype) of data, (shape, dtype[, strides]) of sf; x a tensor or a quantised tensor (data, sf)."""
    data = x if isinstance(x, torch.Tensor) else x[0]
    shape = (data.shape[0], data.shape[1] if data is x else logical_hidden(data))
    return (
        contract.data_layout(*shape, fmt),
        _sf_result(data, num_per_channels, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf, shape),
    )


def _options(name, x, memory, H, fmt, num_per_channels, x_block_size, round_sf, use_packed_ue8m0, use_e4m3_sf,
             stochastic_cast, seed=None):  # fmt: skip
    """The rules of the three calls (use_tma_aligned_col_major_sf: any bool; per_token_cast_with_precomputed_sf
    refuses True); H the logical hidden size."""
    check_row_starts(name, memory, x=x)  # strided rows (TileKernels takes them) on 16 bytes
    if x_block_size is not None:
        raise ValueError(f'{name}: x_block_size is the scale block of a quantised x (data, sf); x is a tensor, got '
                         f'x_block_size={x_block_size}')  # fmt: skip
    _output_options(name, H, fmt, num_per_channels, round_sf, use_packed_ue8m0, use_e4m3_sf)
    _stochastic_options(name, fmt, stochastic_cast, seed)


def _stochastic_options(name, fmt, stochastic_cast, seed):
    """stochastic_cast: e4m3 and FP4 data (fmt is checked with the output options); seed: with stochastic_cast only,
    in [0, 2**32) (quant.cast's rules)."""
    if seed is not None:
        if not stochastic_cast:
            raise ValueError(f'{name}: seed={seed} is used only with stochastic_cast=True')
        if not 0 <= seed < SEED_LIMIT:
            raise ValueError(f'{name}: seed must be in [0, 2**32), got {seed}')


def _output_options(name, H, fmt, num_per_channels, round_sf, use_packed_ue8m0, use_e4m3_sf):
    contract.check_cast_format(name, fmt, FORMATS)
    contract.check_block(name, 'num_per_channels', num_per_channels, CAST_BLOCK_SIZES)
    contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    contract.check_e4m3_sf(name, use_e4m3_sf, round_sf)
    contract.check_hidden(name, H, CAST_HIDDEN_UNIT, 'whole 64-lane registers')


def _choice(mode):
    def choice(x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf):
        chosen = {
            'hidden': x.shape[1],
            'in_dtype': x.dtype,
            'block_size': num_per_channels,
            'round_sf': round_sf,
            'packed_ue8m0': use_packed_ue8m0,
            'mode': mode,
            'fmt': fmt,
            'e4m3_sf': use_e4m3_sf,
            'col_major_sf': use_tma_aligned_col_major_sf,
            'strided_rows': is_strided(x),
        }
        if few_tokens(x.shape[0]):  # absent otherwise: the other launcher keys and configurations stay as they were
            chosen['few_tokens'] = True
        return chosen

    return choice


def _cast_choice(x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf,
                 stochastic_cast):  # fmt: skip
    """per_token_cast's: the kernel of stochastic rounding is one of its own (its key a launch argument)."""
    choice = _choice('cast')(x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                             use_e4m3_sf)  # fmt: skip
    if stochastic_cast:  # absent otherwise: the plain cast's launcher keys and configurations stay as they were
        choice['stochastic'] = True
    return choice


def _half_options(name, x, memory, H, fmt, num_per_channels, round_sf, use_packed_ue8m0, use_e4m3_sf):
    _options(name, x, memory, H, fmt, num_per_channels, None, round_sf, use_packed_ue8m0, use_e4m3_sf, False)


def _precomputed_options(name, x, memory, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf, round_sf,
                         use_packed_ue8m0, use_e4m3_sf):  # fmt: skip
    _half_options(name, x, memory, x.shape[1], fmt, num_per_channels, round_sf, use_packed_ue8m0, use_e4m3_sf)
    if use_tma_aligned_col_major_sf:
        raise ValueError(
            f'{name}: use_tma_aligned_col_major_sf=True is not supported: the given scales are read row-major (as '
            'TileKernels 2.1.0 reads them)'
        )
    contract.check_given_scales(name, sf, x.shape, (1, num_per_channels), use_packed_ue8m0,
                                f'one per token and block of {num_per_channels}')  # fmt: skip
    wanted = contract.E4M3_SF_DTYPE if use_e4m3_sf else torch.float32
    if sf.dtype != wanted:
        raise TypeError(f'{name}: sf must have dtype {wanted} with use_e4m3_sf={use_e4m3_sf}, got {sf.dtype}')


X = tensor('x', (torch.bfloat16, torch.float32), 'T, H', layout='rows')
_LIMITS = {'limits': lambda name, T, H: contract.check_numel(name, T, H)}
_KERNEL = {'choose_config': choose_per_token_cast_config, 'get_kernel': get_per_token_cast_kernel}
# After x (a tensor, or the quantised form's (data, sf)): the arguments of per_token_cast and its quantised form.
_CAST_ARGS = (
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    scalar('x_block_size', 'ints', optional=True),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('use_e4m3_sf', 'bool'),
    scalar('stochastic_cast', 'bool'),
    outs('out', 'data', 'sf'),
    scalar('seed', 'int', optional=True),  # keyword-only, after out (TileKernels has no seed)
)
OP = Operator(
    'per_token_cast',
    X,
    *_CAST_ARGS,
    extra=_options,
    choice=_cast_choice,
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
    results=lambda x, num_per_channels, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf: (
        _sf_result(x, num_per_channels, use_tma_aligned_col_major_sf, use_packed_ue8m0, use_e4m3_sf),
    ),
    **_LIMITS,
    **_KERNEL,
)
PRECOMPUTED = Operator(
    'per_token_cast_with_precomputed_sf',
    X,
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    tensor('sf', (torch.float32, contract.E4M3_SF_DTYPE), None),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('use_e4m3_sf', 'bool'),
    out('out'),
    extra=_precomputed_options,
    choice=_choice('precomputed'),
    results=lambda x, fmt: (contract.data_layout(*x.shape, fmt),),
    **_LIMITS,
    **_KERNEL,
)


def _quantised_options(name, x_data, x_sf, T, H, fmt, num_per_channels, x_block_size, round_sf, use_packed_ue8m0,
                       use_e4m3_sf, stochastic_cast, seed):  # fmt: skip
    if x_block_size is None:
        raise ValueError(f'{name}: a quantised x (data, sf) needs x_block_size, the (tokens, channels) block of its '
                         'scales')  # fmt: skip
    check_quantised(name, x_data, x_sf, T, H, x_block_size)
    hidden = 2 * H if x_data.dtype == contract.FP4_DATA_DTYPE else H
    _output_options(name, hidden, fmt, num_per_channels, round_sf, use_packed_ue8m0, use_e4m3_sf)
    _stochastic_options(name, fmt, stochastic_cast, seed)


# The fused CUDA kernel of a quantised x is lowered and compiled (nvcc, sm_90a) but has not run on a GPU yet: until
# its device test (which sets this) passes, CUDA launches the two checked stages. Read per call: part of the choice
# and of the fast path's key.
FUSE_ON_CUDA = False


def _quantised_choice(x, x_block_size, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, use_e4m3_sf, stochastic_cast):  # fmt: skip
    cast = _cast_choice(x[0], fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                        use_e4m3_sf, stochastic_cast)  # fmt: skip
    cast['hidden'] = logical_hidden(x[0])
    cast['strided_rows'] = False  # the dequantising stage's contiguous rows
    del cast['in_dtype']  # float32: what the dequantising stage writes
    dequantise = kernel_choice(x, 'fp32', x_block_size)
    del dequantise['out_dtype']
    return {'dequantise': tuple(dequantise.items()), 'cast': tuple(cast.items()), 'fuse': FUSE_ON_CUDA}


# per_token_cast of a quantised x (data, sf): the form per_token_cast routes a tuple x to (its errors say
# per_token_cast): one fused kernel on CUDA where the chooser fuses (PerTokenRecastConfig.fused), else a composition
# of cast_back to fp32 and per_token_cast of the fp32 rows.
QUANTISED = Operator(
    'per_token_cast_quantised',
    QUANTISED_X,
    *_CAST_ARGS,  # per_token_cast's signature
    extra=_quantised_options,
    choice=_quantised_choice,
    results=_results,
    **_LIMITS,
    choose_config=choose_per_token_recast_config,
    get_kernel=get_per_token_recast_kernel,
    label='per_token_cast',
)


def _quantised_eager(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                     use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out, seed) -> QuantTensor:  # fmt: skip
    """The contract once, then what the configuration launches: the fused kernel (x_data, x_sf, data, sf), or the
    two stages through their public operators, x dequantised to fp32 rows (T, H), which per_token_cast casts. Fast
    path (fused kernels only; without out=, stochastic_cast or seed): by (data columns, CUDA index, the options,
    x's data and scale dtypes and scale layout, the token count's class, FUSE_ON_CUDA); scales of neither layout take
    the full check (its error)."""
    args = (x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
            use_e4m3_sf, stochastic_cast, out, seed)  # fmt: skip
    key = None
    x_sf_col_major = None
    if out is None and stochastic_cast is False and seed is None and (shape := QUANTISED.fast_ok(*args)) is not None:
        x_sf_col_major = sf_col_major(x[1]) if x[1].dim() == 2 else None
        if shape[0] and x_sf_col_major is not None:
            key = (shape[1], x[0].get_device(), fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                   round_sf, use_packed_ue8m0, use_e4m3_sf, x[0].dtype, x[1].dtype, x_sf_col_major,
                   few_tokens(shape[0]), FUSE_ON_CUDA)  # fmt: skip
    launcher, fast = QUANTISED.prepare(key, args)
    if launcher.cfg.fused:
        data, sf = QUANTISED.new_outputs(x[0], *args) if out is None else out
        x_data, x_sf = x
        if x_data.shape[0]:
            x_sf = kernel_x_sf(x_sf, sf_col_major(x_sf) if x_sf_col_major is None else x_sf_col_major)
        launch_args = (x_data, x_sf, data, kernel_sf(sf, use_packed_ue8m0, use_tma_aligned_col_major_sf))
        QUANTISED.finish(launcher, fast, key, launch_args, args, empty=not x_data.shape[0])
        return QuantTensor(data, sf)
    values = cast_back(x, 'fp32', tuple(x_block_size))
    return per_token_cast(values, fmt, num_per_channels, None, use_tma_aligned_col_major_sf, round_sf,
                          use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out, seed=seed)  # fmt: skip


@QUANTISED.public(_quantised_eager, result=QuantTensor)
def per_token_cast_quantised(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    stochastic_cast: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    seed: int | None = None,
) -> QuantTensor:
    """per_token_cast of a quantised x = (data, sf), what per_token_cast(x, ...) calls for a tuple x: the cast of
    the dequantised values, per_token_cast(cast_back(x, 'fp32', x_block_size), fmt, num_per_channels, ...), bit for
    bit (two launches, or on CUDA one for e4m3 data where FUSE_ON_CUDA is set; see per_token_cast), stochastic_cast
    and seed included: the stochastic rounding of the dequantised values times the inverse, element index t * H + h
    as for a tensor x."""


@OP.public(
    cast_eager(OP, 'cast', 'num_per_channels', col_major=True, token_class=few_tokens),
    result=QuantTensor,
    quantised=per_token_cast_quantised,
)
def per_token_cast(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    stochastic_cast: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    seed: int | None = None,
) -> QuantTensor:
    """Cast each row of x to FP8 e4m3 or FP4 e2m1 with one scale factor per block of `num_per_channels` channels
    (TileKernels 2.1.0's call). For a block with absolute maximum a, m the format's largest value (448 / 6) and
    c = max(a, floor) (TileKernels' floors: e4m3 1e-4, E4M3 scales m * 2**-9, FP4 with fp32 scales 6 * 2**-126):

        sf = c / m, data = narrow(x * (m / c))
        round_sf: sf = 2 ** ceil(log2(c / m)), data = narrow(x * 2 ** -log2(sf))
        use_e4m3_sf: sf = e4m3(c / m) (nearest even, saturating at 448), data = narrow(x * (1 / fp32(sf)))

    narrow: e4m3 to nearest even, saturating at +-448; e2m1 to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6},
    saturating at +-6 (values past 6, +-inf and NaN give +-6).

    Args:
        x: (T, H) bf16 or fp32, the last dimension contiguous, rows contiguous or of any stride whose row starts
            are 16-byte aligned (as TileKernels takes them; a kernel of its own, the row stride a launch argument);
            T >= 0 (T = 0: empty results, no launch), H a positive multiple of 64 (with num_per_channels 128 an odd
            multiple, e.g. 2880, leaves a short last block: its scale covers its 64 channels; on Ascend then
            H <= 8128), T * H < 2**31. Or a quantised tensor (data, sf) with its scale block
            x_block_size, in any layout cast_back reads (e4m3 or FP4 data; fp32, packed UE8M0 or E4M3 scales,
            row- or column-major): the result is the cast of its dequantised values, bit for bit
            per_token_cast(cast_back(x, 'fp32', x_block_size), ...), on both backends. (TileKernels' Ascend kernel
            computes that; its CUDA kernel multiplies the data by x_sf * inverse instead, which can round
            differently where neither scale is a power of two.) Two launches, the fp32 rows through memory; on
            CUDA e4m3 data with row-block scales can be one launch, the products formed in registers (FUSE_ON_CUDA,
            off until that kernel has run on a GPU; stochastic_cast: two).
        fmt: 'e4m3' (FP8) or 'e2m1' (FP4: two codes a byte, element 2 i in the low nibble of byte i).
        num_per_channels: channels per scale factor, 16, 32, 64 or 128.
        round_sf: power-of-two scale factors.
        use_packed_ue8m0: with round_sf, the scale factors as UE8M0 exponent bytes, byte k of a row for block k,
            packed four per int32 (zero padding).
        use_e4m3_sf: the scale factors as float8_e4m3fn (not with round_sf). A block maximum past 448 * m
            saturates its scale at 448, so its data saturates too.
        use_tma_aligned_col_major_sf: sf column-major, as TMA-loading FP8 GEMMs (DeepGEMM) read it: the same
            shape and values, strides (1, T_pad), a view buf[:, :T].T of a (K, T_pad) buffer; T_pad is T rounded up
            to 16 bytes of sf's dtype on CUDA (4 fp32 / int32, 16 E4M3), T on Ascend (TileKernels' rule per
            backend; T = 0: strides (1, 0)).
        x_block_size: (tokens, channels) per scale of a quantised x (cast_back's blocks); None for a tensor x.
        stochastic_cast: TileKernels' stochastic rounding of the narrowing. The scales are the plain cast's (the
            scale rule is unchanged); e4m3 data is data = SR_e4m3(fp32(x) * inverse), the stochastic
            rounding to e4m3 of the operator `cast` (cast_kernel.py: a product between two e4m3 neighbours rounds
            up in magnitude with probability (distance to the lower one) / (their spacing), so E[data * sf] = x
            within e4m3's range; saturating at +-448, NaN -> 0x7F with its sign), its random bits a fixed integer
            hash of (seed, element index), the element index t * H + h of x's logical element, so the bytes depend
            on neither the kernel's tiling nor the backend (integer and exact fp32 operations: the same bytes on
            Ascend and CUDA for the same seed; the CUDA kernel is lowered in this project's CPU tier but not yet
            run on a GPU). FP4 data (fmt 'e2m1'): the same hash h of the same element index; for v = fp32(x) *
            inverse and a = |v| < 6, lo the largest e2m1 magnitude <= a and hi the next one, the code is hi's iff
            (h >> 8) * 2**-24 < (a - lo) / (hi - lo) (exact in fp32), else lo's, with v's sign bit (-0.0 and
            negatives rounded to 0: code 8); a >= 6, +-inf and NaN give +-6 (code 7 with the sign bit), as the
            nearest-even rounding. E[data * sf] = x where |x * inverse| <= 6 (always, with fp32 / power-of-two
            scales). A quantised x: the rounding of its dequantised values, the same element index.
        out: optional (data, sf) buffers of the result's shapes and dtypes, on x's device, not overlapping x or each
            other; data contiguous, sf contiguous or, with use_tma_aligned_col_major_sf, of the strides above
            (ValueError otherwise).
        seed: (keyword-only; TileKernels has none) the stochastic rounding's seed, in [0, 2**32), with
            stochastic_cast=True only (ValueError otherwise). None: drawn per call from torch's default CPU generator
            (torch.manual_seed reproduces a call), without a device synchronisation. The kernel takes the seed's key
            as a launch argument: no compile per seed.

    Returns:
        QuantTensor(data, sf), a tuple: data (T, H) float8_e4m3fn, or FP4 (T, H / 2) int8; sf (T, H /
        num_per_channels) fp32 or float8_e4m3fn, or with use_packed_ue8m0 (T, ceil(H / num_per_channels / 4))
        int32. Both backends give the same bytes for the same input. -0.0 stays -0.0 (FP4: code 8), subnormal
        inputs are ordinary values; an inf in a block makes its fp32 / UE8M0 scale inf and its values +-0 and,
        for the inf, NaN of either sign (FP4: +-6 of either sign); with E4M3 scales the scale saturates at 448
        and the inf at +-448 / +-6; NaN in a block gives unspecified values (as TileKernels).
    """


@SF_ONLY.public(
    cast_eager(SF_ONLY, 'sf_only', 'num_per_channels', col_major=True, token_class=few_tokens), returns='Tensor'
)
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
    """The scale factors of per_token_cast (same arguments and rules, column-major scales included; TileKernels
    2.1.0's call), without the data: x is read once and only sf is written. out_sf: an optional buffer of sf's shape,
    dtype and layout."""


@PRECOMPUTED.public(
    cast_eager(PRECOMPUTED, 'precomputed', 'num_per_channels', token_class=few_tokens), returns='Tensor'
)
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
    """The data of per_token_cast from given scale factors (TileKernels 2.1.0's call): data = narrow(x * (1 /
    fp32(sf))) per block (IEEE reciprocal; e4m3 clamped to +-448 then to nearest even, FP4 e2m1 as per_token_cast),
    for sf (T, H / num_per_channels) contiguous, fp32, or float8_e4m3fn with use_e4m3_sf. round_sf does not change
    the result; use_packed_ue8m0 and use_tma_aligned_col_major_sf are not supported (ValueError; the peer refuses
    them too). A scale of 0 gives inverse inf: the block's values become +-448 (FP4 +-6) and its zeros NaN (FP4 +-6).
    out: an optional buffer of the data's shape and dtype ((T, H) float8_e4m3fn, or FP4 (T, H / 2) int8)."""
