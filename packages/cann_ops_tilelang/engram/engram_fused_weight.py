"""engram_fused_weight: the fused RMSNorm weight of the Engram gate, float(wh) * float(we) in fp32."""

from __future__ import annotations

import torch

from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.operator import Operator, out, tensor

from .engram_fused_weight_kernel import choose_engram_fused_weight_config, get_engram_fused_weight_kernel

OP = Operator(
    'engram_fused_weight',
    tensor('weight_hidden', torch.bfloat16, 'hc, hidden', aligned=True),
    tensor('weight_embed', torch.bfloat16, 'hc, hidden', aligned=True),
    out('out', torch.float32, 'hc, hidden', aligned=True),
    limits=check_hc_hidden,
    choice=lambda weight_hidden: {'hc': weight_hidden.shape[0], 'hidden': weight_hidden.shape[1]},
    choose_config=choose_engram_fused_weight_config,
    get_kernel=get_engram_fused_weight_kernel,
)


def _eager(wh, we, out):
    """Every check, then the launch (also the torch.library ops' kernel). Fast path: by (shape, CUDA index)."""
    shape = OP.fast_ok(wh, we, out)
    if shape is not None and (launcher := OP.fast.get((shape, wh.get_device()))) is not None:
        result = wh.new_empty(shape, dtype=torch.float32)
        OP.launch(launcher, (wh, we, result), (wh, we, None))
        return result
    launcher = OP.plan(wh, we, out)  # valid hc and H: never empty; new_empty: about 1 us less than torch.empty(device=)
    result = wh.new_empty(wh.shape, dtype=torch.float32) if out is None else out
    launcher.launch(wh, we, result)
    if out is None:
        OP.remember((wh.shape, wh.get_device()), launcher)
    return result


@OP.public(_eager, returns='Tensor', fake=lambda wh, we, out: wh.new_empty(wh.shape, dtype=torch.float32))
def engram_fused_weight(
    weight_hidden: torch.Tensor, weight_embed: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """out[h, d] = float(weight_hidden[h, d]) * float(weight_embed[h, d]).

    Args:
        weight_hidden, weight_embed: (hc, H) bf16, contiguous, 16-byte aligned: the RMSNorm weights of the hidden
            states and of the key. hc in 1..8, H a multiple of 64 up to 16384 (ValueError otherwise).
        out: optional (hc, H) fp32 contiguous, 16-byte aligned buffer on the same device, not overlapping the inputs.

    Returns:
        (hc, H) fp32, bit-exact (the product of two bf16 values is exact in fp32).
    """
