"""Kernels of engram_sinkhorn_momentum_update (docs/engram.md, "Sinkhorn normalisation").

Per element, in fp32 (b = beta1 and a = 1 - beta1 as fp32 runtime scalars, a computed on the host in
double precision and rounded once):
    s  = a * g                           (one rounding)
    m' = fma(m, b, s)                    (one rounding; stored in the buffer's dtype, bf16 rounds to nearest even)
    sinkhorn_input = fma(m', b, s)       (nesterov; m' unrounded fp32) or m'
Both backends evaluate exactly these operations, so their results are bit-identical to each other; torch
rounds b * m separately, so an fp32 torch reference can differ by about one ulp (see the tests).

One pass over memory: grad and the buffer are read once, the buffer and sinkhorn_input written once.
The element count is a runtime size (T.dynamic) and any count works: tails are handled in the kernels.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle). The CUDA access width lives with
# its kernel: elements of one vector access (16 bytes of fp32, 8 of bf16), so that a warp's access covers 32
# consecutive chunks and every tensor's accesses are coalesced whatever its dtype.
from ._engram_sinkhorn_momentum_update_ascend import ascend_engram_sinkhorn_momentum_update_kernel
from ._engram_sinkhorn_momentum_update_cuda import CUDA_CHUNK as _CUDA_CHUNK
from ._engram_sinkhorn_momentum_update_cuda import cuda_engram_sinkhorn_momentum_update_kernel
from ._sinkhorn_common import LANES as _LANES  # the Sinkhorn family's Ascend lane width

_DTYPES = ('bfloat16', 'float32')
# CUDA block shapes, (threads, elements per block). Streaming: one warp of 8 elements per thread, the grid
# the tile count (up to 32 blocks per SM). Calls of at most _CUDA_WIDE_BLOCKS_PER_SM wide blocks per SM take
# the wide shape instead: in one or two waves of blocks, fewer and fuller blocks finish sooner (README,
# Performance: both were the fastest of the block shapes measured side by side on the H200 in their range).
_CUDA_STREAMING_BLOCK = (32, 256)
_CUDA_WIDE_BLOCK = (128, 2048)
_CUDA_WIDE_BLOCKS_PER_SM = 2


def cuda_wide_block_max_numel(num_sms: int) -> int:
    """The largest element count that takes the CUDA kernel's wide blocks on a GPU of `num_sms` SMs."""
    return _CUDA_WIDE_BLOCKS_PER_SM * num_sms * _CUDA_WIDE_BLOCK[1]


@dataclasses.dataclass(frozen=True)
class EngramSinkhornMomentumUpdateConfig:
    backend: Backend
    grad_dtype: str  # 'bfloat16' or 'float32'
    momentum_dtype: str  # 'bfloat16' or 'float32'
    nesterov: bool
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block: int  # elements of one task (Ascend UB tile) / of one thread block (CUDA)
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.grad_dtype not in _DTYPES or self.momentum_dtype not in _DTYPES:
            raise ValueError(f'dtypes must be among {_DTYPES}, got {self.grad_dtype!r}, {self.momentum_dtype!r}')
        if self.backend == 'ascend' and self.block % _LANES != 0:
            raise ValueError(f'block {self.block} must be a multiple of {_LANES}')
        if self.backend == 'cuda' and self.block % (self.threads * _CUDA_CHUNK) != 0:
            raise ValueError(f'block {self.block} must be a multiple of threads * {_CUDA_CHUNK}')


def choose_engram_sinkhorn_momentum_update_config(
    *, backend: Backend, grad_dtype: str, momentum_dtype: str, nesterov: bool, num_cores: int, numel: int
) -> EngramSinkhornMomentumUpdateConfig:
    """Pure choice of the compile-time parameters (no device query). The element count is a runtime size;
    on CUDA it also picks one of two block shapes (cuda_wide_block_max_numel), so two calls of different
    sizes may launch two kernels."""
    if backend == 'ascend':
        # 8192 elements per task: at most 3 x 32 KB of UB per buffer version (fp32 in and out), two versions
        # so the DMA of the next tile overlaps the vector work of this one.
        return EngramSinkhornMomentumUpdateConfig(
            backend, grad_dtype, momentum_dtype, nesterov, num_cores, block=8192, threads=0, num_stages=2
        )
    threads, block = _CUDA_WIDE_BLOCK if numel <= cuda_wide_block_max_numel(num_cores) else _CUDA_STREAMING_BLOCK
    return EngramSinkhornMomentumUpdateConfig(
        backend, grad_dtype, momentum_dtype, nesterov, num_cores, block=block, threads=threads, num_stages=1
    )


def make_engram_sinkhorn_momentum_update_kernel(cfg: EngramSinkhornMomentumUpdateConfig):
    """The TileLang prim_func `engram_sinkhorn_momentum_update_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_engram_sinkhorn_momentum_update_kernel(cfg)
    return cuda_engram_sinkhorn_momentum_update_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_momentum_update_kernel(cfg: EngramSinkhornMomentumUpdateConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_momentum_update_kernel(cfg), cfg.backend)
