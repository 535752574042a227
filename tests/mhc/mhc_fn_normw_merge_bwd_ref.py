"""PyTorch reference of mhc_fn_normw_merge_bwd: autograd of the forward's reference in float64 (never imported
by runtime code)."""

import torch

from .mhc_fn_normw_merge_fwd_ref import mhc_fn_normw_merge_fwd_ref


def mhc_fn_normw_merge_bwd_ref(
    fn: torch.Tensor,
    normw: torch.Tensor,
    out_fn_grad: torch.Tensor,
    fn_grad: torch.Tensor,
    normw_grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fn_grad + d fn, normw_grad + d normw) in float64, the gradients taken by autograd through
    mhc_fn_normw_merge_fwd_ref with out_fn's gradient out_fn_grad (the operator accumulates into its buffers)."""
    fn64 = fn.double().requires_grad_()
    normw64 = normw.double().requires_grad_()
    out = mhc_fn_normw_merge_fwd_ref(fn64, normw64)
    d_fn, d_normw = torch.autograd.grad(out, (fn64, normw64), out_fn_grad.double())
    return fn_grad.double() + d_fn, normw_grad.double() + d_normw
