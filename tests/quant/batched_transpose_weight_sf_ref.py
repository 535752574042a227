"""Pure-PyTorch oracle of batched_transpose_weight_sf (semantics: packages/cann_ops_tilelang/quant/
batched_transpose_weight_sf_kernel.py).

Tests only; never imported at run time, and it imports no kernel module. Integer arithmetic only (no floats):
the exponent byte of each scale's bits, then the bytes laid out one by one into uint8 storage that is read as
little-endian int32 words, so it is exact by construction.
"""

from __future__ import annotations

import torch

PACK = 4  # UE8M0 bytes per int32 word


def exponent_bytes_ref(sf: torch.Tensor) -> torch.Tensor:
    """(bits >> 23) & 0xFF of fp32 scales, as int64 (sign and mantissa dropped)."""
    return (sf.contiguous().view(torch.int32).to(torch.int64) >> 23) & 0xFF


def _packed_rows(exps: torch.Tensor, repeat: int) -> torch.Tensor:
    """exps (G, R, C) -> int32 (G, ceil(C / 4), R * repeat): word [g, p, i] has byte j = exps[g, i // repeat,
    4 p + j] (0 past C)."""
    groups, rows, cols = exps.shape
    words = -(-cols // PACK)
    padded = torch.zeros(groups, rows, words * PACK, dtype=torch.uint8)
    padded[:, :, :cols] = exps.to(torch.uint8)
    # (G, R, P, 4) bytes -> (G, P, R * repeat, 4): byte j of word p of every row of block r.
    by_word = padded.view(groups, rows, words, PACK).permute(0, 2, 1, 3).repeat_interleave(repeat, dim=2)
    return by_word.contiguous().view(torch.int32).squeeze(-1)


def transpose_weight_sf_ref(sf: torch.Tensor, block_size: int, transpose_sf1: bool):
    """(sf0, sf1) of one weight's scales (n / bs, k / bs) or (G, n / bs, k / bs), with the operator's shapes and
    strides (views of (G, P0, n) / (G, P1, k) storage)."""
    dense = sf.dim() == 2
    exps = exponent_bytes_ref(sf.unsqueeze(0) if dense else sf)
    sf0 = _packed_rows(exps, block_size).transpose(-1, -2)  # (G, n, P0), strides (P0 n, 1, n)
    sf1 = _packed_rows(exps.transpose(1, 2), block_size).transpose(-1, -2)  # (G, k, P1)
    if transpose_sf1:
        sf1 = sf1.transpose(-1, -2)
    return (sf0[0], sf1[0]) if dense else (sf0, sf1)


def batched_transpose_weight_sf_ref(sf, block_size: int, transpose_sf1s):
    return [transpose_weight_sf_ref(s, block_size, flag) for s, flag in zip(sf, transpose_sf1s, strict=True)]


def power_of_two_scales(shape, generator: torch.Generator, low: int = -40, high: int = 40) -> torch.Tensor:
    """fp32 scales 2**m, m uniform in [low, high), built on the bits (biased exponent m + 127)."""
    exps = torch.randint(low + 127, high + 127, shape, generator=generator, dtype=torch.int32)
    return (exps << 23).view(torch.float32)
