"""engram_gate_fwd: the Engram gate forward (docs/engram.md, "Forward")."""

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
    check_bool,
    check_contiguous,
    check_image_token_mask,
    check_last_dim_contiguous,
    check_no_overlap,
    check_out,
    check_positive_float,
    check_shape,
    check_tensor,
    is_contiguous_tensor,
)

from .engram_gate_fwd_kernel import EngramGateFwdConfig, choose_engram_gate_fwd_config, get_engram_gate_fwd_kernel

_NAME = 'engram_gate_fwd'


class EngramGateFwdResult(NamedTuple):
    output: torch.Tensor  # (T, hc, H) bf16: x + gate_score * v (x itself for image tokens)
    dot: torch.Tensor | None  # (T, hc) fp32: sum(x * w * k), unnormalised
    gate_score: torch.Tensor | None  # (T, hc) fp32
    rstd_x: torch.Tensor | None  # (T, hc) fp32
    rstd_k: torch.Tensor | None  # (T, hc) fp32


def _access_vec(hidden_states: torch.Tensor, kv: torch.Tensor, out: torch.Tensor | None) -> int:
    """Widest access (8, 4, 2 or 1 bf16 elements) that the addresses of hidden_states, kv and out (None: the
    caching allocator's, aligned) and kv's outer strides are all aligned to.

    A power of two divides each address and stride in bytes iff it divides their bitwise or, whose lowest
    set bit is the answer (_contract.kv_alignment_bits).
    """
    bits = hidden_states.data_ptr() | kv_alignment_bits(kv)
    if out is not None:
        bits |= out.data_ptr()
    low = bits & -bits  # bytes; 0 where every address and stride is 0
    return 8 if low == 0 or low >= 16 else max(1, low // 2)


# One launcher per (device, backend, hc, H, save_for_backward, mask, access width): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (hidden_states.shape[1:], CUDA device index, save_for_backward, mask given, access width): found there,
# a call without inplace or out= checks in Python only what the entry cannot (argument types, the scalars,
# kv's outer strides, alignment) and leaves the explanation of a rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}


def _fast_key(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask) -> tuple | None:
    """The _CHECKED key of a call whose remaining checks the entry makes; None sends it the full way."""
    if not (
        type(hidden_states) in PLAIN_TENSOR_TYPES
        and type(kv) in PLAIN_TENSOR_TYPES
        and type(weight_fused) in PLAIN_TENSOR_TYPES
        and hidden_states.is_cuda
        and kv.dim() == 3
        and type(eps) is float
        and 0.0 < eps < math.inf
        and type(clamp_value) is float
        and 0.0 < clamp_value < math.inf
        and type(save_for_backward) is bool
        and (image_token_mask is None or type(image_token_mask) in PLAIN_TENSOR_TYPES)
    ):
        return None
    stride_t, stride_h, _ = kv.stride()
    if stride_t < 0 or stride_h < 0 or weight_fused.data_ptr() % ALIGN_BYTES:
        return None
    vec = _access_vec(hidden_states, kv, None)
    return (hidden_states.shape[1:], hidden_states.get_device(), save_for_backward, image_token_mask is None, vec)


def _conforms(x, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask) -> bool:
    """Whether every check of _check_each passes for a call without inplace or out= (whose overlap checks
    stay with _check_each), found with direct comparisons: the common call's path, without a helper call
    per check. False sends the call through _check_each, which raises the contract's typed error, first
    violation first (or passes: an int eps, say). No memory needed (fake tensors too)."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 3):
        return False
    num_tokens, hc, hidden = x.shape
    if not (
        x.dtype is torch.bfloat16
        and x.is_contiguous()
        and gate_operands_conform(kv, weight_fused, clamp_value, num_tokens, hc, hidden)
        and type(eps) is float
        and 0.0 < eps < math.inf
        and type(save_for_backward) is bool
    ):
        return False
    return image_token_mask is None or is_contiguous_tensor(image_token_mask, torch.bool, (num_tokens,))


def _check(
    hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out, *, memory
) -> str:
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); the backend."""
    if not (
        inplace is False
        and out is None
        and _conforms(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask)
    ):
        _check_each(
            hidden_states,
            kv,
            weight_fused,
            eps,
            clamp_value,
            save_for_backward,
            image_token_mask,
            inplace,
            out,
            memory=memory,
        )
    tensors = (
        (hidden_states, kv, weight_fused)
        if image_token_mask is None
        else (hidden_states, kv, weight_fused, image_token_mask)
    )
    return require_accelerator(*tensors) if out is None else require_accelerator(*tensors, out)


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _check_each(
    hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out, *, memory
) -> None:
    """Every check of the contract, one helper each, in the order that decides which error a call with
    several violations gets: types, dtypes and ranks first, then hc / H, shapes, layouts, scalars, the mask,
    inplace / out= and their overlaps (memory=False: fake tensors, see validation.may_overlap)."""
    x = check_tensor('hidden_states', hidden_states, dtype=torch.bfloat16, ndim=3)
    check_tensor('kv', kv, dtype=torch.bfloat16, ndim=3)
    check_tensor('weight_fused', weight_fused, dtype=torch.float32, ndim=2)
    num_tokens, hc, hidden = x.shape
    check_hc_hidden(_NAME, hc, hidden)
    check_shape('kv', kv, (num_tokens, hc + 1, hidden))
    check_shape('weight_fused', weight_fused, (hc, hidden))
    check_contiguous('hidden_states', x)
    check_last_dim_contiguous('kv', kv)
    check_contiguous('weight_fused', weight_fused)
    check_positive_float('eps', eps)
    check_positive_float('clamp_value', clamp_value)
    save_for_backward = check_bool('save_for_backward', save_for_backward)
    inplace = check_bool('inplace', inplace)
    inputs = {'hidden_states': x, 'kv': kv, 'weight_fused': weight_fused}
    if image_token_mask is not None:
        check_image_token_mask(image_token_mask, num_tokens)
        inputs['image_token_mask'] = image_token_mask
    if inplace:
        if save_for_backward:
            raise ValueError(
                f'{_NAME}: inplace=True overwrites hidden_states, which the backward needs: use save_for_backward=False'
            )
        if out is not None:
            raise ValueError(f'{_NAME}: inplace=True writes the output into hidden_states: do not also pass out=')
        check_no_overlap('hidden_states', x, inputs, what='written in place', memory=memory)
    elif out is not None:
        check_out(
            'out',
            out,
            shape=(num_tokens, hc, hidden),
            dtype=torch.bfloat16,
            device=x.device,
            inputs=inputs,
            memory=memory,
        )


def _launcher(backend, hidden_states, kv, save_for_backward, image_token_mask, out) -> Launcher:
    _, hc, hidden = hidden_states.shape
    device = hidden_states.device
    vec = _access_vec(hidden_states, kv, out)
    has_mask = image_token_mask is not None
    key = (device, backend, hc, hidden, save_for_backward, has_mask, vec)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_gate_fwd_config(
            backend=backend,
            hc=hc,
            hidden=hidden,
            num_cores=get_num_cores(device),
            save_for_backward=save_for_backward,
            has_mask=has_mask,
            vec=vec,
        )
        launcher = _LAUNCHERS[key] = Launcher(get_engram_gate_fwd_kernel, cfg, device)
    return launcher


def _eager(
    hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out
) -> EngramGateFwdResult:
    """The call on real tensors: every check, then the launch (also the torch.library ops' kernel)."""
    args = (hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out)
    fast_key = (
        _fast_key(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask)
        if inplace is False and out is None
        else None
    )
    launcher = _CHECKED.get(fast_key) if fast_key is not None else None
    if launcher is not None and hidden_states.shape[0]:
        output, saved, launch_args = _outputs_and_args(
            hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, None
        )
        launch_or_explain(launcher, launch_args, _check_real, *args)
        return EngramGateFwdResult(output, *saved)
    backend = _check(*args, memory=True)
    launcher = _launcher(backend, hidden_states, kv, save_for_backward, image_token_mask, out)
    if weight_fused.data_ptr() % ALIGN_BYTES:  # the kernels read it in 16-byte vectors: an aligned copy
        weight_fused = weight_fused.clone()
    written = hidden_states if inplace else out  # None: allocated
    output, saved, launch_args = _outputs_and_args(
        hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, written
    )
    if hidden_states.shape[0] == 0:
        return EngramGateFwdResult(output, *saved)
    launcher.launch(*launch_args)
    if fast_key is not None and launcher.checks_arguments:
        _CHECKED[fast_key] = launcher
    return EngramGateFwdResult(output, *saved)


def _outputs_and_args(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, output):
    """(output, the four saved tensors or Nones, the kernel's arguments): `output` None allocates it."""
    num_tokens, hc, hidden = hidden_states.shape
    if output is None:
        output = hidden_states.new_empty((num_tokens, hc, hidden))  # cheaper than torch.empty(..., device=)
    if save_for_backward:
        new_empty, shape, f32 = hidden_states.new_empty, (num_tokens, hc), torch.float32
        # four calls spelled out: a generator and tuple() around them cost more than a call
        saved = (
            new_empty(shape, dtype=f32),
            new_empty(shape, dtype=f32),
            new_empty(shape, dtype=f32),
            new_empty(shape, dtype=f32),
        )
    else:
        saved = (None, None, None, None)
    # kv whole: the kernel reads keys and value through its strides (no views to build per call).
    outputs = (output, *saved) if save_for_backward else (output,)  # no slots for unsaved outputs
    if image_token_mask is None:
        return output, saved, (hidden_states, kv, weight_fused, *outputs, float(eps), float(clamp_value))
    return output, saved, (hidden_states, kv, weight_fused, image_token_mask, *outputs, float(eps), float(clamp_value))


def _fake(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out):
    """The outputs while torch traces: the checks that need no memory, then the tensors the call allocates
    (the output unless inplace or out=, the four saved tensors with save_for_backward), all contiguous."""
    _check(
        hidden_states,
        kv,
        weight_fused,
        eps,
        clamp_value,
        save_for_backward,
        image_token_mask,
        inplace,
        out,
        memory=False,
    )
    num_tokens, hc, hidden = hidden_states.shape
    device = hidden_states.device
    new = []
    if not inplace and out is None:
        new.append(torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device))
    if save_for_backward:
        new += [torch.empty((num_tokens, hc), dtype=torch.float32, device=device) for _ in range(4)]
    return new


