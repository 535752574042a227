"""moe_swiglu_backward_and_per_token_cast: moe_swiglu_backward from an FP8 input, with the input gradient also cast
per token to FP8 (TileKernels 2.1.0's `swiglu_backward_and_per_token_cast`). The same kernels as
moe_swiglu_backward (moe_swiglu_backward_kernel.py), with the cast's passes."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, new_output, quant, scalar, tensor

from ..quant import _contract as quant_contract
from ..quant._quant_tensor import QuantTensor
from ..quant.per_token_cast_kernel import CAST_HIDDEN_UNIT
from ._swiglu_contract import check_layout_options, swiglu_fast_key
from .moe_swiglu_backward import (
    check_sizes,
    layout_choice,
    result_tuple,
    run_backward,
)
from .moe_swiglu_backward_kernel import (
    CAST_BLOCK_SIZES,
    CAST_FORMAT,
    blocks_straddle,
    choose_moe_swiglu_backward_config,
    get_moe_swiglu_backward_kernel,
)


def sf_layout(num_tokens: int, hidden: int, num_per_channels: int, packed: bool, col_major: bool = False,
              device: torch.device | None = None):  # fmt: skip
    """(shape, dtype) of x_grad_fp8's scales: per_token_cast's of a (T, 2 H) tensor; column-major (shape, dtype,
    strides): per_token_cast's strides, the peer's rule on `device`'s backend."""
    layout = quant_contract.sf_layout(num_tokens, 2 * hidden, (1, num_per_channels), packed)
    return quant_contract.scale_result(layout, col_major, device)


