"""moe_swiglu_forward_and_per_token_cast: moe_swiglu_forward's fp32 result cast to FP8 e4m3 per token and block of
channels in the same pass (TileKernels 2.1.0's `swiglu_forward_and_per_token_cast`): the bytes of
per_token_cast(moe_swiglu_forward(x, 'fp32', ...)), without the fp32 tensor in between."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, outs, scalar, tensor
from cann_ops_tilelang.quant import _contract as quant_contract
from cann_ops_tilelang.quant._quant_tensor import QuantTensor
from cann_ops_tilelang.quant.per_token_cast import sf_layout
from cann_ops_tilelang.quant.per_token_cast_kernel import CAST_BLOCK_SIZES, CAST_HIDDEN_UNIT

from ._swiglu import CLAMP_COUNTERS
from ._swiglu_contract import swiglu_fast_key
from .moe_swiglu_forward import (
    check_swiglu_arguments,
    check_swiglu_sizes,
    launch_swiglu,
    swiglu_choice,
    swiglu_launch_args,
)
from .moe_swiglu_forward_kernel import choose_moe_swiglu_forward_config, get_moe_swiglu_forward_kernel


def _contract(name, W, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
              use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, clamped_count):  # fmt: skip
    quant_contract.check_format(name, fmt)
    quant_contract.check_block(name, 'num_per_channels', num_per_channels, CAST_BLOCK_SIZES)
    quant_contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    # per_token_cast's I: whole 64-lane registers for every block, a short last block included.
    check_swiglu_arguments(name, W, CAST_HIDDEN_UNIT, psum_num_tokens_per_expert, topk_weights,
                           routed_scaling_factor, clamp_value, clamped_count)  # fmt: skip


def _results(x, num_per_channels, use_tma_aligned_col_major_sf, use_packed_ue8m0):
    """(shape, dtype) of data, (shape, dtype[, strides]) of sf: per_token_cast's layouts of the (T, I) result
    (column-major scales: its strides, the peer's rule on x's backend)."""
    num_tokens, hidden = x.shape[0], x.shape[1] // 2
    sf = sf_layout(num_tokens, hidden, num_per_channels, use_packed_ue8m0)
    return ((num_tokens, hidden), torch.float8_e4m3fn), quant_contract.scale_result(
        sf, use_tma_aligned_col_major_sf, x.device
    )


def _choice(x, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, use_tma_aligned_col_major_sf,
            round_sf, use_packed_ue8m0, clamp_value, clamped_count):  # fmt: skip
    cast = {'block_size': num_per_channels, 'round_sf': round_sf, 'packed_ue8m0': use_packed_ue8m0,
            'col_major_sf': use_tma_aligned_col_major_sf}  # fmt: skip
    return swiglu_choice(x, fmt, psum_num_tokens_per_expert, topk_weights, clamp_value, clamped_count, cast)


OP = Operator(
    'moe_swiglu_forward_and_per_token_cast',
    tensor('x', (torch.bfloat16, torch.float32), 'T, W'),
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    tensor('psum_num_tokens_per_expert', torch.int32, optional=True),  # (E,): checked in _contract
    tensor('topk_weights', torch.float32, 'T', optional=True),
    scalar('routed_scaling_factor', 'float', optional=True),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('clamp_value', 'positive', optional=True),
    tensor('clamped_count', torch.int64, str(CLAMP_COUNTERS), optional=True, written='updated'),
    outs('out', 'data', 'sf'),
    limits=check_swiglu_sizes,
    extra=_contract,
    results=_results,
    choice=_choice,
    choose_config=choose_moe_swiglu_forward_config,
    get_kernel=get_moe_swiglu_forward_kernel,
)


def _eager(x, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
           use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, clamped_count, out):  # fmt: skip
    """A call on real tensors (also the kernel of the torch.library forms): every check, then the launch. The
    scales reach the kernel as it takes them: column-major ones transposed (sf.T), UE8M0 ones as bytes (a uint8 view
    of the int32 words)."""
    args = (x, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
            use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, clamped_count, out)  # fmt: skip
    key = swiglu_fast_key(OP.fast_ok(*args), x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                          clamp_value, fmt, num_per_channels, round_sf, use_packed_ue8m0,
                          use_tma_aligned_col_major_sf)  # fmt: skip

    def kernel_sf(sf):
        sf = sf.T if use_tma_aligned_col_major_sf else sf
        return sf.view(torch.uint8) if use_packed_ue8m0 else sf

    if key is not None:  # no out= and no clamped_count (OP.fast_ok): one launch of a remembered launcher
        launcher, fast = OP.prepare(key, args)
        data, sf = OP.new_outputs(x, *args)
        launch_args = swiglu_launch_args(x, data, kernel_sf(sf), psum_num_tokens_per_expert, topk_weights,
                                         routed_scaling_factor, clamp_value)  # fmt: skip
        OP.finish(launcher, fast, key, launch_args, args, empty=False)
        return QuantTensor(data, sf)
    launcher = OP.plan(*args)
    if out is None:
        out = OP.new_outputs(x, *args)
    data, sf = out
    if x.shape[0]:  # no rows: nothing to launch, nothing counted
        launch_swiglu(launcher, x, data, kernel_sf(sf), psum_num_tokens_per_expert, topk_weights,
                      routed_scaling_factor, clamp_value, clamped_count)  # fmt: skip
    return QuantTensor(data, sf)


@OP.public(_eager, result=QuantTensor)
def moe_swiglu_forward_and_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    clamp_value: float | None = None,
    clamped_count: torch.Tensor | None = None,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QuantTensor:
    """moe_swiglu_forward (same arguments, rows, padding and clamp counts) with its fp32 result y cast to e4m3 per
    row and block of num_per_channels channels, as per_token_cast(y, 'e4m3', num_per_channels, round_sf=...,
    use_packed_ue8m0=...) casts it: equal bytes (padding rows are y = 0: data 0, the floor's scale).

    Args:
        x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count: as
            moe_swiglu_forward; I a positive multiple of 64 as per_token_cast takes it: with num_per_channels 128
            an odd multiple (e.g. gpt-oss's 2880) ends each row in a short block of 64 channels, whose scale is
            its 64 channels' (Ascend: I <= 8128 then, the row one task).
        fmt: 'e4m3' (TileKernels' 'bf16' / 'fp32' output: moe_swiglu_forward).
        num_per_channels: channels per scale factor, 16, 32, 64 or 128 (TileKernels: 32 and 128).
        round_sf, use_packed_ue8m0: per_token_cast's power-of-two and UE8M0 scales (packed needs round_sf).
        use_tma_aligned_col_major_sf: sf column-major, as per_token_cast's option: the same shape and values
            (padding rows' scales included), strides (1, T_pad), a view buf[:, :T].T of a (K, T_pad) buffer (T_pad:
            T rounded up to 16 bytes of sf's dtype on CUDA, T on Ascend; T = 0: strides (1, 0)).
        out: optional (data, sf) buffers of the result's shapes and dtypes, apart from the inputs: data contiguous,
            sf contiguous or, with use_tma_aligned_col_major_sf, of exactly the strides above.

    Returns:
        QuantTensor(data (T, I) float8_e4m3fn, sf (T, ceil(I / num_per_channels)) fp32, or with use_packed_ue8m0
        (T, ceil(ceil(I / num_per_channels) / 4)) int32), `out` when given.
    """
