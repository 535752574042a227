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


def per_token_cast_ref(
    x: torch.Tensor,
    block_size: int = 32,
    *,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    ue8m0_pack: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (T, H) float8_e4m3fn, out_sf) of x (T, H) bf16 / fp32, H a multiple of `block_size`.

    out_sf: (T, H // block_size) fp32 (the scale, a power of two with `round_sf`), or with `packed_ue8m0` the
    biased exponent bytes, (T, H // block_size rounded up to `ue8m0_pack`) uint8 with zero padding.
    """
    num_tokens, hidden = x.shape
    blocks = x.float().reshape(num_tokens, hidden // block_size, block_size)
    amax = blocks.abs().amax(dim=-1)
    stored, inverse = scale_and_inverse_ref(amax, round_sf=round_sf, packed_ue8m0=packed_ue8m0)
    sf = pack_ue8m0_rows(stored, ue8m0_pack) if packed_ue8m0 else stored
    scaled = (blocks * inverse.unsqueeze(-1)).reshape(num_tokens, hidden)
    return e4m3_ref(scaled), sf


def padded_hidden(block_size: int) -> int:
    """A hidden size whose UE8M0 scale rows end in padding on both backends: 17, 34 or 9 blocks of 64, 32 or 128."""
    return 1088 if block_size <= 64 else 1152


def scaled_rows(num_tokens: int, hidden: int, dtype: str, device) -> torch.Tensor:
    """Test input: rows of very different magnitudes, so that the scales span many binades."""
    scale = torch.exp2(torch.randint(-20, 20, (num_tokens, 1)).float())
    return (torch.randn(num_tokens, hidden) * scale).to(getattr(torch, dtype)).to(device)
