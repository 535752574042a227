"""Kernels of moe_normalize_weight: topk_weights (T, K) fp32 -> denominator (T,) and topk_weights / denominator.

Per token row: denominator = sum(row) + 1e-20 (WEIGHT_SUM_EPS, as TileKernels' kernel), the sum taken as a
binary tree over the row's positions (k = 2i with 2i + 1, then pairs of those, ...; the Ascend vector unit's
reduction order, which the CUDA kernel repeats, so both give the same sum); normalized = row / denominator
(an IEEE division per element).

K is at most MAX_TOPK = 64: the Ascend kernel holds a row in one 64-lane fp32 vector register, the CUDA kernel in
one thread's registers (64 floats and the tree's 64 more stay below the 255-register limit). The token count is
dynamic (`T.dynamic`): one kernel per K and backend; the interface launches nothing for T = 0. The kernels index
with int32: T * K < 2**31 (the interface's limit).
"""

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._moe_normalize_weight_ascend import ASCEND_LANES, ascend_moe_normalize_weight_kernel
from ._moe_normalize_weight_cuda import cuda_moe_normalize_weight_kernel

MAX_TOPK = ASCEND_LANES  # one vector register (Ascend) / one thread's registers (CUDA) per row
_ASCEND_TILE_ROWS = 128  # rows per task: 3 UB buffers of 128 x 64 floats at most, two versions: <= 200 KB
_ASCEND_STAGES = 2
_CUDA_THREADS = 64  # rows per CUDA thread block (one thread per row): 2 warps, many blocks over the SMs


@dataclasses.dataclass(frozen=True)
class MoeNormalizeWeightConfig:
    backend: Backend
    num_topk: int  # K, the row length
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the row blocks)
    block_rows: int  # Ascend: rows per task (one UB tile); CUDA: rows (= threads) per thread block
    num_stages: int  # Ascend buffer versions of the persistent loop (1 on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if not 1 <= self.num_topk <= MAX_TOPK:
            raise ValueError(f'num_topk must be in 1..{MAX_TOPK}, got {self.num_topk}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.block_rows < 1 or (self.backend == 'cuda' and self.block_rows % 32):
            raise ValueError(f'block_rows must be positive (a multiple of 32 on CUDA), got {self.block_rows}')


def choose_moe_normalize_weight_config(*, backend: Backend, num_cores: int, num_topk: int) -> MoeNormalizeWeightConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    if backend == 'ascend':
        return MoeNormalizeWeightConfig(backend, num_topk, num_cores, _ASCEND_TILE_ROWS, _ASCEND_STAGES)
    return MoeNormalizeWeightConfig(backend, num_topk, num_cores, _CUDA_THREADS, 1)


def make_moe_normalize_weight_kernel(cfg: MoeNormalizeWeightConfig):
    """The TileLang prim_func `moe_normalize_weight_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_moe_normalize_weight_kernel(cfg)
    return cuda_moe_normalize_weight_kernel(cfg)


@functools.cache
def get_moe_normalize_weight_kernel(cfg: MoeNormalizeWeightConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_moe_normalize_weight_kernel(cfg), cfg.backend)
