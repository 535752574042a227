"""engram_fused_weight: the fused RMSNorm weight of the Engram gate, float(wh) * float(we) in fp32."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.validation import check_aligned, check_contiguous, check_out, check_shape, check_tensor

from .engram_fused_weight_kernel import (
    EngramFusedWeightConfig,
    choose_engram_fused_weight_config,
    get_engram_fused_weight_kernel,
)

_NAME = 'engram_fused_weight'


class _Plan(NamedTuple):
    cfg: EngramFusedWeightConfig
    device: torch.device


def _plan(weight_hidden, weight_embed, out) -> _Plan:
    """Validate the arguments and choose the kernel configuration (no allocation, no launch)."""
    check_tensor('weight_hidden', weight_hidden, dtype=torch.bfloat16, ndim=2)
    check_tensor('weight_embed', weight_embed, dtype=torch.bfloat16, ndim=2)
    hc, hidden = weight_hidden.shape
    check_hc_hidden(_NAME, hc, hidden)
    check_shape('weight_embed', weight_embed, (hc, hidden))
    check_contiguous('weight_hidden', weight_hidden)
    check_contiguous('weight_embed', weight_embed)
    check_aligned('weight_hidden', weight_hidden)
    check_aligned('weight_embed', weight_embed)
    if out is not None:
        check_out(
            'out',
            out,
            shape=(hc, hidden),
            dtype=torch.float32,
            device=weight_hidden.device,
            inputs={'weight_hidden': weight_hidden, 'weight_embed': weight_embed},
        )
        check_aligned('out', out)

    tensors = (weight_hidden, weight_embed) if out is None else (weight_hidden, weight_embed, out)
    backend = require_accelerator(*tensors)
    device = weight_hidden.device
    cfg = choose_engram_fused_weight_config(backend=backend, hc=hc, hidden=hidden, num_cores=get_num_cores(device))
    return _Plan(cfg, device)


def engram_fused_weight(
    weight_hidden: torch.Tensor, weight_embed: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """out[h, d] = float(weight_hidden[h, d]) * float(weight_embed[h, d]).

    Args:
        weight_hidden: (hc, H) bf16, contiguous, 16-byte aligned; RMSNorm weight of the hidden states.
        weight_embed: (hc, H) bf16, contiguous, 16-byte aligned; RMSNorm weight of the key.
        out: optional (hc, H) fp32 contiguous, 16-byte aligned buffer on the same device, not
            overlapping the inputs.

    Returns:
        (hc, H) fp32, bit-exact (the product of two bf16 values is exact in fp32).

    hc must be in 1..8 and H a multiple of 64 up to 16384 (ValueError otherwise).
    """
    cfg, device = _plan(weight_hidden, weight_embed, out)
    # hc >= 1 and H >= 64 after validation: never empty.
    result = torch.empty((cfg.hc, cfg.hidden), dtype=torch.float32, device=device) if out is None else out
    launch_kernel(get_engram_fused_weight_kernel, cfg, device, weight_hidden, weight_embed, result)
    return result


def engram_fused_weight_config(
    weight_hidden: torch.Tensor, weight_embed: torch.Tensor, *, out: torch.Tensor | None = None
) -> EngramFusedWeightConfig:
    """The kernel configuration engram_fused_weight launches for these arguments (validated alike; no launch)."""
    return _plan(weight_hidden, weight_embed, out).cfg
