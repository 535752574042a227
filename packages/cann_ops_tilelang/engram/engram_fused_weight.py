"""engram_fused_weight: the fused RMSNorm weight of the Engram gate, float(wh) * float(we) in fp32."""

from __future__ import annotations

import functools

import torch

from cann_ops_tilelang._torch_library import op, traced
from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.kernel_target import Launcher, launch_or_explain
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_contiguous,
    check_out,
    check_shape,
    check_tensor,
)

from .engram_fused_weight_kernel import (
    EngramFusedWeightConfig,
    choose_engram_fused_weight_config,
    get_engram_fused_weight_kernel,
)

_NAME = 'engram_fused_weight'
# One launcher per (device, backend, hc, H): the configuration is chosen, and the kernel looked up, once
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (weight_hidden.shape, CUDA device index): found there, a call without out= checks in Python only what
# the entry cannot (argument types, alignment) and leaves the explanation of a rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}


def _check(weight_hidden, weight_embed, out, *, memory: bool) -> tuple[int, int, str]:
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); (hc, H, backend)."""
    check_tensor('weight_hidden', weight_hidden, dtype=torch.bfloat16, ndim=2)
    check_tensor('weight_embed', weight_embed, dtype=torch.bfloat16, ndim=2)
    hc, hidden = weight_hidden.shape
    check_hc_hidden(_NAME, hc, hidden)
    check_shape('weight_embed', weight_embed, (hc, hidden))
    check_contiguous('weight_hidden', weight_hidden)
    check_contiguous('weight_embed', weight_embed)
    check_aligned('weight_hidden', weight_hidden, memory=memory)
    check_aligned('weight_embed', weight_embed, memory=memory)
    if out is not None:
        check_out(
            'out',
            out,
            shape=(hc, hidden),
            dtype=torch.float32,
            device=weight_hidden.device,
            inputs={'weight_hidden': weight_hidden, 'weight_embed': weight_embed},
            memory=memory,
        )
        check_aligned('out', out, memory=memory)
    tensors = (weight_hidden, weight_embed) if out is None else (weight_hidden, weight_embed, out)
    return hc, hidden, require_accelerator(*tensors)


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _launcher(backend: str, device: torch.device, hc: int, hidden: int) -> Launcher:
    key = (device, backend, hc, hidden)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_fused_weight_config(backend=backend, hc=hc, hidden=hidden, num_cores=get_num_cores(device))
        launcher = _LAUNCHERS[key] = Launcher(get_engram_fused_weight_kernel, cfg, device)
    return launcher


def _eager(weight_hidden, weight_embed, out):
    """The call on real tensors: every check, then the launch (also the torch.library op's kernel)."""
    if (
        out is None
        and type(weight_hidden) in PLAIN_TENSOR_TYPES
        and type(weight_embed) in PLAIN_TENSOR_TYPES
        and weight_hidden.is_cuda
    ):
        shape = weight_hidden.shape
        launcher = _CHECKED.get((shape, weight_hidden.get_device()))
        if launcher is not None and not (weight_hidden.data_ptr() | weight_embed.data_ptr()) % ALIGN_BYTES:
            result = weight_hidden.new_empty(shape, dtype=torch.float32)
            launch_or_explain(
                launcher, (weight_hidden, weight_embed, result), _check_real, weight_hidden, weight_embed, None
            )
            return result
    hc, hidden, backend = _check(weight_hidden, weight_embed, out, memory=True)
    device = weight_hidden.device
    launcher = _launcher(backend, device, hc, hidden)
    # hc >= 1 and H >= 64 after validation: never empty.
    # Tensor.new_empty: the device from the tensor, no keyword parsing of it (about 1 us less than torch.empty)
    result = weight_hidden.new_empty((hc, hidden), dtype=torch.float32) if out is None else out
    launcher.launch(weight_hidden, weight_embed, result)
    if out is None and launcher.checks_arguments:
        _CHECKED[(weight_hidden.shape, weight_hidden.get_device())] = launcher
    return result


def _fake(weight_hidden, weight_embed, out):
    """The output while torch traces: the checks that need no memory, then an empty (hc, H) fp32 tensor."""
    hc, hidden, _ = _check(weight_hidden, weight_embed, out, memory=False)
    return torch.empty((hc, hidden), dtype=torch.float32, device=weight_hidden.device)


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
    if traced(weight_hidden):  # torch.compile, fake tensors, make_fx: the torch.library op (_torch_ops.py)
        _check(weight_hidden, weight_embed, out, memory=False)
        if out is None:
            return op('engram_fused_weight')(weight_hidden, weight_embed)
        op('engram_fused_weight_out')(weight_hidden, weight_embed, out)
        return out
    return _eager(weight_hidden, weight_embed, out)


def engram_fused_weight_config(
    weight_hidden: torch.Tensor, weight_embed: torch.Tensor, *, out: torch.Tensor | None = None
) -> EngramFusedWeightConfig:
    """The kernel configuration engram_fused_weight launches for these arguments (validated alike; no launch)."""
    hc, hidden, backend = _check(weight_hidden, weight_embed, out, memory=True)
    return _launcher(backend, weight_hidden.device, hc, hidden).cfg
