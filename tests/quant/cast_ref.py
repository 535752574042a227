"""Pure-PyTorch oracles of the domain's casts: the scale rule they share (packages/cann_ops_tilelang/quant/
_scale_rules.py), the e4m3 narrowing, and per_token_cast (semantics: quant/per_token_cast_kernel.py).

Tests only; never imported at run time, and it imports no kernel module. Every step is one fp32 operation as
the kernels do it, so the kernels are compared bit for bit. Divisions are tensor / tensor: torch's
`tensor / scalar` and `scalar / tensor` on the CPU may go through a reciprocal, which rounds differently.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
INV_FP8_MAX = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)  # fp32(1/448), the kernels' constant


def round_up_pow2_bits(scale: torch.Tensor) -> torch.Tensor:
    """int32 bits of 2 ** ceil(log2(scale)) for positive normal fp32 `scale` (inf stays inf)."""
    bits = scale.view(torch.int32)
    return (bits + 0x7FFFFF) & 0x7F800000


def scale_and_inverse_ref(
    amax: torch.Tensor, *, round_sf: bool = False, packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored scale, inverse) of fp32 block maxima, the scale rule every cast of the domain shares: the scale
    fp32 (a power of two with `round_sf`), or with `packed_ue8m0` the biased exponent as uint8 (UE8M0)."""
    if packed_ue8m0 and not round_sf:
        raise ValueError('packed_ue8m0 needs round_sf')
    clamped = amax.clamp(min=AMAX_FLOOR)
    fmax = torch.full_like(clamped, FP8_MAX)
    if not round_sf:
        return clamped / fmax, fmax / clamped
    pow2 = round_up_pow2_bits(clamped * INV_FP8_MAX)
    biased = pow2 >> 23
    inverse = ((254 - biased).clamp(min=0) << 23).view(torch.float32)  # 1 / 2**e exactly; 1 / inf = 0
    return (biased.to(torch.uint8) if packed_ue8m0 else pow2.view(torch.float32)), inverse


UE8M0_PACK = 4  # UE8M0 bytes per int32 word of the interface's view, on both backends


