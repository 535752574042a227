"""per_block_cast_lossless: FP4 (e2m1) data with power-of-two scales -> FP8 (e4m3) data with one power-of-two
scale per larger block, exact where the scales' spread allows (per_block_cast_lossless_kernel.py)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, outs, quant, scalar

from . import _contract as contract
from ._eager import kernel_sf
from ._quant_tensor import QuantTensor
from .per_block_cast_lossless_kernel import (
    IN_BLOCK_CHANNELS,
    IN_BLOCK_TOKENS,
    OUT_BLOCK_CHANNELS,
    OUT_BLOCK_TOKENS,
    choose_per_block_cast_lossless_config,
    get_per_block_cast_lossless_kernel,
    hidden_multiple,
)


def _check_block(name: str, what: str, block, tokens: tuple[int, ...], channels: tuple[int, ...]) -> None:
    if len(block) != 2:
        raise ValueError(f'{name}: {what} must be (tokens, channels), got {block}')
    contract.check_block(name, f'{what}[0] (tokens per scale)', block[0], tokens)
    contract.check_block(name, f'{what}[1] (channels per scale)', block[1], channels)


def _options(name, x_sf, T, K, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf,
             use_packed_ue8m0):  # fmt: skip
    if fmt != contract.FP8_FORMAT:
        raise ValueError(f"{name}: fmt must be 'e4m3' (the output format; x is e2m1), got {fmt!r}")
    _check_block(name, 'x_block_size', x_block_size, IN_BLOCK_TOKENS, IN_BLOCK_CHANNELS)
    _check_block(name, 'out_block_size', out_block_size, OUT_BLOCK_TOKENS, OUT_BLOCK_CHANNELS)
    if out_block_size[0] % x_block_size[0] or out_block_size[1] % x_block_size[1]:
        raise ValueError(f'{name}: out_block_size {tuple(out_block_size)} must be a multiple of x_block_size '
                         f'{tuple(x_block_size)}')  # fmt: skip
    contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    H = 2 * K
    contract.check_hidden(name, H, hidden_multiple(out_block_size[1]), f'out_block_size {tuple(out_block_size)}')
    shape, _ = contract.sf_layout(T, H, x_block_size, x_sf.dtype == contract.PACKED_SF_DTYPE)
    if x_sf.shape != shape:
        raise ValueError(f'{name}: x[1] must have shape {shape} ({x_sf.dtype} scales of blocks '
                         f'{tuple(x_block_size)} of H = {H} channels), got {tuple(x_sf.shape)}')  # fmt: skip
    if x_sf.stride(0) != shape[1] and shape[0] > 1:
        raise ValueError(f'{name}: x[1] must be contiguous (row-major scales), got strides {x_sf.stride()}')


def _choice(x, x_block_size, out_block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0):
    return {
        'hidden': 2 * x[0].shape[1],
        'in_block_tokens': x_block_size[0],
        'in_block_channels': x_block_size[1],
        'out_block_tokens': out_block_size[0],
        'out_block_channels': out_block_size[1],
        'in_packed': x[1].dtype == contract.PACKED_SF_DTYPE,
        'out_packed': use_packed_ue8m0,
        'col_major_sf': use_tma_aligned_col_major_sf,
    }


def _results(x, out_block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0):
    """(shape, dtype) of data; (shape, dtype[, strides]) of sf, column-major strides where asked
    (contract.scale_result of its ceil(T / bto) rows)."""
    shape = (x[0].shape[0], 2 * x[0].shape[1])
    sf = contract.sf_layout(*shape, out_block_size, use_packed_ue8m0)
    return (shape, torch.float8_e4m3fn), contract.scale_result(sf, use_tma_aligned_col_major_sf, x[0].device)


OP = Operator(
    'per_block_cast_lossless',
    quant('x', contract.FP4_DATA_DTYPE, 'T, K', sf_dtype=(torch.float32, contract.PACKED_SF_DTYPE)),
    scalar('fmt', 'str'),
    scalar('x_block_size', 'ints'),
    scalar('out_block_size', 'ints'),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    outs('out', 'data', 'sf'),
    limits=lambda name, T, K: contract.check_numel(name, T, 2 * K),
    extra=_options,
    choice=_choice,
    results=_results,
    choose_config=choose_per_block_cast_lossless_config,
    get_kernel=get_per_block_cast_lossless_kernel,
)


def _eager(x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out):
    args = (x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out)
    key = None
    if out is None and fmt == contract.FP8_FORMAT:
        shape = OP.fast_ok(*args)
        if shape is not None and shape[0]:
            key = (shape[1], x[0].get_device(), x_block_size, out_block_size, x[1].dtype, use_packed_ue8m0,
                   use_tma_aligned_col_major_sf)  # fmt: skip
    launcher, fast = OP.prepare(key, args)
    data, sf = out if out is not None else OP.new_outputs(x[0], *args)
    in_sf = x[1].view(torch.uint8) if x[1].dtype == contract.PACKED_SF_DTYPE else x[1]
    out_sf = kernel_sf(sf, use_packed_ue8m0, use_tma_aligned_col_major_sf)
    OP.finish(launcher, fast, key, (x[0].view(torch.uint8), in_sf, data, out_sf), args, empty=not x[0].shape[0])
    return QuantTensor(data, sf)


@OP.public(_eager, result=QuantTensor)
def per_block_cast_lossless(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    x_block_size: tuple[int, int],
    out_block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QuantTensor:
    """Re-quantise FP4 (e2m1) x = (data, sf) to FP8 e4m3 with one power-of-two scale per block of out_block_size
    (TileKernels 2.1.0's call). With e the biased exponent of an input block's scale and, per output block (over
    its rows that exist), M the maximum of its input blocks' e:

        E = max(M - 6, 0)                       out sf = 2 ** (E - 127) (fp32 bits E << 23, or the UE8M0 byte E)
        data = e4m3(e2m1 * 2 ** (e - E))        to nearest even

    Exact (decode(data) * out_sf == decode(x) * x_sf, bit for bit in fp32) when every output block's input
    exponents lie in 1..254 with M >= 7 and M - e <= 14; past that spread the smallest values round to nearest
    even onto e4m3's subnormals (the peer asserts on the device instead; here nothing is checked or synchronised).

    Args:
        x: data (T, H / 2) int8, two e2m1 codes per byte, the low nibble the even element (quant.fp4's
            unpack_from_e2m1fn_x2 decodes it), contiguous; sf, contiguous: fp32 (rows, H / bci) powers of two
            (only the exponent bits are read) or packed UE8M0 int32 (rows, ceil(H / bci / 4)), byte k of a row for
            channel block k; rows = T for bti = 1, else ceil(T / bti). T >= 0 (T = 0: empty results, no launch),
            H a positive multiple of max(128, bco), T * H < 2**31.
        fmt: 'e4m3', the output format.
        x_block_size: (bti, bci): bti 1, 32, 64 or 128; bci 16, 32, 64 or 128.
        out_block_size: (bto, bco), each 32, 64 or 128, multiples of bti and bci.
        use_tma_aligned_col_major_sf: the output scales column-major, as TMA-loading FP8 GEMMs (DeepGEMM) read
            them and per_block_cast writes them: the same shape and values, strides (1, R_pad), a view
            buf[:, :R].T of a (K, R_pad) buffer, R = ceil(T / bto), R_pad R rounded up to 16 bytes on CUDA (R on
            Ascend). On Ascend packed UE8M0 scales then need whole int32 words per task (ValueError otherwise).
        round_sf: accepted either way (the output scales are powers of two); needed for use_packed_ue8m0.
        use_packed_ue8m0: the output scales as UE8M0 bytes packed four per int32 (zero padding).
        out: optional (data, sf) buffers of the result's shapes and dtypes, data contiguous, sf contiguous or, with
            use_tma_aligned_col_major_sf, of the strides above; on x's device, apart from x and each other.

    Returns:
        QuantTensor(data (T, H) float8_e4m3fn, sf): sf (ceil(T / bto), H / bco) fp32, or with use_packed_ue8m0
        (ceil(T / bto), ceil(H / bco / 4)) int32. Both backends give the same bytes.
    """
