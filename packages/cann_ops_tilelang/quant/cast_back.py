"""cast_back and per_token_cast_back: a quantised tensor (data, sf) -> bf16 / fp32, data times its block's scale."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, quant, scalar

from . import _contract as contract
from .cast_back_kernel import (
    CHANNEL_BLOCK_TOKENS,
    HIDDEN_UNIT,
    ROW_BLOCK_CHANNELS,
    ROW_BLOCK_TOKENS,
    TOKEN_BLOCK_CHANNELS,
    choose_cast_back_config,
    get_cast_back_kernel,
)

OUT_FORMATS = {'bf16': torch.bfloat16, 'fp32': torch.float32}


def _check_blocks(name: str, x_block_size, fp4: bool, e4m3_sf: bool) -> None:
    if len(x_block_size) != 2:
        raise ValueError(f'{name}: x_block_size must be (tokens, channels), got {x_block_size}')
    bt, bc = x_block_size
    if fp4 or e4m3_sf:
        what = 'FP4 (int8) data' if fp4 else 'float8_e4m3fn scales'
        if bt != 1:
            raise ValueError(f'{name}: {what} take per-token scales only: x_block_size[0] must be 1, got {bt}')
    if bt == 1 and bc in TOKEN_BLOCK_CHANNELS:
        return  # per-token scales: per_token_cast's blocks
    if bc == 1:
        contract.check_block(name, 'x_block_size[0] with per-channel scales', bt, CHANNEL_BLOCK_TOKENS)
    else:
        contract.check_block(name, 'x_block_size[1] (channels per scale)', bc, (1, *ROW_BLOCK_CHANNELS))
        contract.check_block(name, 'x_block_size[0] (tokens per scale)', bt, ROW_BLOCK_TOKENS)


def sf_col_major(sf: torch.Tensor) -> bool | None:
    """The layout of given (rows, K) scales, read from their strides as TileKernels 2.1.0 reads them: False
    row-major (each row contiguous, rows K apart, where a dimension of size 1 or an empty tensor may have any
    stride), True column-major (strides (1, S), S >= rows: per_token_cast's and per_block_cast's
    use_tma_aligned_col_major_sf, a view buf[:, :rows].T of a (K, S) buffer), None neither."""
    rows, cols = sf.shape
    s0, s1 = sf.stride()
    if not rows * cols or ((cols <= 1 or s1 == 1) and (rows <= 1 or s0 == cols)):
        return False
    if (rows <= 1 or s0 == 1) and s1 >= rows:
        return True
    return None


def kernel_x_sf(sf: torch.Tensor, col_major: bool) -> torch.Tensor:
    """The scales as the kernel takes them: column-major ones transposed, (K, rows) of row stride S (one row:
    its stride 1, the only element of a row the kernel reads); packed UE8M0 as bytes."""
    if col_major:
        sf = sf.T if sf.shape[0] > 1 else sf.T.as_strided(sf.T.shape, (sf.stride(1), 1))
    return sf.view(torch.uint8) if sf.dtype == contract.PACKED_SF_DTYPE else sf


def logical_hidden(data: torch.Tensor) -> int:
    """The logical hidden size: data's columns, two elements a byte for FP4."""
    return 2 * data.shape[1] if data.dtype == contract.FP4_DATA_DTYPE else data.shape[1]


def _options(name, x_data, x_sf, T, H, fmt, x_block_size, x_special_fmt):
    if fmt not in OUT_FORMATS:
        raise ValueError(f"{name}: fmt must be 'bf16' or 'fp32' (the output format), got {fmt!r}")
    contract.check_unsupported(name, x_special_fmt=x_special_fmt)
    check_quantised(name, x_data, x_sf, T, H, x_block_size)


