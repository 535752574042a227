"""Pure-PyTorch oracle of engram_gate_fwd (docs/engram.md). Tests only; never imported at run time.

Differentiable: autograd of `engram_gate_fwd_ref` is the oracle of engram_gate_bwd.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class EngramGateFwdRef(NamedTuple):
    output: torch.Tensor  # (T, hc, H) bf16
    dot: torch.Tensor  # (T, hc) fp32: sum(x * w * k), unnormalised
    gate_score: torch.Tensor  # (T, hc) fp32: sigmoid(z)
    rstd_x: torch.Tensor  # (T, hc) fp32
    rstd_k: torch.Tensor  # (T, hc) fp32


def engram_gate_fwd_ref(
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    *,
    eps: float = 1e-6,
    clamp_value: float = 1e-6,
    out_dtype: torch.dtype = torch.bfloat16,
    image_token_mask: torch.Tensor | None = None,
) -> EngramGateFwdRef:
    """All arithmetic in fp32; `out_dtype=torch.float32` gives the unrounded output for autograd checks.

    Image tokens (image_token_mask True): output = hidden_states (in out_dtype), saved tensors 0.
    """
    x = hidden_states.float()
    kf = k.float()
    w = weight_fused.float()
    hidden = x.shape[-1]
    rstd_x = torch.rsqrt(x.square().mean(-1) + eps)
    rstd_k = torch.rsqrt(kf.square().mean(-1) + eps)
    dot = (x * w * kf).sum(-1)
    d = dot * rstd_x * rstd_k * hidden**-0.5
    z = torch.sign(d) * torch.sqrt(torch.clamp(d.abs(), min=clamp_value))
    g = torch.sigmoid(z)
    out = x + g.unsqueeze(-1) * v.float().unsqueeze(-2)
    if image_token_mask is None:
        return EngramGateFwdRef(out.to(out_dtype), dot, g, rstd_x, rstd_k)
    img = image_token_mask.to(x.device)
    out = torch.where(img[:, None, None], x, out)
    zero = torch.zeros((), dtype=dot.dtype, device=dot.device)
    dot, g, rstd_x, rstd_k = (torch.where(img[:, None], zero, t) for t in (dot, g, rstd_x, rstd_k))
    return EngramGateFwdRef(out.to(out_dtype), dot, g, rstd_x, rstd_k)
