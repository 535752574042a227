"""mhc_pre_big_fuse_fwd: mHC's whole pre path of a layer, from the split-K partials of the prenorm GEMM to the
layer input, the post mix and the Sinkhorn-normalised residual mix (TileKernels 2.1.0's call; docs/mhc.md).

On Ascend (FUSE_ON_ASCEND, the default) one launch of the fused kernel; otherwise a composition of the domain's
operators, one launch per stage: mhc_reduce_partials_and_rmsnorm_fwd -> mhc_pre_split_mixes_fwd -> mhc_sinkhorn_fwd
-> mhc_pre_apply_mix_fwd; on CUDA, where FUSE_ON_CUDA is set, one launch of the fused kernel. The same bits on
every path."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._mhc_expand_apply_common import check_sizes
from ._mixes_common import split_width
from ._norm_fn_common import check_rms_scalars, check_rms_sizes
from .mhc_pre_apply_mix_fwd import mhc_pre_apply_mix_fwd
from .mhc_pre_big_fuse_kernel import choose_mhc_pre_big_fuse_config, get_mhc_pre_big_fuse_kernel
from .mhc_pre_split_mixes_fwd import mhc_pre_split_mixes_fwd
from .mhc_reduce_partials_and_rmsnorm_fwd import mhc_reduce_partials_and_rmsnorm_fwd
from .mhc_sinkhorn_fwd import check_repeat, mhc_sinkhorn_fwd

# Each intermediate starts on a 128-byte boundary of the one scratch buffer (whole DMA bursts and 16-byte vectors
# on both backends, as a fresh allocation would).
_SEGMENT_ALIGN = 32  # fp32 elements


class MhcPreBigFuseFwdResult(NamedTuple):
    post_mix: torch.Tensor  # (T, M) fp32: the given buffer, written
    comb_mix: torch.Tensor  # (T, M * M) fp32: the given buffer, written
    layer_input: torch.Tensor  # (T, H) bf16: the given buffer, written


def check_pre_path_sizes(name, S, T, M3, M, H):
    """The sizes every stage of the pre path takes (S splits, T tokens, M3 mixes, M = mhc_mult streams of H)."""
    check_sizes(name, T, M, H)
    if split_width(M) != M3:
        raise ValueError(
            f'{name}: the mixes (gemm_out_mul.shape[2]) must number mhc_mult * (mhc_mult + 2) = {split_width(M)} '
            f'for mhc_mult {M} (residual.shape[1]), got {M3}'
        )
    check_rms_sizes(name, S, T, 1, M3)


def check_pre_path_scalars(name, S, M, H, rms_eps, sinkhorn_repeat, n_splits, repeat_limit):
    """The scalars every stage of the pre path takes (repeat_limit: the Sinkhorn direction's bound)."""
    if n_splits != S:
        raise ValueError(f'{name}: n_splits ({n_splits}) must be the first size of gemm_out_mul ({S})')
    check_rms_scalars(name, M * H, rms_eps)
    check_repeat(name, sinkhorn_repeat, repeat_limit)


# The fused CUDA kernel is lowered and compiled (nvcc, sm_90a) but has not run on a GPU yet: until its device test
# (which sets this) passes, CUDA launches the four checked stages. Read per call: part of the choice.
FUSE_ON_CUDA = False
# The fused Ascend kernel computed the composition's bits on the Ascend C emulator: the default there. Off: the
# four stages (the tests' composition to compare with). Read per call: part of the choice.
FUSE_ON_ASCEND = True


def _extra(name, S, M, H, rms_eps, sinkhorn_repeat, n_splits):
    check_pre_path_scalars(name, S, M, H, rms_eps, sinkhorn_repeat, n_splits, 2**31 - 1)


def scratch(like: torch.Tensor, *sizes: int) -> list[torch.Tensor]:
    """Flat fp32 intermediates of these element counts, carved from one allocation, each 128-byte aligned."""
    starts, end = [], 0
    for size in sizes:
        starts.append(end)
        end += -(-size // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
    buffer = like.new_empty(end, dtype=torch.float32)
    return [buffer[start : start + size] for start, size in zip(starts, sizes, strict=True)]


# The contract of the whole path, checked once up front in the mechanism's order: types and dtypes (TypeError),
# sizes and shapes (ValueError), alignment, the scalars, the written buffers apart from everything else, then the
# device (RuntimeError). The stages then check their own (always met) contracts again.
OP = Operator(
    'mhc_pre_big_fuse_fwd',
    tensor('gemm_out_mul', torch.float32, 'S, T, M3'),
    tensor('gemm_out_sqrsum', torch.float32, 'S, T'),
    tensor('mhc_scale', torch.float32, '3'),
    tensor('mhc_base', torch.float32, 'M3'),
    tensor('residual', torch.bfloat16, 'T, M, H', aligned=True),
    tensor('post_mix', torch.float32, 'T, M', written='written'),
    tensor('comb_mix', torch.float32, 'T, M * M', written='written'),
    tensor('layer_input', torch.bfloat16, 'T, H', aligned=True, written='written'),
    scalar('rms_eps', 'float'),
    scalar('mhc_pre_eps', 'float'),
    scalar('mhc_sinkhorn_eps', 'float'),
    scalar('mhc_post_mult_value', 'float'),
    scalar('sinkhorn_repeat', 'int'),
    scalar('n_splits', 'int'),
    limits=check_pre_path_sizes,
    extra=_extra,
    choice=lambda residual, gemm_out_mul, sinkhorn_repeat: {
        'direction': 'fwd',
        'mhc_mult': residual.shape[1],
        'hidden': residual.shape[2],
        'n_splits': gemm_out_mul.shape[0],
        'repeat': sinkhorn_repeat,
        'fuse': FUSE_ON_CUDA,
        'fuse_ascend': FUSE_ON_ASCEND,
    },
    choose_config=choose_mhc_pre_big_fuse_config,
    get_kernel=get_mhc_pre_big_fuse_kernel,
)


def fused_launch_args(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input,
                      rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value) -> tuple:  # fmt: skip
    """The fused kernel's arguments in its parameters' order: the partials as one RMS group, the stages' scalars
    (1 / rms_group_size, rms_group_size = M * H, as the reduction takes it)."""
    S, T, M3 = gemm_out_mul.shape
    M, H = residual.shape[1:]
    return (gemm_out_mul.view(S, T, 1, M3), gemm_out_sqrsum.view(S, T, 1), mhc_scale, mhc_base, residual, post_mix,
            comb_mix, layer_input, 1.0 / (M * H), float(rms_eps), float(mhc_pre_eps), float(mhc_sinkhorn_eps),
            float(mhc_post_mult_value))  # fmt: skip


def _eager(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input, rms_eps,
           mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat,
           n_splits) -> MhcPreBigFuseFwdResult:  # fmt: skip
    """The contract once, then (nothing for T = 0) the fused kernel, or the intermediates in one allocation and the
    four stages."""
    launcher = OP.plan(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input,
                       rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat,
                       n_splits)  # fmt: skip
    result = MhcPreBigFuseFwdResult(post_mix, comb_mix, layer_input)
    S, T, M3 = gemm_out_mul.shape
    M, H = residual.shape[1:]
    if not T:
        return result
    if launcher.cfg.fused:
        launcher.launch(*fused_launch_args(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix,
                                           comb_mix, layer_input, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
                                           mhc_post_mult_value))  # fmt: skip
        return result
    out_mul, sqrsum, mixes, pre_mix, comb_logits = scratch(gemm_out_mul, T * M3, T, T * M3, T * M, T * M * M)
    mhc_reduce_partials_and_rmsnorm_fwd(
        gemm_out_mul.view(S, T, 1, M3), gemm_out_sqrsum.view(S, T, 1), out_mul.view(T, 1, M3), sqrsum.view(T, 1),
        mixes.view(T, M3), M * H, rms_eps, n_splits,
    )  # fmt: skip
    mhc_pre_split_mixes_fwd(
        mixes.view(T, M3), mhc_scale, mhc_base, pre_mix.view(T, M), post_mix, comb_logits.view(T, M * M),
        mhc_post_mult_value, mhc_pre_eps,
    )  # fmt: skip
    mhc_sinkhorn_fwd(comb_logits.view(T, M, M), comb_mix.view(T, M, M), sinkhorn_repeat, mhc_sinkhorn_eps)
    mhc_pre_apply_mix_fwd(residual, pre_mix.view(T, M), layer_input)
    return result


@OP.public(_eager, result=MhcPreBigFuseFwdResult)
def mhc_pre_big_fuse_fwd(
    gemm_out_mul: torch.Tensor,
    gemm_out_sqrsum: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    residual: torch.Tensor,
    post_mix: torch.Tensor,
    comb_mix: torch.Tensor,
    layer_input: torch.Tensor,
    rms_eps: float,
    mhc_pre_eps: float,
    mhc_sinkhorn_eps: float,
    mhc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 16,
) -> MhcPreBigFuseFwdResult:
    """mHC's pre path of a layer, per token t, in fp32 (M = mhc_mult, H = hidden, M3 = M * (M + 2)):

        mixes[t, j]   = (sum over s of gemm_out_mul[s, t, j]) / sqrt((sum over s of gemm_out_sqrsum[s, t]) / (M * H)
                        + rms_eps)
        z[t, c]       = mixes[t, c] * mhc_scale[segment(c)] + mhc_base[c]    (segments: M pre, M post, M * M comb)
        pre[t, j]     = sigmoid(z[t, j]) + mhc_pre_eps
        post_mix[t, j] = sigmoid(z[t, M + j]) * mhc_post_mult_value
        comb_mix[t]   = Sinkhorn(z[t, 2M:] as an M x M matrix, sinkhorn_repeat, mhc_sinkhorn_eps)
        layer_input[t, h] = bf16(sum over m of pre[t, m] * residual[t, m, h])

    A composition, one launch per stage, its intermediates (the reduced partials, the mixes, pre and the comb
    logits) in one allocation: the results equal, bit for bit, the chain of the public operators
    mhc_reduce_partials_and_rmsnorm_fwd (one RMS group, rms_group_size M * H) -> mhc_pre_split_mixes_fwd ->
    mhc_sinkhorn_fwd -> mhc_pre_apply_mix_fwd, whose docstrings give the rounding and the summation orders. On
    Ascend (FUSE_ON_ASCEND, on: emulated bit-equal) and on CUDA with FUSE_ON_CUDA set (off until the kernel has
    run on a GPU), one launch of a fused kernel that does the stages' arithmetic in their order: the same bits,
    no intermediates in memory.
    Beyond the peer: every mhc_mult of 1 .. 8 and any token count on both backends, n_splits on Ascend.

    Args:
        gemm_out_mul: (S, T, M3) fp32, contiguous: the split-K partials of the prenorm GEMM (residual . fn).
            T >= 0 tokens (0: nothing is launched), S * (T + 1) * M3 (M3 rounded up to 8) < 2**31.
        gemm_out_sqrsum: (S, T) fp32, contiguous: the partial sums of squares of the residual.
        mhc_scale: (3,) fp32, contiguous: the pre, post and comb scales.
        mhc_base: (M3,) fp32, contiguous.
        residual: (T, M, H) bf16, contiguous, 16-byte aligned: M in 1 .. 8, H a positive multiple of 64,
            T * M * H <= 2**30 (int32 indices).
        post_mix: (T, M) fp32 buffer, written.
        comb_mix: (T, M * M) fp32 buffer (row-major M x M per token), written.
        layer_input: (T, H) bf16 buffer, 16-byte aligned, written.
        rms_eps: finite float >= 0. mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value: finite floats.
        sinkhorn_repeat: >= 1 Sinkhorn rounds.
        n_splits: S (ValueError otherwise); the peer's default 16.
        Every tensor contiguous, on one device; the buffers apart from each other and from the inputs.

    Returns:
        MhcPreBigFuseFwdResult(post_mix, comb_mix, layer_input): the written buffers (the peer returns None).
    """
