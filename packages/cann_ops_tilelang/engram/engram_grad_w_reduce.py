"""engram_grad_w_reduce: finish the Engram RMSNorm weight gradients from per-block partials, in place."""

from __future__ import annotations

import functools
from typing import NamedTuple

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
    check_shape,
    check_tensor,
)

from .engram_grad_w_reduce_kernel import (
    EngramGradWReduceConfig,
    choose_engram_grad_w_reduce_config,
    get_engram_grad_w_reduce_kernel,
)

_NAME = 'engram_grad_w_reduce'


class EngramGradWReduceResult(NamedTuple):
    grad_weight_hidden: torch.Tensor  # (hc, H) fp32, the updated input tensor
    grad_weight_embed: torch.Tensor  # (hc, H) fp32, the updated input tensor


# One launcher per (device, backend, hc, H): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (hc, H, CUDA device index): found there, a call checks in Python only what the entry
# cannot (argument types, alignment, overlaps) and leaves the explanation of a rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}


# (name, dtype, ndim) of the five tensor arguments, in order.
_ARGS = (
    ('grad_w_partial', torch.float32, 3),
    ('weight_hidden', torch.bfloat16, 2),
    ('weight_embed', torch.bfloat16, 2),
    ('grad_weight_hidden', torch.float32, 2),
    ('grad_weight_embed', torch.float32, 2),
)
_GRADS = (3, 4)  # the tensors updated in place, by index into _ARGS


