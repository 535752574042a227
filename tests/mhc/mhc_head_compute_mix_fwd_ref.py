"""PyTorch reference of mhc_head_compute_mix_fwd (the oracle of its tests; never imported by runtime code)."""

import torch


def mhc_head_compute_mix_fwd_ref(
    input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_pre_eps: float
) -> torch.Tensor:
    """sigmoid(input_mix * mhc_scale + mhc_base) + mhc_pre_eps in float64: input_mix (T, M), mhc_scale (1,),
    mhc_base (M,). Differentiable (the backward's reference is its autograd)."""
    return torch.sigmoid(input_mix.double() * mhc_scale.double() + mhc_base.double()) + mhc_pre_eps
