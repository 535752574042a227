"""Pure-PyTorch oracle of engram_grad_w_reduce (docs/engram.md). Tests only; never imported at run time."""

from __future__ import annotations

import torch


def engram_grad_w_reduce_ref(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The updated (grad_weight_hidden, grad_weight_embed) as new fp32 tensors; the inputs are not modified."""
    s = grad_w_partial.float().sum(0)
    return grad_weight_hidden + s * weight_embed.float(), grad_weight_embed + s * weight_hidden.float()


def engram_grad_w_reduce_error_scale(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element, the sum of the magnitudes of every term the result adds up (fp64).

    Any order of fp32 additions of these terms is off from the exact sum by at most
    about (P + 2) * 2**-24 times this scale (the classic bound for recursive summation).
    """
    a = grad_w_partial.double().abs().sum(0)
    return (
        grad_weight_hidden.double().abs() + a * weight_embed.double().abs(),
        grad_weight_embed.double().abs() + a * weight_hidden.double().abs(),
    )
