"""moe_swiglu_forward: x (T, 2 I) = [gate | up] -> silu(gate) * up (T, I) in bf16 or fp32, over the MoE expert layout
(TileKernels 2.1.0's `swiglu_forward`), with top-k weights, routed scaling and clamp counters. Its contract and
eager path serve moe_swiglu_forward_and_per_token_cast too (one kernel family: moe_swiglu_forward_kernel.py)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.kernel_target import placeholder
from cann_ops_tilelang.operator import Operator, out, scalar, tensor
from cann_ops_tilelang.quant import _contract as quant_contract

from ._swiglu import CLAMP_COUNTERS
from ._swiglu_contract import check_layout_options, swiglu_fast_key
from .moe_swiglu_forward_kernel import (
    OUT_FORMATS,
    PLAIN_BLOCK,
    choose_moe_swiglu_forward_config,
    fold_counts,
    get_moe_swiglu_forward_kernel,
)

PLAIN_FORMATS = ('bf16', 'fp32')  # moe_swiglu_forward's output formats
_TORCH_DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32, 'float8_e4m3fn': torch.float8_e4m3fn}


def output_dtype(fmt: str) -> torch.dtype:
    return _TORCH_DTYPES[OUT_FORMATS[fmt]]


def check_swiglu_sizes(name: str, T: int, W: int) -> None:
    """The limits of both operators: x (T, W = 2 I), int32 element offsets."""
    quant_contract.check_numel(name, T, W)


def check_swiglu_arguments(name, W, unit, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                           clamp_value, clamped_count):  # fmt: skip
    """The rules of both operators the declaration's table cannot say (ValueError)."""
    if W % 2 or W // 2 <= 0 or (W // 2) % unit:
        raise ValueError(f'{name}: x must have 2 I columns, I a positive multiple of {unit}, got {W}')
    check_layout_options(name, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor)
    if clamped_count is not None and clamp_value is None:
        raise ValueError(f'{name}: clamped_count needs clamp_value')


def swiglu_choice(x, fmt, psum_num_tokens_per_expert, topk_weights, clamp_value, clamped_count, cast=None):
    """The keyword arguments of choose_moe_swiglu_forward_config for a call (`cast`: the fused cast's options)."""
    return {
        'hidden': x.shape[1] // 2,
        'in_dtype': x.dtype,
        'fmt': fmt,
        'with_layout': psum_num_tokens_per_expert is not None,
        'with_weight': topk_weights is not None,
        'clamp': clamp_value is not None,
        'count_clamp': clamped_count is not None,
        **(cast or {}),
    }


def _choice(x, fmt, psum_num_tokens_per_expert, topk_weights, clamp_value, clamped_count):
    return swiglu_choice(x, fmt, psum_num_tokens_per_expert, topk_weights, clamp_value, clamped_count)


def swiglu_launch_args(x, data, sf, psum, topk_weights, routed_scaling_factor, clamp_value, counts=None) -> tuple:
    """The arguments of a moe_swiglu_forward kernel launch, placeholders for what the call does not give."""
    device = x.device
    return (
        x,
        data,
        placeholder(device, torch.float32, 2) if sf is None else sf,
        placeholder(device, torch.int32, 1) if psum is None else psum,
        placeholder(device, torch.float32, 1) if topk_weights is None else topk_weights,
        placeholder(device, torch.int32, 1) if counts is None else counts,
        1.0 if routed_scaling_factor is None else float(routed_scaling_factor),
        0.0 if clamp_value is None else float(clamp_value),
    )


def launch_swiglu(launcher, x, data, sf, psum, topk_weights, routed_scaling_factor, clamp_value, clamped_count):
    """Launch a planned moe_swiglu_forward kernel (T >= 1) and add its clamp counts to clamped_count."""
    counts = None
    if clamped_count is not None:
        counts = x.new_empty(launcher.cfg.count_slots(x.shape[0]), dtype=torch.int32)
    launcher.launch(*swiglu_launch_args(x, data, sf, psum, topk_weights, routed_scaling_factor, clamp_value, counts))
    if clamped_count is not None:
        clamped_count.add_(fold_counts(launcher.cfg, counts))


def _contract(name, W, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
              clamped_count):  # fmt: skip
    if fmt not in PLAIN_FORMATS:
        raise ValueError(f'{name}: fmt must be one of {PLAIN_FORMATS} (FP8: moe_swiglu_forward_and_per_token_cast), '
                         f'got {fmt!r}')  # fmt: skip
    check_swiglu_arguments(name, W, PLAIN_BLOCK, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                           clamp_value, clamped_count)  # fmt: skip