def _check(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed, *, memory) -> str:
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); the backend.

    One pass per kind of check over the five tensors; the check functions run only to raise (this is the
    host path of a launch-bound call)."""
    values = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    for (name, dtype, ndim), value in zip(_ARGS, values, strict=True):
        check_tensor(name, value, dtype=dtype, ndim=ndim)
    _, hc, hidden = grad_w_partial.shape
    check_hc_hidden(_NAME, hc, hidden)
    weight_shape = grad_w_partial.shape[1:]
    for (name, _, _), value in zip(_ARGS[1:], values[1:], strict=True):
        if value.shape != weight_shape:
            check_shape(name, value, (hc, hidden))
    spans = [] if memory else None  # all five are contiguous: each occupies [data_ptr, data_ptr + nbytes)
    for (name, _, _), value in zip(_ARGS, values, strict=True):
        if not value.is_contiguous():
            check_contiguous(name, value)
        if memory:
            start = value.data_ptr()
            if start % ALIGN_BYTES:
                check_aligned(name, value)
            spans.append((start, start + value.nbytes))
    if _overlap(values, spans, *_GRADS):
        raise ValueError(f'{_NAME}: grad_weight_hidden and grad_weight_embed must not overlap')
    for grad_index in _GRADS:
        for index in range(_GRADS[0]):
            if _overlap(values, spans, grad_index, index):
                grad_name, input_name = _ARGS[grad_index][0], _ARGS[index][0]
                raise ValueError(f'{_NAME}: {grad_name} (updated in place) must not alias the input {input_name}')
    return require_accelerator(*values)


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _overlap(values, spans, i: int, j: int) -> bool:
    """Whether values[i] and values[j] share memory (spans None: fake tensors, only the same tensor twice)."""
    if spans is None:
        return values[i] is values[j]
    (a0, a1), (b0, b1) = spans[i], spans[j]
    return a0 < b1 and b0 < a1 and values[i].device == values[j].device


def _launcher(backend, grad_w_partial) -> Launcher:
    _, hc, hidden = grad_w_partial.shape
    device = grad_w_partial.device
    key = (device, backend, hc, hidden)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_grad_w_reduce_config(backend=backend, hc=hc, hidden=hidden, num_cores=get_num_cores(device))
        launcher = _LAUNCHERS[key] = Launcher(get_engram_grad_w_reduce_kernel, cfg, device)
    return launcher


def _fast_launcher(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    """The _CHECKED launcher of a call whose remaining checks the entry makes: plain tensors on a GPU,
    aligned, the gradients overlapping nothing; None sends the call the full way.

    The spans are those of the layout the entry accepts ((P, hc, H) and (hc, H) contiguous, fp32 partials and
    gradients, bf16 weights, hc and H those of the key): a call with another layout is rejected by the entry
    before any launch, whatever its spans are."""
    plain = PLAIN_TENSOR_TYPES
    if not (
        type(grad_w_partial) in plain
        and type(weight_hidden) in plain
        and type(weight_embed) in plain
        and type(grad_weight_hidden) in plain
        and type(grad_weight_embed) in plain
        and grad_w_partial.is_cuda
        and grad_w_partial.dim() == 3
    ):
        return None
    num_partials, hc, hidden = grad_w_partial.shape
    launcher = _CHECKED.get((hc, hidden, grad_w_partial.get_device()))
    if launcher is None or not num_partials:
        return None
    partial = grad_w_partial.data_ptr()
    w_hidden = weight_hidden.data_ptr()
    w_embed = weight_embed.data_ptr()
    g_hidden = grad_weight_hidden.data_ptr()
    g_embed = grad_weight_embed.data_ptr()
    if (partial | w_hidden | w_embed | g_hidden | g_embed) % ALIGN_BYTES:
        return None
    weight_bytes = 2 * hc * hidden
    grad_bytes = 2 * weight_bytes
    partial_end = partial + num_partials * grad_bytes
    w_hidden_end = w_hidden + weight_bytes
    w_embed_end = w_embed + weight_bytes
    g_hidden_end = g_hidden + grad_bytes
    g_embed_end = g_embed + grad_bytes
    # Each gradient against the partials, the weights and the other gradient (on one device or not: the
    # full way tells).
    if (
        (g_hidden < partial_end and partial < g_hidden_end)
        or (g_hidden < w_hidden_end and w_hidden < g_hidden_end)
        or (g_hidden < w_embed_end and w_embed < g_hidden_end)
        or (g_embed < partial_end and partial < g_embed_end)
        or (g_embed < w_hidden_end and w_hidden < g_embed_end)
        or (g_embed < w_embed_end and w_embed < g_embed_end)
        or (g_hidden < g_embed_end and g_embed < g_hidden_end)
    ):
        return None
    return launcher


def _eager(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """The call on real tensors: every check, then the launch (also the torch.library op's kernel)."""
    args = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    launcher = _fast_launcher(*args)
    if launcher is not None:
        launch_or_explain(launcher, args, _check_real, *args)
        return
    backend = _check(*args, memory=True)
    launcher = _launcher(backend, grad_w_partial)
    if grad_w_partial.shape[0] == 0:  # empty sum: nothing to add
        return
    launcher.launch(*args)
    if launcher.checks_arguments:
        _, hc, hidden = grad_w_partial.shape
        _CHECKED[(hc, hidden, grad_w_partial.get_device())] = launcher


def _fake(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """While torch traces: the checks that need no memory (the op writes its gradients in place)."""
    _check(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed, memory=False)


def engram_grad_w_reduce(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> EngramGradWReduceResult:
    """Accumulate the weight gradients in place (fp32):

        s = sum_p grad_w_partial[p]
        grad_weight_hidden += s * float(weight_embed)
        grad_weight_embed  += s * float(weight_hidden)

    Args:
        grad_w_partial: (P, hc, H) fp32; any P >= 0 (P = 0 leaves the gradients unchanged).
        weight_hidden, weight_embed: (hc, H) bf16.
        grad_weight_hidden, grad_weight_embed: (hc, H) fp32, updated in place. They must
            not overlap each other or any input (ValueError).

    All tensors contiguous and 16-byte aligned, on one device; hc in 1..8, H a multiple of 64 up to 16384.

    Returns:
        EngramGradWReduceResult(grad_weight_hidden, grad_weight_embed): the two updated tensors.

    The fp32 sum over P runs in another order than torch's, so results differ from an fp32
    reference by rounding only (a few ulps of sum_p |partial[p]| * |w|).
    """
    if traced(grad_w_partial):  # torch.compile, fake tensors, make_fx: the torch.library op (_torch_ops.py)
        args = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
        _check(*args, memory=False)
        op('engram_grad_w_reduce')(*args)
    else:
        _eager(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    # EngramGradWReduceResult(...) without the NamedTuple's Python-level __new__ (the host path of every call).
    return tuple.__new__(EngramGradWReduceResult, (grad_weight_hidden, grad_weight_embed))


def engram_grad_w_reduce_config(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> EngramGradWReduceConfig:
    """The kernel configuration engram_grad_w_reduce launches for these arguments (validated alike; no launch)."""
    args = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    return _launcher(_check(*args, memory=True), grad_w_partial).cfg
