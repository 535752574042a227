"""moe_swiglu_backward: the SwiGLU backward over the MoE expert layout, recomputing the activation (x_grad, the
weight gradient of the top-k weights, optionally the forward output), TileKernels 2.1.0's `swiglu_backward`.

Also the eager path moe_swiglu_backward_and_per_token_cast shares (one kernel family serves both:
moe_swiglu_backward_kernel.py).
"""

from __future__ import annotations

import torch

from cann_ops_tilelang.kernel_target import placeholder
from cann_ops_tilelang.operator import Operator, new_output, scalar, tensor

from ..quant import _contract as quant_contract
from ._swiglu_contract import check_layout_options, swiglu_fast_key
from .moe_swiglu_backward_kernel import (
    HIDDEN_UNIT,
    OUT_FORMATS,
    choose_moe_swiglu_backward_config,
    get_moe_swiglu_backward_kernel,
)

_FLOATS = (torch.bfloat16, torch.float32)


def check_sizes(name: str, T: int, H2: int) -> None:
    """x is (T, 2 H): H a positive multiple of 64, and int32 element offsets (T * 2 H < 2**31)."""
    if H2 <= 0 or H2 % (2 * HIDDEN_UNIT):
        raise ValueError(
            f'{name}: x must have a last dimension 2 * H with H a positive multiple of {HIDDEN_UNIT}, got {H2}'
        )
    quant_contract.check_numel(name, T, H2)


def _options(name, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor):
    if fmt not in OUT_FORMATS:
        raise ValueError(f'{name}: fmt must be one of {tuple(OUT_FORMATS)}, got {fmt!r}')
    check_layout_options(name, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor)


def layout_choice(act_x_grad, psum_num_tokens_per_expert, topk_weights, clamp_value, do_recompute) -> dict:
    """The configuration's fields both operators take from the call."""
    return {
        'hidden': act_x_grad.shape[1],
        'grad_dtype': act_x_grad.dtype,
        'num_experts': 0 if psum_num_tokens_per_expert is None else psum_num_tokens_per_expert.shape[0],
        'with_weight': topk_weights is not None,
        'use_clamp': clamp_value is not None,
        'do_recompute': do_recompute,
    }


def _choice(x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights, clamp_value, do_recompute):
    return {
        'x_dtype': x.dtype,
        'out_dtype': OUT_FORMATS[fmt],
        **layout_choice(act_x_grad, psum_num_tokens_per_expert, topk_weights, clamp_value, do_recompute),
    }


OP = Operator(
    'moe_swiglu_backward',
    tensor('x', _FLOATS, 'T, H2'),
    tensor('act_x_grad', _FLOATS, 'T, H2 // 2'),
    scalar('fmt', 'str'),
    tensor('psum_num_tokens_per_expert', torch.int32, optional=True),
    tensor('topk_weights', torch.float32, 'T', optional=True),
    scalar('routed_scaling_factor', 'float', optional=True),
    scalar('clamp_value', 'positive', optional=True),
    scalar('do_recompute', 'bool'),
    limits=check_sizes,
    extra=_options,
    choice=_choice,
    choose_config=choose_moe_swiglu_backward_config,
    get_kernel=get_moe_swiglu_backward_kernel,
)


def run_backward(op, prepared, key, args, x, x_sf, act_x_grad, psum, topk_weights, routed_scaling_factor,
                 clamp_value, do_recompute, out_dtype, cast_sf=None):  # fmt: skip
    """Allocate and launch (none for T = 0) what `prepared`, op.prepare(key, args), gave. cast_sf: ((shape, dtype)
    of the cast's scales, or (shape, dtype, strides) for column-major ones, whether they are packed UE8M0) or None;
    column-major scales reach the kernel transposed (sf.T), UE8M0 ones as bytes. Returns (x_grad, weight_grad,
    act_out, (fp8, sf))."""
    launcher, fast = prepared
    num_tokens, hidden = act_x_grad.shape
    x_grad = x.new_empty(num_tokens, 2 * hidden, dtype=out_dtype)
    weight_grad = x.new_empty(num_tokens, dtype=torch.float32) if topk_weights is not None else None
    act_out = x.new_empty(num_tokens, hidden, dtype=out_dtype) if do_recompute else None
    fp8 = sf = sf_bytes = None
    if cast_sf is not None:
        sf_layout, packed = cast_sf
        fp8 = x.new_empty(num_tokens, 2 * hidden, dtype=torch.float8_e4m3fn)
        sf = new_output(x, sf_layout)
        sf_bytes = sf.T if len(sf_layout) > 2 else sf
        sf_bytes = sf_bytes.view(torch.uint8) if packed else sf_bytes

    def given(value, role, dtype):
        return value if value is not None else placeholder(x.device, dtype, role=role)

    launch_args = (
        x,
        given(x_sf, 'x_sf', torch.float32),
        act_x_grad,
        given(topk_weights, 'topk_weights', torch.float32),
        given(psum, 'psum', torch.int32),
        x_grad,
        given(weight_grad, 'weight_grad', torch.float32),
        given(act_out, 'act_out', out_dtype),
        given(fp8, 'x_grad_fp8', torch.float8_e4m3fn),
        given(sf_bytes, 'x_grad_sf', torch.float32),
        1.0 if routed_scaling_factor is None else float(routed_scaling_factor),
        0.0 if clamp_value is None else float(clamp_value),
    )
    op.finish(launcher, fast, key, launch_args, args, empty=not num_tokens)
    return x_grad, weight_grad, act_out, (fp8, sf)


