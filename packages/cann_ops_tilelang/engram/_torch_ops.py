"""The Engram operators as torch.library custom ops `cann_ops_tilelang::<name>` (see _torch_library.py).

Each public operator has one op per calling form whose aliasing torch must know statically: the functional
form returns new tensors; an `out=` form (`<name>_out`) and the in-place forward (`engram_gate_fwd_inplace`)
declare the buffer they write in `mutates_args` and return only the tensors they allocate (a custom op may
not return an input); the Sinkhorn buffers, grad_w_reduce's gradients and momentum_buffer are declared
mutated the same way. The real kernel of every op is the operator's eager path (all checks, including those
that need memory: alignment and overlap, then the launch); the fake kernel runs the checks that need no
memory, with the same typed errors, and allocates outputs of the exact shapes, dtypes and strides. Nothing
here touches a device at import; P of the partial-sum outputs (a device's core count) is read when a fake
kernel first runs for a device.
"""

from __future__ import annotations

import importlib

import torch

from cann_ops_tilelang._torch_library import NAMESPACE


def _module(name: str):
    # The package binds each operator's name to its function, so the module comes from the import system.
    return importlib.import_module(f'{__package__}.{name}')


_fw = _module('engram_fused_weight')


def _name(op: str) -> str:
    return f'{NAMESPACE}::{op}'


def _op(op: str):
    return getattr(getattr(torch.ops, NAMESPACE), op).default


# ---------------------------------------------------------------- engram_fused_weight


@torch.library.custom_op(_name('engram_fused_weight'), mutates_args=())
def _fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    return _fw._eager(weight_hidden, weight_embed, None)


@_fused_weight.register_fake
def _(weight_hidden, weight_embed):
    return _fw._fake(weight_hidden, weight_embed, None)


@torch.library.custom_op(_name('engram_fused_weight_out'), mutates_args=('out',))
def _fused_weight_out(weight_hidden: torch.Tensor, weight_embed: torch.Tensor, out: torch.Tensor) -> None:
    _fw._eager(weight_hidden, weight_embed, out)


@_fused_weight_out.register_fake
def _(weight_hidden, weight_embed, out):
    _fw._fake(weight_hidden, weight_embed, out)


# ---------------------------------------------------------------- engram_gate_fwd

_fwd = _module('engram_gate_fwd')


@torch.library.custom_op(_name('engram_gate_fwd'), mutates_args=())
def _gate_fwd(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    save_for_backward: bool,
    image_token_mask: torch.Tensor | None,
) -> list[torch.Tensor]:
    """[output, dot, gate_score, rstd_x, rstd_k], or [output] without save_for_backward."""
    result = _fwd._eager(
        hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, False, None
    )
    return list(result) if save_for_backward else [result.output]


@_gate_fwd.register_fake
def _(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask):
    args = (hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask)
    return _fwd._fake(*args, False, None)


