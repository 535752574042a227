"""Kernels of randn: fill a flat bf16 / fp16 / fp32 tensor with the counter-based normal generator.

What each element is: _counter_normal.py (a pure function of the seed keys, the pair offset and the element's
index; the same bits on both backends). One generator builds the Ascend 950 kernel or the CUDA kernel, chosen by
`cfg.backend`. Arguments of both: `out` (num_elements,) of the dtype and `state` int32[4] = [k0, k1, offset_lo,
offset_hi] (the per-device state tensor, read on the device, so no value of a call is baked into the launch).
The element count is dynamic (`T.dynamic`): one compiled kernel per dtype.
"""

import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._counter_normal import GROUP_ELEMENTS
from ._randn_ascend import ascend_randn_kernel
from ._randn_cuda import cuda_randn_kernel

# TileLang dtype name of each supported torch dtype.
TILELANG_DTYPES = {torch.bfloat16: 'bfloat16', torch.float16: 'float16', torch.float32: 'float32'}
_BYTES = {'bfloat16': 2, 'float16': 2, 'float32': 4}
# Ascend: one UB tile of output per task (at most 2 versions: 64 KB of the 248 KB UB).
_ASCEND_TILE_BYTES = 32 * 1024
_CUDA_STORE_BYTES = 16  # one vector store per half group and thread
_CUDA_THREADS = 256
# Elements of one call: every int32 index (a whole grid of CUDA thread blocks or Ascend tiles past the end
# included) stays below 2**31.
MAX_NUMEL = 2**31 - 2**20


@dataclasses.dataclass(frozen=True)
class RandnConfig:
    backend: Backend
    dtype: str  # TileLang dtype name of the output: 'bfloat16', 'float16' or 'float32'
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the pair count)
    block: int  # Ascend: elements per task (one UB tile, whole groups); CUDA: unused (0)
    threads: int  # CUDA threads per block (unused on Ascend: 0)
    vec: int  # CUDA pairs per thread: one 16-byte store per half group (unused on Ascend: 0)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA: 1)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.dtype not in _BYTES:
            raise ValueError(f'dtype must be one of {sorted(_BYTES)}, got {self.dtype!r}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.backend == 'ascend' and (self.block < GROUP_ELEMENTS or self.block % GROUP_ELEMENTS):
            raise ValueError(f'block {self.block} must be a positive multiple of {GROUP_ELEMENTS} (whole groups)')
        if self.backend == 'cuda' and (self.vec * _BYTES[self.dtype] != _CUDA_STORE_BYTES or self.threads % 32):
            raise ValueError(f'vec {self.vec} must fill a 16-byte store and threads {self.threads} whole warps')


def choose_randn_config(*, backend: Backend, dtype: torch.dtype, num_cores: int) -> RandnConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    if dtype not in TILELANG_DTYPES:
        raise ValueError(f'randn supports {list(TILELANG_DTYPES)}, got {dtype}')
    name = TILELANG_DTYPES[dtype]
    if backend == 'ascend':
        return RandnConfig(backend, name, num_cores, _ASCEND_TILE_BYTES // _BYTES[name], 0, 0, 2)
    return RandnConfig(backend, name, num_cores, 0, _CUDA_THREADS, _CUDA_STORE_BYTES // _BYTES[name], 1)


def make_randn_kernel(cfg: RandnConfig):
    """The TileLang prim_func `randn_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_randn_kernel(cfg)
    return cuda_randn_kernel(cfg)


@functools.cache
def get_randn_kernel(cfg: RandnConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_randn_kernel(cfg), cfg.backend)