# The contract, checked in the mechanism's order: types and dtypes (TypeError), shapes and layouts (ValueError),
# the scalars, the rules of `_contract`, the out= buffer, the written clamped_count apart from the others, the device.
OP = Operator(
    'moe_swiglu_forward',
    tensor('x', (torch.bfloat16, torch.float32), 'T, W'),
    scalar('fmt', 'str'),
    tensor('psum_num_tokens_per_expert', torch.int32, optional=True),  # (E,): checked in _contract
    tensor('topk_weights', torch.float32, 'T', optional=True),
    scalar('routed_scaling_factor', 'float', optional=True),
    scalar('clamp_value', 'positive', optional=True),
    tensor('clamped_count', torch.int64, str(CLAMP_COUNTERS), optional=True, written='updated'),
    out('out'),
    limits=check_swiglu_sizes,
    extra=_contract,
    results=lambda x, fmt: (((x.shape[0], x.shape[1] // 2), output_dtype(fmt)),),
    choice=_choice,
    choose_config=choose_moe_swiglu_forward_config,
    get_kernel=get_moe_swiglu_forward_kernel,
)


def _eager(x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count,
           out):  # fmt: skip
    """A call on real tensors (also the kernel of the torch.library forms): every check, then the launch."""
    args = (x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count, out)
    key = swiglu_fast_key(OP.fast_ok(*args), x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                          clamp_value, fmt)  # fmt: skip
    if key is not None:  # no out= and no clamped_count (OP.fast_ok): one launch of a remembered launcher
        launcher, fast = OP.prepare(key, args)
        ((shape, dtype),) = OP.results(*args)
        out = x.new_empty(shape, dtype=dtype)
        launch_args = swiglu_launch_args(x, out, None, psum_num_tokens_per_expert, topk_weights,
                                         routed_scaling_factor, clamp_value)  # fmt: skip
        OP.finish(launcher, fast, key, launch_args, args, empty=False)
        return out
    launcher = OP.plan(*args)
    if out is None:
        ((shape, dtype),) = OP.results(*args)
        out = x.new_empty(shape, dtype=dtype)
    if x.shape[0]:  # no rows: nothing to launch, nothing counted
        launch_swiglu(launcher, x, out, None, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                      clamp_value, clamped_count)  # fmt: skip
    return out


@OP.public(_eager, returns='Tensor')
def moe_swiglu_forward(
    x: torch.Tensor,
    fmt: str,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    clamp_value: float | None = None,
    clamped_count: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """SwiGLU over the rows of the MoE expert layout (TileKernels 2.1.0's `swiglu_forward`). Per row t, with
    gate = x[t, :I], up = x[t, I:], c = clamp_value and w = fp32(topk_weights[t] * routed_scaling_factor):

        gate = min(gate, c), up = min(max(up, -c), c)          (with clamp_value)
        out[t] = gate / (1 + exp(-gate)) * up * w               (fp32; w = 1 without topk_weights)

    With psum_num_tokens_per_expert (P, E values, non-decreasing): expert e owns rows [align(P[e - 1]), P[e]),
    P[-1] = 0, align rounding up to 128 rows (TileKernels' default token alignment); every other row is padding,
    and gives out[t] = 0 without reading x[t] (TileKernels leaves it unwritten). Decreasing values give unspecified
    rows (never an access outside the tensors).
    clamped_count (int64 (4,)), with clamp_value: adds the counts of gate > c, up > c, up < -c (before the clamp)
    over the rows that are not padding, and those rows' element count T' * I. Deterministic: integer partial counts
    summed in int64, no atomics.

    Args:
        x: (T, 2 I) bf16 or fp32, contiguous; T >= 0 (T = 0: empty result, nothing counted, no launch), I a
            positive multiple of 64, T * 2 I < 2**31.
        fmt: the output format, 'bf16' (to nearest even) or 'fp32'.
        psum_num_tokens_per_expert: optional (E,) int32, contiguous, E >= 1.
        topk_weights: optional (T,) fp32, contiguous: each row's routing weight.
        routed_scaling_factor: optional finite float, multiplied into the weights (needs topk_weights).
        clamp_value: optional finite float > 0.
        clamped_count: optional (4,) int64, contiguous, updated in place (needs clamp_value).
        out: optional (T, I) buffer of fmt's dtype, contiguous, not overlapping the inputs.
        Every tensor on x's device.

    Returns:
        out (T, I), bf16 or fp32. NaN in x gives NaN in its element (the clamp may drop it); inf follows IEEE
        arithmetic (silu(-inf) is NaN, as -inf / inf).
    """
