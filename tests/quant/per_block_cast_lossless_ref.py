"""Pure-PyTorch oracle of per_block_cast_lossless (semantics: packages/cann_ops_tilelang/quant/
per_block_cast_lossless_kernel.py), and the inputs its tests draw.

Tests only; never imported at run time, and it imports no kernel module. It works on exact values (the e2m1
table, exponents as integers, products in float64, which hold every e2m1 value times 2**d exactly) and narrows
with torch's fp32 -> e4m3 cast (nearest even), so the kernels, which build the product on the bits, are compared
bit for bit.
"""

from __future__ import annotations

import torch

from cann_ops_tilelang.quant.fp4 import unpack_from_e2m1fn_x2
from tests.quant.cast_ref import pack_ue8m0_rows, ue8m0_to_fp32

HEADROOM = 6  # E = max(M - 6, 0)


def input_exponents(sf: torch.Tensor, hidden: int, block_channels: int) -> torch.Tensor:
    """Biased exponents (rows, H / bc) int64 of input scales: UE8M0 bytes (uint8 rows, padded), or bits 23..30
    of fp32 scales (their mantissa and sign ignored)."""
    blocks = hidden // block_channels
    if sf.dtype == torch.uint8:
        return sf[:, :blocks].to(torch.int64)
    return (sf.view(torch.int32).to(torch.int64) >> 23) & 0xFF


def expand(per_block: torch.Tensor, num_tokens: int, block_tokens: int, block_channels: int) -> torch.Tensor:
    """(rows, blocks) -> (num_tokens, blocks * block_channels): each block's value on each of its elements."""
    return per_block.repeat_interleave(block_tokens, 0).repeat_interleave(block_channels, 1)[:num_tokens]


def output_exponents(element_exp: torch.Tensor, block_tokens: int, block_channels: int) -> torch.Tensor:
    """E = max(M - 6, 0) per output block, M the maximum of its elements' input exponents over the rows that
    exist (zero rows below them change no maximum: exponents are >= 0)."""
    num_tokens, hidden = element_exp.shape
    rows = -(-num_tokens // block_tokens)
    padded = torch.zeros(rows * block_tokens, hidden, dtype=torch.int64)
    padded[:num_tokens] = element_exp
    top = padded.reshape(rows, block_tokens, hidden // block_channels, block_channels).amax(dim=(1, 3))
    return (top - HEADROOM).clamp(min=0)


def per_block_cast_lossless_ref(
    data: torch.Tensor, sf: torch.Tensor, x_block_size, out_block_size, *, out_packed: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (T, H) float8_e4m3fn, out_sf) of data (T, H / 2) int8 / uint8 FP4 and sf (fp32, or UE8M0 bytes uint8
    rows). out_sf: fp32 (ceil(T / bto), H / bco) with bits E << 23, or with `out_packed` the UE8M0 bytes padded to
    whole int32 words (uint8)."""
    bti, bci = x_block_size
    bto, bco = out_block_size
    num_tokens, hidden = data.shape[0], 2 * data.shape[1]
    values = unpack_from_e2m1fn_x2(data, torch.float64)
    element_exp = expand(input_exponents(sf, hidden, bci), num_tokens, bti, bci)
    out_exp = output_exponents(element_exp, bto, bco)
    d = element_exp - expand(out_exp, num_tokens, bto, bco)
    # Exact in float64; an fp32 underflow (|value| < 2**-126) is far below e4m3's rounding threshold 2**-10.
    out = (values * torch.exp2(d.double())).float().to(torch.float8_e4m3fn)
    if out_packed:
        return out, pack_ue8m0_rows(out_exp.to(torch.uint8))
    return out, ue8m0_to_fp32(out_exp.to(torch.uint8))


def decode(data: torch.Tensor, sf_fp32: torch.Tensor, block_size) -> torch.Tensor:
    """fp32(value) * fp32(scale of its block), one fp32 product per element (the 'bit for bit' of the lossless
    bound); data e4m3 (T, H) or FP4 bytes (T, H / 2); sf_fp32 fp32 (rows, blocks)."""
    values = unpack_from_e2m1fn_x2(data) if data.dtype in (torch.int8, torch.uint8) else data.float()
    return values * expand(sf_fp32, values.shape[0], *block_size)


def random_fp4(num_tokens: int, hidden: int) -> torch.Tensor:
    """(T, H / 2) int8: every e2m1 code pair equally likely."""
    return torch.randint(0, 256, (num_tokens, hidden // 2), dtype=torch.int32).to(torch.uint8).view(torch.int8)


def random_exponents(rows: int, blocks: int, low: int, high: int) -> torch.Tensor:
    """(rows, blocks) int64 biased exponents drawn from low..high."""
    return torch.randint(low, high + 1, (rows, blocks), dtype=torch.int64)


def scales_of(exps: torch.Tensor, packed: bool, *, junk_bits: bool = False) -> torch.Tensor:
    """Input scales in the kernels' layout from biased exponents: UE8M0 bytes padded to whole int32 words
    (uint8), or fp32 powers of two; `junk_bits`: fp32 with random mantissa and sign bits (which are ignored)."""
    if packed:
        return pack_ue8m0_rows(exps.to(torch.uint8))
    bits = exps.to(torch.int32) << 23
    if junk_bits:
        bits = bits | torch.randint(0, 1 << 23, exps.shape, dtype=torch.int32)
        bits = torch.where(torch.rand(exps.shape) < 0.5, bits | (-(2**31)), bits)
    return bits.view(torch.float32)
