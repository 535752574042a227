"""Pure-PyTorch oracles of engram_gate_bwd (docs/engram.md, "Backward"). Tests only.

Two independent references:

- `engram_gate_bwd_ref`: the explicit formulas of engram.md, from the forward's saved tensors.
- `engram_gate_bwd_autograd_ref`: autograd through `engram_gate_fwd_ref` (out_dtype=float32).

`tests/engram/test_engram_gate_bwd.py` checks that the two agree (that is the proof that the formulas,
and hence the kernels implementing them, are right), and checks the kernels against autograd.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tests.engram.engram_gate_fwd_ref import engram_gate_fwd_ref


class EngramGateBwdRef(NamedTuple):
    grad_hidden_states: torch.Tensor  # (T, hc, H), compute dtype
    grad_k: torch.Tensor  # (T, hc, H)
    grad_v: torch.Tensor  # (T, H)
    grad_weight_fused: torch.Tensor  # (hc, H): sum over tokens of r * x * k (= sum_p grad_w_partial[p])


def engram_gate_bwd_ref(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    *,
    clamp_value: float = 1e-6,
    compute_dtype: torch.dtype = torch.float32,
    image_token_mask: torch.Tensor | None = None,
) -> EngramGateBwdRef:
    """The explicit backward formulas in `compute_dtype` (fp32 by default, fp64 for tight checks).

    Image tokens: grad_x = grad_out, grad_k = grad_v = 0, no share of grad_weight_fused.
    """
    f = compute_dtype
    go, x, kf, w = grad_out.to(f), hidden_states.to(f), k.to(f), weight_fused.to(f)
    vf = v.to(f).unsqueeze(-2)  # (T, 1, H): shared by all branches
    dot, g, rx, rk = dot.to(f), gate_score.to(f), rstd_x.to(f), rstd_k.to(f)
    hidden = x.shape[-1]
    s = hidden**-0.5
    d = dot * rx * rk * s
    dldg = (go * vf).sum(-1)
    r = dldg * g * (1 - g) * 0.5 * torch.sqrt(s * rx * rk / dot.abs())
    r = torch.where(d.abs() < clamp_value, torch.zeros_like(r), r)  # the clamp has no gradient
    img = None if image_token_mask is None else image_token_mask.to(x.device)
    if img is not None:
        r = torch.where(img[:, None], torch.zeros_like(r), r)
    r3 = r.unsqueeze(-1)
    grad_x = go + r3 * (kf * w - x * (dot * rx * rx / hidden).unsqueeze(-1))
    grad_k = r3 * (x * w - kf * (dot * rk * rk / hidden).unsqueeze(-1))
    grad_v = (go * g.unsqueeze(-1)).sum(-2)
    if img is not None:
        grad_x = torch.where(img[:, None, None], go, grad_x)
        grad_k = torch.where(img[:, None, None], torch.zeros_like(grad_k), grad_k)
        grad_v = torch.where(img[:, None], torch.zeros_like(grad_v), grad_v)
    grad_w = (r3 * x * kf).sum(0)
    return EngramGateBwdRef(grad_x, grad_k, grad_v, grad_w)


def engram_gate_bwd_autograd_ref(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    *,
    eps: float = 1e-6,
    clamp_value: float = 1e-6,
    image_token_mask: torch.Tensor | None = None,
) -> EngramGateBwdRef:
    """Autograd of the fp32 forward reference: d(sum(output * grad_out)) / d(x, k, v, weight_fused).

    The inputs become fp32 leaves (bf16 values are exact in fp32), so the grads are not rounded to bf16.
    Image tokens pass x through (torch.where in the forward reference): autograd gives them grad_x =
    grad_out and nothing else.
    """
    leaves = [t.detach().float().requires_grad_(True) for t in (hidden_states, k, v, weight_fused)]
    with torch.enable_grad():
        out = engram_gate_fwd_ref(
            *leaves, eps=eps, clamp_value=clamp_value, out_dtype=torch.float32, image_token_mask=image_token_mask
        ).output
        grads = torch.autograd.grad(out, leaves, grad_outputs=grad_out.float())
    return EngramGateBwdRef(*(g.detach() for g in grads))