def result_tuple(x_grad, weight_grad, act_out, quantised=None) -> tuple:
    """TileKernels' field order: x_grad, then (x_grad_fp8, x_grad_fp8_sf) with the cast, weight_grad with weights,
    act_out with do_recompute."""
    return (x_grad, *(() if quantised is None else (quantised,)), *(() if weight_grad is None else (weight_grad,)),
            *(() if act_out is None else (act_out,)))  # fmt: skip


def _eager(x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
           do_recompute):  # fmt: skip
    args = (x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
            do_recompute)  # fmt: skip
    key = swiglu_fast_key(OP.fast_ok(*args), x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                          clamp_value, act_x_grad.dtype, do_recompute, fmt)  # fmt: skip
    prepared = OP.prepare(key, args)  # checked here unless the key is known
    x_grad, weight_grad, act_out, _ = run_backward(
        OP, prepared, key, args, x, None, act_x_grad, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
        clamp_value, do_recompute, OUT_FORMATS[fmt],
    )  # fmt: skip
    return result_tuple(x_grad, weight_grad, act_out)


def _fake(x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
          do_recompute):  # fmt: skip
    num_tokens, hidden = act_x_grad.shape
    out_dtype = OUT_FORMATS[fmt]
    return result_tuple(
        x.new_empty(num_tokens, 2 * hidden, dtype=out_dtype),
        None if topk_weights is None else x.new_empty(num_tokens, dtype=torch.float32),
        x.new_empty(num_tokens, hidden, dtype=out_dtype) if do_recompute else None,
    )


_SCHEMA = ('(Tensor x, Tensor act_x_grad, str fmt, Tensor? psum_num_tokens_per_expert, Tensor? topk_weights, '
           'float? routed_scaling_factor, float? clamp_value, bool do_recompute) -> Tensor[]')  # fmt: skip
# The number of results depends on the arguments: the op returns them as a list, the public call as a tuple.
_functional = OP.define('moe_swiglu_backward', _SCHEMA, lambda *a: list(_eager(*a)), lambda *a: list(_fake(*a)))


def _traced(x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
            do_recompute):  # fmt: skip
    """torch.compile, fake tensors, make_fx: the torch.library op (scalars as the schema's floats)."""
    return tuple(
        _functional(
            x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights,
            None if routed_scaling_factor is None else float(routed_scaling_factor),
            None if clamp_value is None else float(clamp_value), do_recompute,
        )
    )  # fmt: skip


@OP.public(_eager, traced=_traced)
def moe_swiglu_backward(
    x: torch.Tensor,
    act_x_grad: torch.Tensor,
    fmt: str,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    clamp_value: float | None = None,
    do_recompute: bool = False,
) -> tuple:
    """The SwiGLU backward (TileKernels 2.1.0's call). Row t of x holds a = x[t, :H] and b = x[t, H:], g =
    act_x_grad[t], w = topk_weights[t] * routed_scaling_factor (1 without weights); in fp32, with a' = min(a, c)
    and b' = min(max(b, -c), c) for the clamp value c (a' = a, b' = b without it), s = sigmoid(a') and
    act = a' * s * b':

        x_grad[t, :H] = g * w * s * b' * (1 + a' * (1 - s)), 0 where a > c
        x_grad[t, H:] = g * w * s * a',                      0 where |b| > c
        weight_grad[t] = routed_scaling_factor * sum(g * act)
        act_out[t] = act * w

    Args:
        x: (T, 2 H) bf16 or fp32, contiguous: the forward input; H a positive multiple of 64, T * 2 H < 2**31,
            T >= 0 (T = 0: empty results, no launch).
        act_x_grad: (T, H) bf16 or fp32 (either, whatever x's dtype), contiguous: the gradient of the forward output.
        fmt: 'bf16' or 'fp32': the dtype of x_grad and act_out.
        psum_num_tokens_per_expert: optional (E,) int32, E >= 1, non-decreasing: expert e's tokens are the slots
            [align(psum[e - 1], 128), psum[e]) (psum[-1] = 0); every other slot is padding, where every output is
            0 (whatever x and act_x_grad hold there). None: every slot is a token.
        topk_weights: optional (T,) fp32, contiguous: each slot's routing weight (None: no scaling, no weight_grad).
        routed_scaling_factor: optional finite float, with topk_weights only.
        clamp_value: optional finite float > 0: SwiGLU's clamp.
        do_recompute: also return act_out, the forward output (scaled by the weights).

    Returns:
        A tuple: x_grad (T, 2 H) in fmt's dtype; weight_grad (T,) fp32 when topk_weights is given; act_out (T, H)
        in fmt's dtype when do_recompute. Every value is the same from run to run (no atomics; the weight
        gradient's sum has a fixed order on each backend).
    """
