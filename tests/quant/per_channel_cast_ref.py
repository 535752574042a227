"""Pure-PyTorch oracle of per_channel_cast (semantics: packages/cann_ops_tilelang/quant/per_channel_cast_kernel.py).

Tests only; never imported at run time, and it imports no kernel module. The scale rule and the e4m3 narrowing
are the domain's shared ones (cast_ref.py); every step is one fp32 operation as the kernels do it, so the kernels
are compared bit for bit.
"""

from __future__ import annotations

import torch

from tests.quant.cast_ref import e4m3_ref, pack_ue8m0_cols, scale_and_inverse_ref, ue8m0_to_fp32


def decode_prequantised(
    x: torch.Tensor, x_sf: torch.Tensor, in_block_channels: int, *, in_packed_ue8m0: bool = False
) -> torch.Tensor:
    """fp32(x) * scale of a pre-quantised x (T, H) float8_e4m3fn, one scale per token and block of
    `in_block_channels` channels: x_sf fp32 (T, H / in_block_channels), or UE8M0 bytes uint8 (T, >= H /
    in_block_channels) in the row layout (byte k of row t for channel block k, padding ignored)."""
    blocks = x.shape[1] // in_block_channels
    scale = ue8m0_to_fp32(x_sf[:, :blocks]) if in_packed_ue8m0 else x_sf[:, :blocks].float()
    return x.float() * scale.repeat_interleave(in_block_channels, dim=1)


def per_channel_cast_ref(
    x: torch.Tensor,
    block_tokens: int,
    *,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    x_sf: torch.Tensor | None = None,
    in_block_channels: int | None = None,
    in_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (T, H) float8_e4m3fn, out_sf) of x (T, H): bf16 / fp32, or float8_e4m3fn with its per-token scales
    x_sf (`in_block_channels`, `in_packed_ue8m0`: decode_prequantised).

    One scale per channel and block of `block_tokens` tokens (the last block partial when T is not a multiple):
    out_sf fp32 (ceil(T / block_tokens), H), or with `packed_ue8m0` the UE8M0 bytes column-packed
    (pack_ue8m0_cols): uint8 (ceil(ceil(T / block_tokens) / 4), 4 H).
    """
    if (x_sf is None) != (in_block_channels is None):
        raise ValueError('x_sf and in_block_channels go together (a pre-quantised x)')
    num_tokens, hidden = x.shape
    if x_sf is None:
        values = x.float()
    else:
        values = decode_prequantised(x, x_sf, in_block_channels, in_packed_ue8m0=in_packed_ue8m0)
    blocks = -(-num_tokens // block_tokens)
    magnitudes = torch.zeros(blocks * block_tokens, hidden)  # rows past T count as 0: maxima are >= 0
    magnitudes[:num_tokens] = values.abs()
    amax = magnitudes.view(blocks, block_tokens, hidden).amax(dim=1)
    stored, inverse = scale_and_inverse_ref(amax, round_sf=round_sf, packed_ue8m0=packed_ue8m0)
    scaled = values * inverse.repeat_interleave(block_tokens, dim=0)[:num_tokens]
    return e4m3_ref(scaled), (pack_ue8m0_cols(stored) if packed_ue8m0 else stored)
