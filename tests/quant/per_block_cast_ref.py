"""Pure-PyTorch oracle of per_block_cast (semantics: packages/cann_ops_tilelang/quant/per_block_cast_kernel.py).

Tests only; never imported at run time, and it imports no kernel module. The scale rule (every output and scale
format) and the e4m3 / e2m1 narrowing are the domain's (cast_ref.py); what is per_block_cast's own is which
elements share a scale: blocks of `block_tokens` rows by `block_channels` columns, the last token block holding
only the rows that exist. Every step is one fp32 operation as the kernels do it, so the kernels are compared bit
for bit.
"""

from __future__ import annotations

import torch

from tests.quant.cast_ref import format_scale_and_inverse_ref, narrow_ref, pack_ue8m0_rows


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


def scaled_ref(
    x: torch.Tensor, inverse: torch.Tensor, block_tokens: int, block_channels: int, fmt: str = 'e4m3'
) -> torch.Tensor:
    """narrow(fp32(x) * inverse of its block): e4m3 to nearest even, saturating at +-448 (NaN stays NaN), or FP4
    bytes (T, H / 2) int8 (cast_ref.narrow_ref)."""
    expanded = expand_blocks(inverse, x.shape[0], block_tokens, block_channels)
    return narrow_ref(x.float() * expanded, fmt)


def per_block_cast_ref(
    x: torch.Tensor,
    block_tokens: int = 32,
    block_channels: int = 32,
    fmt: str = 'e4m3',
    *,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    e4m3_sf: bool = False,
    ue8m0_pack: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) bf16 / fp32, H a multiple of `block_channels` (modes 'cast' and, the sf alone,
    'sf_only'). data: (T, H) float8_e4m3fn, or FP4 (T, H / 2) int8.

    sf: (ceil(T / block_tokens), H / block_channels) fp32 (the scale, a power of two with `round_sf`) or
    float8_e4m3fn (`e4m3_sf`), or with `packed_ue8m0` the biased exponent bytes, (ceil(T / block_tokens),
    H / block_channels rounded up to `ue8m0_pack`) uint8 with zero padding.
    """
    amax = block_amax_ref(x, block_tokens, block_channels)
    stored, inverse = format_scale_and_inverse_ref(
        amax, fmt, round_sf=round_sf, packed_ue8m0=packed_ue8m0, e4m3_sf=e4m3_sf
    )
    sf = pack_ue8m0_rows(stored, ue8m0_pack) if packed_ue8m0 else stored
    return scaled_ref(x, inverse, block_tokens, block_channels, fmt), sf


def per_block_cast_precomputed_ref(
    x: torch.Tensor, sf: torch.Tensor, block_tokens: int = 32, block_channels: int = 32, fmt: str = 'e4m3'
) -> torch.Tensor:
    """data of x with the given scales sf (ceil(T / block_tokens), H / block_channels), fp32 or float8_e4m3fn
    (mode 'precomputed'): inverse = 1 / fp32(sf) (IEEE, tensor / tensor), then the same narrowing."""
    if sf.dtype not in (torch.float32, torch.float8_e4m3fn):
        raise TypeError(f'sf must be float32 or float8_e4m3fn, got {sf.dtype}')
    given = sf.float()
    inverse = torch.ones_like(given) / given
    return scaled_ref(x, inverse, block_tokens, block_channels, fmt)
