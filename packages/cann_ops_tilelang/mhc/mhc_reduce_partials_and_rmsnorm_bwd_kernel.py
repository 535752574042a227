"""Kernels of mhc_reduce_partials_and_rmsnorm_bwd, the gradients of the forward's RMS step (fp32). For token t,
RMS group g, with rstd = 1 / sqrt(sqrsum[t, g] / rms_group_size + rms_eps):

    out_mul_grad[t, g, j] = out_grad[t, j] * rstd
    sqrsum_grad[t, g]     = -0.5 * rstd / (sqrsum[t, g] + rms_eps * rms_group_size)
                            * sum over j of out_grad[t, j] * out_mul[t, g, j]

(d rstd / d sqrsum = -rstd**3 / (2 * rms_group_size)). Every sum lives in one task or one thread, in a fixed
order: no atomics, the same bits on every call. The token count is dynamic; rms_group_size and rms_eps are
runtime scalars.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_reduce_partials_and_rmsnorm_bwd_ascend import ascend_mhc_reduce_partials_and_rmsnorm_bwd_kernel
from ._mhc_reduce_partials_and_rmsnorm_bwd_cuda import cuda_mhc_reduce_partials_and_rmsnorm_bwd_kernel
from ._norm_fn_common import MAX_RMS_GROUPS, ROW_ALIGN, check_mhc_mult3
from .mhc_reduce_partials_and_rmsnorm_fwd_kernel import cuda_block, tokens_per_task


@dataclasses.dataclass(frozen=True)
class MhcReducePartialsAndRmsnormBwdConfig:
    backend: Backend
    mhc_mult3: int  # mixes per RMS group
    groups: int  # RMS groups per token
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    tokens: int  # tokens per task (Ascend) / per thread block (CUDA)
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the input tiles (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        check_mhc_mult3('mhc_reduce_partials_and_rmsnorm_bwd', self.mhc_mult3)
        if not 1 <= self.groups <= MAX_RMS_GROUPS or self.num_cores < 1:
            raise ValueError(f'groups in [1, {MAX_RMS_GROUPS}] and num_cores >= 1 needed')
        if self.backend == 'ascend' and self.tokens % ROW_ALIGN:
            raise ValueError(f'Ascend tokens per task must be a multiple of {ROW_ALIGN}, got {self.tokens}')


def choose_mhc_reduce_partials_and_rmsnorm_bwd_config(
    *, backend: Backend, mhc_mult3: int, groups: int, num_cores: int
) -> MhcReducePartialsAndRmsnormBwdConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    if backend == 'ascend':
        return MhcReducePartialsAndRmsnormBwdConfig(
            backend, mhc_mult3, groups, num_cores, tokens_per_task(groups, mhc_mult3), 0, 2
        )
    tokens, threads = cuda_block(groups * mhc_mult3)
    return MhcReducePartialsAndRmsnormBwdConfig(backend, mhc_mult3, groups, num_cores, tokens, threads, 1)


def make_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg: MhcReducePartialsAndRmsnormBwdConfig):
    """The TileLang prim_func `mhc_reduce_partials_and_rmsnorm_bwd_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg)
    return cuda_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg)


@functools.cache
def get_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg: MhcReducePartialsAndRmsnormBwdConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg), cfg.backend)
