"""engram_fused_weight: the fused RMSNorm weight of the Engram gate, float(wh) * float(we) in fp32."""

from __future__ import annotations

import torch

from cann_ops_tilelang.config import require_accelerator
from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.operator import Operator, traced
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_contiguous,
    check_out,
    check_shape,
    check_tensor,
)

from .engram_fused_weight_kernel import choose_engram_fused_weight_config, get_engram_fused_weight_kernel


def _check(wh, we, out, *, memory=True) -> tuple[int, int, str]:
    """(hc, H, backend) of valid arguments (wh, we: weight_hidden, weight_embed)."""
    check_tensor('weight_hidden', wh, dtype=torch.bfloat16, ndim=2)
    check_tensor('weight_embed', we, dtype=torch.bfloat16, ndim=2)
    hc, hidden = shape = wh.shape
    check_hc_hidden(OP.name, hc, hidden)
    check_shape('weight_embed', we, shape)
    check_contiguous('weight_hidden', wh)
    check_contiguous('weight_embed', we)
    check_aligned('weight_hidden', wh, memory=memory)
    check_aligned('weight_embed', we, memory=memory)
    if out is not None:
        inputs = {'weight_hidden': wh, 'weight_embed': we}
        check_out('out', out, shape=shape, dtype=torch.float32, device=wh.device, inputs=inputs, memory=memory)
        check_aligned('out', out, memory=memory)
    return hc, hidden, require_accelerator(wh, we) if out is None else require_accelerator(wh, we, out)


OP = Operator('engram_fused_weight', _check, choose_engram_fused_weight_config, get_engram_fused_weight_kernel)


def _plan(weight_hidden, weight_embed, out=None):
    hc, hidden, backend = OP.check(weight_hidden, weight_embed, out)
    return OP.launcher(backend, weight_hidden.device, hc=hc, hidden=hidden)


def _eager(wh, we, out=None):
    """Every check, then the launch (also the torch.library ops' kernel). Fast path: by (shape, CUDA index)."""
    if out is None and type(wh) in PLAIN_TENSOR_TYPES and type(we) in PLAIN_TENSOR_TYPES:
        launcher = OP.fast.get((wh.shape, wh.get_device())) if wh.is_cuda else None
        if launcher is not None and not (wh.data_ptr() | we.data_ptr()) % ALIGN_BYTES:
            result = wh.new_empty(wh.shape, dtype=torch.float32)
            OP.launch(launcher, (wh, we, result), wh, we, None)
            return result
    launcher = _plan(wh, we, out)  # valid hc and H: never empty; new_empty: about 1 us less than torch.empty(device=)
    result = wh.new_empty(wh.shape, dtype=torch.float32) if out is None else out
    launcher.launch(wh, we, result)
    if out is None:
        OP.remember((wh.shape, wh.get_device()), launcher)
    return result


def _fake(wh, we, out=None):
    """While torch traces: the checks that need no memory, then the (hc, H) fp32 result (None with out=)."""
    OP.check(wh, we, out, memory=False)
    return torch.empty(wh.shape, dtype=torch.float32, device=wh.device) if out is None else None


_SIGNATURE = 'Tensor weight_hidden, Tensor weight_embed'
_functional = OP.define('engram_fused_weight', f'({_SIGNATURE}) -> Tensor', _eager, _fake)
_into_out = OP.define('engram_fused_weight_out', f'({_SIGNATURE}, Tensor(a!) out) -> ()', _eager, _fake)


@OP.public(_plan)
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
    if not traced(weight_hidden):
        return _eager(weight_hidden, weight_embed, out)
    OP.check(weight_hidden, weight_embed, out, memory=False)
    if out is None:
        return _functional(weight_hidden, weight_embed)
    _into_out(weight_hidden, weight_embed, out)
    return out
