"""norm_forward: RMSNorm of each row of x, optionally after a residual add (docs/norm.md)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor
from cann_ops_tilelang.validation import batch_rows, check_row_starts

from ._norm_common import any_strided, check_hidden, check_same_dtype, forward_launch_args
from .norm_forward_kernel import choose_norm_forward_config, get_norm_forward_kernel

DTYPES = (torch.bfloat16, torch.float32)


class NormForwardResult(NamedTuple):
    out: torch.Tensor  # (T, H) x's dtype
    rstd: torch.Tensor | None  # (T,) fp32 with with_rstd
    norm_input: torch.Tensor  # residual_out (x + residual), or x itself without residual


def _rules(name, x, weight, residual, out, residual_out, memory):
    check_same_dtype(name, x, weight=weight, residual=residual, out=out, residual_out=residual_out)
    ignored = residual is None  # residual_out is ignored without residual
    check_row_starts(name, memory, x=x, residual=residual, out=out, residual_out=None if ignored else residual_out)


def _strided(x, residual, out, residual_out) -> bool:
    """Whether the call takes the kernels of strided rows (residual_out counts only with residual)."""
    return any_strided(x, residual, out, residual_out if residual is not None else None)


OP = Operator(
    'norm_forward',
    tensor('x', DTYPES, 'T, H', layout='rows'),
    tensor('weight', DTYPES, 'H', optional=True),
    scalar('eps', 'positive'),
    tensor('residual', DTYPES, 'T, H', optional=True, layout='rows'),
    scalar('out_scale', 'float'),
    tensor('out', DTYPES, 'T, H', optional=True, written='written', layout='rows'),
    tensor('residual_out', DTYPES, 'T, H', optional=True, written='written', layout='rows'),
    scalar('with_rstd', 'bool'),
    limits=check_hidden,
    extra=_rules,
    choice=lambda x, weight, residual, out, residual_out, with_rstd: {
        'hidden': x.shape[1],
        'dtype': x.dtype,
        'with_weight': weight is not None,
        'with_residual': residual is not None,
        'with_rstd': with_rstd,
        'strided_rows': _strided(x, residual, out, residual_out),
    },
    choose_config=choose_norm_forward_config,
    get_kernel=get_norm_forward_kernel,
)


def _run(x, weight, eps, residual, out_scale, out, residual_out, with_rstd, rstd=None) -> NormForwardResult:
    """Every check (or the fast path's), the outputs the call did not give, the launch (none for T = 0). Fast
    path: by (H, dtype, CUDA index, weight given, residual given, with_rstd), for T > 0 and contiguous rows
    (strided rows take the full check, their alignment included)."""
    args = (x, weight, eps, residual, out_scale, out, residual_out, with_rstd)
    key = None
    shape = OP.fast_ok(*args)
    if shape is not None and shape[0] and not _strided(x, residual, None, None):
        key = (shape[1], x.dtype, x.get_device(), weight is None, residual is None, with_rstd)
    launcher, fast = OP.prepare(key, args)
    if out is None:
        out = x.new_empty(x.shape)
    if residual is not None and residual_out is None:
        residual_out = x.new_empty(x.shape)
    if with_rstd and rstd is None:
        rstd = x.new_empty(x.shape[:1], dtype=torch.float32)
    launch_args = forward_launch_args(x, weight, residual, residual_out, out, rstd, None, None, None, eps, out_scale)
    OP.finish(launcher, fast, key, launch_args, args, empty=not x.shape[0])
    return tuple.__new__(NormForwardResult, (out, rstd, x if residual is None else residual_out))


def _eager(x, weight, eps, residual, out_scale, out, residual_out, with_rstd) -> NormForwardResult:
    return _run(x, weight, eps, residual, out_scale, out, residual_out, with_rstd)


def _fake(x, weight, eps, residual, out_scale, out, residual_out, with_rstd) -> NormForwardResult:
    """While torch traces: what `_run` returns (new tensors contiguous)."""
    OP.check(x, weight, eps, residual, out_scale, out, residual_out, with_rstd, memory=False)
    out = torch.empty_like(x) if out is None else out
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    rstd = x.new_empty(x.shape[:1], dtype=torch.float32) if with_rstd else None
    return NormForwardResult(out, rstd, x if residual is None else residual_out)


def _listed(result: NormForwardResult, residual) -> list:
    """The functional op's outputs: out, then rstd with with_rstd, then residual_out with residual (a custom op
    may not return an input, so never x)."""
    return [result.out, *([result.rstd] if result.rstd is not None else []), *([] if residual is None else [
        result.norm_input])]  # fmt: skip


_HEAD = 'Tensor x, Tensor? weight, float eps, Tensor? residual, float out_scale'
_functional = OP.define(
    'norm_forward',
    f'({_HEAD}, bool with_rstd) -> Tensor[]',
    lambda x, w, eps, res, scale, with_rstd: _listed(_eager(x, w, eps, res, scale, None, None, with_rstd), res),
    lambda x, w, eps, res, scale, with_rstd: _listed(_fake(x, w, eps, res, scale, None, None, with_rstd), res),
)
# The out= form writes every output into given buffers (the traced call allocates those the caller did not give).
_into = OP.define(
    'norm_forward_out',
    f'({_HEAD}, Tensor(a!) out, Tensor(b!)? residual_out, Tensor(c!)? rstd) -> ()',
    lambda x, w, eps, res, scale, out, res_out, rstd: _run(x, w, eps, res, scale, out, res_out, rstd is not None, rstd),
    lambda x, w, eps, res, scale, out, res_out, rstd: None,
)


def _traced(x, weight, eps, residual, out_scale, out, residual_out, with_rstd) -> NormForwardResult:
    """torch.compile, fake tensors, make_fx: the op of the call's form."""
    head = (x, weight, float(eps), residual, float(out_scale))
    if out is None and residual_out is None:
        values = iter(_functional(*head, with_rstd))
        out = next(values)
        rstd = next(values) if with_rstd else None
        return NormForwardResult(out, rstd, x if residual is None else next(values))
    out = torch.empty_like(x) if out is None else out
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    rstd = x.new_empty(x.shape[:1], dtype=torch.float32) if with_rstd else None
    _into(*head, out, residual_out if residual is not None else None, rstd)
    return NormForwardResult(out, rstd, x if residual is None else residual_out)


