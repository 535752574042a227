"""Pure-PyTorch oracle of engram_fused_weight (docs/engram.md). Tests only; never imported at run time."""

from __future__ import annotations

import torch


def engram_fused_weight_ref(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """float(wh) * float(we) in fp32: exact, since a product of two bf16 values fits in fp32."""
    return weight_hidden.float() * weight_embed.float()