def _options(name, x_sf, T, H2, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights,
             routed_scaling_factor, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0):  # fmt: skip
    quant_contract.check_cast_format(name, fmt, (CAST_FORMAT,))
    quant_contract.check_block(name, 'num_per_channels', num_per_channels, CAST_BLOCK_SIZES)
    quant_contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    # per_token_cast's blocks of the 2 H row: whole 64-lane registers; with 128-channel blocks an odd multiple of 64
    # puts a block across the two halves (2 H is still whole blocks).
    quant_contract.check_hidden(name, H2 // 2, CAST_HIDDEN_UNIT, f'num_per_channels {num_per_channels}')
    if (
        use_packed_ue8m0
        and not blocks_straddle(H2 // 2, num_per_channels)
        and (H2 // num_per_channels) % quant_contract.UE8M0_PACK
    ):
        raise ValueError(
            f'{name}: use_packed_ue8m0 needs 2 * H / num_per_channels a multiple of {quant_contract.UE8M0_PACK} '
            f'(whole int32 words of scales) where H is whole blocks, got {H2 // num_per_channels}'
        )
    if x_sf.shape != (T, H2 // num_per_channels):
        raise ValueError(
            f'{name}: x[1] must have shape {(T, H2 // num_per_channels)} (one fp32 scale per token and block of '
            f'{num_per_channels} channels), got {tuple(x_sf.shape)}'
        )
    if not x_sf.is_contiguous():
        raise ValueError(f'{name}: x[1] must be contiguous')
    check_layout_options(name, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor)


def _choice(act_x_grad, num_per_channels, psum_num_tokens_per_expert, topk_weights, use_tma_aligned_col_major_sf,
            round_sf, use_packed_ue8m0, clamp_value, do_recompute):  # fmt: skip
    return {
        'x_dtype': torch.float8_e4m3fn,
        'out_dtype': torch.bfloat16,
        'block_size': num_per_channels,
        'round_sf': round_sf,
        'packed_ue8m0': use_packed_ue8m0,
        'col_major_sf': use_tma_aligned_col_major_sf,
        **layout_choice(act_x_grad, psum_num_tokens_per_expert, topk_weights, clamp_value, do_recompute),
    }


OP = Operator(
    'moe_swiglu_backward_and_per_token_cast',
    quant('x', torch.float8_e4m3fn, 'T, H2', sf_dtype=torch.float32),
    tensor('act_x_grad', (torch.bfloat16, torch.float32), 'T, H2 // 2'),
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    tensor('psum_num_tokens_per_expert', torch.int32, optional=True),
    tensor('topk_weights', torch.float32, 'T', optional=True),
    scalar('routed_scaling_factor', 'float', optional=True),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('clamp_value', 'positive', optional=True),
    scalar('do_recompute', 'bool'),
    limits=check_sizes,
    extra=_options,
    choice=_choice,
    choose_config=choose_moe_swiglu_backward_config,
    get_kernel=get_moe_swiglu_backward_kernel,
)


def _eager(x, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
           use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute):  # fmt: skip
    args = (x, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
            use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute)  # fmt: skip
    data = x[0] if isinstance(x, tuple) and x else x
    key = swiglu_fast_key(OP.fast_ok(*args), data, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                          clamp_value, act_x_grad.dtype, do_recompute, fmt, num_per_channels, round_sf,
                          use_packed_ue8m0, use_tma_aligned_col_major_sf)  # fmt: skip
    prepared = OP.prepare(key, args)  # checked here unless the key is known
    (data, sf), (num_tokens, hidden) = x, act_x_grad.shape
    layout = sf_layout(num_tokens, hidden, num_per_channels, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                       data.device)  # fmt: skip
    x_grad, weight_grad, act_out, (fp8, scales) = run_backward(
        OP, prepared, key, args, data, sf, act_x_grad, psum_num_tokens_per_expert, topk_weights,
        routed_scaling_factor, clamp_value, do_recompute, torch.bfloat16, (layout, use_packed_ue8m0),
    )  # fmt: skip
    return result_tuple(x_grad, weight_grad, act_out, QuantTensor(fp8, scales))


def _fake(x, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
          use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute):  # fmt: skip
    num_tokens, hidden = act_x_grad.shape
    data = x[0]
    layout = sf_layout(num_tokens, hidden, num_per_channels, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                       data.device)  # fmt: skip
    return result_tuple(
        data.new_empty(num_tokens, 2 * hidden, dtype=torch.bfloat16),
        None if topk_weights is None else data.new_empty(num_tokens, dtype=torch.float32),
        data.new_empty(num_tokens, hidden, dtype=torch.bfloat16) if do_recompute else None,
        QuantTensor(data.new_empty(num_tokens, 2 * hidden, dtype=torch.float8_e4m3fn),
                    new_output(data, layout)),
    )  # fmt: skip


def _flat(result: tuple) -> list:
    """The public tuple as the op's list: x_grad, data, sf, then weight_grad and act_out where present."""
    return [result[0], *result[1], *result[2:]]


_SCHEMA = ('(Tensor x_data, Tensor x_sf, Tensor act_x_grad, str fmt, int num_per_channels, '
           'Tensor? psum_num_tokens_per_expert, Tensor? topk_weights, float? routed_scaling_factor, '
           'bool use_tma_aligned_col_major_sf, bool round_sf, bool use_packed_ue8m0, float? clamp_value, '
           'bool do_recompute) -> Tensor[]')  # fmt: skip
# The number of results depends on the arguments: the op returns them as a list, the public call as a tuple.
_functional = OP.define(
    'moe_swiglu_backward_and_per_token_cast',
    _SCHEMA,
    lambda data, sf, *rest: _flat(_eager((data, sf), *rest)),
    lambda data, sf, *rest: _flat(_fake((data, sf), *rest)),
)


def _traced(x, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
            use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute):  # fmt: skip
    """torch.compile, fake tensors, make_fx: the torch.library op (scalars as the schema's floats)."""
    flat = _functional(
        x[0], x[1], act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights,
        None if routed_scaling_factor is None else float(routed_scaling_factor), use_tma_aligned_col_major_sf,
        round_sf, use_packed_ue8m0, None if clamp_value is None else float(clamp_value), do_recompute,
    )  # fmt: skip
    return (flat[0], QuantTensor(flat[1], flat[2]), *flat[3:])


@OP.public(_eager, traced=_traced)
def moe_swiglu_backward_and_per_token_cast(
    x: tuple[torch.Tensor, torch.Tensor],
    act_x_grad: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    clamp_value: float | None = None,
    do_recompute: bool = False,
) -> tuple:
    """moe_swiglu_backward of the FP8 input x = data * sf, with x_grad also cast to FP8 per token (TileKernels
    2.1.0's call). In fp32, x's values are data * sf (one product, sf of the value's block of num_per_channels
    channels); the gradients are moe_swiglu_backward's; then the fp32 x_grad row is cast exactly as
    per_token_cast(x_grad, 'e4m3', num_per_channels, round_sf=, use_packed_ue8m0=) casts a (T, 2 H) tensor, and
    x_grad is returned rounded to bf16. On padding slots of the expert layout every output is 0, the scales
    included.

    Args:
        x: (data, sf): data (T, 2 H) float8_e4m3fn, contiguous; sf (T, 2 H / num_per_channels) fp32, contiguous.
            H a positive multiple of 64, T * 2 H < 2**31, T >= 0 (T = 0: no launch). With num_per_channels 128
            an odd multiple of 64 (e.g. gpt-oss's 2880) puts block H / 128 across the two halves (the gate's last
            64 channels, the up's first 64), as per_token_cast's blocks of the 2 H row are (Ascend: H <= 6720).
        act_x_grad: (T, H) bf16 or fp32, contiguous.
        fmt: 'e4m3'.
        num_per_channels: 32, 64 or 128 channels per scale, of x and of the cast (both backends).
        psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, do_recompute: as
            moe_swiglu_backward's.
        use_tma_aligned_col_major_sf: x_grad_fp8's scales column-major, as per_token_cast's option: the same
            shape and values (padding slots' zeros included), strides (1, T_pad), a view buf[:, :T].T of a (K,
            T_pad) buffer (T_pad: T rounded up to 16 bytes of the scale dtype on CUDA, T on Ascend; T = 0: strides
            (1, 0)); x's own scales stay row-major (as the peer's). On Ascend with use_packed_ue8m0, H /
            num_per_channels a multiple of 4 (whole words per half row; ValueError otherwise).
        round_sf: power-of-two scales. use_packed_ue8m0: with round_sf, the scales as UE8M0 bytes packed four
            per int32 (2 H / num_per_channels a multiple of 4 where H is whole blocks; with a block across the halves
            the row ends in zero bytes up to a word, per_token_cast's padding).

    Returns:
        A tuple: x_grad (T, 2 H) bf16; QuantTensor(x_grad_fp8 (T, 2 H) float8_e4m3fn, its scales (T, 2 H /
        num_per_channels) fp32 or (T, ceil(2 H / num_per_channels / 4)) int32 packed); weight_grad (T,) fp32 with
        topk_weights; act_out (T, H) bf16 with do_recompute. The same from run to run.
    """
