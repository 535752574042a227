"""Kernels of engram_sinkhorn_step_reduce (docs/engram.md, "Sinkhorn normalisation").

    col_sumsq[j] = sum over p of col_sumsq_partial[p, j]      (fp32, P a runtime size)

The order of the fp32 additions is fixed by the configuration alone (never by timing or by the grid), so
repeated calls give bit-identical results. `num_segments` = S names the order: the P rows are cut into S
consecutive segments of L = ceil(P / S) rows; each segment is summed sequentially from +0.0 in row order,
then the S segment sums are added in segment order (sum_0 + sum_1, then + sum_2, ...). Ascend uses S = 1
(plain sequential order p = 0, 1, ..., P - 1); CUDA uses S = 8 so that eight threads per column keep
loads in flight. tests/engram/engram_sinkhorn_step_reduce_ref.py replays this order bit for bit.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle) and the Sinkhorn family's shared
# sizes.
from ._engram_sinkhorn_step_reduce_ascend import ascend_engram_sinkhorn_step_reduce_kernel
from ._engram_sinkhorn_step_reduce_cuda import cuda_engram_sinkhorn_step_reduce_kernel
from ._sinkhorn_common import HEAD_DIM_ALIGN, MAX_HEAD_DIM

_CUDA_COLS = 128  # columns of one CUDA block: 32 threads x 4 per segment
_CUDA_SEGMENTS = 8
_CUDA_UNROLL = 8  # independent 16-byte loads per thread in flight


@dataclasses.dataclass(frozen=True)
class EngramSinkhornStepReduceConfig:
    backend: Backend
    head_dim: int
    num_cores: int  # Ascend: vector cores; CUDA: SMs (informational)
    num_segments: int  # S of the summation order (module docstring)
    block_cols: int  # columns of one task (Ascend) / one block (CUDA)
    block_rows: int  # Ascend: partial rows per DMA step; CUDA: loads in flight per thread
    num_stages: int  # Ascend: buffer versions of the partial rows; unused on CUDA

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f'head_dim must be a multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}')
        if self.backend == 'ascend' and (self.num_segments != 1 or self.head_dim % self.block_cols):
            raise ValueError('Ascend: one segment and block_cols dividing head_dim')
        if self.block_rows < 1 or self.num_segments < 1:
            raise ValueError('block_rows and num_segments must be >= 1')

    @property
    def num_tiles(self) -> int:
        return -(-self.head_dim // self.block_cols)


def choose_engram_sinkhorn_step_reduce_config(
    *, backend: Backend, head_dim: int, num_cores: int
) -> EngramSinkhornStepReduceConfig:
    """Pure choice of the compile-time parameters (no device query). P is a runtime size."""
    if backend == 'ascend':
        # The narrowest column tile that keeps the tiles within one round of the cores; 32 KB of
        # partial rows per DMA step, double-buffered.
        divisors = [w for w in (64, 128, 256, 512, 1024, 2048) if head_dim % w == 0]
        cols = next((w for w in divisors if head_dim // w <= num_cores), divisors[-1])
        return EngramSinkhornStepReduceConfig(
            backend,
            head_dim,
            num_cores,
            num_segments=1,
            block_cols=cols,
            block_rows=max(1, 8192 // cols),
            num_stages=2,
        )
    return EngramSinkhornStepReduceConfig(
        backend,
        head_dim,
        num_cores,
        num_segments=_CUDA_SEGMENTS,
        block_cols=_CUDA_COLS,
        block_rows=_CUDA_UNROLL,
        num_stages=1,
    )


def make_engram_sinkhorn_step_reduce_kernel(cfg: EngramSinkhornStepReduceConfig):
    """The TileLang prim_func `engram_sinkhorn_step_reduce_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_engram_sinkhorn_step_reduce_kernel(cfg)
    return cuda_engram_sinkhorn_step_reduce_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_step_reduce_kernel(cfg: EngramSinkhornStepReduceConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_step_reduce_kernel(cfg), cfg.backend)
