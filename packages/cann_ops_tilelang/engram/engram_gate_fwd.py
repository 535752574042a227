"""engram_gate_fwd: the Engram gate forward (docs/engram.md, "Forward")."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.engram._contract import check_hc_hidden, kv_alignment_bits
from cann_ops_tilelang.operator import Operator, out, scalar, tensor
from cann_ops_tilelang.validation import ALIGN_BYTES, check_no_overlap

from .engram_gate_fwd_kernel import choose_engram_gate_fwd_config, get_engram_gate_fwd_kernel


class EngramGateFwdResult(NamedTuple):
    output: torch.Tensor  # (T, hc, H) bf16: x + gate_score * v (x itself for image tokens)
    dot: torch.Tensor | None  # (T, hc) fp32: sum(x * w * k), unnormalised
    gate_score: torch.Tensor | None  # (T, hc) fp32
    rstd_x: torch.Tensor | None  # (T, hc) fp32
    rstd_k: torch.Tensor | None  # (T, hc) fp32


def _inplace_rules(name, hidden_states, kv, weight_fused, save_for_backward, image_token_mask, inplace, out, memory):
    if not inplace:
        return
    if save_for_backward:
        raise ValueError(
            f'{name}: inplace=True overwrites hidden_states, which the backward needs: use save_for_backward=False'
        )
    if out is not None:
        raise ValueError(f'{name}: inplace=True writes the output into hidden_states: do not also pass out=')
    others = {'kv': kv, 'weight_fused': weight_fused}
    if image_token_mask is not None:
        others['image_token_mask'] = image_token_mask
    check_no_overlap('hidden_states', hidden_states, others, what='written in place', memory=memory)


def _access_vec(x: torch.Tensor, kv: torch.Tensor, out: torch.Tensor | None) -> int:
    """Widest access (8, 4, 2 or 1 bf16 elements) that the addresses of x, kv and out (None: the allocator's,
    aligned) and kv's outer strides all fit: the lowest set bit of their bitwise or (kv_alignment_bits)."""
    bits = x.data_ptr() | kv_alignment_bits(kv)
    if out is not None:
        bits |= out.data_ptr()
    low = bits & -bits  # bytes; 0 where every address and stride is 0
    return 8 if low == 0 or low >= 16 else max(1, low // 2)


def _choice(hidden_states, kv, save_for_backward, image_token_mask, out):
    _, hc, hidden = hidden_states.shape
    has_mask, vec = image_token_mask is not None, _access_vec(hidden_states, kv, out)
    return {'hc': hc, 'hidden': hidden, 'save_for_backward': save_for_backward, 'has_mask': has_mask, 'vec': vec}


OP = Operator(
    'engram_gate_fwd',
    tensor('hidden_states', torch.bfloat16, 'T, hc, hidden'),
    tensor('kv', torch.bfloat16, 'T, hc + 1, hidden', layout='rows'),
    tensor('weight_fused', torch.float32, 'hc, hidden', aligned='copied'),
    scalar('eps', 'positive'),
    scalar('clamp_value', 'positive'),
    scalar('save_for_backward', 'bool'),
    tensor('image_token_mask', torch.bool, 'T', optional=True),
    scalar('inplace', 'bool'),
    out('out', torch.bfloat16, 'T, hc, hidden'),
    limits=check_hc_hidden,
    extra=_inplace_rules,
    choice=_choice,
    choose_config=choose_engram_gate_fwd_config,
    get_kernel=get_engram_gate_fwd_kernel,
)


def _eager(x, kv, w, eps, clamp, save, mask, inplace, out) -> EngramGateFwdResult:
    """Every check, then the launch (also the ops' kernel). Fast path (no inplace or out=, T > 0): by (x.shape[1:],
    CUDA index, save, mask given, access width), after fast_ok and kv's outer strides."""
    key = launcher = None
    shape = OP.fast_ok(x, kv, w, eps, clamp, save, mask, inplace, out)
    if shape is not None and not inplace and kv.dim() == 3:
        stride_t, stride_h, _ = kv.stride()
        if stride_t >= 0 and stride_h >= 0:
            key = (shape[1:], x.get_device(), save, mask is None, _access_vec(x, kv, None))
            launcher = OP.fast.get(key)
    fast = launcher is not None and shape[0]
    if not fast:
        launcher = OP.plan(x, kv, w, eps, clamp, save, mask, inplace, out)
        if w.data_ptr() % ALIGN_BYTES:  # the kernels read it in 16-byte vectors: an aligned copy
            w = w.clone()
    num_tokens, hc, hidden = shape if fast else x.shape
    output = x if inplace else out
    if output is None:
        output = x.new_empty(num_tokens, hc, hidden)  # cheaper than torch.empty(..., device=)
    if save:  # four calls spelled out: a generator and tuple() around them cost more than a call
        new, shape, f32 = x.new_empty, (num_tokens, hc), torch.float32
        saved = (new(shape, dtype=f32), new(shape, dtype=f32), new(shape, dtype=f32), new(shape, dtype=f32))
        outputs = (output, *saved)
    else:
        saved, outputs = (None, None, None, None), (output,)  # no slots for unsaved outputs
    # kv whole: the kernel reads keys and value through its strides (no views to build per call).
    if mask is None:
        launch_args = (x, kv, w, *outputs, float(eps), float(clamp))
    else:
        launch_args = (x, kv, w, mask, *outputs, float(eps), float(clamp))
    if fast:
        OP.launch(launcher, launch_args, (x, kv, w, eps, clamp, save, mask, inplace, out))
    elif num_tokens:  # T = 0: nothing to launch
        launcher.launch(*launch_args)
        if key is not None:
            OP.remember(key, launcher)
    return tuple.__new__(EngramGateFwdResult, (output, *saved))  # without the NamedTuple's Python-level __new__


def _fake(x, kv, w, eps, clamp, save, mask, inplace, out) -> EngramGateFwdResult:
    """While torch traces: the checks that need no memory, then the result (new tensors contiguous)."""
    OP.check(x, kv, w, eps, clamp, save, mask, inplace, out, memory=False)
    output = x if inplace else torch.empty_like(x) if out is None else out  # x: contiguous, so is its empty_like
    saved = [x.new_empty(x.shape[:2], dtype=torch.float32) for _ in range(4)] if save else [None] * 4
    return EngramGateFwdResult(output, *saved)


# A custom op may not return an input: the ops return the tensors the call allocated.
def _outputs(result: EngramGateFwdResult) -> list:
    """The functional op's: the output, then the saved tensors with save_for_backward."""
    return [result.output] if result.dot is None else list(result)


def _written(save: bool, inplace: bool) -> list:
    """[kernel, fake] of an op that writes an argument (out= or in place): they return the saved tensors or None."""

    def form(run):
        if inplace:
            return lambda x, kv, w, eps, clamp, mask: _saved(run(x, kv, w, eps, clamp, save, mask, True, None))
        return lambda x, kv, w, eps, clamp, mask, out: _saved(run(x, kv, w, eps, clamp, save, mask, False, out))

    return [form(_eager), form(_fake)]


def _saved(result: EngramGateFwdResult) -> tuple | None:
    return None if result.dot is None else tuple(result[1:])


# One op per calling form whose aliasing torch must know statically. With a mutated argument an op may not return
# a list (functionalization needs a fixed output count), so out= has one op per save_for_backward.
_functional = OP.define(
    'engram_gate_fwd',
    '(Tensor hidden_states, Tensor kv, Tensor weight_fused, float eps, float clamp_value, bool save_for_backward, '
    'Tensor? image_token_mask) -> Tensor[]',
    lambda x, kv, w, eps, clamp, save, mask: _outputs(_eager(x, kv, w, eps, clamp, save, mask, False, None)),
    lambda x, kv, w, eps, clamp, save, mask: _outputs(_fake(x, kv, w, eps, clamp, save, mask, False, None)),
)
_TAIL = 'Tensor kv, Tensor weight_fused, float eps, float clamp_value, Tensor? image_token_mask'
_OUT = f'(Tensor hidden_states, {_TAIL}, Tensor(a!) out)'
_into_out = OP.define('engram_gate_fwd_out', f'{_OUT} -> (Tensor, Tensor, Tensor, Tensor)', *_written(True, False))
_into_out_nosave = OP.define('engram_gate_fwd_out_nosave', f'{_OUT} -> ()', *_written(False, False))
_in_place = OP.define('engram_gate_fwd_inplace', f'(Tensor(a!) hidden_states, {_TAIL}) -> ()', *_written(False, True))


def _traced(x, kv, w, eps, clamp, save, mask, inplace, out) -> EngramGateFwdResult:
    """torch.compile, fake tensors, make_fx: the torch.library op of the call's form."""
    head = (x, kv, w, float(eps), float(clamp))  # the ops' schemas take floats
    if inplace:
        _in_place(*head, mask)
        return EngramGateFwdResult(x, None, None, None, None)
    if out is None:
        result = _functional(*head, save, mask)
        return EngramGateFwdResult(*result) if save else EngramGateFwdResult(result[0], *[None] * 4)
    if save:
        return EngramGateFwdResult(out, *_into_out(*head, mask, out))
    _into_out_nosave(*head, mask, out)
    return EngramGateFwdResult(out, None, None, None, None)


@OP.public(_eager, traced=_traced)
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
