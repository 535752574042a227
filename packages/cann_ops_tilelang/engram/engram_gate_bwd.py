"""engram_gate_bwd: the Engram gate backward (shared/docs/engram.md, "Backward")."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    check_contiguous,
    check_last_dim_contiguous,
    check_positive_float,
    check_shape,
    check_tensor,
)

from .engram_gate_bwd_kernel import EngramGateBwdConfig, choose_engram_gate_bwd_config, get_engram_gate_bwd_kernel

_NAME = 'engram_gate_bwd'
_MAX_STRIDE = 2**31 - 1  # strides are int32 kernel arguments


class EngramGateBwdResult(NamedTuple):
    grad_hidden_states: torch.Tensor  # (T, hc, H) bf16
    grad_k: torch.Tensor  # (T, hc, H) bf16, contiguous
    grad_v: torch.Tensor  # (T, H) bf16
    grad_w_partial: torch.Tensor  # (P, hc, H) fp32: per-block partial sums of r * x * k over tokens


def _aligned(value: torch.Tensor) -> torch.Tensor:
    """`value` itself when its address and outer strides suit 16-byte vector accesses, else an aligned copy.

    Strides of size-1 dimensions are never used and do not count. The copy (contiguous, from the caching
    allocator, so aligned) keeps views with odd offsets or strides correct at the price of one extra pass.
    """
    elems = ALIGN_BYTES // value.element_size()
    ok = value.data_ptr() % ALIGN_BYTES == 0
    for size, stride in zip(value.shape[:-1], value.stride()[:-1], strict=True):
        if size > 1 and (stride % elems != 0 or stride > _MAX_STRIDE):
            ok = False
    if ok:
        return value
    return value.clone(memory_format=torch.contiguous_format)


class _Plan(NamedTuple):
    cfg: EngramGateBwdConfig
    device: torch.device


def _plan(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value) -> _Plan:
    """Validate the arguments and choose the kernel configuration (no allocation, no launch)."""
    check_tensor('grad_out', grad_out, dtype=torch.bfloat16, ndim=3)
    x = check_tensor('hidden_states', hidden_states, dtype=torch.bfloat16, ndim=3)
    check_tensor('k', k, dtype=torch.bfloat16, ndim=3)
    check_tensor('v', v, dtype=torch.bfloat16, ndim=2)
    check_tensor('weight_fused', weight_fused, dtype=torch.float32, ndim=2)
    saved = {'dot': dot, 'gate_score': gate_score, 'rstd_x': rstd_x, 'rstd_k': rstd_k}
    for name, value in saved.items():
        check_tensor(name, value, dtype=torch.float32, ndim=2)
    num_tokens, hc, hidden = x.shape
    check_hc_hidden(_NAME, hc, hidden)
    check_shape('grad_out', grad_out, (num_tokens, hc, hidden))
    check_shape('k', k, (num_tokens, hc, hidden))
    check_shape('v', v, (num_tokens, hidden))
    check_shape('weight_fused', weight_fused, (hc, hidden))
    for name, value in saved.items():
        check_shape(name, value, (num_tokens, hc))
    check_contiguous('grad_out', grad_out)
    check_contiguous('hidden_states', x)
    check_last_dim_contiguous('k', k)
    check_last_dim_contiguous('v', v)
    check_contiguous('weight_fused', weight_fused)
    for name, value in saved.items():
        check_contiguous(name, value)
    check_positive_float('clamp_value', clamp_value)

    backend = require_accelerator(grad_out, x, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k)
    device = x.device
    cfg = choose_engram_gate_bwd_config(
        backend=backend,
        hc=hc,
        hidden=hidden,
        num_cores=get_num_cores(device),
        deterministic=torch.are_deterministic_algorithms_enabled(),
    )
    return _Plan(cfg, device)


def engram_gate_bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    *,
    clamp_value: float = 1e-6,
) -> EngramGateBwdResult:
    """Gradients of the Engram gate (engram_gate_fwd) from the forward's saved tensors.

    Per token t and branch h (fp32 math, s = H ** -0.5, d = dot * rstd_x * rstd_k * s recomputed from the
    saved tensors; r = dL/d(dot), 0 where |d| < clamp_value):

        dL/dg  = sum(grad_out[t, h] * v[t])
        r      = dL/dg * g * (1 - g) * 0.5 * sqrt(s * rstd_x * rstd_k / |dot|)
        grad_x = grad_out + r * (k * w - x * dot * rstd_x**2 / H)
        grad_k = r * (x * w - k * dot * rstd_k**2 / H)
        grad_v[t] = sum_h grad_out[t, h] * g[t, h]
        grad_w_partial[p] = sum over the tokens of block p of r * x * k

    Args:
        grad_out, hidden_states: (T, hc, H) bf16, contiguous.
        k: (T, hc, H) bf16, last dimension contiguous, other strides free.
        v: (T, H) bf16, last dimension contiguous, other stride free.
        weight_fused: (hc, H) fp32, contiguous (engram_fused_weight).
        dot, gate_score, rstd_x, rstd_k: (T, hc) fp32, contiguous (saved by engram_gate_fwd).
        clamp_value: the forward's clamp (a finite float > 0).

    hc in 1..8, H a multiple of 64 up to 16384, T >= 0; all tensors on one accelerator. Inputs whose
    address or outer strides are not 16-byte multiples are first copied to aligned buffers.

    Returns:
        EngramGateBwdResult(grad_hidden_states, grad_k, grad_v, grad_w_partial): the first three bf16 like
        their inputs (grad_k contiguous); grad_w_partial (P, hc, H) fp32, one slice per persistent block of
        the kernel (P = the device's SMs / vector cores). The weight gradient d/d(weight_fused) is
        grad_w_partial.sum(0); engram_grad_w_reduce finishes the RMSNorm weight gradients from it.
        On CUDA (hc * H up to about 32K) the blocks claim tokens at run time, so which tokens a slice
        sums, and the last bits of the weight gradient, can differ between runs; the other three grads
        never do. Under torch.use_deterministic_algorithms(True) every block takes a fixed token range
        instead and all four results are the same bits on every run.
        For T == 0 nothing is launched: the grads are empty and grad_w_partial is zeros with the same P
        a launch on this device would use.
    """
    cfg, device = _plan(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value)
    num_tokens, hc, hidden = hidden_states.shape
    x = hidden_states
    grad_x = torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device)
    grad_k = torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device)
    grad_v = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=device)
    if num_tokens == 0:
        grad_w_partial = torch.zeros((cfg.num_blocks, hc, hidden), dtype=torch.float32, device=device)
        return EngramGateBwdResult(grad_x, grad_k, grad_v, grad_w_partial)
    alloc = torch.zeros if cfg.accumulates_into_partials else torch.empty
    grad_w_partial = alloc((cfg.num_blocks, hc, hidden), dtype=torch.float32, device=device)

    extra = ()
    if cfg.takes_token_counter:
        # A fresh counter per call (zero-filled only where the blocks claim from it): stream-ordered and
        # captured with the launch in CUDA graphs, so concurrent calls never share one.
        alloc_counter = torch.zeros if cfg.dynamic_tokens else torch.empty
        extra = (alloc_counter((1,), dtype=torch.int32, device=device),)

    grad_out, x, k, v, weight_fused = (_aligned(t) for t in (grad_out, x, k, v, weight_fused))
    launch_kernel(
        get_engram_gate_bwd_kernel,
        cfg,
        device,
        grad_out,
        x,
        k,
        v,
        weight_fused,
        dot,
        gate_score,
        rstd_x,
        rstd_k,
        grad_x,
        grad_k,
        grad_v,
        grad_w_partial,
        float(clamp_value),
        *extra,
    )
    return EngramGateBwdResult(grad_x, grad_k, grad_v, grad_w_partial)


def engram_gate_bwd_config(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    *,
    clamp_value: float = 1e-6,
) -> EngramGateBwdConfig:
    """The kernel configuration engram_gate_bwd launches for these arguments (validated alike; no launch)."""
    return _plan(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value).cfg
