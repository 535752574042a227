"""engram_gate_fwd: the Engram gate forward (shared/docs/engram.md, "Forward")."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.validation import (
    check_bool,
    check_contiguous,
    check_last_dim_contiguous,
    check_out,
    check_positive_float,
    check_shape,
    check_tensor,
)

from .engram_gate_fwd_kernel import EngramGateFwdConfig, choose_engram_gate_fwd_config, get_engram_gate_fwd_kernel

_NAME = 'engram_gate_fwd'


class EngramGateFwdResult(NamedTuple):
    output: torch.Tensor  # (T, hc, H) bf16: x + gate_score * v
    dot: torch.Tensor | None  # (T, hc) fp32: sum(x * w * k), unnormalised
    gate_score: torch.Tensor | None  # (T, hc) fp32
    rstd_x: torch.Tensor | None  # (T, hc) fp32
    rstd_k: torch.Tensor | None  # (T, hc) fp32


def _access_vec(tensors: tuple[torch.Tensor, ...], strides: tuple[int, ...]) -> int:
    """Widest access (8, 4, 2 or 1 bf16 elements) that every pointer and outer stride is aligned to."""
    vec = 8
    for t in tensors:
        while vec > 1 and t.data_ptr() % (2 * vec):
            vec //= 2
    for s in strides:
        while vec > 1 and s % vec:
            vec //= 2
    return vec


class _Plan(NamedTuple):
    cfg: EngramGateFwdConfig
    device: torch.device


def _plan(hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward, out) -> _Plan:
    """Validate the arguments and choose the kernel configuration (no allocation, no launch)."""
    x = check_tensor('hidden_states', hidden_states, dtype=torch.bfloat16, ndim=3)
    check_tensor('k', k, dtype=torch.bfloat16, ndim=3)
    check_tensor('v', v, dtype=torch.bfloat16, ndim=2)
    check_tensor('weight_fused', weight_fused, dtype=torch.float32, ndim=2)
    num_tokens, hc, hidden = x.shape
    check_hc_hidden(_NAME, hc, hidden)
    check_shape('k', k, (num_tokens, hc, hidden))
    check_shape('v', v, (num_tokens, hidden))
    check_shape('weight_fused', weight_fused, (hc, hidden))
    check_contiguous('hidden_states', x)
    check_last_dim_contiguous('k', k)
    check_last_dim_contiguous('v', v)
    check_contiguous('weight_fused', weight_fused)
    check_positive_float('eps', eps)
    check_positive_float('clamp_value', clamp_value)
    save_for_backward = check_bool('save_for_backward', save_for_backward)
    inputs = {'hidden_states': x, 'k': k, 'v': v, 'weight_fused': weight_fused}
    if out is not None:
        check_out('out', out, shape=(num_tokens, hc, hidden), dtype=torch.bfloat16, device=x.device, inputs=inputs)

    tensors = (x, k, v, weight_fused) + ((out,) if out is not None else ())
    backend = require_accelerator(*tensors)
    device = x.device
    # Outer strides of size-1 dimensions are never used: they do not limit the access width. The output
    # (allocated by the caching allocator where not given) is 16-byte aligned unless `out` says otherwise.
    strides = [k.stride(0), v.stride(0)] if num_tokens > 1 else []
    if hc > 1:
        strides.append(k.stride(1))
    vec = _access_vec((x, k, v) + ((out,) if out is not None else ()), tuple(strides))
    cfg = choose_engram_gate_fwd_config(
        backend=backend,
        hc=hc,
        hidden=hidden,
        num_cores=get_num_cores(device),
        save_for_backward=save_for_backward,
        vec=vec,
    )
    return _Plan(cfg, device)


def engram_gate_fwd(
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    *,
    eps: float = 1e-6,
    clamp_value: float = 1e-6,
    save_for_backward: bool = True,
    out: torch.Tensor | None = None,
) -> EngramGateFwdResult:
    """Gate the value `v` into every hyper-connection branch of the hidden states.

    hidden_states: (T, hc, H) bf16, contiguous. k: (T, hc, H) bf16, last dimension contiguous, other
    strides free. v: (T, H) bf16, last dimension contiguous. weight_fused: (hc, H) fp32, contiguous
    (engram_fused_weight). hc in 1..8, H a multiple of 64 up to 16384, T >= 0.

    Returns (output, dot, gate_score, rstd_x, rstd_k): output (T, hc, H) bf16 (written into `out` when
    given); the four saved tensors (T, hc) fp32, or None when save_for_backward is False.
    """
    cfg, device = _plan(hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward, out)
    num_tokens, hc, hidden = hidden_states.shape
    output = torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device) if out is None else out
    saved: tuple[torch.Tensor | None, ...] = (None, None, None, None)
    if cfg.save_for_backward:
        saved = tuple(torch.empty((num_tokens, hc), dtype=torch.float32, device=device) for _ in range(4))
    if num_tokens == 0:
        return EngramGateFwdResult(output, *saved)
    outputs = (output, *saved) if cfg.save_for_backward else (output,)  # the kernel without saved outputs has no slots
    launch_kernel(
        get_engram_gate_fwd_kernel,
        cfg,
        device,
        hidden_states,
        k,
        v,
        weight_fused,
        *outputs,
        float(eps),
        float(clamp_value),
    )
    return EngramGateFwdResult(output, *saved)


def engram_gate_fwd_config(
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    *,
    eps: float = 1e-6,
    clamp_value: float = 1e-6,
    save_for_backward: bool = True,
    out: torch.Tensor | None = None,
) -> EngramGateFwdConfig:
    """The kernel configuration engram_gate_fwd launches for these arguments (validated alike; no launch)."""
    return _plan(hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward, out).cfg
