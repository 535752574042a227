"""Manifold-constrained hyper-connections (mHC): expanding, mixing and Sinkhorn-normalising a token's residual
streams, forward and backward (docs/mhc.md). Experimental: not exported by the root package yet."""

from .mhc_expand_bwd import mhc_expand_bwd
from .mhc_expand_fwd import mhc_expand_fwd
from .mhc_fn_normw_merge_bwd import mhc_fn_normw_merge_bwd
from .mhc_fn_normw_merge_fwd import mhc_fn_normw_merge_fwd
from .mhc_head_compute_mix_bwd import mhc_head_compute_mix_bwd
from .mhc_head_compute_mix_fwd import mhc_head_compute_mix_fwd
from .mhc_multilayer_recompute import mhc_multilayer_recompute
from .mhc_post_bwd import mhc_post_bwd
from .mhc_post_fwd import mhc_post_fwd
from .mhc_pre_apply_mix_bwd import mhc_pre_apply_mix_bwd
from .mhc_pre_apply_mix_fwd import mhc_pre_apply_mix_fwd
from .mhc_pre_big_fuse_bwd import mhc_pre_big_fuse_bwd
from .mhc_pre_big_fuse_fwd import mhc_pre_big_fuse_fwd
from .mhc_pre_split_mixes_bwd import mhc_pre_split_mixes_bwd
from .mhc_pre_split_mixes_fwd import mhc_pre_split_mixes_fwd
from .mhc_reduce_partials_and_rmsnorm_bwd import mhc_reduce_partials_and_rmsnorm_bwd
from .mhc_reduce_partials_and_rmsnorm_fwd import mhc_reduce_partials_and_rmsnorm_fwd
from .mhc_sinkhorn_bwd import mhc_sinkhorn_bwd
from .mhc_sinkhorn_fwd import mhc_sinkhorn_fwd

__all__ = [
    'mhc_expand_bwd',
    'mhc_expand_fwd',
    'mhc_fn_normw_merge_bwd',
    'mhc_fn_normw_merge_fwd',
    'mhc_head_compute_mix_bwd',
    'mhc_head_compute_mix_fwd',
    'mhc_multilayer_recompute',
    'mhc_post_bwd',
    'mhc_post_fwd',
    'mhc_pre_apply_mix_bwd',
    'mhc_pre_apply_mix_fwd',
    'mhc_pre_big_fuse_bwd',
    'mhc_pre_big_fuse_fwd',
    'mhc_pre_split_mixes_bwd',
    'mhc_pre_split_mixes_fwd',
    'mhc_reduce_partials_and_rmsnorm_bwd',
    'mhc_reduce_partials_and_rmsnorm_fwd',
    'mhc_sinkhorn_bwd',
    'mhc_sinkhorn_fwd',
]
