"""PyTorch references of mhc_pre_apply_mix_bwd: the correctness oracles of its tests (never imported by runtime
code). The gradients come from float64 autograd of mhc_pre_apply_mix_fwd_ref."""

import torch

from .mhc_pre_apply_mix_fwd_ref import mhc_pre_apply_mix_fwd_ref


def mhc_pre_apply_mix_bwd_ref(
    o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor, x_grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_grad + dL/dx, dL/dmix) in float64 for the upstream gradient o_grad (T, H): x_grad (T, mhc_mult, H) is
    the buffer's value before the call (the operator accumulates into it)."""
    x64 = x.double().requires_grad_()
    mix64 = mix.double().requires_grad_()
    x_part, mix_grad = torch.autograd.grad(mhc_pre_apply_mix_fwd_ref(x64, mix64), (x64, mix64), o_grad.double())
    return x_grad.double() + x_part, mix_grad


def x_grad_bound(o_grad: torch.Tensor, mix: torch.Tensor, x_grad: torch.Tensor, expected: torch.Tensor):
    """How far the bf16 x_grad may be from the float64 value: one fp32 fused multiply-add (2**-24 of at most
    |x_grad| + |mix * o_grad|) and the bf16 rounding (2**-8 relative)."""
    scale = x_grad.double().abs() + (mix.double().unsqueeze(-1) * o_grad.double().unsqueeze(1)).abs()
    return 2.0**-8 * expected.abs() + 2.0**-22 * scale


def mix_grad_bound(o_grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """How far the fp32 mix_grad may be from the float64 value. The products of two bf16 values are exact in
    fp32; a sum of n of them in any order of pairwise additions of depth d has error at most d * 2**-24 * S
    (S = sum |o_grad * x|). Ascend: a lane adds H / 64 products in turn, then a 6-level lane tree; CUDA: a
    thread adds at most H / 32 products (hidden blocks of up to 128 vectors of 8 on 128 threads, or 32 threads of
    smaller vectors), then at most 7 tree levels: d <= H / 32 + 7, rounded up to H / 32 + 16."""
    hidden = x.shape[-1]
    scale = (o_grad.double().unsqueeze(1) * x.double()).abs().sum(-1)
    return (hidden / 32 + 16) * 2.0**-24 * scale
