"""PyTorch reference of mhc_post_bwd: the gradients of mhc_post_fwd written out, in float64 (never imported by
runtime code). The tests check it against autograd of mhc_post_fwd_ref."""

import torch


def mhc_post_bwd_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    d_o: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d_x, d_residual, d_post_layer_mix, d_comb_res_mix) in float64, shaped as x, residual, post_layer_mix and
    comb_res_mix."""
    x, residual, d_o = x.double(), residual.double(), d_o.double()
    post_layer_mix, comb_res_mix = post_layer_mix.double(), comb_res_mix.double()
    d_x = (d_o * post_layer_mix).sum(-2)  # sum over the output branch o
    d_residual = torch.einsum('stio,stoh->stih', comb_res_mix, d_o)
    d_post_layer_mix = (d_o * x.unsqueeze(-2)).sum(-1, keepdim=True)
    d_comb_res_mix = torch.einsum('stih,stoh->stio', residual, d_o)
    return d_x, d_residual, d_post_layer_mix, d_comb_res_mix
