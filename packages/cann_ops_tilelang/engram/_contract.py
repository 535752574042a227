"""Shape limits shared by the Engram operators (docs/engram.md, "Shapes to support"), the gate operators' tensor
checks and kv alignment."""

from __future__ import annotations

import torch

from cann_ops_tilelang.validation import check_contiguous, check_last_dim_contiguous, check_shape, check_tensor

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


# The gate operators' tensors: dtype and rank by argument name.
_GATE_TENSORS = {
    'grad_out': (torch.bfloat16, 3),
    'hidden_states': (torch.bfloat16, 3),
    'kv': (torch.bfloat16, 3),
    'weight_fused': (torch.float32, 2),
    'dot': (torch.float32, 2),
    'gate_score': (torch.float32, 2),
    'rstd_x': (torch.float32, 2),
    'rstd_k': (torch.float32, 2),
}


def check_gate_tensors(name: str, tensors: dict[str, torch.Tensor]) -> tuple[int, int, int]:
    """(T, hc, H) of the gate operators' tensors (argument name -> value, in call order), checked in this order:
    types, dtypes and ranks; hc and H (of hidden_states); shapes; layouts (kv: last dimension contiguous, the rest
    contiguous). hidden_states, grad_out: (T, hc, H); kv (T, hc + 1, H); weight_fused (hc, H); the saved (T, hc)."""
    for arg, value in tensors.items():
        dtype, ndim = _GATE_TENSORS[arg]
        check_tensor(arg, value, dtype=dtype, ndim=ndim)
    num_tokens, hc, hidden = tensors['hidden_states'].shape
    check_hc_hidden(name, hc, hidden)
    shapes = {'grad_out': (num_tokens, hc, hidden), 'kv': (num_tokens, hc + 1, hidden), 'weight_fused': (hc, hidden)}
    for arg, value in tensors.items():
        if arg != 'hidden_states':
            check_shape(arg, value, shapes.get(arg, (num_tokens, hc)))
    for arg, value in tensors.items():
        (check_last_dim_contiguous if arg == 'kv' else check_contiguous)(arg, value)
    return num_tokens, hc, hidden


def kv_alignment_bits(kv: torch.Tensor) -> int:
    """The bitwise or of kv's address and its outer strides in bytes: a power of two divides all of them iff
    it divides this (integer operations only, for the gate operators' access widths and alignment copies).
    The token stride of a single token is never used and does not count; kv.stride(1) (key rows, the
    value's offset) always does (hc + 1 >= 2 rows)."""
    stride_t, stride_h, _ = kv.stride()
    if kv.shape[0] <= 1:
        stride_t = 0
    return kv.data_ptr() | (stride_t | stride_h) * kv.element_size()
