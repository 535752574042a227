"""PyTorch reference of mhc_head_compute_mix_bwd: autograd of the forward's float64 reference (tests only)."""

import torch

from .mhc_head_compute_mix_fwd_ref import mhc_head_compute_mix_fwd_ref


def mhc_head_compute_mix_bwd_ref(
    output_mix_grad: torch.Tensor, input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_mix_grad (T, M), mhc_scale_grad (1,), mhc_base_grad (M,)) in float64: the vector-Jacobian product
    of mhc_head_compute_mix_fwd_ref with output_mix_grad (eps does not enter the gradient)."""
    leaves = [t.detach().double().requires_grad_() for t in (input_mix, mhc_scale, mhc_base)]
    out = mhc_head_compute_mix_fwd_ref(*leaves, 0.0)
    return torch.autograd.grad(out, leaves, output_mix_grad.double())
