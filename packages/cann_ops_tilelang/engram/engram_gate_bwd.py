"""engram_gate_bwd: the Engram gate backward (docs/engram.md, "Backward")."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from cann_ops_tilelang._torch_library import op, traced
from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.engram._contract import check_hc_hidden, gate_operands_conform, kv_alignment_bits
from cann_ops_tilelang.kernel_target import Launcher, launch_or_explain
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_contiguous,
    check_image_token_mask,
    check_last_dim_contiguous,
    check_positive_float,
    check_shape,
    check_tensor,
    is_contiguous_tensor,
)

from .engram_gate_bwd_kernel import (
    COUNTER_WORDS,
    EngramGateBwdConfig,
    choose_engram_gate_bwd_config,
    fixed_range_max_tokens,
    get_engram_gate_bwd_kernel,
)

_NAME = 'engram_gate_bwd'
_MAX_STRIDE = 2**31 - 1  # strides are int32 kernel arguments
_KV_ELEMENT_BYTES = 2  # bf16


class EngramGateBwdResult(NamedTuple):
    grad_hidden_states: torch.Tensor  # (T, hc, H) bf16
    grad_kv: torch.Tensor  # (T, hc + 1, H) bf16, contiguous: [:, :hc] grad of the keys, [:, hc] of the value
    grad_w_partial: torch.Tensor  # (P, hc, H) fp32: per-block partial sums of r * x * k over tokens


def _kv_usable_as_is(kv: torch.Tensor) -> bool:
    """Whether kv's address and outer strides suit 16-byte vector accesses and the int32 stride arguments
    (a single token's stride is never used)."""
    stride_t, stride_h, _ = kv.stride()
    used_stride_t = stride_t if kv.shape[0] > 1 else 0
    return kv_alignment_bits(kv) % ALIGN_BYTES == 0 and max(used_stride_t, stride_h) <= _MAX_STRIDE


def _aligned_kv(kv: torch.Tensor) -> torch.Tensor:
    """kv itself where _kv_usable_as_is, else an aligned copy (contiguous, from the caching allocator):
    views with odd offsets or strides stay correct at the price of one extra pass."""
    return kv if _kv_usable_as_is(kv) else kv.clone(memory_format=torch.contiguous_format)


_SAVED = ('dot', 'gate_score', 'rstd_x', 'rstd_k')
# One launcher per (device, backend, hc, H, fixed token ranges, mask): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# _fast_key (hc, H, CUDA device index, fixed token ranges, mask given): found there, a call checks in Python
# only what the entry cannot (argument types, clamp_value, kv's outer strides, alignment: a call that would
# need an aligned copy goes the full way) and leaves the explanation of a rejection to _check. Each with
# grad_w_partial's shape and the kept token_counter of a kernel that claims nothing (None: one per stream).
_CHECKED: dict[tuple, tuple[Launcher, tuple[int, int, int], torch.Tensor | None]] = {}
# The claiming kernels' token counters, one per (device index, raw CUDA stream): see _token_counter.
_COUNTERS: dict[tuple, torch.Tensor] = {}
# What the kernels that claim nothing get as token_counter (never read or written), one per device.
_UNUSED_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _launch_stream(index: int) -> int | None:
    """The raw current CUDA stream of device `index`, where the launch goes; None while it captures a graph."""
    if torch._C._cuda_getDevice() != index:  # tensors on another GPU than the current one: ask that one
        with torch.cuda.device(index):
            return _launch_stream(index)
    if torch._C._cuda_isCurrentStreamCapturing():
        return None
    return torch._C._cuda_getCurrentRawStream(index)


def _token_counter(x: torch.Tensor, index: int | None) -> torch.Tensor:
    """The token_counter of a kernel that claims tokens: zero when the kernel starts.

    Eagerly one buffer per (device, stream), zero-filled when first used: the kernel leaves it at zero
    (_engram_gate_bwd_cuda_kernel.py) and launches on one stream run one after another, so the next launch
    there finds zeros without a fill of its own, which would be a second launch per call (as much host time
    as the kernel's). Launches on different streams may overlap, hence one buffer each. While the stream
    captures a CUDA graph, a fresh zero-filled buffer per call instead (its memset captured before the kernel,
    in the graph's private memory): a replay may run on any stream, concurrently with eager calls, so it must
    share no buffer with them (nor with another graph). Keyed by the raw stream handle, which a stream
    destroyed and another created could share; PyTorch's pooled streams are never destroyed.
    """
    stream = _launch_stream(index)
    if stream is None:
        return x.new_zeros((COUNTER_WORDS,), dtype=torch.int32)
    key = (index, stream)
    counter = _COUNTERS.get(key)
    if counter is None:  # allocated and zero-filled on this very stream, so ordered before the kernel
        counter = _COUNTERS[key] = x.new_zeros((COUNTER_WORDS,), dtype=torch.int32)
    return counter


def _unused_counter(x: torch.Tensor) -> torch.Tensor:
    """token_counter for the kernels that claim nothing: any int32 (COUNTER_WORDS,) of the device, kept."""
    counter = _UNUSED_COUNTERS.get(x.device)
    if counter is None:
        counter = _UNUSED_COUNTERS[x.device] = x.new_empty((COUNTER_WORDS,), dtype=torch.int32)
    return counter


def _conforms(grad_out, x, kv, weight_fused, saved, clamp_value, image_token_mask) -> bool:
    """Whether every check of _check_each passes, found with direct comparisons: the common call's path,
    without a helper call per check. False sends the call through _check_each, which raises the contract's
    typed error, first violation first (or passes: an int clamp_value, say). No memory needed (fake tensors
    too)."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 3):
        return False
    shape = x.shape
    num_tokens, hc, hidden = shape
    if not (
        x.dtype is torch.bfloat16
        and x.is_contiguous()
        and is_contiguous_tensor(grad_out, torch.bfloat16, shape)
        and gate_operands_conform(kv, weight_fused, clamp_value, num_tokens, hc, hidden)
    ):
        return False
    saved_shape = (num_tokens, hc)
    for value in saved:
        if not is_contiguous_tensor(value, torch.float32, saved_shape):
            return False
    return image_token_mask is None or is_contiguous_tensor(image_token_mask, torch.bool, (num_tokens,))


def _check(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask) -> str:
    """Validate the arguments (none needs memory: misaligned inputs are copied, see _eager); the backend."""
    if not _conforms(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask):
        _check_each(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask)
    if image_token_mask is None:
        return require_accelerator(grad_out, hidden_states, kv, weight_fused, *saved)
    return require_accelerator(grad_out, hidden_states, kv, weight_fused, *saved, image_token_mask)


def _check_each(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask) -> None:
    """Every check of the contract, one helper each, in the order that decides which error a call with
    several violations gets: types, dtypes and ranks first, then hc / H, shapes, layouts, clamp_value."""
    check_tensor('grad_out', grad_out, dtype=torch.bfloat16, ndim=3)
    x = check_tensor('hidden_states', hidden_states, dtype=torch.bfloat16, ndim=3)
    check_tensor('kv', kv, dtype=torch.bfloat16, ndim=3)
    check_tensor('weight_fused', weight_fused, dtype=torch.float32, ndim=2)
    for name, value in zip(_SAVED, saved, strict=True):
        check_tensor(name, value, dtype=torch.float32, ndim=2)
    num_tokens, hc, hidden = x.shape
    check_hc_hidden(_NAME, hc, hidden)
    check_shape('grad_out', grad_out, (num_tokens, hc, hidden))
    check_shape('kv', kv, (num_tokens, hc + 1, hidden))
    check_shape('weight_fused', weight_fused, (hc, hidden))
    for name, value in zip(_SAVED, saved, strict=True):
        check_shape(name, value, (num_tokens, hc))
    check_contiguous('grad_out', grad_out)
    check_contiguous('hidden_states', x)
    check_last_dim_contiguous('kv', kv)
    check_contiguous('weight_fused', weight_fused)
    for name, value in zip(_SAVED, saved, strict=True):
        check_contiguous(name, value)
    check_positive_float('clamp_value', clamp_value)
    if image_token_mask is not None:
        check_image_token_mask(image_token_mask, num_tokens)


@functools.cache
def _cuda_fixed_range_max_tokens(index: int) -> int:
    """fixed_range_max_tokens of CUDA device `index` (the fast path's: one cache lookup, no device query)."""
    return fixed_range_max_tokens(get_num_cores(torch.device('cuda', index)))


def _fixed_ranges(num_tokens: int, limit: int) -> bool:
    """Whether a call of `num_tokens` tokens takes the kernel's fixed token ranges (no claims, no counter)."""
    # _get_deterministic_algorithms: torch.are_deterministic_algorithms_enabled without its Python frame
    return num_tokens <= limit or torch._C._get_deterministic_algorithms()


def _launcher(backend, device, hc: int, hidden: int, image_token_mask, fixed_ranges: bool) -> Launcher:
    has_mask = image_token_mask is not None
    key = (device, backend, hc, hidden, fixed_ranges, has_mask)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_gate_bwd_config(
            backend=backend,
            hc=hc,
            hidden=hidden,
            num_cores=get_num_cores(device),
            deterministic=fixed_ranges,
            has_mask=has_mask,
        )
        launcher = _LAUNCHERS[key] = Launcher(get_engram_gate_bwd_kernel, cfg, device)
    return launcher


def _fast_key(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask) -> tuple | None:
    """(_CHECKED key, T) of a call whose remaining checks the entry makes and that needs no aligned copy;
    None sends it the full way. The key is (hc, H, CUDA device index, fixed token ranges, mask given)."""
    plain = PLAIN_TENSOR_TYPES
    if not (
        type(hidden_states) in plain
        and type(grad_out) in plain
        and type(kv) in plain
        and type(weight_fused) in plain
        and type(saved[0]) in plain
        and type(saved[1]) in plain
        and type(saved[2]) in plain
        and type(saved[3]) in plain
        and (image_token_mask is None or type(image_token_mask) in plain)
        and hidden_states.is_cuda
        and kv.dim() == 3
        and type(clamp_value) is float
        and 0.0 < clamp_value < math.inf
    ):
        return None
    num_tokens, hc, hidden = hidden_states.shape
    stride_t, stride_h, _ = kv.stride()
    # As _kv_usable_as_is, with the T of hidden_states: a kv of another T is the entry's to reject.
    used_stride_t = stride_t if num_tokens > 1 else 0
    if not (
        stride_t >= 0  # (the entry does not check kv's outer strides; the contract wants them >= 0)
        and stride_h >= 0
        and used_stride_t <= _MAX_STRIDE
        and stride_h <= _MAX_STRIDE
        and not (
            grad_out.data_ptr()
            | hidden_states.data_ptr()
            | weight_fused.data_ptr()
            | kv.data_ptr()
            | (used_stride_t | stride_h) * _KV_ELEMENT_BYTES
        )
        % ALIGN_BYTES
    ):
        return None
    index = hidden_states.get_device()
    fixed_ranges = _fixed_ranges(num_tokens, _cuda_fixed_range_max_tokens(index))
    return (hc, hidden, index, fixed_ranges, image_token_mask is None), num_tokens


def _eager(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask) -> EngramGateBwdResult:
    """The call on real tensors: every check, then the launch (also the torch.library op's kernel)."""
    fast = _fast_key(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask)
    if fast is not None:
        key, num_tokens = fast
        checked = _CHECKED.get(key)
        if checked is not None and num_tokens:
            launcher, partial_shape, counter = checked
            x = hidden_states
            # empty_like: no size list to parse (x's layout is the entry's to check: contiguous once it launches)
            grad_x = torch.empty_like(x)
            grad_kv = x.new_empty((num_tokens, key[0] + 1, key[1]))
            grad_w_partial = x.new_empty(partial_shape, dtype=torch.float32)
            if counter is None:  # the blocks claim tokens
                counter = _token_counter(x, key[2])
            if image_token_mask is None:
                args = (grad_out, x, kv, weight_fused, *saved, grad_x, grad_kv, grad_w_partial, clamp_value, counter)
            else:
                args = (grad_out, x, kv, weight_fused, *saved, image_token_mask, grad_x, grad_kv, grad_w_partial)
                args += (clamp_value, counter)
            launch_or_explain(
                launcher, args, _check, grad_out, x, kv, weight_fused, saved, clamp_value, image_token_mask
            )
            # EngramGateBwdResult(...) without the NamedTuple's Python-level __new__
            return tuple.__new__(EngramGateBwdResult, (grad_x, grad_kv, grad_w_partial))
    backend = _check(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask)
    num_tokens, hc, hidden = hidden_states.shape
    fixed_ranges = _fixed_ranges(num_tokens, fixed_range_max_tokens(get_num_cores(hidden_states.device)))
    launcher = _launcher(backend, hidden_states.device, hc, hidden, image_token_mask, fixed_ranges)
    cfg, device = launcher.cfg, launcher.device
    x = hidden_states  # its dtype (bf16) and device; new_empty is cheaper than torch.empty(..., device=)
    grad_x = x.new_empty((num_tokens, hc, hidden))
    grad_kv = x.new_empty((num_tokens, hc + 1, hidden))
    if num_tokens == 0:
        grad_w_partial = torch.zeros((cfg.num_blocks, hc, hidden), dtype=torch.float32, device=device)
        return EngramGateBwdResult(grad_x, grad_kv, grad_w_partial)
    alloc = x.new_zeros if cfg.accumulates_into_partials else x.new_empty
    grad_w_partial = alloc((cfg.num_blocks, hc, hidden), dtype=torch.float32)
    token_counter = _token_counter(x, x.device.index) if cfg.dynamic_tokens else _unused_counter(x)

    # grad_out, hidden_states and weight_fused are contiguous with rows of H (a multiple of 64) elements, so
    # only their addresses can be misaligned (one test for the three); a copy from the caching allocator is
    # aligned. kv's outer strides are free: _aligned_kv.
    if (grad_out.data_ptr() | x.data_ptr() | weight_fused.data_ptr()) % ALIGN_BYTES:
        grad_out, x, weight_fused = (
            t if t.data_ptr() % ALIGN_BYTES == 0 else t.clone() for t in (grad_out, x, weight_fused)
        )
    kv = _aligned_kv(kv)  # whole: the kernels read keys and value through its strides
    if image_token_mask is None:
        launcher.launch(
            grad_out, x, kv, weight_fused, *saved, grad_x, grad_kv, grad_w_partial, float(clamp_value), token_counter
        )
    else:
        launcher.launch(
            grad_out,
            x,
            kv,
            weight_fused,
            *saved,
            image_token_mask,
            grad_x,
            grad_kv,
            grad_w_partial,
            float(clamp_value),
            token_counter,
        )
    if fast is not None and launcher.checks_arguments and not cfg.accumulates_into_partials:
        kept_counter = None if cfg.dynamic_tokens else token_counter
        _CHECKED[fast[0]] = (launcher, (cfg.num_blocks, hc, hidden), kept_counter)
    return EngramGateBwdResult(grad_x, grad_kv, grad_w_partial)


def _fake(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask) -> EngramGateBwdResult:
    """The outputs while torch traces: the checks, then contiguous grads and (P, hc, H) partials, P the
    device's (a device query on the first trace for a device)."""
    backend = _check(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask)
    num_tokens, hc, hidden = hidden_states.shape
    device = hidden_states.device
    # int(): sizes may be symbolic while torch traces with dynamic shapes; P depends on none of them.
    # (P is the same with fixed token ranges or claimed ones, so a symbolic T is not compared.)
    fixed_ranges = torch.are_deterministic_algorithms_enabled()
    num_blocks = _launcher(backend, device, int(hc), int(hidden), image_token_mask, fixed_ranges).cfg.num_blocks
    return EngramGateBwdResult(
        torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device),
        torch.empty((num_tokens, hc + 1, hidden), dtype=torch.bfloat16, device=device),
        torch.empty((num_blocks, hc, hidden), dtype=torch.float32, device=device),
    )


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
        image_token_mask: optional (T,) bool, contiguous, the forward's: an image token gets grad_x =
            grad_out bit for bit, grad_kv = 0 and adds nothing to grad_w_partial. None is its own
            compiled variant.

    hc in 1..8, H a multiple of 64 up to 16384, T >= 0; all tensors on one accelerator. Inputs whose
    address or outer strides are not 16-byte multiples are first copied to aligned buffers.

    Returns:
        EngramGateBwdResult(grad_hidden_states, grad_kv, grad_w_partial), a tuple: grad_hidden_states
        (T, hc, H) and grad_kv (T, hc + 1, H) bf16, contiguous (the kernels write the key and value
        gradients straight into it); grad_w_partial (P, hc, H) fp32, one slice per persistent block of
        the kernel (P = the device's SMs / vector cores). The weight gradient d/d(weight_fused) is
        grad_w_partial.sum(0); engram_grad_w_reduce finishes the RMSNorm weight gradients from it.
        On CUDA (hc * H up to about 32K) the blocks of a call of more than 8 tokens per block
        (FIXED_RANGE_MAX_TOKENS_PER_BLOCK x P) claim tokens at run time, so which tokens a slice sums, and the last
        bits of the weight gradient, can differ between runs; the other grads never do. Smaller calls,
        and every call under torch.use_deterministic_algorithms(True), give each block a fixed token
        range instead, and all their results are the same bits on every run.
        For T == 0 nothing is launched: the grads are empty and grad_w_partial is zeros with the same P
        a launch on this device would use.
    """
    saved = (dot, gate_score, rstd_x, rstd_k)
    if traced(grad_out):  # torch.compile, fake tensors, make_fx: the torch.library op (_torch_ops.py)
        _check(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask)
        args = (grad_out, hidden_states, kv, weight_fused, *saved, float(clamp_value), image_token_mask)
        return EngramGateBwdResult(*op('engram_gate_bwd')(*args))
    return _eager(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask)


def engram_gate_bwd_config(
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
) -> EngramGateBwdConfig:
    """The kernel configuration engram_gate_bwd launches for these arguments (validated alike; no launch)."""
    saved = (dot, gate_score, rstd_x, rstd_k)
    backend = _check(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask)
    num_tokens, hc, hidden = hidden_states.shape
    fixed_ranges = _fixed_ranges(num_tokens, fixed_range_max_tokens(get_num_cores(hidden_states.device)))
    return _launcher(backend, hidden_states.device, hc, hidden, image_token_mask, fixed_ranges).cfg
