"""Kernels of engram_fused_weight: out[h, d] = float(wh[h, d]) * float(we[h, d]), bf16 x2 -> fp32.

One generator builds the Ascend 950 kernel (vector cores, SIMD: _engram_fused_weight_ascend.py) or the
CUDA kernel (_engram_fused_weight_cuda.py), chosen by `cfg.backend`. The product of two bf16 values is
exact in fp32 (8 + 8 significant bits fit in 24), so both kernels are bit-exact against the fp32
reference; the CUDA build does not use fast math.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle; the lane width the config checks
# lives with the Ascend kernel).
from ._engram_fused_weight_ascend import LANES as _LANES
from ._engram_fused_weight_ascend import ascend_engram_fused_weight_kernel
from ._engram_fused_weight_cuda import cuda_engram_fused_weight_kernel

_BLOCK_CANDIDATES = (2048, 1024, 512, 256, 128, 64)


@dataclasses.dataclass(frozen=True)
class EngramFusedWeightConfig:
    backend: Backend
    hc: int
    hidden: int
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block: int  # elements of one row handled per task (Ascend) / per thread block (CUDA); divides hidden
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.hidden % self.block != 0 or self.block % _LANES != 0:
            raise ValueError(f'block {self.block} must be a multiple of {_LANES} dividing hidden {self.hidden}')

    @property
    def num_tasks(self) -> int:
        return self.hc * (self.hidden // self.block)


def choose_engram_fused_weight_config(
    *, backend: Backend, hc: int, hidden: int, num_cores: int
) -> EngramFusedWeightConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    divisors = [b for b in _BLOCK_CANDIDATES if hidden % b == 0]  # descending; 64 always divides hidden
    if backend == 'ascend':
        # Largest block that still gives every vector core a task, but DMAs of at least 256 elements
        # where hidden allows it (the op is launch/latency bound: fewer, larger copies per core).
        block = next((b for b in divisors if hc * hidden // b >= num_cores), divisors[-1])
        block = max(block, next(b for b in divisors if b <= 256))
        return EngramFusedWeightConfig(backend, hc, hidden, num_cores, block, threads=0, num_stages=2)
    # CUDA: launch-bound; 1024 elements per 128-thread block (two 4-wide vectors per thread).
    block = next(b for b in divisors if b <= 1024)
    threads = max(32, min(128, block // 4))
    return EngramFusedWeightConfig(backend, hc, hidden, num_cores, block, threads=threads, num_stages=1)


def make_engram_fused_weight_kernel(cfg: EngramFusedWeightConfig):
    """The TileLang prim_func `engram_fused_weight_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_engram_fused_weight_kernel(cfg)
    return cuda_engram_fused_weight_kernel(cfg)


@functools.cache
def get_engram_fused_weight_kernel(cfg: EngramFusedWeightConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_fused_weight_kernel(cfg), cfg.backend)
