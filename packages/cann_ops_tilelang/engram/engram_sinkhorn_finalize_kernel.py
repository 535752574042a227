"""Kernels of engram_sinkhorn_finalize (docs/engram.md, "Sinkhorn normalisation").

Per row i of the (rows, D) fp32 matrix M, with r = row_scale, c = col_scale (fp32 math):
    x_j = (r_i * M_ij) * c_j,  n_i = sqrt(sum_j x_j^2)
    s_i = alpha * (r_i / (n_i + eps))                      (correctly rounded division)
    out_ij = (s_i * M_ij) * c_j
The operations and their order are the torch reference's, except the order of the sum of squares. The
norm is accumulated exactly as engram_sinkhorn_step accumulates it (its row layout and order), so for
the same row both operators see the same norm, and s_i is alpha times the row scale the step would store.

One pass over memory: each row of M is read once and kept on chip between the norm and the output.
The row count is a runtime size (T.dynamic).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle) and the Sinkhorn family's shared
# code (the step's row layout: the same norms).
from ._engram_sinkhorn_finalize_ascend import ascend_engram_sinkhorn_finalize_kernel
from ._engram_sinkhorn_finalize_cuda import cuda_engram_sinkhorn_finalize_kernel
from ._sinkhorn_common import CUDA_VEC, HEAD_DIM_ALIGN, MAX_HEAD_DIM, ascend_rows_per_task, row_layout

# Rows per block of row groups at most a warp wide: at head_dim 256 on the H200, 32 rows per block were
# slower at 1001 and 10001 rows (fewer blocks than SMs, then fewer waves) and no faster at 100001.
CUDA_FINALIZE_ROWS_PER_BLOCK = 16
# Rows per row group (R): each thread already has its chunks of a row in flight, and with half-warp rows
# (head_dim <= 512) a warp has two rows; R = 2 and 4 were no faster in the same sweep.
CUDA_FINALIZE_ROWS_IN_FLIGHT = 1


@dataclasses.dataclass(frozen=True)
class EngramSinkhornFinalizeConfig:
    backend: Backend
    head_dim: int
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is rows / W)
    rows_per_task: int  # Ascend: rows of one task (UB tile); CUDA: row groups per block (W)
    group_threads: int  # CUDA: threads per row (G); unused on Ascend
    chunks: int  # CUDA: 16-byte chunks per thread; unused on Ascend
    num_stages: int  # Ascend buffer versions of the persistent loop; unused on CUDA
    rows_in_flight: int = 1  # CUDA: rows per row group (R), loaded before any is reduced; Ascend: 1

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f'head_dim must be a multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}')
        if self.backend == 'cuda' and self.group_threads * self.chunks * CUDA_VEC < self.head_dim:
            raise ValueError('group_threads * chunks * 4 must cover head_dim')
        if self.rows_in_flight < 1:
            raise ValueError('rows_in_flight must be at least 1')

    @property
    def threads(self) -> int:
        return self.group_threads * self.rows_per_task


def choose_engram_sinkhorn_finalize_config(
    *, backend: Backend, head_dim: int, num_cores: int
) -> EngramSinkhornFinalizeConfig:
    """Pure choice of the compile-time parameters (no device query). The row count is a runtime size."""
    if backend == 'ascend':
        return EngramSinkhornFinalizeConfig(
            backend,
            head_dim,
            num_cores,
            rows_per_task=ascend_rows_per_task(head_dim),
            group_threads=0,
            chunks=0,
            num_stages=2,
            rows_in_flight=1,
        )
    # The step's row layout (same norms: G and chunks; W and R do not change a row's sum).
    g, chunks = row_layout(head_dim)
    r = CUDA_FINALIZE_ROWS_IN_FLIGHT
    # Groups of at most a warp: CUDA_FINALIZE_ROWS_PER_BLOCK rows per block, each group on its own R rows, no
    # barrier; wider rows: one row group per block.
    w = max(1, CUDA_FINALIZE_ROWS_PER_BLOCK // r) if g <= 32 else 1
    return EngramSinkhornFinalizeConfig(
        backend, head_dim, num_cores, rows_per_task=w, group_threads=g, chunks=chunks, num_stages=1, rows_in_flight=r
    )


def make_engram_sinkhorn_finalize_kernel(cfg: EngramSinkhornFinalizeConfig):
    """The TileLang prim_func `engram_sinkhorn_finalize_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_engram_sinkhorn_finalize_kernel(cfg)
    return cuda_engram_sinkhorn_finalize_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_finalize_kernel(cfg: EngramSinkhornFinalizeConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_finalize_kernel(cfg), cfg.backend)
