"""Kernels of mhc_fn_normw_merge_fwd: out_fn[m, k] = fn[m, k] * normw[k] (fp32).

fn is a weight (mhc_mult3 rows, hidden columns), so both sizes are compile-time constants: a kernel per model
shape. Ascend: column tiles of `block_cols` over the vector cores (T.Persistent), every row of the tile at once.
CUDA: blocks of `block_rows` x `block_cols`, vectorised to 16-byte accesses.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_fn_normw_merge_fwd_ascend import ascend_mhc_fn_normw_merge_fwd_kernel
from ._mhc_fn_normw_merge_fwd_cuda import cuda_mhc_fn_normw_merge_fwd_kernel
from ._norm_fn_common import LANES, check_fn_shape

_ASCEND_TILE_ELEMENTS = 8192  # fn tile and out tile, two versions each: 4 x 32 KB of UB at most
_CUDA_THREADS = 128
_CUDA_BLOCK_ELEMENTS = 2048  # 16 elements (four 16-byte accesses) per thread


def column_block(rows: int, hidden: int, budget: int, num_cores: int) -> int:
    """Columns of one tile: a divisor of `hidden`, a multiple of 64, with rows x columns within `budget`
    elements; the widest that still gives every core a tile, else the narrowest (the most tiles)."""
    fits = [c for c in (64, 128, 256, 512, 1024, 2048) if hidden % c == 0 and rows * c <= budget] or [LANES]
    return next((c for c in reversed(fits) if hidden // c >= num_cores), fits[0])


@dataclasses.dataclass(frozen=True)
class MhcFnNormwMergeFwdConfig:
    backend: Backend
    rows: int  # mhc_mult3: rows of fn
    hidden: int  # columns of fn
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    block_rows: int  # Ascend: every row; CUDA: rows of one thread block (a divisor of rows)
    block_cols: int  # columns of one task / thread block (a multiple of 64 dividing hidden)
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        check_fn_shape('mhc_fn_normw_merge_fwd', self.rows, self.hidden)
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.block_cols % LANES or self.hidden % self.block_cols:
            raise ValueError(f'block_cols {self.block_cols} must be a multiple of {LANES} dividing {self.hidden}')
        if self.rows % self.block_rows:
            raise ValueError(f'block_rows {self.block_rows} must divide rows {self.rows}')


def choose_mhc_fn_normw_merge_fwd_config(
    *, backend: Backend, rows: int, hidden: int, num_cores: int
) -> MhcFnNormwMergeFwdConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    check_fn_shape('mhc_fn_normw_merge_fwd', rows, hidden)
    if backend == 'ascend':
        cols = column_block(rows, hidden, _ASCEND_TILE_ELEMENTS, num_cores)
        return MhcFnNormwMergeFwdConfig(backend, rows, hidden, num_cores, rows, cols, 0, 2)
    cols = next(c for c in (512, 256, 128, 64) if hidden % c == 0)
    block_rows = max(r for r in range(1, rows + 1) if rows % r == 0 and r * cols <= _CUDA_BLOCK_ELEMENTS)
    return MhcFnNormwMergeFwdConfig(backend, rows, hidden, num_cores, block_rows, cols, _CUDA_THREADS, 1)


def make_mhc_fn_normw_merge_fwd_kernel(cfg: MhcFnNormwMergeFwdConfig):
    """The TileLang prim_func `mhc_fn_normw_merge_fwd_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_fn_normw_merge_fwd_kernel(cfg)
    return cuda_mhc_fn_normw_merge_fwd_kernel(cfg)


@functools.cache
def get_mhc_fn_normw_merge_fwd_kernel(cfg: MhcFnNormwMergeFwdConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_fn_normw_merge_fwd_kernel(cfg), cfg.backend)
