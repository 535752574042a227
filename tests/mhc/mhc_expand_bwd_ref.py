"""PyTorch references of mhc_expand_bwd: the correctness oracles of its tests (never imported by runtime code)."""

import torch

from .mhc_expand_fwd_ref import mhc_expand_fwd_ref


def mhc_expand_bwd_ref(o_grad: torch.Tensor) -> torch.Tensor:
    """The kernels' exact result: the streams of o_grad (T, mhc_mult, H) summed in order m = 0 .. mhc_mult - 1 in
    fp32 (one IEEE rounding per addition), rounded once to bf16 (nearest even)."""
    total = o_grad[:, 0].float()
    for m in range(1, o_grad.shape[1]):
        total = total + o_grad[:, m].float()
    return total.bfloat16()


def mhc_expand_grad_ref(o_grad: torch.Tensor) -> torch.Tensor:
    """The gradient of mhc_expand_fwd_ref for the upstream gradient o_grad, by float64 autograd: (T, H) float64."""
    x = torch.zeros(o_grad.shape[0], o_grad.shape[2], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(mhc_expand_fwd_ref(x, o_grad.shape[1]), x, o_grad.double())
    return grad


def expand_grad_bound(o_grad: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How far the bf16 result may be from the float64 gradient: the fp32 sums (mhc_mult - 1 roundings of at most
    2**-24 of the running |sum|, at most S = sum |o_grad|) and the final bf16 rounding (2**-8 relative to the fp32
    value): 2**-8 |x_grad| + 2**-20 S."""
    return 2.0**-8 * expected.abs() + 2.0**-20 * o_grad.double().abs().sum(1)