def ue8m0_to_fp32(ue8m0: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8) -> the fp32 whose bits are byte << 23: 2 ** (byte - 127), 0.0 for 0, inf for 255."""
    return (ue8m0.to(torch.int32) << 23).view(torch.float32)


def pack_ue8m0_cols(ue8m0: torch.Tensor, pack: int = UE8M0_PACK) -> torch.Tensor:
    """Per-channel UE8M0 bytes (G, H) of G token blocks -> the column-packed layout (ceil(G / pack), pack * H):
    byte [r, pack * h + j] is token block pack * r + j of channel h, zero past G."""
    blocks, hidden = ue8m0.shape
    rows = -(-blocks // pack)
    padded = torch.zeros(rows * pack, hidden, dtype=torch.uint8)
    padded[:blocks] = ue8m0
    return padded.reshape(rows, pack, hidden).permute(0, 2, 1).reshape(rows, pack * hidden).contiguous()


def unpack_ue8m0_cols(packed: torch.Tensor, blocks: int, pack: int = UE8M0_PACK) -> torch.Tensor:
    """The inverse of pack_ue8m0_cols: (ceil(G / pack), pack * H) -> (G, H) bytes."""
    rows, width = packed.shape
    hidden = width // pack
    return packed.reshape(rows, hidden, pack).permute(0, 2, 1).reshape(rows * pack, hidden)[:blocks]


def pack_ue8m0_rows(ue8m0: torch.Tensor, pack: int = UE8M0_PACK) -> torch.Tensor:
    """UE8M0 bytes (R, B) uint8 padded with zero bytes to (R, B rounded up to `pack`)."""
    rows, blocks = ue8m0.shape
    padded = torch.zeros(rows, -(-blocks // pack) * pack, dtype=torch.uint8)
    padded[:, :blocks] = ue8m0
    return padded


def e4m3_ref(scaled: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn as the kernels narrow: to nearest even, saturating at +-448 (NaN stays NaN)."""
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def row_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """x (T, H) as fp32 blocks (T, ceil(H / block), block): a short last block (H not a multiple of the block) is
    filled with zeros, which leave its |x| maximum as its own channels' (the scale rule's definition)."""
    num_tokens, hidden = x.shape
    blocks = -(-hidden // block_size)
    padded = torch.nn.functional.pad(x.float(), (0, blocks * block_size - hidden))
    return padded.reshape(num_tokens, blocks, block_size)


def from_blocks(scaled: torch.Tensor, hidden: int) -> torch.Tensor:
    """The (T, H) values of row_blocks' layout: the short block's filling dropped."""
    num_tokens, blocks, block = scaled.shape
    return scaled.reshape(num_tokens, blocks * block)[:, :hidden]


# The scale row of a 2880-channel row (gpt-oss's width, 64 x odd) per (block, scale format): (short_block,
# num_blocks, sf_cols, sf_padding), what every fused cast's RowScales gives, as per_token_cast's.
SCALE_ROWS_2880 = {
    (128, 'fp32'): (True, 23, 23, 0),
    (128, 'ue8m0'): (True, 23, 24, 1),
    (64, 'ue8m0'): (False, 45, 48, 3),
    (32, 'fp32'): (False, 90, 90, 0),
}


def per_token_cast_ref(
    x: torch.Tensor,
    block_size: int = 32,
    *,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    ue8m0_pack: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (T, H) float8_e4m3fn, out_sf) of x (T, H) bf16 / fp32 (a short last block: row_blocks).

    out_sf: (T, ceil(H / block_size)) fp32 (the scale, a power of two with `round_sf`), or with `packed_ue8m0` the
    biased exponent bytes, (T, H // block_size rounded up to `ue8m0_pack`) uint8 with zero padding.
    """
    blocks = row_blocks(x, block_size)
    amax = blocks.abs().amax(dim=-1)
    stored, inverse = scale_and_inverse_ref(amax, round_sf=round_sf, packed_ue8m0=packed_ue8m0)
    sf = pack_ue8m0_rows(stored, ue8m0_pack) if packed_ue8m0 else stored
    return e4m3_ref(from_blocks(blocks * inverse.unsqueeze(-1), x.shape[1])), sf


def tma_col_major_sf(shape: tuple[int, int], dtype: torch.dtype, backend: str, device=None) -> torch.Tensor:
    """An uninitialised column-major scale tensor of logical shape (T, K) as TileKernels 2.1.0 allocates it for
    use_tma_aligned_col_major_sf (its rule, restated): a (K, T_pad) buffer of the scales' storage dtype (packed
    UE8M0: bytes, 4 a word) whose last dimension is T rounded up to 16 bytes on CUDA and T itself on Ascend, torn
    to strides (T_pad, 1) when T_pad is 0 (torch gives a zero-size last dimension stride 1), cut to its first T
    columns, viewed as the scale dtype, and transposed."""
    num_tokens, k = shape
    storage = torch.uint8 if dtype == torch.int32 else dtype  # packed UE8M0: bytes, 4 per int32 word
    width = num_tokens * (4 if dtype == torch.int32 else 1)
    per = 16 // storage.itemsize
    padded = -(-width // per) * per if backend == 'cuda' else width
    buffer = torch.empty((k, padded), dtype=storage, device=device)
    if padded == 0:
        buffer = buffer.as_strided(buffer.shape, (padded, 1))
    return buffer[:, :width].view(dtype).T


def padded_hidden(block_size: int) -> int:
    """A hidden size whose UE8M0 scale rows end in padding on both backends: 17, 34 or 9 blocks of 64, 32 or 128."""
    return 1088 if block_size <= 64 else 1152


def scaled_rows(num_tokens: int, hidden: int, dtype: str, device) -> torch.Tensor:
    """Test input: rows of very different magnitudes, so that the scales span many binades."""
    scale = torch.exp2(torch.randint(-20, 20, (num_tokens, 1)).float())
    return (torch.randn(num_tokens, hidden) * scale).to(getattr(torch, dtype)).to(device)


# ---------------------------------------------------------------- FP4 (e2m1) output and E4M3 scale factors

FORMAT_MAX = {'e4m3': FP8_MAX, 'e2m1': 6.0}
E4M3_SF_FLOOR = 2.0**-9  # the smallest e4m3 subnormal
AMAX_FLOORS = {  # TileKernels' amax floors per (fmt, E4M3 scales)
    ('e4m3', False): AMAX_FLOOR,
    ('e4m3', True): FP8_MAX * E4M3_SF_FLOOR,
    ('e2m1', False): 6.0 * 2.0**-126,
    ('e2m1', True): 6.0 * E4M3_SF_FLOOR,
}
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)  # magnitudes of codes 0..7


def e2m1_codes_ref(values: torch.Tensor) -> torch.Tensor:
    """fp32 values -> e2m1 codes (uint8, 0..15): the nearest magnitude of the grid, a tie to the even code, past 6
    (and +-inf, NaN) 6; the sign bit from the value's sign bit (so -0.0 and small negatives give code 8)."""
    magnitude = values.double().abs().nan_to_num(nan=6.0, posinf=6.0).clamp(max=6.0)
    distance = (magnitude.unsqueeze(-1) - E2M1_GRID).abs()
    nearest = distance.min(dim=-1, keepdim=True).values
    # Among the nearest magnitudes (two on a tie, one of them even) take the even code: odd codes rank last.
    ranked = torch.where(distance == nearest, torch.arange(8) % 2, 2)
    codes = ranked.argmin(dim=-1).to(torch.uint8)
    return codes | (torch.signbit(values).to(torch.uint8) << 3)


def pack_e2m1_ref(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (..., 2 K) uint8 -> (..., K) int8 bytes, element 2 i in the low nibble of byte i."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.int8)


def narrow_ref(scaled: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp32 products -> the cast's data: e4m3 (e4m3_ref), or FP4 bytes (T, H / 2) int8."""
    return pack_e2m1_ref(e2m1_codes_ref(scaled)) if fmt == 'e2m1' else e4m3_ref(scaled)


def e4m3_sf_ref(scale: torch.Tensor) -> torch.Tensor:
    """fp32 scales -> E4M3 scale bytes: nearest even, saturating at 448 (+inf too)."""
    return scale.clamp(max=FP8_MAX).to(torch.float8_e4m3fn)


def format_scale_and_inverse_ref(
    amax: torch.Tensor, fmt: str, *, round_sf: bool = False, packed_ue8m0: bool = False, e4m3_sf: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """scale_and_inverse_ref for output format `fmt` (largest value m) and E4M3 scales: c = max(a, floor);
    fp32 sf = c / m, inverse = m / c; round_sf: 2 ** ceil(log2(c * fp32(1 / m))), inverse 1 / sf; e4m3_sf:
    sf = e4m3(c / m) (saturating), inverse = 1 / fp32(sf)."""
    if e4m3_sf and round_sf:
        raise ValueError('e4m3_sf excludes round_sf')
    if packed_ue8m0 and not round_sf:
        raise ValueError('packed_ue8m0 needs round_sf')
    clamped = amax.clamp(min=AMAX_FLOORS[fmt, e4m3_sf])
    fmax = torch.full_like(clamped, FORMAT_MAX[fmt])
    if e4m3_sf:
        stored = e4m3_sf_ref(clamped / fmax)
        return stored, torch.ones_like(clamped) / stored.float()
    if not round_sf:
        return clamped / fmax, fmax / clamped
    pow2 = round_up_pow2_bits(clamped * torch.tensor(1.0 / FORMAT_MAX[fmt], dtype=torch.float32))
    biased = pow2 >> 23
    inverse = ((254 - biased).clamp(min=0) << 23).view(torch.float32)
    return (biased.to(torch.uint8) if packed_ue8m0 else pow2.view(torch.float32)), inverse


def per_token_cast_format_ref(
    x: torch.Tensor,
    block_size: int,
    fmt: str = 'e4m3',
    *,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    e4m3_sf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_cast_ref for every output and scale format: (data, sf). data (T, H) float8_e4m3fn, or FP4 (T, H / 2)
    int8; sf (T, H / block) fp32 / float8_e4m3fn, or UE8M0 bytes padded to 4 (uint8). Products are clamped to
    +-448 before the e4m3 narrowing (E4M3 scales may round below c / 448 or saturate)."""
    blocks = row_blocks(x, block_size)
    amax = blocks.abs().amax(dim=-1)
    stored, inverse = format_scale_and_inverse_ref(
        amax, fmt, round_sf=round_sf, packed_ue8m0=packed_ue8m0, e4m3_sf=e4m3_sf
    )
    sf = pack_ue8m0_rows(stored) if packed_ue8m0 else stored
    return narrow_ref(from_blocks(blocks * inverse.unsqueeze(-1), x.shape[1]), fmt), sf


def per_token_cast_precomputed_ref(x: torch.Tensor, sf: torch.Tensor, block_size: int, fmt: str = 'e4m3'):
    """The data of per_token_cast_with_precomputed_sf: x * (1 / fp32(sf)) per block (IEEE reciprocal), narrowed
    (e4m3: clamped to +-448 first, NaN kept; FP4: e2m1_codes_ref)."""
    blocks = row_blocks(x, block_size)
    given = sf.float()
    inverse = torch.ones_like(given) / given
    return narrow_ref(from_blocks(blocks * inverse.unsqueeze(-1), x.shape[1]), fmt)


def logical_sf_bytes(sf: torch.Tensor) -> torch.Tensor:
    """The scales' bytes in the logical (row-major) order, whatever the layout."""
    return sf.cpu().flatten().view(torch.uint8)


def assert_col_major_buffer_written(cast_into, rows_sf: torch.Tensor, backend: str, device) -> None:
    """`cast_into(buffer)` (a call given a column-major scale buffer; it returns the call's scales) writes the values
    of `rows_sf` (the row-major call's scales) into a poisoned buffer of the peer's layout: that buffer is the
    result, and each scale row is written while its padding (CUDA's) is left alone."""
    buffer = tma_col_major_sf(tuple(rows_sf.shape), rows_sf.dtype, backend, device)
    nbytes = buffer.untyped_storage().nbytes()
    whole = torch.empty(0, dtype=torch.uint8, device=device).set_(buffer.untyped_storage(), 0, (nbytes,))
    whole.fill_(0xA5)  # the buffer's bytes, CUDA's padding columns included
    assert cast_into(buffer) is buffer
    assert torch.equal(logical_sf_bytes(buffer), logical_sf_bytes(rows_sf))
    if rows_sf.shape[0]:
        k, width = rows_sf.shape[1], rows_sf.shape[0] * rows_sf.element_size()
        image = torch.full((k, nbytes // k), 0xA5, dtype=torch.uint8)
        image[:, :width] = rows_sf.cpu().T.flatten().view(torch.uint8).view(k, width)
        assert torch.equal(whole.cpu().view(k, -1), image)  # each scale row written, its padding left alone


# The scale dtype of each scale format of the tests, as the calls return it (packed UE8M0: int32 words).
SF_DTYPES = {'fp32': torch.float32, 'pow2': torch.float32, 'ue8m0': torch.int32, 'e4m3': torch.float8_e4m3fn}


def assert_peer_layout(sf: torch.Tensor, rows: int, sf_name: str, backend: str) -> None:
    """sf, scales of `rows` scale rows (tokens, or token blocks) in format `sf_name`, has TileKernels' column-major
    layout on `backend`: its strides, and the whole padded buffer behind it."""
    peer = tma_col_major_sf((rows, sf.shape[1]), SF_DTYPES[sf_name], backend)
    assert (tuple(sf.shape), sf.dtype, sf.stride()) == (tuple(peer.shape), peer.dtype, peer.stride())
    assert sf.untyped_storage().nbytes() - sf.storage_offset() * sf.element_size() >= peer.untyped_storage().nbytes()
