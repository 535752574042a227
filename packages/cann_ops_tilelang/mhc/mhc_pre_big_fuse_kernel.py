"""The stages of mhc_pre_big_fuse_fwd and mhc_pre_big_fuse_bwd: the domain's kernels in sequence (one launch per
stage), or the forward's fused kernel (_mhc_pre_big_fuse_fwd_ascend.py, _mhc_pre_big_fuse_fwd_cuda.py), one launch.

A configuration lists the stage kernels' configurations, each chosen by its own operator's chooser, in launch
order: what a call of the composition launches is exactly what the chain of public operators launches. A fused
configuration lists the same stages; its one kernel takes its sizes, tiles and Sinkhorn reciprocal from them and
does each stage's arithmetic on every value in the stage's order, so its results are the composition's bits.
"""

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The fused backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_pre_big_fuse_fwd_ascend import ascend_mhc_pre_big_fuse_fwd_kernel, fused_ub_bytes
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
# The Ascend fused kernel: tokens per task (whole 64-lane registers of every segment tile: a multiple of 8), and
# the UB its buffers may take (of 248 KB; the SIMT Sinkhorn's VF leaves the rest to the compiler).
ASCEND_FUSED_TOKEN_BLOCK = 16
ASCEND_FUSED_UB_BUDGET = 192 * 1024


@dataclasses.dataclass(frozen=True)
class MhcPreBigFuseConfig:
    backend: Backend
    direction: str  # 'fwd' or 'bwd'
    # (stage name, the stage kernel's configuration), in launch order
    stages: tuple[tuple[str, object], ...]
    # One launch of the fused kernel (the forward only) instead of the stages' launches
    fused: bool = False
    # Ascend fused kernel: tokens per task (0 otherwise)
    token_block: int = 0

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.direction not in DIRECTIONS:
            raise ValueError(f'direction must be one of {DIRECTIONS}, got {self.direction!r}')
        for name, cfg in self.stages:
            if cfg.backend != self.backend:
                raise ValueError(f'stage {name} is configured for {cfg.backend}, not {self.backend}')
        if self.token_block and not (self.fused and self.backend == 'ascend'):
            raise ValueError(f"token_block is the Ascend fused kernel's, got {self.token_block} for {self}")
        if self.fused:
            if self.direction != 'fwd':
                raise ValueError(f'the fused kernel is the forward, got {self.backend} {self.direction}')
            if tuple(name for name, _ in self.stages) != FWD_STAGES:
                raise ValueError(f'the fused kernel does the stages {FWD_STAGES}, got {self.stages}')
            if self.backend == 'cuda' and self.stage('sinkhorn_fwd').tokens > self.stage('pre_apply_mix_fwd').threads:
                raise ValueError("a thread per token of a Sinkhorn block: sinkhorn tokens <= the tile's threads")
            if self.backend == 'ascend':
                tb = self.token_block
                if not 8 <= tb <= 64 or tb % 8:
                    raise ValueError(f'Ascend fused token_block must be a multiple of 8 in [8, 64], got {tb}')
                if self.ub_bytes > ASCEND_FUSED_UB_BUDGET:
                    raise ValueError(f'the Ascend fused kernel needs {self.ub_bytes} B of UB, over its budget')

    def stage(self, name: str):
        """The configuration of stage `name`."""
        return dict(self.stages)[name]

    @property
    def ub_bytes(self) -> int:
        """UB bytes of the Ascend fused kernel's buffers (0 for other configurations)."""
        if not (self.fused and self.backend == 'ascend'):
            return 0
        apply = self.stage('pre_apply_mix_fwd')
        return fused_ub_bytes(apply.mhc, self.token_block, apply.hidden_block)


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
    fuse_ascend: bool = True,
) -> MhcPreBigFuseConfig:
    """Pure choice (no device query): each stage's configuration from its operator's chooser. The backward
    recomputes the forward's reduction and split (its sinkhorn backward recomputes the Sinkhorn iterates), and is
    the stages. The forward: the fused kernel of the backend where asked, on CUDA `fuse` (FUSE_ON_CUDA, off until
    a GPU has run it), on Ascend `fuse_ascend` (FUSE_ON_ASCEND, on: emulated bit-equal to the composition), each
    taking every size the composition takes (Ascend: within the UB budget, which every size checked fits);
    elsewhere the stages."""
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
        if backend == 'cuda':
            return MhcPreBigFuseConfig(backend, direction, stages, fuse)
        fits = fused_ub_bytes(mhc_mult, ASCEND_FUSED_TOKEN_BLOCK, apply.hidden_block) <= ASCEND_FUSED_UB_BUDGET
        if fuse_ascend and fits:
            return MhcPreBigFuseConfig(backend, direction, stages, True, ASCEND_FUSED_TOKEN_BLOCK)
        return MhcPreBigFuseConfig(backend, direction, stages)
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
    if cfg.backend == 'ascend':
        return ascend_mhc_pre_big_fuse_fwd_kernel(cfg)
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
