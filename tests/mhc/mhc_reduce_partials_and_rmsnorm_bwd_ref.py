"""PyTorch reference of mhc_reduce_partials_and_rmsnorm_bwd: autograd of the forward's RMS step in float64
(never imported by runtime code)."""

import torch

from .mhc_reduce_partials_and_rmsnorm_fwd_ref import rms_normalised_mixes


def mhc_reduce_partials_and_rmsnorm_bwd_ref(
    out_grad: torch.Tensor, out_mul: torch.Tensor, sqrsum: torch.Tensor, rms_group_size: int, rms_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out_mul_grad, sqrsum_grad) in float64: the gradients of rms_normalised_mixes with out's gradient
    out_grad, taken by autograd."""
    out_mul64 = out_mul.double().requires_grad_()
    sqrsum64 = sqrsum.double().requires_grad_()
    out = rms_normalised_mixes(out_mul64, sqrsum64, rms_group_size, rms_eps)
    return torch.autograd.grad(out, (out_mul64, sqrsum64), out_grad.double())
