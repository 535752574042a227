"""PyTorch reference of mhc_multilayer_recompute: the correctness oracle of its tests (never imported by runtime
code)."""

import torch


def mhc_multilayer_recompute_ref(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list):
    """(layer_inputs, residuals): each layer's sums in float64 (exact products of bf16 and fp32 values), rounded to
    bf16 once, as the kernels store them; the next layer starts from the rounded residual."""
    M, H = initial_residual.shape[-2:]
    residual = initial_residual.reshape(-1, M, H).double()
    T = residual.shape[0]
    layer_inputs, residuals = [], []
    for layer, pre in enumerate(pre_mix_list):
        mix = pre.reshape(T, M, 1).double()
        layer_inputs.append((mix * residual).sum(1).to(torch.bfloat16))
        if layer < len(layer_output_list):
            out = layer_output_list[layer].reshape(T, 1, H).double()
            post = post_mix_list[layer].reshape(T, M, 1).double()
            comb = comb_mix_list[layer].reshape(T, M, M).double()
            mixed = torch.einsum('tio,tih->toh', comb, residual)
            residuals.append((post * out + mixed).to(torch.bfloat16))
            residual = residuals[-1].double()
    return layer_inputs, residuals
