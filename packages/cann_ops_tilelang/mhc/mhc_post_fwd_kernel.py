"""Kernels of mhc_post_fwd: Ascend 950 and CUDA.

Per token t (N = S * T tokens), branch o < M and column h < H, fp32 math, bf16 in and out:
    out[t, o, h] = post_layer_mix[t, o] * x[t, h] + sum_i comb_res_mix[t, i, o] * residual[t, i, h]
A streaming kernel: x and residual are read once, out written once; the token count is dynamic (T.dynamic), so
one compiled kernel serves every N of a (M, H).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_post_common import ASCEND_LANES, ascend_tile, check_stream_config
from ._mhc_post_fwd_ascend import ascend_mhc_post_fwd_kernel
from ._mhc_post_fwd_cuda import cuda_mhc_post_fwd_kernel

# Ascend: UB bytes for the big tiles (x, residual, out, every version); the mix rows and alignment padding
# take the rest of the 248 KB.
ASCEND_UB_BUDGET = 200 * 1024
ASCEND_STAGES = 2
CUDA_THREADS = 256  # 8 warps a block; the grid's many blocks keep up to 2048 threads an SM busy


@dataclasses.dataclass(frozen=True)
class MhcPostFwdConfig:
    backend: Backend
    mhc: int  # M, branches
    hidden: int  # H
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational: the grid covers the chunks)
    threads: int = CUDA_THREADS  # CUDA threads a block (one 8-column chunk each)
    tile: int = ASCEND_LANES  # Ascend hidden columns a task; divides H
    stages: int = ASCEND_STAGES  # Ascend buffer versions of the persistent loop

    def __post_init__(self):
        check_stream_config(self)
        if self.stages not in (1, 2, 3):
            raise ValueError(f'stages must be 1, 2 or 3, got {self.stages}')


def ascend_ub_bytes(mhc: int, tile: int, stages: int) -> int:
    """UB of the big tiles: x (tile,) and residual, out (M, tile), bf16, `stages` versions each."""
    return stages * tile * 2 * (1 + 2 * mhc)


def choose_mhc_post_fwd_config(*, backend: Backend, mhc: int, hidden: int, num_cores: int) -> MhcPostFwdConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    if backend == 'ascend':
        tile = ascend_tile(hidden, ascend_ub_bytes(mhc, 1, ASCEND_STAGES), ASCEND_UB_BUDGET)
        return MhcPostFwdConfig('ascend', mhc, hidden, num_cores, tile=tile)
    if backend == 'cuda':
        return MhcPostFwdConfig('cuda', mhc, hidden, num_cores)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_mhc_post_fwd_kernel(cfg: MhcPostFwdConfig):
    """The TileLang prim_func `mhc_post_fwd_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_post_fwd_kernel(cfg)
    return cuda_mhc_post_fwd_kernel(cfg)


@functools.cache
def get_mhc_post_fwd_kernel(cfg: MhcPostFwdConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_post_fwd_kernel(cfg), cfg.backend)
