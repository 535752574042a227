"""engram_grad_w_reduce: finish the Engram RMSNorm weight gradients from per-block partials, in place."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import require_accelerator
from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.operator import Operator, traced
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_contiguous,
    check_shape,
    check_tensor,
)

from .engram_grad_w_reduce_kernel import choose_engram_grad_w_reduce_config, get_engram_grad_w_reduce_kernel


class EngramGradWReduceResult(NamedTuple):
    grad_weight_hidden: torch.Tensor  # (hc, H) fp32, the updated input tensor
    grad_weight_embed: torch.Tensor  # (hc, H) fp32, the updated input tensor


# The five tensor arguments in order (the last two updated in place), their dtypes and ranks.
_NAMES = ('grad_w_partial', 'weight_hidden', 'weight_embed', 'grad_weight_hidden', 'grad_weight_embed')
_DTYPES = (torch.float32, torch.bfloat16, torch.bfloat16, torch.float32, torch.float32)
_NDIMS = (3, 2, 2, 2, 2)
# (gradient, other tensor) of each overlap the contract refuses, by index, in the order of its checks
_OVERLAPS = ((3, 4), (3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2))


def _check(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed, *, memory=True) -> str:
    """The backend of valid arguments: one pass per kind of check; the check functions run only to raise."""
    values = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    for name, dtype, ndim, value in zip(_NAMES, _DTYPES, _NDIMS, values, strict=True):
        check_tensor(name, value, dtype=dtype, ndim=ndim)
    _, hc, hidden = grad_w_partial.shape
    check_hc_hidden(OP.name, hc, hidden)
    for name, value in zip(_NAMES[1:], values[1:], strict=True):
        if value.shape != grad_w_partial.shape[1:]:
            check_shape(name, value, (hc, hidden))
    spans = [] if memory else None  # all five are contiguous: each occupies [data_ptr, data_ptr + nbytes)
    for name, value in zip(_NAMES, values, strict=True):
        if not value.is_contiguous():
            check_contiguous(name, value)
        if memory:
            start = value.data_ptr()
            if start % ALIGN_BYTES:
                check_aligned(name, value)
            spans.append((start, start + value.nbytes))
    for grad, other in _OVERLAPS:
        if _overlap(values, spans, grad, other):
            if other == 4:
                raise ValueError(f'{OP.name}: grad_weight_hidden and grad_weight_embed must not overlap')
            raise ValueError(f'{OP.name}: {_NAMES[grad]} (updated in place) must not alias the input {_NAMES[other]}')
    return require_accelerator(*values)


def _overlap(values, spans, i: int, j: int) -> bool:
    """Whether values[i] and values[j] share memory (spans None: fake tensors, only the same tensor twice)."""
    if spans is None:
        return values[i] is values[j]
    (a0, a1), (b0, b1) = spans[i], spans[j]
    return a0 < b1 and b0 < a1 and values[i].device == values[j].device


OP = Operator('engram_grad_w_reduce', _check, choose_engram_grad_w_reduce_config, get_engram_grad_w_reduce_kernel)


def _plan(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    backend = OP.check(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    _, hc, hidden = grad_w_partial.shape
    return OP.launcher(backend, grad_w_partial.device, hc=hc, hidden=hidden)


def _eager(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """Every check, then the launch. Fast path: by (hc, H, CUDA index), for plain tensors, aligned, P > 0, neither
    gradient overlapping another tensor in the layout the entry accepts (it rejects any other before a launch)."""
    args = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    plain = PLAIN_TENSOR_TYPES
    if (
        type(grad_w_partial) in plain
        and type(weight_hidden) in plain
        and type(weight_embed) in plain
        and type(grad_weight_hidden) in plain
        and type(grad_weight_embed) in plain
        and grad_w_partial.is_cuda
        and grad_w_partial.dim() == 3
    ):
        num_partials, hc, hidden = grad_w_partial.shape
        launcher = OP.fast.get((hc, hidden, grad_w_partial.get_device()))
        if launcher is not None and num_partials:
            p, wh, we = grad_w_partial.data_ptr(), weight_hidden.data_ptr(), weight_embed.data_ptr()
            gh, ge = grad_weight_hidden.data_ptr(), grad_weight_embed.data_ptr()
            w = 2 * hc * hidden  # bytes of a weight; a gradient has g = 2 * w, the partials P * g
            g = 2 * w
            p_end, wh_end, we_end = p + num_partials * g, wh + w, we + w
            gh_end, ge_end = gh + g, ge + g
            # Each gradient against the partials, the weights and the other gradient (on one device or not: the
            # full way tells).
            if not (
                (p | wh | we | gh | ge) % ALIGN_BYTES
                or (gh < p_end and p < gh_end)
                or (gh < wh_end and wh < gh_end)
                or (gh < we_end and we < gh_end)
                or (ge < p_end and p < ge_end)
                or (ge < wh_end and wh < ge_end)
                or (ge < we_end and we < ge_end)
                or (gh < ge_end and ge < gh_end)
            ):
                OP.launch(launcher, args, *args)
                return
    launcher = _plan(*args)
    if grad_w_partial.shape[0]:  # P = 0, the empty sum: nothing to add
        launcher.launch(*args)
        OP.remember((*grad_w_partial.shape[1:], grad_w_partial.get_device()), launcher)


def _fake(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    OP.check(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed, memory=False)


_SCHEMA = '(Tensor grad_w_partial, Tensor weight_hidden, Tensor weight_embed, Tensor(a!) grad_weight_hidden, '
_in_place = OP.define('engram_grad_w_reduce', _SCHEMA + 'Tensor(b!) grad_weight_embed) -> ()', _eager, _fake)


@OP.public(_plan)
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
    if not traced(grad_w_partial):
        _eager(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    else:
        args = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
        OP.check(*args, memory=False)
        _in_place(*args)
    # EngramGradWReduceResult(...) without the NamedTuple's Python-level __new__ (the host path of every call).
    return tuple.__new__(EngramGradWReduceResult, (grad_weight_hidden, grad_weight_embed))
