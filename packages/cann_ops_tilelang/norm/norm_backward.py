"""norm_backward: the gradients of norm_forward's RMSNorm, the weight gradient accumulated deterministically
(docs/norm.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor
from cann_ops_tilelang.validation import check_row_starts

from ._norm_common import any_strided, check_hidden, check_same_dtype, placeholder
from .norm_backward_kernel import choose_norm_backward_config, get_norm_backward_kernel
from .norm_forward import DTYPES


class NormBackwardResult(NamedTuple):
    x_grad: torch.Tensor  # (T, H) x's dtype
    weight_grad: torch.Tensor | None  # (H,): the given buffer, or weight's dtype; None without weight


def _rules(name, out_grad, x, weight, residual_out_grad, weight_grad, memory):
    check_same_dtype(name, x, out_grad=out_grad, weight=weight, residual_out_grad=residual_out_grad)
    check_row_starts(name, memory, out_grad=out_grad, x=x, residual_out_grad=residual_out_grad)
    if weight_grad is not None and weight is None:
        raise ValueError(f'{name}: weight_grad accumulates the gradient of a weight: it needs weight')


def _choice(out_grad, x, weight, residual_out_grad):
    return {
        'hidden': x.shape[1],
        'dtype': x.dtype,
        'with_weight': weight is not None,
        'with_residual_out_grad': residual_out_grad is not None,
        'strided_rows': any_strided(out_grad, x, residual_out_grad),
    }


OP = Operator(
    'norm_backward',
    tensor('out_grad', DTYPES, 'T, H', layout='rows'),
    tensor('x', DTYPES, 'T, H', layout='rows'),
    tensor('weight', DTYPES, 'H', optional=True),
    tensor('rstd', torch.float32, 'T'),
    tensor('residual_out_grad', DTYPES, 'T, H', optional=True, layout='rows'),
    scalar('out_scale', 'float'),
    tensor('weight_grad', (torch.float32, torch.bfloat16), 'H', optional=True, written='updated'),
    limits=check_hidden,
    extra=_rules,
    choice=_choice,
    choose_config=choose_norm_backward_config,
    get_kernel=get_norm_backward_kernel,
)


def _eager(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad) -> NormBackwardResult:
    """Every check (or the fast path's), then the row kernel and, with a weight, the reduction of its partials
    (none for T = 0). Fast path, for T > 0: by (H, dtype, CUDA index, weight given, residual_out_grad given,
    weight_grad's dtype or None), whose entry is the pair of launchers; strided rows take the full check (their
    alignment included) and the stage 'reduce' of contiguous rows' configuration (it reads only the partials)."""
    args = (out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad)
    key = entry = None
    shape = OP.fast_ok(*args)
    if shape is not None and shape[0] and not any_strided(out_grad, x, residual_out_grad):
        key = (shape[1], x.dtype, x.get_device(), weight is None, residual_out_grad is None,
               None if weight_grad is None else weight_grad.dtype)  # fmt: skip
        entry = OP.fast.get(key)
    num_tokens, hidden = x.shape
    if entry is None:
        rows = OP.plan(*args)
        reduce = None
        if weight is not None:
            reduce = OP.launcher(
                rows.cfg.backend, rows.device, **_choice(out_grad, x, weight, residual_out_grad), stage='reduce',
                weight_grad_dtype=weight.dtype if weight_grad is None else weight_grad.dtype,
                accumulate=weight_grad is not None,
            )  # fmt: skip
    else:
        rows, reduce = entry
    x_grad = x.new_empty(x.shape)
    accumulate = weight_grad is not None
    if weight is not None and weight_grad is None:
        weight_grad = weight.new_empty(hidden)
    if not num_tokens:
        if weight is not None and not accumulate:
            weight_grad.zero_()
        return NormBackwardResult(x_grad, weight_grad)
    partials = x.new_empty(rows.cfg.num_partials, hidden, dtype=torch.float32) if weight is not None else None
    launch_args = (
        x,
        placeholder(x.device, x.dtype) if weight is None else weight,
        out_grad,
        rstd,
        placeholder(x.device, x.dtype) if residual_out_grad is None else residual_out_grad,
        x_grad,
        placeholder(x.device, torch.float32) if partials is None else partials,
        float(out_scale),
    )
    if entry is not None:
        OP.launch(rows, launch_args, args)
    else:
        rows.launch(*launch_args)
        if key is not None:
            OP.remember(key, rows, (rows, reduce))
    if reduce is not None:
        reduce.launch(partials, weight_grad)
    return NormBackwardResult(x_grad, weight_grad)


def _fake(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad) -> NormBackwardResult:
    OP.check(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad, memory=False)
    if weight is not None and weight_grad is None:
        weight_grad = weight.new_empty(weight.shape)
    return NormBackwardResult(torch.empty_like(x), weight_grad)


_HEAD = 'Tensor out_grad, Tensor x, Tensor? weight, Tensor rstd, Tensor? residual_out_grad, float out_scale'
_functional = OP.define(
    'norm_backward',
    f'({_HEAD}) -> Tensor[]',
    lambda g, x, w, rstd, rog, scale: [t for t in _eager(g, x, w, rstd, rog, scale, None) if t is not None],
    lambda g, x, w, rstd, rog, scale: [t for t in _fake(g, x, w, rstd, rog, scale, None) if t is not None],
)
# The weight gradient accumulated into a given buffer, written in place.
_accumulate = OP.define(
    'norm_backward_accumulate',
    f'({_HEAD}, Tensor(a!) weight_grad) -> Tensor',
    lambda g, x, w, rstd, rog, scale, wg: _eager(g, x, w, rstd, rog, scale, wg).x_grad,
    lambda g, x, w, rstd, rog, scale, wg: _fake(g, x, w, rstd, rog, scale, wg).x_grad,
)


def _traced(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad) -> NormBackwardResult:
    head = (out_grad, x, weight, rstd, residual_out_grad, float(out_scale))
    if weight_grad is not None:
        return NormBackwardResult(_accumulate(*head, weight_grad), weight_grad)
    values = _functional(*head)
    return NormBackwardResult(values[0], values[1] if weight is not None else None)


@OP.public(_eager, traced=_traced)
def norm_backward(
    out_grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    residual_out_grad: torch.Tensor | None = None,
    out_scale: float = 1.0,
    weight_grad: torch.Tensor | None = None,
) -> NormBackwardResult:
    """The gradients of norm_forward (TileKernels 2.1.0's call). Per row, in fp32:

        xhat = x * rstd, g = out_grad * out_scale, gw = g * weight (g without weight)
        x_grad = (gw - xhat * sum(xhat * gw) / H) * rstd + residual_out_grad, rounded to x's dtype
        weight_grad = weight_grad + sum over the rows of xhat * g

    The weight gradient's sum is deterministic: per-worker partial sums in row order, reduced in worker order
    (no atomics), so a call gives the same bits on every run.

    Args:
        out_grad: (T, H) of x's dtype, rows (below).
        x: (T, H) bf16 or fp32, rows (below): norm_forward's norm_input. T >= 0, H a multiple of 64 up to 16384
            (on Ascend fp32 rows with weight and residual_out_grad up to what fits UB, ValueError beyond),
            T * H < 2**31.
        weight: (H,) of x's dtype, contiguous, or None (unit weight, no weight gradient).
        rstd: (T,) fp32, contiguous: norm_forward's rstd.
        residual_out_grad: optional (T, H) of x's dtype, rows (below): the gradient reaching norm_input by the
            residual path.
        out_scale: finite float, norm_forward's.
        weight_grad: optional (H,) fp32 or bf16 buffer (needs weight), contiguous, apart from every other
            argument: the gradient is added to it in place (fp32 sum, rounded once to its dtype).
        Rows (as TileKernels takes them): the last dimension contiguous, the row stride free, each tensor its
        own; a strided one (row stride other than H, T > 1) must start each row on 16 bytes (row stride in bytes
        and data_ptr() multiples of 16; ValueError naming it) and runs a kernel of strided rows (the strides are
        launch arguments). x_grad is new and contiguous.

    Returns:
        NormBackwardResult(x_grad, weight_grad), a tuple: x_grad (T, H) x's dtype (also the gradient of the
        residual where norm_forward added one); weight_grad the given buffer, or a new (H,) tensor of weight's
        dtype (zeros for T = 0), or None without weight.
    """
