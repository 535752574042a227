"""PyTorch reference of mhc_pre_apply_mix_fwd: the correctness oracle of its tests (never imported by runtime
code)."""

import torch


def mhc_pre_apply_mix_fwd_ref(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """o[t, h] = sum over m of mix[t, m] * x[t, m, h], in float64: x (T, mhc_mult, H), mix (T, mhc_mult) -> (T, H).
    Differentiable (the backward's gradient checks take its autograd)."""
    return (x.double() * mix.double().unsqueeze(-1)).sum(-2)


def pre_apply_mix_fwd_bound(x: torch.Tensor, mix: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How far the kernels' bf16 o may be from the float64 value: the fp32 products and fused multiply-adds (at
    most 8 roundings of 2**-24 of the running sum, itself at most S = sum |mix * x|, so 2**-21 S) and the final
    bf16 rounding (2**-8 relative to the fp32 value): 2**-8 |o| + 2**-20 S."""
    scale = (x.double() * mix.double().unsqueeze(-1)).abs().sum(-2)
    return 2.0**-8 * expected.abs() + 2.0**-20 * scale
