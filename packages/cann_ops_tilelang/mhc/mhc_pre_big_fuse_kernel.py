"""The stages of mhc_pre_big_fuse_fwd and mhc_pre_big_fuse_bwd: the domain's kernels in sequence (one launch per
stage), or on CUDA the forward's fused kernel (_mhc_pre_big_fuse_fwd_cuda.py), one launch.

A configuration lists the stage kernels' configurations, each chosen by its own operator's chooser, in launch
order: what a call of the composition launches is exactly what the chain of public operators launches. A fused
configuration lists the same stages; its one kernel takes its sizes, tiles and Sinkhorn reciprocal from them and
does each stage's arithmetic on every value in the stage's order, so its results are the composition's bits.
"""

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The fused backend takes the configuration as `cfg` and does not import this module: no import circle.
from ._mhc_pre_big_fuse_fwd_cuda import cuda_mhc_pre_big_fuse_fwd_kernel
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
FWD_STAGES = ('reduce_partials_and_rmsnorm_fwd', 'pre_split_mixes_fwd', 'sinkhorn_fwd', 'pre_apply_mix_fwd')


@dataclasses.dataclass(frozen=True)
class MhcPreBigFuseConfig:
    backend: Backend
    direction: str  # 'fwd' or 'bwd'
    # (stage name, the stage kernel's configuration), in launch order
    stages: tuple[tuple[str, object], ...]
    # One launch of the fused kernel (CUDA forward only) instead of the stages' launches
    fused: bool = False

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.direction not in DIRECTIONS:
            raise ValueError(f'direction must be one of {DIRECTIONS}, got {self.direction!r}')
        for name, cfg in self.stages:
            if cfg.backend != self.backend:
                raise ValueError(f'stage {name} is configured for {cfg.backend}, not {self.backend}')
        if self.fused:
            if (self.backend, self.direction) != ('cuda', 'fwd'):
                raise ValueError(f'the fused kernel is the CUDA forward, got {self.backend} {self.direction}')
            if tuple(name for name, _ in self.stages) != FWD_STAGES:
                raise ValueError(f'the fused kernel does the stages {FWD_STAGES}, got {self.stages}')
            if self.stage('sinkhorn_fwd').tokens > self.stage('pre_apply_mix_fwd').threads:
                raise ValueError("a thread per token of a Sinkhorn block: sinkhorn tokens <= the tile's threads")

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
    *,
    backend: Backend,
    num_cores: int,
    direction: str,
    mhc_mult: int,
    hidden: int,
    n_splits: int,
    repeat: int,
    fuse: bool = False,
) -> MhcPreBigFuseConfig:
    """Pure choice (no device query): each stage's configuration from its operator's chooser. The backward
    recomputes the forward's reduction and split (its sinkhorn backward recomputes the Sinkhorn iterates). `fuse`
    asks for the fused kernel, which the CUDA forward takes (every size the composition takes); elsewhere the
    stages."""
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
        return MhcPreBigFuseConfig(backend, direction, stages, fuse and backend == 'cuda')
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


def make_mhc_pre_big_fuse_fwd_kernel(cfg: MhcPreBigFuseConfig):
    """The TileLang prim_func `mhc_pre_big_fuse_fwd_kernel` of a fused configuration (no compile)."""
    if not cfg.fused:
        raise ValueError('a composition has no kernel of its own: its stages launch through their operators')
    return cuda_mhc_pre_big_fuse_fwd_kernel(cfg)


@functools.cache
def _fused_kernel(cfg: MhcPreBigFuseConfig):
    return compile_kernel(make_mhc_pre_big_fuse_fwd_kernel(cfg), cfg.backend)


def get_mhc_pre_big_fuse_kernel(cfg: MhcPreBigFuseConfig):
    """A fused configuration: its compiled kernel (compiled on first use, for the current device). A composition:
    the stages' compiled kernels, in launch order (each cached by its own module); the operators launch the stages
    through their public functions, which find these same compiled kernels."""
    if cfg.fused:
        return _fused_kernel(cfg)
    return tuple(_GET_KERNEL[name](stage_cfg) for name, stage_cfg in cfg.stages)
