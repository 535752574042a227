"""Shape limits shared by the Engram operators (docs/engram.md, "Shapes to support")."""

from __future__ import annotations

import math

import torch

from cann_ops_tilelang.validation import is_contiguous_tensor

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


def hc_hidden_supported(hc: int, hidden: int) -> bool:
    """check_hc_hidden's conditions as one boolean (the operators' fast checks)."""
    return 1 <= hc <= MAX_HC and hidden % HIDDEN_ALIGN == 0 and HIDDEN_ALIGN <= hidden <= MAX_HIDDEN


def gate_operands_conform(kv, weight_fused, clamp_value, num_tokens: int, hc: int, hidden: int) -> bool:
    """Whether the gate operators' shared operands pass their checks, for hidden states of shape (T, hc, H):
    hc and H supported, kv (T, hc + 1, H) bf16 with a contiguous last dimension and non-negative strides,
    weight_fused (hc, H) fp32 contiguous, clamp_value a finite float > 0. A False sends the call through
    the per-check helpers, which raise the typed error (or pass: an int clamp_value, say)."""
    if not (
        hc_hidden_supported(hc, hidden)
        and isinstance(kv, torch.Tensor)
        and kv.dtype is torch.bfloat16
        and kv.shape == (num_tokens, hc + 1, hidden)
        and is_contiguous_tensor(weight_fused, torch.float32, (hc, hidden))
        and type(clamp_value) is float
        and 0.0 < clamp_value < math.inf
    ):
        return False
    stride_t, stride_h, stride_last = kv.stride()
    return stride_last == 1 and stride_t >= 0 and stride_h >= 0


def kv_alignment_bits(kv: torch.Tensor) -> int:
    """The bitwise or of kv's address and its outer strides in bytes: a power of two divides all of them iff
    it divides this (integer operations only, for the gate operators' access widths and alignment copies).
    The token stride of a single token is never used and does not count; kv.stride(1) (key rows, the
    value's offset) always does (hc + 1 >= 2 rows)."""
    stride_t, stride_h, _ = kv.stride()
    if kv.shape[0] <= 1:
        stride_t = 0
    return kv.data_ptr() | (stride_t | stride_h) * kv.element_size()
