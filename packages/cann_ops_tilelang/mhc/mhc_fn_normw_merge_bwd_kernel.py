"""Kernels of mhc_fn_normw_merge_bwd, the gradients of out_fn = fn * normw, accumulated (fp32):

    fn_grad[m, k]  += out_fn_grad[m, k] * normw[k]
    normw_grad[k]  += sum over m of out_fn_grad[m, k] * fn[m, k]

Each column's sum has an order fixed by the configuration, so every call gives the same bits (no atomics).
Ascend: from the given normw_grad[k], row after row in row order, in one task. CUDA: the rows are cut into
`row_groups` consecutive ranges, each summed in row order from +0.0 by one group of threads, then the range sums are
added to the given normw_grad[k] in range order. Both sizes of fn are compile-time constants, as in the
forward.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_fn_normw_merge_bwd_ascend import ascend_mhc_fn_normw_merge_bwd_kernel
from ._mhc_fn_normw_merge_bwd_cuda import cuda_mhc_fn_normw_merge_bwd_kernel
from ._norm_fn_common import CUDA_VEC, LANES, check_fn_shape
from .mhc_fn_normw_merge_fwd_kernel import column_block

# fn, out_fn_grad and fn_grad tiles, two versions each: 6 x 20 KB of UB at most (80 rows x 64 columns fit).
_ASCEND_TILE_ELEMENTS = 5120
_CUDA_COLS = 128  # columns of one warp's tile: 32 threads x one 16-byte access
_CUDA_ROW_GROUPS = 4  # thread groups of a block (a warp each for 128 columns), one row range each
_CUDA_BATCH = 8  # rows a thread loads before it computes them


@dataclasses.dataclass(frozen=True)
class MhcFnNormwMergeBwdConfig:
    backend: Backend
    rows: int  # mhc_mult3: rows of fn
    hidden: int  # columns of fn
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    block_cols: int  # columns of one task / thread block (a multiple of 64 dividing hidden)
    threads: int  # CUDA threads per block (unused on Ascend)
    row_groups: int  # CUDA: row ranges of the column sums, one thread group each (1 on Ascend: one range)
    batch: int  # CUDA: rows a thread loads before it computes them (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        check_fn_shape('mhc_fn_normw_merge_bwd', self.rows, self.hidden)
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.block_cols % LANES or self.hidden % self.block_cols:
            raise ValueError(f'block_cols {self.block_cols} must be a multiple of {LANES} dividing {self.hidden}')
        if not 1 <= self.row_groups <= self.rows or self.batch < 1:
            raise ValueError(f'row_groups must be in [1, rows] and batch >= 1, got {self.row_groups}, {self.batch}')


def choose_mhc_fn_normw_merge_bwd_config(
    *, backend: Backend, rows: int, hidden: int, num_cores: int
) -> MhcFnNormwMergeBwdConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    check_fn_shape('mhc_fn_normw_merge_bwd', rows, hidden)
    if backend == 'ascend':
        cols = column_block(rows, hidden, _ASCEND_TILE_ELEMENTS, num_cores)
        return MhcFnNormwMergeBwdConfig(backend, rows, hidden, num_cores, cols, 0, 1, 1, 2)
    cols = _CUDA_COLS if hidden % _CUDA_COLS == 0 else LANES
    groups = min(_CUDA_ROW_GROUPS, rows)
    batch = min(_CUDA_BATCH, -(-rows // groups))
    return MhcFnNormwMergeBwdConfig(backend, rows, hidden, num_cores, cols, cols // CUDA_VEC * groups, groups, batch, 1)


def make_mhc_fn_normw_merge_bwd_kernel(cfg: MhcFnNormwMergeBwdConfig):
    """The TileLang prim_func `mhc_fn_normw_merge_bwd_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_fn_normw_merge_bwd_kernel(cfg)
    return cuda_mhc_fn_normw_merge_bwd_kernel(cfg, CUDA_VEC)


@functools.cache
def get_mhc_fn_normw_merge_bwd_kernel(cfg: MhcFnNormwMergeBwdConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_fn_normw_merge_bwd_kernel(cfg), cfg.backend)