def check_quantised(name, x_data, x_sf, T, H, x_block_size) -> None:
    """The rules of a quantised x = (data, sf) of blocks x_block_size that cast_back reads (dtypes checked by the
    declaration): the block for the data and scale formats, the hidden size, sf's shape and layout. H: data's
    columns (bytes for FP4)."""
    fp4 = x_data.dtype == contract.FP4_DATA_DTYPE
    _check_blocks(name, x_block_size, fp4, x_sf.dtype == contract.E4M3_SF_DTYPE)
    if fp4:
        H = 2 * H  # elements: two e2m1 codes a byte
        contract.check_numel(name, T, H)
    why = f'x_block_size {tuple(x_block_size)}' + (' and FP4 data (H is twice its bytes)' if fp4 else '')
    contract.check_hidden(name, H, HIDDEN_UNIT, why)
    shape, _ = contract.sf_layout(T, H, x_block_size, x_sf.dtype == contract.PACKED_SF_DTYPE)
    if x_sf.shape != shape:
        raise ValueError(f'{name}: x[1] must have shape {shape} ({x_sf.dtype} scales of blocks '
                         f'{tuple(x_block_size)}), got {tuple(x_sf.shape)}')  # fmt: skip
    col_major = sf_col_major(x_sf)
    if col_major is None:
        raise ValueError(
            f'{name}: x[1] must be row-major (contiguous) or column-major (strides (1, S) with S >= {shape[0]}, as '
            f'per_token_cast / per_block_cast(..., use_tma_aligned_col_major_sf=True) return), got strides '
            f'{x_sf.stride()} for shape {tuple(x_sf.shape)}'
        )
    if col_major and x_block_size[1] == 1:
        raise ValueError(f'{name}: column-major scales are not supported with per-channel scales (x_block_size[1] '
                         f'1; TileKernels 2.1.0 refuses them too), got strides {x_sf.stride()}')  # fmt: skip


def kernel_choice(x, fmt, x_block_size):
    """choose_cast_back_config's keyword arguments for x = (data, sf) of blocks x_block_size, output `fmt`."""
    return {
        'hidden': logical_hidden(x[0]),
        'out_dtype': OUT_FORMATS[fmt],
        'block_tokens': x_block_size[0],
        'block_channels': x_block_size[1],
        'packed_ue8m0': x[1].dtype == contract.PACKED_SF_DTYPE,
        'fp4': x[0].dtype == contract.FP4_DATA_DTYPE,
        'e4m3_sf': x[1].dtype == contract.E4M3_SF_DTYPE,
        'col_major_sf': bool(sf_col_major(x[1])),
    }


def _output(x, fmt):
    return (((x[0].shape[0], logical_hidden(x[0])), OUT_FORMATS[fmt]),)


# e4m3 data (T, H) or FP4 data (T, H / 2) int8 (per_token_cast's); the scale dtype names the scale format.
X = quant(
    'x',
    (torch.float8_e4m3fn, contract.FP4_DATA_DTYPE),
    'T, H',
    sf_dtype=(torch.float32, contract.PACKED_SF_DTYPE, contract.E4M3_SF_DTYPE),
    sf_layout=None,  # row- or column-major: `_options` reads the layout from the strides
)
_COMMON = dict(
    limits=lambda name, T, H: contract.check_numel(name, T, H),
    results=_output,
    choose_config=choose_cast_back_config,
    get_kernel=get_cast_back_kernel,
)
OP = Operator(
    'cast_back',
    X,
    scalar('fmt', 'str'),
    scalar('x_block_size', 'ints'),
    scalar('x_special_fmt', 'str', optional=True),
    out('out'),
    extra=_options,
    choice=kernel_choice,
    **_COMMON,
)
PER_TOKEN = Operator(
    'per_token_cast_back',
    X,
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    scalar('x_special_fmt', 'str', optional=True),
    out('out'),
    extra=lambda name, x_data, x_sf, T, H, fmt, num_per_channels, x_special_fmt: _options(
        name, x_data, x_sf, T, H, fmt, (1, num_per_channels), x_special_fmt
    ),
    choice=lambda x, fmt, num_per_channels: kernel_choice(x, fmt, (1, num_per_channels)),
    **_COMMON,
)


