"""PyTorch reference of mhc_sinkhorn_bwd: autograd of the float64 forward reference (never imported by runtime
code)."""

import torch

from .mhc_sinkhorn_fwd_ref import mhc_sinkhorn_fwd_ref


def mhc_sinkhorn_bwd_ref(grad_output: torch.Tensor, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """The gradient at x of sum(mhc_sinkhorn_fwd_ref(x) * grad_output), in float64."""
    logits = x.detach().to(torch.float64).requires_grad_()
    result = mhc_sinkhorn_fwd_ref(logits, repeat, eps)
    (grad,) = torch.autograd.grad(result, logits, grad_output.to(torch.float64))
    return grad
