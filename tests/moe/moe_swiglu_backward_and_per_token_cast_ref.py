"""PyTorch helpers of moe_swiglu_backward_and_per_token_cast's tests: its FP8 input and that input's values. The
gradients' reference is moe_swiglu_backward_ref's; the cast's, per_token_cast's (tests/quant/cast_ref.py). Never
imported by runtime code."""

from __future__ import annotations

import torch

from tests.quant.cast_ref import per_token_cast_ref


def fp8_input_ref(x: torch.Tensor, num_per_channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP8 input (data (T, 2 H) float8_e4m3fn, sf (T, 2 H / num_per_channels) fp32) made from x on the CPU."""
    return per_token_cast_ref(x.cpu().float(), num_per_channels)


def dequantize_ref(data: torch.Tensor, sf: torch.Tensor, num_per_channels: int) -> torch.Tensor:
    """The fp32 values the kernels read from an FP8 input: data * sf of its block, one fp32 product each."""
    num_tokens, width = data.shape
    blocks = data.float().reshape(num_tokens, width // num_per_channels, num_per_channels)
    return (blocks * sf.float().unsqueeze(-1)).reshape(num_tokens, width)
