"""Pure-PyTorch oracle of per_block_cast (semantics: packages/cann_ops_tilelang/quant/per_block_cast_kernel.py).

Tests only; never imported at run time, and it imports no kernel module. The scale rule and the e4m3 narrowing
are the domain's (cast_ref.py); what is per_block_cast's own is which elements share a scale: blocks of
`block_tokens` rows by `block_channels` columns, the last token block holding only the rows that exist. Every
step is one fp32 operation as the kernels do it, so the kernels are compared bit for bit.
"""

from __future__ import annotations

import torch

from tests.quant.cast_ref import e4m3_ref, pack_ue8m0_rows, scale_and_inverse_ref


def block_amax_ref(x: torch.Tensor, block_tokens: int, block_channels: int) -> torch.Tensor:
    """fp32 |x| maxima (ceil(T / block_tokens), H / block_channels) of x (T, H), over the rows that exist."""
    num_tokens, hidden = x.shape
    rows = -(-num_tokens // block_tokens)
    padded = torch.zeros(rows * block_tokens, hidden, dtype=torch.float32)  # |x| >= 0: zero rows change no max
    padded[:num_tokens] = x.float().abs()
    blocks = padded.reshape(rows, block_tokens, hidden // block_channels, block_channels)
    return blocks.amax(dim=(1, 3))


def expand_blocks(per_block: torch.Tensor, num_tokens: int, block_tokens: int, block_channels: int) -> torch.Tensor:
    """(rows, blocks) -> (num_tokens, blocks * block_channels): each block's value on each of its elements."""
    full = per_block.repeat_interleave(block_tokens, dim=0).repeat_interleave(block_channels, dim=1)
    return full[:num_tokens]


def scaled_e4m3_ref(x: torch.Tensor, inverse: torch.Tensor, block_tokens: int, block_channels: int) -> torch.Tensor:
    """e4m3(fp32(x) * inverse of its block): nearest even, saturating at +-448 (NaN stays NaN)."""
    expanded = expand_blocks(inverse, x.shape[0], block_tokens, block_channels)
    return e4m3_ref(x.float() * expanded)


def per_block_cast_ref(
    x: torch.Tensor,
    block_tokens: int = 32,
    block_channels: int = 32,
    *,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    ue8m0_pack: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (T, H) float8_e4m3fn, sf) of x (T, H) bf16 / fp32, H a multiple of `block_channels` (modes 'cast' and,
    the sf alone, 'sf_only').

    sf: (ceil(T / block_tokens), H / block_channels) fp32 (the scale, a power of two with `round_sf`), or with
    `packed_ue8m0` the biased exponent bytes, (ceil(T / block_tokens), H / block_channels rounded up to
    `ue8m0_pack`) uint8 with zero padding.
    """
    amax = block_amax_ref(x, block_tokens, block_channels)
    stored, inverse = scale_and_inverse_ref(amax, round_sf=round_sf, packed_ue8m0=packed_ue8m0)
    sf = pack_ue8m0_rows(stored, ue8m0_pack) if packed_ue8m0 else stored
    return scaled_e4m3_ref(x, inverse, block_tokens, block_channels), sf


def per_block_cast_precomputed_ref(
    x: torch.Tensor, sf: torch.Tensor, block_tokens: int = 32, block_channels: int = 32
) -> torch.Tensor:
    """out (T, H) float8_e4m3fn of x with the given fp32 scales sf (ceil(T / block_tokens), H / block_channels)
    (mode 'precomputed'): inverse = 1 / sf (IEEE, tensor / tensor), then the same narrowing."""
    if sf.dtype != torch.float32:
        raise TypeError(f'sf must be float32, got {sf.dtype}')
    inverse = torch.ones_like(sf) / sf
    return scaled_e4m3_ref(x, inverse, block_tokens, block_channels)
