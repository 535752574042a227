"""PyTorch reference of mhc_pre_split_mixes_bwd: autograd of the forward's float64 reference (tests only)."""

import torch

from .mhc_pre_split_mixes_fwd_ref import mhc_pre_split_mixes_fwd_ref


def mhc_pre_split_mixes_bwd_ref(
    pre_layer_mix_grad: torch.Tensor,
    post_layer_mix_grad: torch.Tensor,
    comb_res_mix_grad: torch.Tensor,
    input_mixes: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    mhc_post_mult_value: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_mixes_grad, mhc_scale_grad (3,), mhc_base_grad) in float64: the vector-Jacobian product of
    mhc_pre_split_mixes_fwd_ref with the three output gradients."""
    leaves = [t.detach().double().requires_grad_() for t in (input_mixes, mhc_scale, mhc_base)]
    outs = mhc_pre_split_mixes_fwd_ref(*leaves, pre_layer_mix_grad.shape[1], mhc_post_mult_value, 0.0)
    grads = [g.double() for g in (pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad)]
    return torch.autograd.grad(outs, leaves, grads)
