"""Kernels of mhc_reduce_partials_and_rmsnorm_fwd: the split-K partials of the prenorm GEMM reduced, then the
RMS normalisation (fp32). For token t, RMS group g and mix j:

    out_mul[t, g, j] = sum over s of out_mul_splitted[s, t, g, j]
    sqrsum[t, g]     = sum over s of sqrsum_splitted[s, t, g]
    out[t, j]        = sum over g of out_mul[t, g, j] / sqrt(sqrsum[t, g] / rms_group_size + rms_eps)

The split sums run in split order (s = 0, 1, ...) from +0.0, the group sum in group order: no atomics, the
same bits on every call. The token count is dynamic (one kernel per (mhc_mult3, groups, n_splits));
rms_group_size and rms_eps are runtime scalars (1 / rms_group_size is passed, so the kernels multiply).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_reduce_partials_and_rmsnorm_fwd_ascend import ascend_mhc_reduce_partials_and_rmsnorm_fwd_kernel
from ._mhc_reduce_partials_and_rmsnorm_fwd_cuda import cuda_mhc_reduce_partials_and_rmsnorm_fwd_kernel
from ._norm_fn_common import MAX_RMS_GROUPS, ROW_ALIGN, check_mhc_mult3, padded_row

# Ascend: per task, about this many fp32 elements in each (tokens x groups, padded mixes) tile; seven such
# tiles (the partial rows twice, the sum, the output, the per-row scalars) stay well inside UB.
_ASCEND_TILE_ELEMENTS = 4096
_ASCEND_MAX_TOKENS = 64
_CUDA_ELEMENTS = 256  # about this many outputs (one thread each) per CUDA block: several blocks per SM


def cuda_block(per_token: int) -> tuple[int, int]:
    """(tokens, threads) of a CUDA block, one thread per output element of `per_token` per token: whole warps,
    at most _CUDA_ELEMENTS threads (a thread loops over the rest when one token has more elements)."""
    per_token = max(1, per_token)  # sizes out of range reach the config's own check
    tokens = max(1, _CUDA_ELEMENTS // per_token)
    return tokens, min(_CUDA_ELEMENTS, -(-tokens * per_token // 32) * 32)


def tokens_per_task(groups: int, mhc_mult3: int) -> int:
    """Ascend tokens per task: a multiple of 8 (so each tile is whole 64-lane registers), within the budget."""
    per_token = max(1, groups * padded_row(mhc_mult3))  # sizes out of range reach the config's own check
    fit = _ASCEND_TILE_ELEMENTS // per_token // ROW_ALIGN * ROW_ALIGN
    return max(ROW_ALIGN, min(_ASCEND_MAX_TOKENS, fit))


@dataclasses.dataclass(frozen=True)
class MhcReducePartialsAndRmsnormFwdConfig:
    backend: Backend
    mhc_mult3: int  # mixes per RMS group
    groups: int  # RMS groups per token
    n_splits: int  # split-K partials
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    tokens: int  # tokens per task (Ascend) / per thread block (CUDA)
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the partial tiles (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        check_mhc_mult3('mhc_reduce_partials_and_rmsnorm_fwd', self.mhc_mult3)
        if not 1 <= self.groups <= MAX_RMS_GROUPS or self.n_splits < 1 or self.num_cores < 1:
            raise ValueError(f'groups in [1, {MAX_RMS_GROUPS}], n_splits >= 1 and num_cores >= 1 needed')
        if self.backend == 'ascend' and self.tokens % ROW_ALIGN:
            raise ValueError(f'Ascend tokens per task must be a multiple of {ROW_ALIGN}, got {self.tokens}')


def choose_mhc_reduce_partials_and_rmsnorm_fwd_config(
    *, backend: Backend, mhc_mult3: int, groups: int, n_splits: int, num_cores: int
) -> MhcReducePartialsAndRmsnormFwdConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    if backend == 'ascend':
        return MhcReducePartialsAndRmsnormFwdConfig(
            backend, mhc_mult3, groups, n_splits, num_cores, tokens_per_task(groups, mhc_mult3), 0, 2
        )
    tokens, threads = cuda_block(mhc_mult3)
    return MhcReducePartialsAndRmsnormFwdConfig(backend, mhc_mult3, groups, n_splits, num_cores, tokens, threads, 1)


def make_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg: MhcReducePartialsAndRmsnormFwdConfig):
    """The TileLang prim_func `mhc_reduce_partials_and_rmsnorm_fwd_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg)
    return cuda_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg)


@functools.cache
def get_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg: MhcReducePartialsAndRmsnormFwdConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg), cfg.backend)
