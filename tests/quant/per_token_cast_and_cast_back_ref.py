"""Pure-PyTorch oracle of per_token_cast_and_cast_back (semantics: packages/cann_ops_tilelang/quant/
per_token_cast_and_cast_back_kernel.py), built on tests/quant/cast_ref.py's per-token cast and scale rule.

Tests only; it imports no kernel module. Every step is one fp32 operation as the kernels do it, so the kernels
are compared bit for bit.
"""

from __future__ import annotations

import torch

from tests.quant.cast_ref import per_token_cast_ref, scale_and_inverse_ref


def per_token_cast_and_cast_back_ref(x: torch.Tensor, block_size: int = 32, *, round_sf: bool = False) -> torch.Tensor:
    """x (T, H) bf16 / fp32 -> a new (T, H) tensor of x's dtype: x.dtype(fp32(e4m3(x * inverse)) * sf) per block."""
    num_tokens, hidden = x.shape
    fp8, sf = per_token_cast_ref(x, block_size, round_sf=round_sf)
    if round_sf:  # the stored scale is already the fp32 power of two
        assert sf.dtype == torch.float32
    back = fp8.float().reshape(num_tokens, hidden // block_size, block_size) * sf.unsqueeze(-1)
    return back.reshape(num_tokens, hidden).to(x.dtype)


__all__ = ['per_token_cast_and_cast_back_ref', 'scale_and_inverse_ref']
