"""PyTorch reference of mhc_post_fwd: the correctness oracle of its tests (never imported by runtime code)."""

import torch


def mhc_post_fwd_ref(
    x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor
) -> torch.Tensor:
    """out[s, t, o, h] = post_layer_mix[s, t, o, 0] * x[s, t, h] + sum_i comb_res_mix[s, t, i, o] * residual[s, t, i,
    h], in float64 (exact for the products of bf16 and fp32 values, differentiable: the backward's oracle)."""
    x, residual = x.double(), residual.double()
    post_layer_mix, comb_res_mix = post_layer_mix.double(), comb_res_mix.double()
    mixed = torch.einsum('stio,stih->stoh', comb_res_mix, residual)
    return x.unsqueeze(-2) * post_layer_mix + mixed