def _run(op: Operator, args: tuple, x, fmt, block, out) -> torch.Tensor:
    """Every check, then the launch. Fast path (without out= or x_special_fmt): by (data columns, CUDA index, fmt,
    block, data dtype, scale dtype, scale layout); scales of neither layout take the full check (its error)."""
    key = None
    col_major = None
    if out is None and args[3] is None and (shape := op.fast_ok(*args)) is not None and shape[0]:
        col_major = sf_col_major(x[1]) if x[1].dim() == 2 else None
        if col_major is not None:
            key = (shape[1], x[0].get_device(), fmt, block, x[0].dtype, x[1].dtype, col_major)
    launcher, fast = op.prepare(key, args)
    data, sf = x
    if out is None:
        out = data.new_empty(data.shape[0], logical_hidden(data), dtype=OUT_FORMATS[fmt])
    if data.shape[0]:
        sf = kernel_x_sf(sf, sf_col_major(sf) if col_major is None else col_major)
    op.finish(launcher, fast, key, (data, sf, out), args, empty=not data.shape[0])
    return out


def _eager(x, fmt, x_block_size, x_special_fmt, out) -> torch.Tensor:
    return _run(OP, (x, fmt, x_block_size, x_special_fmt, out), x, fmt, x_block_size, out)


def _eager_per_token(x, fmt, num_per_channels, x_special_fmt, out) -> torch.Tensor:
    return _run(PER_TOKEN, (x, fmt, num_per_channels, x_special_fmt, out), x, fmt, num_per_channels, out)


@OP.public(_eager, returns='Tensor')
def cast_back(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    x_block_size: tuple[int, int],
    x_special_fmt: str | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dequantise x = (data, sf) to bf16 or fp32 (TileKernels 2.1.0's call): each element times the scale of its
    block of x_block_size = (bt, bc) tokens by channels, one fp32 product rounded to the output dtype:

        out[t, h] = fmt(fp32(data[t, h]) * fp32(sf[t // bt, h // bc]))

    Args:
        x: data and sf, data contiguous. data (T, H) float8_e4m3fn: the result of per_token_cast (bt = 1, bc 16, 32,
            64 or 128), per_block_cast (bt, bc in 32, 64, 128; bt also 1) or per_channel_cast (bc = 1, bt 32 or
            128); or FP4 (T, H / 2) int8, two e2m1 codes a byte, element 2 i in the low nibble of byte i
            (per_token_cast's 'e2m1': bt = 1 only). sf fp32, packed UE8M0 int32 in those operators' layouts (a
            UE8M0 byte b is 2 ** (b - 127); 0 gives 0.0, 255 inf), or float8_e4m3fn (T, ceil(H / bc)) (per_token_cast's
            use_e4m3_sf: bt = 1 only). sf row-major (contiguous), or with bc > 1 column-major, as per_token_cast and
            per_block_cast(..., use_tma_aligned_col_major_sf=True) return it: strides (1, S), S >= R, R its rows (T,
            or ceil(T / bt) token blocks) (read from the strides, as TileKernels does; other strides: ValueError).
            T >= 0 (T = 0: an empty result, no launch), H a positive multiple of 64 (FP4: H elements, H / 2 bytes),
            T * H < 2**31. With bc = 128, H = 64 * odd (e4m3 or FP4 data, e.g. gpt-oss's 2880) ends in a short
            block of 64 channels with a scale of its own: sf has ceil(H / bc)
            columns (packed UE8M0: ceil(ceil(H / bc) / 4) words), per_token_cast's layout; on Ascend then H <= 16384
            (the row one task; ValueError beyond).
        fmt: the output, 'bf16' (to nearest even) or 'fp32'.
        x_block_size: (bt, bc).
        x_special_fmt: only None is supported (TileKernels reserves it too).
        out: an optional (T, H) buffer of the output dtype, contiguous, on x's device, apart from x.

    Returns:
        (T, H) bf16 or fp32. NaN data stays NaN, inf * 0 is NaN, products beyond bf16's range are +-inf; e2m1 has
        no NaN or inf, its -0 (code 8) stays -0.0 under a positive scale.
    """


@PER_TOKEN.public(_eager_per_token, returns='Tensor')
def per_token_cast_back(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    num_per_channels: int,
    x_special_fmt: str | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The inverse of per_token_cast: cast_back(x, fmt, (1, num_per_channels)) (TileKernels 2.1.0's call), for
    num_per_channels 16, 32, 64 or 128, e4m3 or FP4 data, and fp32, packed UE8M0 or float8_e4m3fn scales, row- or
    column-major (per_token_cast's use_tma_aligned_col_major_sf); the same H as cast_back (128 channels a scale: a
    short last block of 64 where H = 64 * odd)."""
