"""PyTorch reference of mhc_pre_big_fuse_fwd, mHC's whole pre path, built from the domain's references of its
stages (the correctness oracle of its tests; never imported by runtime code). float64, differentiable."""

import torch

from .mhc_pre_apply_mix_fwd_ref import mhc_pre_apply_mix_fwd_ref
from .mhc_pre_split_mixes_fwd_ref import mhc_pre_split_mixes_fwd_ref
from .mhc_reduce_partials_and_rmsnorm_fwd_ref import mhc_reduce_partials_and_rmsnorm_fwd_ref
from .mhc_sinkhorn_fwd_ref import mhc_sinkhorn_fwd_ref


def mhc_pre_big_fuse_fwd_ref(
    gemm_out_mul: torch.Tensor,
    gemm_out_sqrsum: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    residual: torch.Tensor,
    rms_eps: float,
    mhc_pre_eps: float,
    mhc_sinkhorn_eps: float,
    mhc_post_mult_value: float,
    sinkhorn_repeat: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(post_mix (T, M), comb_mix (T, M * M), layer_input (T, H)) in float64 from gemm_out_mul (S, T, M3),
    gemm_out_sqrsum (S, T), mhc_scale (3,), mhc_base (M3,), residual (T, M, H): the partials reduced and
    RMS-normalised (one group of M * H elements), split into the mixes, the comb logits Sinkhorn-normalised, the
    streams mixed by pre."""
    num_tokens, mhc_mult, hidden = residual.shape
    _, _, mixes = mhc_reduce_partials_and_rmsnorm_fwd_ref(
        gemm_out_mul.unsqueeze(2), gemm_out_sqrsum.unsqueeze(2), mhc_mult * hidden, rms_eps
    )
    pre, post, comb = mhc_pre_split_mixes_fwd_ref(
        mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps
    )
    comb_mix = mhc_sinkhorn_fwd_ref(comb.view(num_tokens, mhc_mult, mhc_mult), sinkhorn_repeat, mhc_sinkhorn_eps)
    return post, comb_mix.flatten(1), mhc_pre_apply_mix_fwd_ref(residual, pre)
