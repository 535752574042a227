"""Pure-PyTorch oracle of cast_back (semantics and scale layouts: packages/cann_ops_tilelang/quant/
cast_back_kernel.py), and the scale layouts it reads, for the kernel tests.

Tests only; never imported at run time, and it imports no kernel module. As the kernels: the e4m3 data (or FP4:
the e2m1 value of each nibble, element 2 i in the low nibble of byte i) widens to fp32 exactly, as do E4M3
scales, each element is multiplied once in fp32 by its block's scale, and the product is cast to the output dtype
(torch rounds to nearest even into bf16), so the kernels are compared bit for bit.
"""

from __future__ import annotations

import torch

from cann_ops_tilelang.quant.fp4 import E2M1_VALUES
from tests.quant.cast_ref import UE8M0_PACK, pack_ue8m0_cols, pack_ue8m0_rows, ue8m0_to_fp32, unpack_ue8m0_cols


def block_scales(
    sf: torch.Tensor, num_tokens: int, hidden: int, block_tokens: int, block_channels: int
) -> torch.Tensor:
    """The fp32 scale of every element, (T, H), from x_sf in the kernels' layouts: fp32 (G, ceil(H / bc)) or (G, H);
    uint8 UE8M0 row-packed (G, 4 * ceil(ceil(H / bc) / 4)) or, for bc = 1, col-packed (ceil(G / 4), 4 * H). A short
    last block (H = 64 * odd, bc = 128) has a scale of its own: whole blocks expanded, then cut back to H."""
    blocks = -(-num_tokens // block_tokens)
    per_row = -(-hidden // block_channels)
    if sf.dtype == torch.uint8:
        # Col-packed bytes of every token block, or the row layout's bytes without the padding.
        ue8m0 = unpack_ue8m0_cols(sf, blocks) if block_channels == 1 else sf[:, :per_row]
        scales = ue8m0_to_fp32(ue8m0)
    elif sf.dtype == torch.float32:
        scales = sf
    elif sf.dtype == torch.float8_e4m3fn:
        scales = sf.float()  # exact
    else:
        raise TypeError(f'x_sf must be float32, float8_e4m3fn or uint8 (UE8M0), got {sf.dtype}')
    if tuple(scales.shape) != (blocks, per_row):
        raise ValueError(f'scales of shape {tuple(scales.shape)}, expected {(blocks, per_row)}')
    expanded = scales.repeat_interleave(block_tokens, dim=0)[:num_tokens]
    return expanded.repeat_interleave(block_channels, dim=1)[:, :hidden]


def cast_back_ref(
    data: torch.Tensor,
    sf: torch.Tensor,
    out_dtype: torch.dtype,
    block_tokens: int,
    block_channels: int,
) -> torch.Tensor:
    """out (T, H) of out_dtype: fp32(data) * scale, one fp32 multiply, then the cast (nearest even into bf16).
    data: (T, H) float8_e4m3fn, or FP4 (T, H / 2) int8."""
    if data.dtype == torch.int8:
        values = decode_e2m1(data.cpu())
    elif data.dtype == torch.float8_e4m3fn:
        values = data.cpu().float()
    else:
        raise TypeError(f'data must be float8_e4m3fn or int8 (FP4), got {data.dtype}')
    num_tokens, hidden = values.shape
    scales = block_scales(sf.cpu(), num_tokens, hidden, block_tokens, block_channels)
    return (values * scales).to(out_dtype)


def decode_e2m1(data: torch.Tensor) -> torch.Tensor:
    """FP4 bytes (T, K) int8 -> (T, 2 K) fp32 by table (fp4.E2M1_VALUES): the low nibble is element 2 i."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    codes = data.view(torch.uint8).to(torch.int64)
    return torch.stack((table[codes & 0xF], table[codes >> 4]), dim=-1).reshape(data.shape[0], 2 * data.shape[1])


def random_e2m1(num_tokens: int, hidden: int) -> torch.Tensor:
    """FP4 data (T, H / 2) int8: every byte (every pair of the 16 e2m1 codes) equally likely."""
    return torch.randint(-128, 128, (num_tokens, hidden // 2), dtype=torch.int8)


def random_e4m3(num_tokens: int, hidden: int, *, nan: bool = False) -> torch.Tensor:
    """Every e4m3 bit pattern equally likely (NaN, 0x7f / 0xff, only with `nan`: otherwise redrawn as +-0)."""
    bits = torch.randint(0, 256, (num_tokens, hidden), dtype=torch.int32).to(torch.uint8)
    if not nan:
        bits = torch.where((bits & 0x7F) == 0x7F, bits & 0x80, bits)
    return bits.view(torch.float8_e4m3fn)


def random_scales(
    num_tokens: int, hidden: int, block_tokens: int, block_channels: int, *, packed_ue8m0: bool, e4m3_sf: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_sf in the kernels' layout, the same scales as fp32 (G, ceil(H / bc))) with magnitudes over many binades:
    fp32 scales with random significands (so bf16 outputs need rounding), UE8M0 bytes 100..154 (finite
    products for every e4m3 value), or every finite float8_e4m3fn scale (NaN redrawn as +-0)."""
    blocks = -(-num_tokens // block_tokens)
    per_row = -(-hidden // block_channels)  # a short last block has its scale
    if e4m3_sf:
        scales = random_e4m3(blocks, per_row)
        return scales, scales.float()
    if packed_ue8m0:
        ue8m0 = torch.randint(100, 155, (blocks, per_row), dtype=torch.int32).to(torch.uint8)
        packed = pack_ue8m0_cols(ue8m0) if block_channels == 1 else pack_ue8m0_rows(ue8m0, UE8M0_PACK)
        return packed, ue8m0_to_fp32(ue8m0)
    sign = torch.where(torch.rand(blocks, per_row) < 0.25, -1.0, 1.0)
    scales = sign * (1 + torch.rand(blocks, per_row)) * torch.exp2(torch.randint(-40, 40, (blocks, per_row)).float())
    return scales, scales
