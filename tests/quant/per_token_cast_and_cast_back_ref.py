"""Pure-PyTorch oracle of per_token_cast_and_cast_back (semantics: packages/cann_ops_tilelang/quant/
per_token_cast_and_cast_back_kernel.py), built on tests/quant/cast_ref.py's per-token cast and scale rule.

Tests only; it imports no kernel module. Every step is one fp32 operation as the kernels do it, so the kernels
are compared bit for bit.
"""

from __future__ import annotations

import torch

from tests.quant.cast_ref import (
    E2M1_GRID,
    e2m1_codes_ref,
    e4m3_ref,
    format_scale_and_inverse_ref,
    from_blocks,
    row_blocks,
    scale_and_inverse_ref,
)


def e2m1_values_ref(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15) -> their fp32 values (exact; code 8 is -0.0)."""
    magnitude = E2M1_GRID.float()[(codes & 7).long()]
    return torch.where((codes & 8).bool(), -magnitude, magnitude)


def per_token_cast_and_cast_back_ref(
    x: torch.Tensor, block_size: int = 32, *, round_sf: bool = False, fmt: str = 'e4m3', e4m3_sf: bool = False
) -> torch.Tensor:
    """x (T, H) bf16 / fp32 -> a new (T, H) tensor of x's dtype: x.dtype(fp32(narrow(x * inverse)) * fp32(sf)) per
    block, per_token_cast's scale, inverse and narrowing for `fmt` (e4m3 clamped to +-448, e2m1 nearest even)."""
    blocks = row_blocks(x, block_size)
    stored, inverse = format_scale_and_inverse_ref(blocks.abs().amax(dim=-1), fmt, round_sf=round_sf, e4m3_sf=e4m3_sf)
    scaled = blocks * inverse.unsqueeze(-1)
    back = e2m1_values_ref(e2m1_codes_ref(scaled)) if fmt == 'e2m1' else e4m3_ref(scaled).float()
    return from_blocks(back * stored.float().unsqueeze(-1), x.shape[1]).to(x.dtype)


__all__ = ['e2m1_values_ref', 'per_token_cast_and_cast_back_ref', 'scale_and_inverse_ref']
