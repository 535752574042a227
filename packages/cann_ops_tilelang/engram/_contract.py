"""Shape limits shared by the Engram operators (docs/engram.md, "Shapes to support") and the gate operators' kv
alignment."""

from __future__ import annotations

import torch

MAX_HC = 8
HIDDEN_ALIGN = 64
MAX_HIDDEN = 16384


def check_hc_hidden(name: str, hc: int, hidden: int) -> None:
    """hc in 1..8 and hidden a multiple of 64 in 64..16384, else ValueError naming the constraint."""
    if not 1 <= hc <= MAX_HC:
        raise ValueError(f'{name}: hc (number of hyper-connection branches) must be in 1..{MAX_HC}, got {hc}')
    if hidden <= 0 or hidden % HIDDEN_ALIGN != 0 or hidden > MAX_HIDDEN:
        raise ValueError(
            f'{name}: hidden size must be a positive multiple of {HIDDEN_ALIGN} up to {MAX_HIDDEN}, got {hidden}'
        )


def kv_alignment_bits(kv: torch.Tensor) -> int:
    """The bitwise or of kv's address and its outer strides in bytes: a power of two divides all of them iff
    it divides this (integer operations only, for the gate operators' access widths and alignment copies).
    The token stride of a single token is never used and does not count; kv.stride(1) (key rows, the
    value's offset) always does (hc + 1 >= 2 rows)."""
    stride_t, stride_h, _ = kv.stride()
    if kv.shape[0] <= 1:
        stride_t = 0
    return kv.data_ptr() | (stride_t | stride_h) * kv.element_size()