def engram_gate_fwd(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    save_for_backward: bool = True,
    image_token_mask: torch.Tensor | None = None,
    inplace: bool = False,
    *,
    out: torch.Tensor | None = None,
) -> EngramGateFwdResult:
    """Gate the value into every hyper-connection branch of the hidden states (TileKernels 2.1.0's call).

    Args:
        hidden_states: (T, hc, H) bf16, contiguous. hc in 1..8, H a multiple of 64 up to 16384, T >= 0.
        kv: (T, hc + 1, H) bf16: kv[:, :hc] the key of each branch, kv[:, hc] the value shared by all
            branches. Last dimension contiguous, other strides free.
        weight_fused: (hc, H) fp32, contiguous (engram_fused_weight); at an address that is not a 16-byte
            multiple it is first copied to an aligned buffer.
        eps, clamp_value: finite floats > 0 (RMSNorm epsilon; clamp of the signed square root).
        save_for_backward: also return dot, gate_score, rstd_x, rstd_k for engram_gate_bwd.
        image_token_mask: optional (T,) bool, contiguous; True marks an image token, for which the gate
            does nothing: output[t] = hidden_states[t] bit for bit and its saved values are 0. None is
            its own compiled variant (text-only batches run the kernel without any mask test).
        inplace: write the output into hidden_states (returned as output). Not with save_for_backward
            (the backward reads hidden_states) nor with out=; hidden_states must not overlap another input.
        out: optional (T, hc, H) bf16 contiguous buffer on the same device, not overlapping any input.

    Returns:
        EngramGateFwdResult(output, dot, gate_score, rstd_x, rstd_k), a tuple: output (T, hc, H) bf16; the
        four saved tensors (T, hc) fp32, or None when save_for_backward is False.
    """
    if traced(hidden_states):  # torch.compile, fake tensors, make_fx: the torch.library ops (_torch_ops.py)
        args = (hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out)
        _check(*args, memory=False)
        eps, clamp_value = float(eps), float(clamp_value)  # the ops' schemas take floats
        head = (hidden_states, kv, weight_fused, eps, clamp_value)
        if inplace:
            op('engram_gate_fwd_inplace')(*head, image_token_mask)
            return EngramGateFwdResult(hidden_states, None, None, None, None)
        if out is None:
            result = op('engram_gate_fwd')(*head, save_for_backward, image_token_mask)
            return EngramGateFwdResult(*result) if save_for_backward else EngramGateFwdResult(result[0], *[None] * 4)
        if save_for_backward:
            return EngramGateFwdResult(out, *op('engram_gate_fwd_out')(*head, image_token_mask, out))
        op('engram_gate_fwd_out_nosave')(*head, image_token_mask, out)
        return EngramGateFwdResult(out, None, None, None, None)
    return _eager(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out)


def engram_gate_fwd_config(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    save_for_backward: bool = True,
    image_token_mask: torch.Tensor | None = None,
    inplace: bool = False,
    *,
    out: torch.Tensor | None = None,
) -> EngramGateFwdConfig:
    """The kernel configuration engram_gate_fwd launches for these arguments (validated alike; no launch)."""
    args = (hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace, out)
    backend = _check(*args, memory=True)
    return _launcher(backend, hidden_states, kv, save_for_backward, image_token_mask, out).cfg
