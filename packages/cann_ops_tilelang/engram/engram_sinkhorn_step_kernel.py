"""Kernels of engram_sinkhorn_step (docs/engram.md, "Sinkhorn normalisation").

Per row i of the (rows, D) fp32 matrix M, with r = row_scale, c = col_scale (fp32 math):
    x_j = (r_i * M_ij) * c_j,  row_norm_i = sqrt(sum_j x_j^2)
    r'_i = r_i / (row_norm_i + eps)                          (correctly rounded division; stored in row_scale)
    col_sumsq_partial[p, j] += ((r'_i * M_ij) * c_j)^2       (rows of worker p only)
The products are evaluated in the order of the torch reference, so the terms of both sums are the
reference's; only the order of the sums differs (and the fused multiply-adds of the squares).

One pass over memory: each row of M is read once (kept on chip between the norm and the column
update); row_scale is read and written once; each worker writes its own (D,) partial, no atomics.
P (the number of workers) is fixed by the configuration: the vector cores on Ascend, two blocks per SM
on CUDA; a worker's rows and the order it adds them in are fixed, so the partials are reproducible.
The row count is a runtime size (T.dynamic).

engram_sinkhorn_finalize computes its row norms with the same row layout (`row_layout`, _sinkhorn_common.py)
and the same accumulation order, so both operators give bit-identical norms for the same row.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle; the CUDA register model, which the
# chooser uses too, lives with its kernel) and the Sinkhorn family's shared code, re-exported from here for the
# operator interfaces and the tests.
from ._engram_sinkhorn_step_ascend import ascend_engram_sinkhorn_step_kernel
from ._engram_sinkhorn_step_cuda import (
    CUDA_BLOCKS_PER_SM,
    CUDA_REGS_PER_SM,
    _cuda_regs_estimate,
    cuda_engram_sinkhorn_step_kernel,
)
from ._sinkhorn_common import CUDA_NARROW_MAX_HEAD_DIM as CUDA_NARROW_MAX_HEAD_DIM
from ._sinkhorn_common import CUDA_VEC, HEAD_DIM_ALIGN, MAX_HEAD_DIM, ascend_rows_per_task, row_layout

CUDA_BLOCK_THREADS = 512  # CUDA threads per block when row groups are at most a warp wide


def cuda_row_groups(group_threads: int, chunks: int, rows_in_flight: int, stages: int) -> int:
    """CUDA: row groups per block (W): at most CUDA_BLOCK_THREADS threads, and as many as leave both blocks
    of an SM resident within the register file by _cuda_regs_estimate; groups narrower than a warp fill
    whole warps."""
    regs = _cuda_regs_estimate(chunks, rows_in_flight, stages)
    fit = CUDA_REGS_PER_SM // (CUDA_BLOCKS_PER_SM * group_threads * regs)
    w = min(CUDA_BLOCK_THREADS // group_threads, fit)
    if group_threads < 32:
        w -= w % (32 // group_threads)
    return max(1, w)


@dataclasses.dataclass(frozen=True)
class EngramSinkhornStepConfig:
    backend: Backend
    head_dim: int
    num_cores: int  # Ascend: vector cores; CUDA: SMs
    num_partials: int  # P: workers, one (head_dim,) partial each (Ascend cores / CUDA blocks)
    rows_per_task: int  # Ascend: rows of one task (UB tile); CUDA: row groups per block (W)
    group_threads: int  # CUDA: threads per row (G); unused on Ascend
    chunks: int  # CUDA: 16-byte chunks per thread; unused on Ascend
    # Ascend: buffer versions of the persistent loop. CUDA: 1 = a row group loads its rows_in_flight rows,
    # then reduces them; 2 = it also loads its next rows_in_flight rows before reducing the current ones.
    num_stages: int
    rows_in_flight: int = 1  # CUDA: rows a row group loads per iteration before reducing them (R); Ascend: 1

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f'head_dim must be a multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}')
        if self.backend == 'cuda' and self.group_threads * self.chunks * CUDA_VEC < self.head_dim:
            raise ValueError('group_threads * chunks * 4 must cover head_dim')
        if self.backend == 'cuda' and (self.num_stages not in (1, 2) or self.rows_in_flight < 1):
            raise ValueError('CUDA: num_stages must be 1 or 2 and rows_in_flight at least 1')

    @property
    def threads(self) -> int:
        return self.group_threads * self.rows_per_task


def cuda_rows_in_flight(head_dim: int) -> tuple[int, int]:
    """CUDA: (rows_in_flight, num_stages) of a row group, from the H200 sweeps of the variants at 1001, 10001
    and 100001 rows (docs/engram.md, "Sinkhorn step: rows in flight").

    Half-warp rows (head_dim <= CUDA_NARROW_MAX_HEAD_DIM) are loaded four at a time and reduced as four
    independent chains, so that a warp has eight rows in flight. Wider rows (one or more warps per row): one
    row at a time, the next one prefetched, and enough row groups per block (cuda_row_groups) to keep the
    SM's warps busy."""
    g, _ = row_layout(head_dim)
    if g < 32:
        return 4, 1
    return 1, 2


def choose_engram_sinkhorn_step_config(*, backend: Backend, head_dim: int, num_cores: int) -> EngramSinkhornStepConfig:
    """Pure choice of the compile-time parameters (no device query). The row count is a runtime size."""
    if backend == 'ascend':
        return EngramSinkhornStepConfig(
            backend,
            head_dim,
            num_cores,
            num_partials=num_cores,
            rows_per_task=ascend_rows_per_task(head_dim),
            group_threads=0,
            chunks=0,
            num_stages=2,
            rows_in_flight=1,
        )
    g, chunks = row_layout(head_dim)
    r, stages = cuda_rows_in_flight(head_dim)
    # As many row groups per block as leave both blocks of an SM resident (each group on its own rows;
    # groups wider than a warp meet at a barrier per row). Two blocks per SM: P = 2 * SMs partials.
    w = cuda_row_groups(g, chunks, r, stages)
    return EngramSinkhornStepConfig(
        backend,
        head_dim,
        num_cores,
        num_partials=num_cores * CUDA_BLOCKS_PER_SM,
        rows_per_task=w,
        group_threads=g,
        chunks=chunks,
        num_stages=stages,
        rows_in_flight=r,
    )


def make_engram_sinkhorn_step_kernel(cfg: EngramSinkhornStepConfig):
    """The TileLang prim_func `engram_sinkhorn_step_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_engram_sinkhorn_step_kernel(cfg)
    return cuda_engram_sinkhorn_step_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_step_kernel(cfg: EngramSinkhornStepConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_step_kernel(cfg), cfg.backend)
