"""The contract the domain's operators share: the element limit, the format and option rules, and the scale
layouts of the interface (docs/quant.md)."""

from __future__ import annotations

import torch

from ._scale_rules import UE8M0_PACK

MAX_NUMEL = 2**31 - 1  # int32 element indices in the kernels
FP8_FORMAT = 'e4m3'  # the format of the operators without an FP4 form (check_format)
PACKED_SF_DTYPE = torch.int32  # four UE8M0 bytes, the interface's view on both backends


def check_numel(name: str, T: int, H: int) -> None:
    if T * H > MAX_NUMEL:
        raise ValueError(f'{name}: x must have at most 2**31 - 1 elements, got {T * H}')


def check_format(name: str, fmt: str) -> None:
    if fmt != FP8_FORMAT:
        raise ValueError(f"{name}: fmt must be 'e4m3' (this operator has no FP4 'e2m1' form), got {fmt!r}")


def check_unsupported(name: str, **options) -> None:
    """TileKernels' options these kernels do not have yet: each must be False (or None)."""
    for option, value in options.items():
        if value:
            raise ValueError(f'{name}: {option}={value!r} is not supported yet')


def check_scale_flags(name: str, round_sf: bool, use_packed_ue8m0: bool) -> None:
    if use_packed_ue8m0 and not round_sf:
        raise ValueError(f'{name}: use_packed_ue8m0=True needs round_sf=True (UE8M0 holds powers of two only)')


def check_block(name: str, what: str, value: int, allowed: tuple[int, ...]) -> None:
    if value not in allowed:
        raise ValueError(f'{name}: {what} must be one of {allowed}, got {value}')


def check_hidden(name: str, hidden: int, unit: int, why: str) -> None:
    if hidden <= 0 or hidden % unit:
        raise ValueError(f'{name}: hidden size must be a positive multiple of {unit} for {why}, got {hidden}')


def sf_layout(num_tokens: int, hidden: int, block, packed: bool) -> tuple[tuple[int, int], torch.dtype]:
    """(shape, dtype) of the scale factors of a (T, H) tensor cast in blocks of block = (bt, bc) tokens by
    channels, one row per token block:

    - bc > 1 (per_token_cast's bt = 1, per_block_cast's): fp32 (ceil(T / bt), ceil(H / bc)), or UE8M0 bytes, byte k
      of a row for channel block k, packed four per int32 (ceil(T / bt), ceil(ceil(H / bc) / 4)), zero padding (a
      short last block, per_token_cast's H = 64 * odd with bc = 128, has its scale);
    - bc = 1 (per_channel_cast's): fp32 (ceil(T / bt), H), or UE8M0 bytes packed along the tokens, byte j of word
      [r, h] for token block 4 r + j of channel h, (ceil(ceil(T / bt) / 4), H).
    """
    bt, bc = block
    rows = -(-num_tokens // bt)
    blocks = -(-hidden // bc)
    if not packed:
        return (rows, blocks), torch.float32
    if bc == 1:
        return (-(-rows // UE8M0_PACK), hidden), PACKED_SF_DTYPE
    return (rows, -(-blocks // UE8M0_PACK)), PACKED_SF_DTYPE


TMA_ALIGN_BYTES = 16  # what TMA needs of a column-major scale buffer's row stride (the peer's CUDA padding)


def col_major_sf_strides(num_tokens: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int]:
    """Strides of TileKernels' column-major scales (use_tma_aligned_col_major_sf) of T tokens, the peer's rule per
    backend: the (T, K) scales are a view buf[:, :T].T of a (K, T_pad) buffer, on CUDA T_pad = T rounded up to 16
    bytes of the scale dtype (TMA's alignment: 4 fp32 or packed int32 words, 16 E4M3 bytes), on Ascend T_pad = T
    (CPU tensors reach the Ascend kernels only, on the emulator). Strides (1, T_pad); T = 0 gives (1, 0), as the
    peer's buffer of a zero-size last dimension."""
    if device.type != 'cuda':
        return 1, num_tokens
    per = TMA_ALIGN_BYTES // dtype.itemsize
    return 1, -(-num_tokens // per) * per


def scale_result(layout: tuple, col_major: bool, device: torch.device) -> tuple:
    """A `results` item of scales: `layout` (shape, dtype), with col_major_sf_strides of its rows (tokens or token
    blocks) on `device`'s backend when the scales are column-major."""
    shape, dtype = layout
    return layout if not col_major else (shape, dtype, col_major_sf_strides(shape[0], dtype, device))


def check_given_scales(name: str, sf: torch.Tensor, x_shape, block, use_packed_ue8m0: bool, blocks_are: str) -> None:
    """The fp32 scales a `_with_precomputed_sf` cast takes: of sf_layout's shape (`blocks_are` says what one
    scale covers, for the message); packed UE8M0 is not taken there."""
    if use_packed_ue8m0:
        raise ValueError(f'{name}: precomputed scales are fp32: use_packed_ue8m0=True is not supported')
    shape, _ = sf_layout(*x_shape, block, False)
    if sf.shape != shape:
        raise ValueError(f'{name}: sf must have shape {shape} ({blocks_are}), got {tuple(sf.shape)}')


FP4_FORMAT = 'e2m1'  # FP4: two e2m1 codes per byte, the low nibble first (per_token_cast)
FP4_DATA_DTYPE = torch.int8  # the packed FP4 data's dtype (TileKernels'), (T, H / 2)
E4M3_SF_DTYPE = torch.float8_e4m3fn  # use_e4m3_sf: one e4m3 byte per scale


def check_cast_format(name: str, fmt: str, formats: tuple[str, ...]) -> None:
    """check_format for an operator with more than one output format."""
    if fmt not in formats:
        raise ValueError(f'{name}: fmt must be one of {formats}, got {fmt!r}')


def check_e4m3_sf(name: str, use_e4m3_sf: bool, round_sf: bool) -> None:
    """E4M3 scale factors are rounded to e4m3 themselves: not with round_sf (nor packed UE8M0, which needs it)."""
    if use_e4m3_sf and round_sf:
        raise ValueError(f'{name}: use_e4m3_sf=True and round_sf=True exclude each other (E4M3 or power-of-two scales)')


def data_layout(num_tokens: int, hidden: int, fmt: str) -> tuple[tuple[int, int], torch.dtype]:
    """(shape, dtype) of the cast data of a (T, H) tensor: e4m3 (T, H), or FP4 bytes (T, H / 2) int8."""
    if fmt == FP4_FORMAT:
        return (num_tokens, hidden // 2), FP4_DATA_DTYPE
    return (num_tokens, hidden), torch.float8_e4m3fn
