"""Kernels of engram_grad_w_reduce: finish the Engram weight gradients from per-block partials.

    s[h, d] = sum_p partial[p, h, d]                      (fp32, P is a runtime size)
    grad_weight_hidden[h, d] += s[h, d] * float(we[h, d])  (in place)
    grad_weight_embed[h, d]  += s[h, d] * float(wh[h, d])  (in place)

One pass: every partial element is read once, the two weights and the two gradients once each.
The work is split over column tiles (h, d0:d0 + block_cols); each tile loops over P in chunks of
`block_rows` partial rows.

Summation order (fp32): Ascend adds the rows of a tile in order p = 0, 1, ..., P - 1. CUDA: the tile's
threads are (row lane, 16-byte column group) pairs; lane l adds rows l, l + L, l + 2L, ... in order, then
the L lane sums of a column are added in lane order. Both differ from torch's order, so results agree with
an fp32 reference within a few ulps of sum_p |partial[p]| (see the tests).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle; the widths the config checks live
# with them).
from ._engram_grad_w_reduce_ascend import LANES as _LANES
from ._engram_grad_w_reduce_ascend import ascend_engram_grad_w_reduce_kernel
from ._engram_grad_w_reduce_cuda import CUDA_VEC as _CUDA_VEC
from ._engram_grad_w_reduce_cuda import cuda_engram_grad_w_reduce_kernel


@dataclasses.dataclass(frozen=True)
class EngramGradWReduceConfig:
    backend: Backend
    hc: int
    hidden: int
    num_cores: int  # Ascend vector cores / CUDA SMs: the tiles are sized to fill them in one round
    block_cols: int  # W: columns of one tile, divides hidden
    block_rows: int  # R: partial rows loaded per step
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend: buffer versions of the partial rows (double buffering); unused on CUDA

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.hidden % self.block_cols != 0 or self.block_cols % _LANES != 0:
            raise ValueError(f'block_cols {self.block_cols} must be a multiple of {_LANES} dividing {self.hidden}')
        if self.block_rows < 1:
            raise ValueError(f'block_rows must be >= 1, got {self.block_rows}')
        if self.backend == 'cuda':
            groups = self.block_cols // _CUDA_VEC
            if self.threads % groups or self.block_rows % (self.threads // groups):
                raise ValueError(
                    f'CUDA tiling: threads {self.threads} must be a multiple of the {groups} column groups and '
                    f'block_rows {self.block_rows} a multiple of the {self.threads // max(1, groups)} row lanes'
                )

    @property
    def num_tiles(self) -> int:
        return self.hc * (self.hidden // self.block_cols)


def choose_engram_grad_w_reduce_config(
    *, backend: Backend, hc: int, hidden: int, num_cores: int
) -> EngramGradWReduceConfig:
    """Pure choice of the compile-time parameters (no device query). P is a runtime size."""
    divisors = [w for w in (64, 128, 256, 512, 1024, 2048) if hidden % w == 0]  # ascending; 64 always divides
    if backend == 'ascend':
        # One tile per vector core in a single round: the narrowest tile that keeps the grid within the
        # cores (the widest candidate when none does; the extra blocks then run in further rounds);
        # 32 KB of partial rows per step, double-buffered.
        cols = next((w for w in divisors if hc * hidden // w <= num_cores), divisors[-1])
        return EngramGradWReduceConfig(
            backend,
            hc,
            hidden,
            num_cores,
            block_cols=cols,
            block_rows=max(1, min(32, 8192 // cols)),
            threads=0,
            num_stages=2,
        )
    # CUDA: 64-column tiles (hc * H / 64 blocks, several per SM) of 128 threads: 16 column groups x 8 row
    # lanes, each lane with 9 independent 16-byte row loads per step (2 steps for P = 132).
    return EngramGradWReduceConfig(
        backend, hc, hidden, num_cores, block_cols=_LANES, block_rows=72, threads=128, num_stages=1
    )


def make_engram_grad_w_reduce_kernel(cfg: EngramGradWReduceConfig):
    """The TileLang prim_func `engram_grad_w_reduce_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_engram_grad_w_reduce_kernel(cfg)
    return cuda_engram_grad_w_reduce_kernel(cfg)


@functools.cache
def get_engram_grad_w_reduce_kernel(cfg: EngramGradWReduceConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_grad_w_reduce_kernel(cfg), cfg.backend)
