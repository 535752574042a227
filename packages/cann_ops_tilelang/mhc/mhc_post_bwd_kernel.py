"""Kernels of mhc_post_bwd: Ascend 950 and CUDA.

The gradients of mhc_post_fwd per token t (fp32 math; bf16 d_x and d_residual, fp32 mix gradients):
    d_x[t, h]                 = sum_o d_o[t, o, h] * post_layer_mix[t, o]
    d_residual[t, i, h]       = sum_o comb_res_mix[t, i, o] * d_o[t, o, h]
    d_post_layer_mix[t, o]    = sum_h d_o[t, o, h] * x[t, h]
    d_comb_res_mix[t, i, o]   = sum_h residual[t, i, h] * d_o[t, o, h]
One pass over x, residual and d_o; the sums over h of a token are reduced on one core / in one thread block in a
fixed order (deterministic, no atomics). The token count is dynamic (T.dynamic).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import CUDA_MAX_THREADS_PER_SM, compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_post_bwd_ascend import ascend_mhc_post_bwd_kernel
from ._mhc_post_bwd_cuda import cuda_mhc_post_bwd_kernel
from ._mhc_post_common import ASCEND_LANES, CUDA_VEC, ascend_tile, check_stream_config

# Ascend: UB bytes for the big tiles (one version each: the tiles of a token run in order on one core); the
# accumulators, mix rows and padding take the rest of the 248 KB.
ASCEND_UB_BUDGET = 200 * 1024
# CUDA: thread counts tried in order, for a whole number of 16-byte chunks per thread (no predicated thread).
CUDA_THREAD_CHOICES = (128, 256, 64, 192, 160, 224, 96, 320, 384, 448, 512)
CUDA_MAX_CHUNKS = 8  # chunks a thread, at most
# Threads each SM must be able to hold, which caps a thread at 128 registers: ptxas otherwise takes ~200 at
# mhc_mult 4 (it hoists the next chunk's loads), two 128-thread blocks an SM and few loads in flight when a
# wave is partly empty. Only up to CUDA_CAPPED_MAX_MHC: from mhc_mult 5 the per-token mix values and partial
# sums, 2 * (M * M + M) registers, leave too few of 128 for a chunk's data (ptxas spills).
CUDA_RESIDENT_THREADS = 512
CUDA_CAPPED_MAX_MHC = 4
# cp.async stages of a row's chunks (where the threads tile the row exactly): two chunks of every row in flight
# per thread block while it works on a third, as TileKernels' 3-stage pipeline keeps them.
CUDA_PIPELINE_STAGES = 3


@dataclasses.dataclass(frozen=True)
class MhcPostBwdConfig:
    backend: Backend
    mhc: int  # M, branches
    hidden: int  # H
    num_cores: int  # Ascend: vector cores (the round-robin grid); CUDA: SMs (informational: one block a token)
    threads: int = 128  # CUDA threads a block
    chunks: int = 1  # CUDA 8-column chunks a thread
    tile: int = ASCEND_LANES  # Ascend hidden columns a step; divides H
    # CUDA: thread blocks each SM must be able to hold (__launch_bounds__' minimum, which caps the registers a
    # thread); 0: no cap (ptxas then takes ~200 registers at mhc_mult 4: two 128-thread blocks an SM).
    min_blocks: int = 0
    # CUDA: 0, each thread loads its chunks into registers; n >= 2, the chunks of all threads go through shared
    # memory in an n-stage cp.async pipeline (bytes in flight without registers; needs threads * 8 | H).
    pipelined: int = 0

    def __post_init__(self):
        check_stream_config(self)
        if self.backend == 'cuda' and self.threads * self.chunks * CUDA_VEC < self.hidden:
            raise ValueError('threads * chunks * 8 must cover the hidden size')
        if self.min_blocks < 0 or self.min_blocks * self.threads > CUDA_MAX_THREADS_PER_SM:
            raise ValueError(f'min_blocks * threads must be in 0..{CUDA_MAX_THREADS_PER_SM}, got {self.min_blocks}')
        if self.pipelined and (self.pipelined < 2 or self.threads * self.chunks * CUDA_VEC != self.hidden):
            raise ValueError(f'a pipeline needs >= 2 stages and threads * chunks * 8 == hidden: {self}')


def ascend_ub_bytes(mhc: int, tile: int) -> int:
    """UB of the big tiles: x, d_x (tile,) and residual, d_o, d_residual (M, tile), bf16."""
    return tile * 2 * (2 + 3 * mhc)


def _cuda_threads(hidden: int) -> tuple[int, int]:
    """(threads, chunks): the first choice dividing the row's chunks with at most 8 a thread, else the fewest
    threads (a multiple of 32) giving at most 8 (the last chunks of some threads then fall past the row)."""
    row = hidden // CUDA_VEC
    for threads in CUDA_THREAD_CHOICES:
        if row % threads == 0 and row // threads <= CUDA_MAX_CHUNKS:
            return threads, row // threads
    if row <= 64:
        return 64, 1
    threads = -(-row // CUDA_MAX_CHUNKS // 32) * 32
    threads = min(1024, max(threads, 64))
    return threads, -(-row // threads)


def choose_mhc_post_bwd_config(*, backend: Backend, mhc: int, hidden: int, num_cores: int) -> MhcPostBwdConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    if backend == 'ascend':
        tile = ascend_tile(hidden, ascend_ub_bytes(mhc, 1), ASCEND_UB_BUDGET)
        return MhcPostBwdConfig('ascend', mhc, hidden, num_cores, tile=tile)
    if backend == 'cuda':
        threads, chunks = _cuda_threads(hidden)
        min_blocks = CUDA_RESIDENT_THREADS // threads if mhc <= CUDA_CAPPED_MAX_MHC else 0
        stages = CUDA_PIPELINE_STAGES if threads * chunks * CUDA_VEC == hidden else 0
        return MhcPostBwdConfig(
            'cuda', mhc, hidden, num_cores, threads=threads, chunks=chunks, min_blocks=min_blocks, pipelined=stages
        )
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_mhc_post_bwd_kernel(cfg: MhcPostBwdConfig):
    """The TileLang prim_func `mhc_post_bwd_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_post_bwd_kernel(cfg)
    return cuda_mhc_post_bwd_kernel(cfg)


@functools.cache
def get_mhc_post_bwd_kernel(cfg: MhcPostBwdConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_post_bwd_kernel(cfg), cfg.backend)