def _batched(function, x, weight, eps, residual, out_scale, out, residual_out, with_rstd) -> NormForwardResult:
    """A (B, T, H) x (the peer's batched call): the call on its B * T rows, the results (B, T, ...)."""
    lead = tuple(x.shape[:2])
    rows = functools.partial(batch_rows, 'norm_forward', lead=lead)
    residual_out = None if residual is None else residual_out  # ignored without residual, as unbatched
    flat = function(rows('x', x), weight, eps, rows('residual', residual), out_scale, rows('out', out),
                    rows('residual_out', residual_out), with_rstd)  # fmt: skip
    norm_input = x if residual is None else residual_out if residual_out is not None else flat.norm_input.view(x.shape)
    return NormForwardResult(
        flat.out.view(x.shape) if out is None else out,
        None if flat.rstd is None else flat.rstd.view(lead),
        norm_input,
    )


@OP.public(_eager, traced=_traced, batched=_batched)
def norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
    out_scale: float = 1.0,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    with_rstd: bool = False,
) -> NormForwardResult:
    """RMSNorm with an optional residual add (TileKernels 2.1.0's call). Per row, in fp32:

        r = x + residual, rounded to x's dtype (r = x without residual)
        rstd = 1 / sqrt(sum(r * r) / H + eps)
        out = (r * rstd) * (weight * out_scale), rounded to x's dtype (weight 1 when None)

    Args:
        x: (T, H) bf16 or fp32, rows (see below); T >= 0 (T = 0: empty results, no launch), H a multiple of 64
            up to 16384, T * H < 2**31. Or (B, T, H), as the peer's batched call: its B * T rows (viewable as
            (B * T, H): a strided x whose batches are not one row stride apart is refused), and the tensors of
            x's shape (residual, out, residual_out) and the results (B, T, ...).
        weight: (H,) of x's dtype, contiguous, or None (unit weight).
        eps: finite float > 0.
        residual: optional (T, H) of x's dtype, rows.
        out_scale: finite float, multiplies the weight before the product.
        out: optional (T, H) buffer of x's dtype for the output, rows.
        residual_out: optional (T, H) buffer of x's dtype for r, rows (ignored without residual).
        with_rstd: also return rstd.
        Rows (as TileKernels takes them): the last dimension contiguous, the row stride free, each tensor its
        own; a strided one (row stride other than H, T > 1) must start each row on 16 bytes (row stride in bytes
        and data_ptr() multiples of 16; ValueError naming it) and runs kernels of strided rows (the strides are
        launch arguments). Buffers are on x's device and overlap no other argument; the outputs the call
        allocates are contiguous.

    Returns:
        NormForwardResult(out, rstd, norm_input), a tuple: out (T, H) x's dtype; rstd (T,) (x.shape[:-1]) fp32 or None;
        norm_input r (residual_out), or x itself without residual (what norm_backward takes as x).
    """
