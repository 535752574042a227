"""PyTorch references of moe_swiglu_backward (and of the gradient part of moe_swiglu_backward_and_per_token_cast):
the correctness oracle of their tests, in float64. Never imported by runtime code.

`swiglu_forward_f64` is the forward the backward differentiates (the tests check the closed form below against
its autograd); `moe_swiglu_backward_ref` is the closed form, with the expert layout's padding slots zeroed.
"""

from __future__ import annotations

import torch

from cann_ops_tilelang.moe._swiglu import TOKEN_ALIGNMENT  # the expert layout's alignment, as the kernels take it


def token_mask_ref(num_tokens: int, psum: torch.Tensor | None, alignment: int = TOKEN_ALIGNMENT) -> torch.Tensor:
    """(T,) bool: True on the slots of expert tokens, [align(psum[e - 1]), psum[e]) for each e (psum[-1] = 0)."""
    mask = torch.zeros(num_tokens, dtype=torch.bool)
    if psum is None:
        return mask.fill_(True)
    start = 0
    for end in psum.cpu().tolist():
        begin = -(-start // alignment) * alignment
        if end > begin:
            mask[begin:end] = True
        start = end
    return mask


def swiglu_forward_f64(x, topk_weights=None, routed_scaling_factor=None, clamp_value=None):
    """The forward SwiGLU in float64 (differentiable): silu(a') * b' * w per row, a, b the halves of x."""
    hidden = x.shape[1] // 2
    a, b = x[:, :hidden], x[:, hidden:]
    if clamp_value is not None:
        a = a.clamp(max=clamp_value)
        b = b.clamp(min=-clamp_value, max=clamp_value)
    out = a * torch.sigmoid(a) * b
    if topk_weights is not None:
        w = topk_weights * (1.0 if routed_scaling_factor is None else routed_scaling_factor)
        out = out * w.unsqueeze(1)
    return out


def moe_swiglu_backward_ref(
    x, act_x_grad, psum=None, topk_weights=None, routed_scaling_factor=None, clamp_value=None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(x_grad (T, 2 H), weight_grad (T,) or None, act_out (T, H)) in float64 on the CPU, 0 on padding slots. x in
    fp32 values (an fp8 input already multiplied by its scales)."""
    x = x.detach().cpu().double()
    g = act_x_grad.detach().cpu().double()
    hidden = x.shape[1] // 2
    kept = token_mask_ref(x.shape[0], psum).unsqueeze(1)
    a, b = x[:, :hidden], x[:, hidden:]
    a_cut = b_cut = torch.zeros_like(a, dtype=torch.bool)
    if clamp_value is not None:
        a_cut, b_cut = a > clamp_value, b.abs() > clamp_value
        a = a.clamp(max=clamp_value)
        b = b.clamp(min=-clamp_value, max=clamp_value)
    s = torch.sigmoid(a)
    act = a * s * b
    scale = 1.0 if routed_scaling_factor is None else routed_scaling_factor
    w = torch.ones(x.shape[0], 1, dtype=torch.float64)
    if topk_weights is not None:
        w = topk_weights.detach().cpu().double().unsqueeze(1) * scale
    grad_a = torch.where(a_cut, 0.0, g * w * s * b * (1 + a * (1 - s)))
    grad_b = torch.where(b_cut, 0.0, g * w * s * a)
    x_grad = torch.where(kept, torch.cat([grad_a, grad_b], dim=1), 0.0)
    weight_grad = None
    if topk_weights is not None:
        weight_grad = torch.where(kept.squeeze(1), (g * act).sum(dim=1) * scale, 0.0)
    return x_grad, weight_grad, torch.where(kept, act * w, 0.0)
