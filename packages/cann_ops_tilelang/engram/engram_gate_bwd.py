"""engram_gate_bwd: the Engram gate backward (docs/engram.md, "Backward")."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.engram._contract import check_hc_hidden, kv_alignment_bits
from cann_ops_tilelang.operator import Operator, scalar, tensor
from cann_ops_tilelang.validation import ALIGN_BYTES

from ._gate_bwd_counters import token_counter, unused_counter
from .engram_gate_bwd_kernel import choose_engram_gate_bwd_config, fixed_range_max_tokens, get_engram_gate_bwd_kernel

_MAX_STRIDE = 2**31 - 1  # strides are int32 kernel arguments


class EngramGateBwdResult(NamedTuple):
    grad_hidden_states: torch.Tensor  # (T, hc, H) bf16
    grad_kv: torch.Tensor  # (T, hc + 1, H) bf16, contiguous: [:, :hc] grad of the keys, [:, hc] of the value
    grad_w_partial: torch.Tensor  # (P, hc, H) fp32: per-block partial sums of r * x * k over tokens


@functools.cache
def _cuda_fixed_range_max_tokens(index: int) -> int:
    """fixed_range_max_tokens of CUDA device `index` (the fast path's: one cache lookup, no device query)."""
    return fixed_range_max_tokens(get_num_cores(torch.device('cuda', index)))


def _fixed_ranges(num_tokens: int, limit: int) -> bool:
    """Whether a call of `num_tokens` tokens takes the kernel's fixed token ranges (no claims, no counter)."""
    # _get_deterministic_algorithms: torch.are_deterministic_algorithms_enabled without its Python frame
    return num_tokens <= limit or torch._C._get_deterministic_algorithms()


def _choice(hidden_states, image_token_mask, device):
    num_tokens, hc, hidden = hidden_states.shape
    fixed_ranges = _fixed_ranges(num_tokens, fixed_range_max_tokens(get_num_cores(device)))
    return {'hc': hc, 'hidden': hidden, 'deterministic': fixed_ranges, 'has_mask': image_token_mask is not None}


_SAVED = 'T, hc'  # dot, gate_score, rstd_x, rstd_k: the forward's saved tensors
OP = Operator(
    'engram_gate_bwd',
    tensor('grad_out', torch.bfloat16, 'T, hc, hidden', aligned='copied'),
    tensor('hidden_states', torch.bfloat16, 'T, hc, hidden', aligned='copied'),
    tensor('kv', torch.bfloat16, 'T, hc + 1, hidden', layout='rows'),
    tensor('weight_fused', torch.float32, 'hc, hidden', aligned='copied'),
    *(tensor(name, torch.float32, _SAVED) for name in ('dot', 'gate_score', 'rstd_x', 'rstd_k')),
    scalar('clamp_value', 'positive'),
    tensor('image_token_mask', torch.bool, 'T', optional=True),
    limits=check_hc_hidden,
    choice=_choice,
    shape_from='hidden_states',
    choose_config=choose_engram_gate_bwd_config,
    get_kernel=get_engram_gate_bwd_kernel,
)


def _eager(grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k, clamp, mask) -> EngramGateBwdResult:
    """Every check, then the launch (also the torch.library op's kernel). Fast path: by (hc, H, CUDA index, fixed
    token ranges, mask given), after fast_ok and kv's strides and alignment (a call that would need an aligned copy
    goes the full way). Its entries: the launcher, grad_w_partial's shape and the kept token_counter of a kernel
    that claims nothing (None: one per stream)."""
    key = entry = None
    shape = OP.fast_ok(grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k, clamp, mask)  # grad_out's
    if shape is not None and kv.dim() == 3:
        num_tokens, hc, hidden = shape
        stride_t, stride_h, _ = kv.stride()
        # As the full path's kv test, with the T of x: a kv of another T is the entry's to reject. (* 2: bf16 bytes)
        used_stride_t = stride_t if num_tokens > 1 else 0
        if (
            stride_t >= 0  # (the entry does not check kv's outer strides; the contract wants them >= 0)
            and stride_h >= 0
            and used_stride_t <= _MAX_STRIDE
            and stride_h <= _MAX_STRIDE
            and not (kv.data_ptr() | (used_stride_t | stride_h) * 2) % ALIGN_BYTES
        ):
            index = x.get_device()
            key = (hc, hidden, index, _fixed_ranges(num_tokens, _cuda_fixed_range_max_tokens(index)), mask is None)
            entry = OP.fast.get(key) if num_tokens else None
    if entry is not None:
        launcher, partial_shape, counter = entry
        # empty_like: no size list to parse (x's layout is the entry's to check: contiguous once it launches)
        grad_x = torch.empty_like(x)
        grad_kv = x.new_empty(num_tokens, hc + 1, hidden)
        partial = x.new_empty(partial_shape, dtype=torch.float32)
        if counter is None:  # the blocks claim tokens
            counter = token_counter(x, index)
        if mask is None:
            args = (grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k, grad_x, grad_kv, partial, clamp, counter)
        else:
            args = (grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k, mask, grad_x, grad_kv, partial, clamp, counter)
        OP.launch(launcher, args, (grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k, clamp, mask))
        # EngramGateBwdResult(...) without the NamedTuple's Python-level __new__
        return tuple.__new__(EngramGateBwdResult, (grad_x, grad_kv, partial))
    launcher = OP.plan(grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k, clamp, mask)
    cfg = launcher.cfg
    num_tokens, hc, hidden = x.shape
    grad_x = x.new_empty(num_tokens, hc, hidden)  # new_empty: cheaper than torch.empty(..., device=)
    grad_kv = x.new_empty(num_tokens, hc + 1, hidden)
    if num_tokens == 0:
        return EngramGateBwdResult(grad_x, grad_kv, x.new_zeros((cfg.num_blocks, hc, hidden), dtype=torch.float32))
    alloc = x.new_zeros if cfg.accumulates_into_partials else x.new_empty
    partial = alloc((cfg.num_blocks, hc, hidden), dtype=torch.float32)
    counter = token_counter(x, x.device.index) if cfg.dynamic_tokens else unused_counter(x)
    # Contiguous rows of H (a multiple of 64): only the addresses of grad_out, x and w can be misaligned. kv's outer
    # strides are free. Misaligned or int32-overflowing ones get an aligned copy (one extra pass, still correct).
    if (grad_out.data_ptr() | x.data_ptr() | w.data_ptr()) % ALIGN_BYTES:
        grad_out, x, w = (t if t.data_ptr() % ALIGN_BYTES == 0 else t.clone() for t in (grad_out, x, w))
    stride_t, stride_h, _ = kv.stride()
    if kv_alignment_bits(kv) % ALIGN_BYTES or max(stride_t if num_tokens > 1 else 0, stride_h) > _MAX_STRIDE:
        kv = kv.clone(memory_format=torch.contiguous_format)
    inputs = (grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k) + (() if mask is None else (mask,))
    launcher.launch(*inputs, grad_x, grad_kv, partial, float(clamp), counter)  # kv whole: read through its strides
    if key is not None and not cfg.accumulates_into_partials:
        kept_counter = None if cfg.dynamic_tokens else counter
        OP.remember(key, launcher, (launcher, (cfg.num_blocks, hc, hidden), kept_counter))
    return EngramGateBwdResult(grad_x, grad_kv, partial)


def _fake(grad_out, x, kv, w, dot, gate_score, rstd_x, rstd_k, clamp, mask) -> tuple:
    """Contiguous grads and (P, hc, H) partials, P the device's (a device query on the first trace for a device)."""
    (num_tokens, hc, hidden), device = x.shape, x.device
    # int(): sizes may be symbolic while torch traces with dynamic shapes; P depends on none of them.
    # (P is the same with fixed token ranges or claimed ones, so a symbolic T is not compared.)
    fixed_ranges = torch.are_deterministic_algorithms_enabled()
    choice = {'hc': int(hc), 'hidden': int(hidden), 'deterministic': fixed_ranges, 'has_mask': mask is not None}
    num_blocks = OP.launcher(backend_of(device), device, **choice).cfg.num_blocks  # device checked before
    grad_kv = torch.empty((num_tokens, hc + 1, hidden), dtype=torch.bfloat16, device=device)
    return torch.empty_like(x), grad_kv, torch.empty((num_blocks, hc, hidden), dtype=torch.float32, device=device)


@OP.public(_eager, returns='(Tensor, Tensor, Tensor)', result=EngramGateBwdResult, fake=_fake)
def engram_gate_bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    clamp_value: float,
    image_token_mask: torch.Tensor | None = None,
) -> EngramGateBwdResult:
    """Gradients of the Engram gate (engram_gate_fwd) from the forward's saved tensors (TileKernels 2.1.0's call).

    Per token t and branch h (fp32 math, s = H ** -0.5, k = kv[t, h], v = kv[t, hc], d = dot * rstd_x *
    rstd_k * s recomputed from the saved tensors; r = dL/d(dot), 0 where |d| < clamp_value):

        dL/dg  = sum(grad_out[t, h] * v)
        r      = dL/dg * g * (1 - g) * 0.5 * sqrt(s * rstd_x * rstd_k / |dot|)
        grad_x = grad_out + r * (k * w - x * dot * rstd_x**2 / H)
        grad_kv[t, h]  = r * (x * w - k * dot * rstd_k**2 / H)
        grad_kv[t, hc] = sum_h grad_out[t, h] * g[t, h]
        grad_w_partial[p] = sum over the tokens of block p of r * x * k

    Args:
        grad_out, hidden_states: (T, hc, H) bf16, contiguous.
        kv: (T, hc + 1, H) bf16 (keys, then the value), last dimension contiguous, other strides free.
        weight_fused: (hc, H) fp32, contiguous (engram_fused_weight).
        dot, gate_score, rstd_x, rstd_k: (T, hc) fp32, contiguous (saved by engram_gate_fwd).
        clamp_value: the forward's clamp (a finite float > 0).
        image_token_mask: optional (T,) bool, contiguous, the forward's: an image token gets grad_x = grad_out bit
            for bit, grad_kv = 0 and adds nothing to grad_w_partial. None is its own compiled variant.

    hc in 1..8, H a multiple of 64 up to 16384, T >= 0; all tensors on one accelerator. Inputs whose address or
    outer strides are not 16-byte multiples are first copied to aligned buffers.

    Returns:
        EngramGateBwdResult(grad_hidden_states, grad_kv, grad_w_partial), a tuple: grad_hidden_states (T, hc, H)
        and grad_kv (T, hc + 1, H) bf16, contiguous (the kernels write the key and value gradients straight into
        it); grad_w_partial (P, hc, H) fp32, one slice per persistent block (P = the device's SMs / vector cores;
        on CUDA, tokens too wide for one SM are split over clusters of 2 and P is half the SMs).
        d/d(weight_fused) is grad_w_partial.sum(0); engram_grad_w_reduce finishes the RMSNorm weight gradients.
        On CUDA (a token on one SM: hc * H up to about 32K) the blocks of a call of more than
        FIXED_RANGE_MAX_TOKENS_PER_BLOCK (8) x P tokens claim tokens at run time, so which tokens a slice sums,
        and the last bits of the weight gradient, can differ between runs; the other grads never do. Smaller
        calls, every call under torch.use_deterministic_algorithms(True) and the split tokens give each block a
        fixed token range: the same bits every run.
        For T == 0 nothing is launched: empty grads, and grad_w_partial zeros with the P a launch would use.
    """
