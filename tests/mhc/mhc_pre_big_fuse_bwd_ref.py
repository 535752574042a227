"""PyTorch reference of mhc_pre_big_fuse_bwd: autograd of the float64 reference of the whole pre path (the
correctness oracle of its tests; never imported by runtime code)."""

import torch

from .mhc_pre_big_fuse_fwd_ref import mhc_pre_big_fuse_fwd_ref


def mhc_pre_big_fuse_bwd_ref(
    post_mix_grad: torch.Tensor,
    comb_mix_grad: torch.Tensor,
    layer_input_grad: torch.Tensor,
    gemm_out_mul: torch.Tensor,
    gemm_out_sqrsum: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    residual: torch.Tensor,
    *scalars,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 gradients (gemm_out_mul (S, T, M3), gemm_out_sqrsum (S, T), mhc_scale, mhc_base, residual) of
    the reference's outputs against the given output gradients; `scalars`: the forward's, from rms_eps to
    sinkhorn_repeat."""
    inputs = [t.detach().double().requires_grad_() for t in (gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base,
                                                               residual)]  # fmt: skip
    outputs = mhc_pre_big_fuse_fwd_ref(*inputs, *scalars)
    grads = [g.double() for g in (post_mix_grad, comb_mix_grad, layer_input_grad)]
    return torch.autograd.grad(outputs, inputs, grads)
