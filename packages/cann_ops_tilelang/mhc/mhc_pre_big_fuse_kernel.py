"""The stages of mhc_pre_big_fuse_fwd and mhc_pre_big_fuse_bwd: no kernel of their own, the domain's kernels in
sequence (one launch per stage).

A configuration lists the stage kernels' configurations, each chosen by its own operator's chooser, in launch
order: what a call of the composition launches is exactly what the chain of public operators launches.
"""

import dataclasses

from cann_ops_tilelang.config import Backend

from ._mixes_kernel import choose_mhc_mixes_config, get_mhc_mixes_kernel
from .mhc_pre_apply_mix_kernel import choose_mhc_pre_apply_mix_config, get_mhc_pre_apply_mix_kernel
from .mhc_reduce_partials_and_rmsnorm_bwd_kernel import (
    choose_mhc_reduce_partials_and_rmsnorm_bwd_config,
    get_mhc_reduce_partials_and_rmsnorm_bwd_kernel,
)
from .mhc_reduce_partials_and_rmsnorm_fwd_kernel import (
    choose_mhc_reduce_partials_and_rmsnorm_fwd_config,
    get_mhc_reduce_partials_and_rmsnorm_fwd_kernel,
)
from .mhc_sinkhorn_kernel import choose_mhc_sinkhorn_config, get_mhc_sinkhorn_kernel

DIRECTIONS = ('fwd', 'bwd')


@dataclasses.dataclass(frozen=True)
class MhcPreBigFuseConfig:
    backend: Backend
    direction: str  # 'fwd' or 'bwd'
    # (stage name, the stage kernel's configuration), in launch order
    stages: tuple[tuple[str, object], ...]

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.direction not in DIRECTIONS:
            raise ValueError(f'direction must be one of {DIRECTIONS}, got {self.direction!r}')
        for name, cfg in self.stages:
            if cfg.backend != self.backend:
                raise ValueError(f'stage {name} is configured for {cfg.backend}, not {self.backend}')

    def stage(self, name: str):
        """The configuration of stage `name`."""
        return dict(self.stages)[name]


# Stage name -> the function compiling its kernel for its configuration.
_GET_KERNEL = {
    'reduce_partials_and_rmsnorm_fwd': get_mhc_reduce_partials_and_rmsnorm_fwd_kernel,
    'pre_split_mixes_fwd': get_mhc_mixes_kernel,
    'sinkhorn_fwd': get_mhc_sinkhorn_kernel,
    'pre_apply_mix_fwd': get_mhc_pre_apply_mix_kernel,
    'sinkhorn_bwd': get_mhc_sinkhorn_kernel,
    'pre_apply_mix_bwd': get_mhc_pre_apply_mix_kernel,
    'pre_split_mixes_bwd': get_mhc_mixes_kernel,
    'pre_split_mixes_reduce': get_mhc_mixes_kernel,
    'reduce_partials_and_rmsnorm_bwd': get_mhc_reduce_partials_and_rmsnorm_bwd_kernel,
}


def choose_mhc_pre_big_fuse_config(
    *, backend: Backend, num_cores: int, direction: str, mhc_mult: int, hidden: int, n_splits: int, repeat: int
) -> MhcPreBigFuseConfig:
    """Pure choice (no device query): each stage's configuration from its operator's chooser. The backward
    recomputes the forward's reduction and split (its sinkhorn backward recomputes the Sinkhorn iterates)."""
    common = {'backend': backend, 'num_cores': num_cores}
    mhc_mult3 = mhc_mult * (mhc_mult + 2)
    recomputed = (
        ('reduce_partials_and_rmsnorm_fwd', choose_mhc_reduce_partials_and_rmsnorm_fwd_config(
            **common, mhc_mult3=mhc_mult3, groups=1, n_splits=n_splits)),
        ('pre_split_mixes_fwd', choose_mhc_mixes_config(**common, kind='split_fwd', mhc_mult=mhc_mult)),
    )  # fmt: skip
    sinkhorn = choose_mhc_sinkhorn_config(**common, direction=direction, mhc_mult=mhc_mult, repeat=repeat)
    apply = choose_mhc_pre_apply_mix_config(**common, direction=direction, mhc=mhc_mult, hidden=hidden)
    if direction == 'fwd':
        stages = (*recomputed, ('sinkhorn_fwd', sinkhorn), ('pre_apply_mix_fwd', apply))
    else:
        stages = (
            *recomputed,
            ('sinkhorn_bwd', sinkhorn),
            ('pre_apply_mix_bwd', apply),
            ('pre_split_mixes_bwd', choose_mhc_mixes_config(**common, kind='split_bwd', mhc_mult=mhc_mult)),
            ('pre_split_mixes_reduce', choose_mhc_mixes_config(**common, kind='split_reduce', mhc_mult=mhc_mult)),
            ('reduce_partials_and_rmsnorm_bwd', choose_mhc_reduce_partials_and_rmsnorm_bwd_config(
                **common, mhc_mult3=mhc_mult3, groups=1)),
        )  # fmt: skip
    return MhcPreBigFuseConfig(backend, direction, stages)


def get_mhc_pre_big_fuse_kernel(cfg: MhcPreBigFuseConfig) -> tuple:
    """The stages' compiled kernels, in launch order (each cached by its own module). The operators launch the
    stages through their public functions, which find these same compiled kernels."""
    return tuple(_GET_KERNEL[name](stage_cfg) for name, stage_cfg in cfg.stages)
