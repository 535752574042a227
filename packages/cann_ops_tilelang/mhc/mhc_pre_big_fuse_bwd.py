"""mhc_pre_big_fuse_bwd: the gradients of mhc_pre_big_fuse_fwd, mHC's whole pre path, at its differentiable
inputs (beyond TileKernels 2.1.0, which has no backward of the fused path; docs/mhc.md).

A composition of the domain's operators, one launch per stage: the forward's mhc_reduce_partials_and_rmsnorm_fwd
and mhc_pre_split_mixes_fwd recomputed, then mhc_sinkhorn_bwd, mhc_pre_apply_mix_bwd, mhc_pre_split_mixes_bwd
(two launches) and mhc_reduce_partials_and_rmsnorm_bwd."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from .mhc_pre_apply_mix_bwd import mhc_pre_apply_mix_bwd
from .mhc_pre_big_fuse_fwd import check_pre_path_scalars, check_pre_path_sizes, scratch
from .mhc_pre_big_fuse_kernel import choose_mhc_pre_big_fuse_config, get_mhc_pre_big_fuse_kernel
from .mhc_pre_split_mixes_bwd import mhc_pre_split_mixes_bwd
from .mhc_pre_split_mixes_fwd import mhc_pre_split_mixes_fwd
from .mhc_reduce_partials_and_rmsnorm_bwd import mhc_reduce_partials_and_rmsnorm_bwd
from .mhc_reduce_partials_and_rmsnorm_fwd import mhc_reduce_partials_and_rmsnorm_fwd
from .mhc_sinkhorn_bwd import mhc_sinkhorn_bwd
from .mhc_sinkhorn_kernel import MAX_REPEAT


class MhcPreBigFuseBwdResult(NamedTuple):
    gemm_out_mul_grad: torch.Tensor  # (T, M3) fp32: the given buffer, written (every split's gradient)
    gemm_out_sqrsum_grad: torch.Tensor  # (T,) fp32: the given buffer, written (every split's gradient)
    mhc_scale_grad: torch.Tensor  # (3,) fp32: the given buffer, written
    mhc_base_grad: torch.Tensor  # (M3,) fp32: the given buffer, written
    residual_grad: torch.Tensor  # (T, M, H) bf16: the given buffer, accumulated into


def _extra(name, S, M, H, rms_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits):
    # The Sinkhorn backward keeps its 2 * repeat - 1 recomputed iterates of a token on chip.
    check_pre_path_scalars(name, S, M, H, rms_eps, sinkhorn_repeat, n_splits, MAX_REPEAT)
    if mhc_post_mult_value == 0:
        raise ValueError(f'{name}: mhc_post_mult_value must be nonzero (post_mix / mhc_post_mult_value is the '
                         "sigmoid the post mix's gradient needs)")  # fmt: skip


OP = Operator(
    'mhc_pre_big_fuse_bwd',
    tensor('post_mix_grad', torch.float32, 'T, M'),
    tensor('comb_mix_grad', torch.float32, 'T, M * M'),
    tensor('layer_input_grad', torch.bfloat16, 'T, H', aligned=True),
    tensor('gemm_out_mul', torch.float32, 'S, T, M3'),
    tensor('gemm_out_sqrsum', torch.float32, 'S, T'),
    tensor('mhc_scale', torch.float32, '3'),
    tensor('mhc_base', torch.float32, 'M3'),
    tensor('residual', torch.bfloat16, 'T, M, H', aligned=True),
    tensor('gemm_out_mul_grad', torch.float32, 'T, M3', written='written'),
    tensor('gemm_out_sqrsum_grad', torch.float32, 'T', written='written'),
    tensor('mhc_scale_grad', torch.float32, '3', written='written'),
    tensor('mhc_base_grad', torch.float32, 'M3', written='written'),
    tensor('residual_grad', torch.bfloat16, 'T, M, H', aligned=True, written='updated'),
    scalar('rms_eps', 'float'),
    scalar('mhc_pre_eps', 'float'),
    scalar('mhc_sinkhorn_eps', 'float'),
    scalar('mhc_post_mult_value', 'float'),
    scalar('sinkhorn_repeat', 'int'),
    scalar('n_splits', 'int'),
    limits=check_pre_path_sizes,
    extra=_extra,
    choice=lambda residual, gemm_out_mul, sinkhorn_repeat: {
        'direction': 'bwd',
        'mhc_mult': residual.shape[1],
        'hidden': residual.shape[2],
        'n_splits': gemm_out_mul.shape[0],
        'repeat': sinkhorn_repeat,
    },
    choose_config=choose_mhc_pre_big_fuse_config,
    get_kernel=get_mhc_pre_big_fuse_kernel,
)


def _eager(post_mix_grad, comb_mix_grad, layer_input_grad, gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base,
           residual, gemm_out_mul_grad, gemm_out_sqrsum_grad, mhc_scale_grad, mhc_base_grad, residual_grad, rms_eps,
           mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat,
           n_splits) -> MhcPreBigFuseBwdResult:  # fmt: skip
    """The contract once, the intermediates in one allocation, then the stages (for T = 0: zero parameter
    gradients, no launch)."""
    OP.check(post_mix_grad, comb_mix_grad, layer_input_grad, gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base,
             residual, gemm_out_mul_grad, gemm_out_sqrsum_grad, mhc_scale_grad, mhc_base_grad, residual_grad, rms_eps,
             mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits)  # fmt: skip
    result = MhcPreBigFuseBwdResult(gemm_out_mul_grad, gemm_out_sqrsum_grad, mhc_scale_grad, mhc_base_grad,
                                    residual_grad)  # fmt: skip
    S, T, M3 = gemm_out_mul.shape
    M, H = residual.shape[1:]
    if not T:  # no token: the parameters' gradients are sums over nothing
        mhc_scale_grad.zero_()
        mhc_base_grad.zero_()
        return result
    out_mul, sqrsum, mixes, pre_mix, post_mix, comb_logits, comb_logits_grad, mixes_grad = scratch(
        gemm_out_mul, T * M3, T, T * M3, T * M, T * M, T * M * M, T * M * M, T * M3
    )
    # The forward's mixes, recomputed (the same launches, so the same bits).
    mhc_reduce_partials_and_rmsnorm_fwd(
        gemm_out_mul.view(S, T, 1, M3), gemm_out_sqrsum.view(S, T, 1), out_mul.view(T, 1, M3), sqrsum.view(T, 1),
        mixes.view(T, M3), M * H, rms_eps, n_splits,
    )  # fmt: skip
    mhc_pre_split_mixes_fwd(
        mixes.view(T, M3), mhc_scale, mhc_base, pre_mix.view(T, M), post_mix.view(T, M), comb_logits.view(T, M * M),
        mhc_post_mult_value, mhc_pre_eps,
    )  # fmt: skip
    # Back through the Sinkhorn iterations, the layer input's mix, the split, the RMS step.
    mhc_sinkhorn_bwd(
        comb_mix_grad.view(T, M, M), comb_logits.view(T, M, M), comb_logits_grad.view(T, M, M), sinkhorn_repeat,
        mhc_sinkhorn_eps,
    )  # fmt: skip
    pre_mix_grad = mhc_pre_apply_mix_bwd(layer_input_grad, residual, pre_mix.view(T, M), residual_grad)
    mhc_pre_split_mixes_bwd(
        pre_mix_grad, post_mix_grad, comb_logits_grad.view(T, M * M), mixes.view(T, M3), post_mix.view(T, M),
        mhc_scale, mhc_base, mixes_grad.view(T, M3), mhc_scale_grad, mhc_base_grad, mhc_post_mult_value,
    )  # fmt: skip
    mhc_reduce_partials_and_rmsnorm_bwd(
        mixes_grad.view(T, M3), out_mul.view(T, 1, M3), sqrsum.view(T, 1), gemm_out_mul_grad.view(T, 1, M3),
        gemm_out_sqrsum_grad.view(T, 1), M * H, rms_eps,
    )  # fmt: skip
    return result


@OP.public(_eager, result=MhcPreBigFuseBwdResult)
def mhc_pre_big_fuse_bwd(
    post_mix_grad: torch.Tensor,
    comb_mix_grad: torch.Tensor,
    layer_input_grad: torch.Tensor,
    gemm_out_mul: torch.Tensor,
    gemm_out_sqrsum: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    residual: torch.Tensor,
    gemm_out_mul_grad: torch.Tensor,
    gemm_out_sqrsum_grad: torch.Tensor,
    mhc_scale_grad: torch.Tensor,
    mhc_base_grad: torch.Tensor,
    residual_grad: torch.Tensor,
    rms_eps: float,
    mhc_pre_eps: float,
    mhc_sinkhorn_eps: float,
    mhc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 16,
) -> MhcPreBigFuseBwdResult:
    """The gradients of mhc_pre_big_fuse_fwd(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, ...)
    given those of its outputs post_mix, comb_mix and layer_input, in fp32 (M = mhc_mult, H = hidden,
    M3 = M * (M + 2)). The forward's sums over the splits are linear, so every split's partials get the same
    gradient: gemm_out_mul_grad[t, j] is d loss / d gemm_out_mul[s, t, j] for every s, gemm_out_sqrsum_grad[t]
    d loss / d gemm_out_sqrsum[s, t] (the split-K GEMM's backward takes them so). residual_grad is accumulated
    into (the streams also get gradient from the residual path), the other gradients are written.

    A composition, one launch per stage (the forward's mixes recomputed first, from the same launches, so the same
    bits), its intermediates in one allocation (pre_mix_grad, returned by mhc_pre_apply_mix_bwd, in its own): the
    results equal, bit for bit, the chain of the public operators
        mhc_reduce_partials_and_rmsnorm_fwd -> mhc_pre_split_mixes_fwd (recomputing mixes, pre, post, comb logits)
        mhc_sinkhorn_bwd(comb_mix_grad) -> comb logits' gradient
        mhc_pre_apply_mix_bwd(layer_input_grad, residual, pre, residual_grad) -> pre's gradient (residual_grad +=)
        mhc_pre_split_mixes_bwd -> mixes' gradient, mhc_scale_grad, mhc_base_grad
        mhc_reduce_partials_and_rmsnorm_bwd (rms_group_size M * H) -> gemm_out_mul_grad, gemm_out_sqrsum_grad
    Every stage sums in a fixed order without atomics: the same bits on every run.

    Args:
        post_mix_grad: (T, M) fp32; comb_mix_grad: (T, M * M) fp32; layer_input_grad: (T, H) bf16, 16-byte
            aligned: the gradients of the forward's outputs.
        gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual: the forward's inputs, with its contract
            (M in 1 .. 8, H a positive multiple of 64, T >= 0, T * M * H <= 2**30, S * (T + 1) * M3 < 2**31).
        gemm_out_mul_grad: (T, M3) fp32 buffer, written.
        gemm_out_sqrsum_grad: (T,) fp32 buffer, written.
        mhc_scale_grad: (3,) fp32 buffer, written (zeros for T = 0).
        mhc_base_grad: (M3,) fp32 buffer, written (zeros for T = 0).
        residual_grad: (T, M, H) bf16 buffer, 16-byte aligned: accumulated into (one bf16 rounding per element).
        rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits: the forward's;
            mhc_post_mult_value nonzero, sinkhorn_repeat in [1, 256] (the recomputed iterates stay on chip).
        Every tensor contiguous, on one device; the buffers apart from each other and from the inputs.

    Returns:
        MhcPreBigFuseBwdResult(gemm_out_mul_grad, gemm_out_sqrsum_grad, mhc_scale_grad, mhc_base_grad,
        residual_grad): the written buffers.
    """