# With a mutated argument an op may not return a list (functionalization needs a fixed output count), so
# out= has one op per save_for_backward.
@torch.library.custom_op(_name('engram_gate_fwd_out'), mutates_args=('out',))
def _gate_fwd_out(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    image_token_mask: torch.Tensor | None,
    out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """save_for_backward=True into `out`: (dot, gate_score, rstd_x, rstd_k)."""
    result = _fwd._eager(hidden_states, kv, weight_fused, eps, clamp_value, True, image_token_mask, False, out)
    return result.dot, result.gate_score, result.rstd_x, result.rstd_k


@_gate_fwd_out.register_fake
def _(hidden_states, kv, weight_fused, eps, clamp_value, image_token_mask, out):
    return tuple(_fwd._fake(hidden_states, kv, weight_fused, eps, clamp_value, True, image_token_mask, False, out))


@torch.library.custom_op(_name('engram_gate_fwd_out_nosave'), mutates_args=('out',))
def _gate_fwd_out_nosave(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    image_token_mask: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """save_for_backward=False into `out`."""
    _fwd._eager(hidden_states, kv, weight_fused, eps, clamp_value, False, image_token_mask, False, out)


@_gate_fwd_out_nosave.register_fake
def _(hidden_states, kv, weight_fused, eps, clamp_value, image_token_mask, out):
    _fwd._fake(hidden_states, kv, weight_fused, eps, clamp_value, False, image_token_mask, False, out)


@torch.library.custom_op(_name('engram_gate_fwd_inplace'), mutates_args=('hidden_states',))
def _gate_fwd_inplace(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    image_token_mask: torch.Tensor | None,
) -> None:
    """inplace=True (save_for_backward=False): the output written into hidden_states."""
    _fwd._eager(hidden_states, kv, weight_fused, eps, clamp_value, False, image_token_mask, True, None)


@_gate_fwd_inplace.register_fake
def _(hidden_states, kv, weight_fused, eps, clamp_value, image_token_mask):
    _fwd._fake(hidden_states, kv, weight_fused, eps, clamp_value, False, image_token_mask, True, None)


# ---------------------------------------------------------------- engram_gate_bwd

_bwd = _module('engram_gate_bwd')


@torch.library.custom_op(_name('engram_gate_bwd'), mutates_args=())
def _gate_bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    clamp_value: float,
    image_token_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_hidden_states, grad_kv, grad_w_partial)."""
    saved = (dot, gate_score, rstd_x, rstd_k)
    return tuple(_bwd._eager(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask))


@_gate_bwd.register_fake
def _(grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value, image_token_mask):
    saved = (dot, gate_score, rstd_x, rstd_k)
    return tuple(_bwd._fake(grad_out, hidden_states, kv, weight_fused, saved, clamp_value, image_token_mask))


# ---------------------------------------------------------------- engram_grad_w_reduce

_gwr = _module('engram_grad_w_reduce')


@torch.library.custom_op(_name('engram_grad_w_reduce'), mutates_args=('grad_weight_hidden', 'grad_weight_embed'))
def _grad_w_reduce(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> None:
    """grad_weight_hidden and grad_weight_embed accumulated in place."""
    _gwr._eager(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)


@_grad_w_reduce.register_fake
def _(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    _gwr._fake(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)


# ---------------------------------------------------------------- engram_hash

_hash = _module('engram_hash')


@torch.library.custom_op(_name('engram_hash'), mutates_args=())
def _engram_hash(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
    image_token_mask: torch.Tensor | None,
) -> torch.Tensor:
    return _hash._eager(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, None)


@_engram_hash.register_fake
def _(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask):
    return _hash._fake(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, None)


@torch.library.custom_op(_name('engram_hash_out'), mutates_args=('out',))
def _engram_hash_out(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
    image_token_mask: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    _hash._eager(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out)


@_engram_hash_out.register_fake
def _(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out):
    _hash._fake(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out)


# ---------------------------------------------------------------- the Sinkhorn operators

_mom = _module('engram_sinkhorn_momentum_update')
_step = _module('engram_sinkhorn_step')
_reduce = _module('engram_sinkhorn_step_reduce')
_fin = _module('engram_sinkhorn_finalize')


@torch.library.custom_op(_name('engram_sinkhorn_momentum_update'), mutates_args=('momentum_buffer',))
def _momentum_update(grad: torch.Tensor, momentum_buffer: torch.Tensor, beta1: float, nesterov: bool) -> torch.Tensor:
    """sinkhorn_input; momentum_buffer updated in place."""
    return _mom._eager(grad, momentum_buffer, beta1, nesterov)


@_momentum_update.register_fake
def _(grad, momentum_buffer, beta1, nesterov):
    return _mom._fake(grad, momentum_buffer, beta1, nesterov)


@torch.library.custom_op(_name('engram_sinkhorn_step'), mutates_args=('row_scale',))
def _sinkhorn_step(
    matrix: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_norm, col_sumsq_partial); row_scale updated in place."""
    return tuple(_step._eager(matrix, row_scale, col_scale, eps))


@_sinkhorn_step.register_fake
def _(matrix, row_scale, col_scale, eps):
    return tuple(_step._fake(matrix, row_scale, col_scale, eps))


@torch.library.custom_op(_name('engram_sinkhorn_step_reduce'), mutates_args=('col_sumsq',))
def _sinkhorn_step_reduce(col_sumsq_partial: torch.Tensor, col_sumsq: torch.Tensor) -> None:
    """col_sumsq overwritten with the fixed-order sum of the partials."""
    _reduce._eager(col_sumsq_partial, col_sumsq)


@_sinkhorn_step_reduce.register_fake
def _(col_sumsq_partial, col_sumsq):
    _reduce._fake(col_sumsq_partial, col_sumsq)


@torch.library.custom_op(_name('engram_sinkhorn_finalize'), mutates_args=())
def _sinkhorn_finalize(
    matrix: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, eps: float, alpha: float
) -> torch.Tensor:
    return _fin._eager(matrix, row_scale, col_scale, eps, alpha, None)


@_sinkhorn_finalize.register_fake
def _(matrix, row_scale, col_scale, eps, alpha):
    return _fin._fake(matrix, row_scale, col_scale, eps, alpha, None)


@torch.library.custom_op(_name('engram_sinkhorn_finalize_out'), mutates_args=('out',))
def _sinkhorn_finalize_out(
    matrix: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, eps: float, alpha: float, out: torch.Tensor
) -> None:
    _fin._eager(matrix, row_scale, col_scale, eps, alpha, out)


@_sinkhorn_finalize_out.register_fake
def _(matrix, row_scale, col_scale, eps, alpha, out):
    _fin._fake(matrix, row_scale, col_scale, eps, alpha, out)


# The ops of each public operator (tests check that every public operator has its op(s)).
OPS: dict[str, tuple[str, ...]] = {
    'engram_fused_weight': ('engram_fused_weight', 'engram_fused_weight_out'),
    'engram_gate_fwd': (
        'engram_gate_fwd',
        'engram_gate_fwd_out',
        'engram_gate_fwd_out_nosave',
        'engram_gate_fwd_inplace',
    ),
    'engram_gate_bwd': ('engram_gate_bwd',),
    'engram_grad_w_reduce': ('engram_grad_w_reduce',),
    'engram_hash': ('engram_hash', 'engram_hash_out'),
    'engram_sinkhorn_momentum_update': ('engram_sinkhorn_momentum_update',),
    'engram_sinkhorn_step': ('engram_sinkhorn_step',),
    'engram_sinkhorn_step_reduce': ('engram_sinkhorn_step_reduce',),
    'engram_sinkhorn_finalize': ('engram_sinkhorn_finalize', 'engram_sinkhorn_finalize_out'),
}


# ---------------------------------------------------------------- autograd


def _mark_non_differentiable(ctx, inputs, output) -> None:
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    if tensors:
        ctx.mark_non_differentiable(*tensors)


def _no_backward(ctx, *grads):
    raise RuntimeError(
        'the cann_ops_tilelang Engram operators are not differentiated by autograd: their gradients are the '
        'explicit operators (engram_gate_bwd, engram_grad_w_reduce)'
    )


# As in eager, where the kernels write tensors autograd never sees, no output of a functional op requires
# grad even when an input (a weight parameter) does, so AOTAutograd traces no backward through them. torch
# takes autograd formulas for functional ops only: an op that writes an input (out=, in place, the buffer
# updates) keeps torch's default, whose outputs require grad where an input does and raise on backward.
FUNCTIONAL_OPS = tuple(name for forms in OPS.values() for name in forms if not _op(name)._schema.is_mutable)
for _op_name in FUNCTIONAL_OPS:
    torch.library.register_autograd(_name(_op_name), _no_backward, setup_context=_mark_non_differentiable)
