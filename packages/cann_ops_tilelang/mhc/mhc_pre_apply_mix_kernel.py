"""Kernels of mhc_pre_apply_mix_fwd and mhc_pre_apply_mix_bwd, one family: a token's mhc_mult streams mixed into
one hidden row by its pre-layer mix, and the gradients of that.

    fwd: o[t, h] = bf16(sum over m of mix[t, m] * x[t, m, h])              (fp32, fused multiply-adds in order m)
    bwd: x_grad[t, m, h] = bf16(x_grad[t, m, h] + mix[t, m] * o_grad[t, h])  (accumulated in place, one fma)
         mix_grad[t, m] = sum over h of o_grad[t, h] * x[t, m, h]           (fp32)

The backward's sum over hidden stays inside one Ascend core (per-lane partial sums in column order, then the
documented lane tree) or one CUDA thread block (per-thread partial sums, then TileLang's fixed shuffle tree): no
atomics, the same bits on every run (the two backends sum in different orders).

Supported: x, o, o_grad, x_grad bf16, mix and mix_grad fp32; mhc_mult 1 .. 8, hidden a positive multiple of 64,
any token count (dynamic; the interface skips empty inputs), tokens * mhc_mult * hidden <= 2**30
(_mhc_expand_apply_common.py).

One generator builds the Ascend 950 kernel (_mhc_pre_apply_mix_ascend.py) or the CUDA kernel
(_mhc_pre_apply_mix_cuda.py), chosen by `cfg.backend`.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._mhc_expand_apply_common import (
    ASCEND_STAGES,
    CUDA_MAX_HIDDEN_BLOCK,
    CUDA_VECTOR,
    ascend_hidden_block,
    check_config,
    cuda_hidden_block,
    cuda_tile,
)
from ._mhc_pre_apply_mix_ascend import ascend_mhc_pre_apply_mix_kernel
from ._mhc_pre_apply_mix_cuda import cuda_mhc_pre_apply_mix_kernel

DIRECTIONS = ('fwd', 'bwd')
# fwd: (T, H) elements of o per thread block, two 16-byte vectors of every stream row per thread (4 * mhc_mult
# loads in flight per thread at most). Half the 4096 of the expand kernels' tiles: twice the blocks, so that
# the last wave of a 4001-token grid leaves less of the GPU idle (the previous tile stays reachable through
# the config, with `hidden_inner=False` for its token-first grid).
CUDA_FWD_TILE_ELEMENTS = 2048
CUDA_FWD_VECTORS_PER_THREAD = 2
# bwd: one token per thread block (its mix_grad row is that block's reduction), hidden blocks in a loop; a
# power of two of threads from a warp up to 128, each with whole vectors of up to 8 bf16 (16 bytes) of every
# stream row, at least 32 vectors per row.
CUDA_BWD_MAX_THREADS = 128
CUDA_BWD_MIN_THREADS = 32
# bwd: the threads each SM must be able to hold, which caps a thread's registers at 128 (ptxas otherwise takes
# 172 for the unrolled streams, two thread blocks per SM: too few loads in flight).
CUDA_BWD_RESIDENT_THREADS = 512


@dataclasses.dataclass(frozen=True)
class MhcPreApplyMixConfig:
    backend: Backend
    direction: str  # 'fwd' or 'bwd'
    mhc: int  # mhc_mult: streams per token
    hidden: int
    num_cores: int  # Ascend: vector cores; CUDA: SMs (informational, the grid is the tile count)
    hidden_block: int  # hidden columns per task / loop step (Ascend) or per thread block / loop step (CUDA)
    token_block: int  # tokens per CUDA thread block (1: Ascend, and the CUDA backward)
    threads: int  # CUDA threads per block (Ascend: 0)
    vector: int  # CUDA bf16 elements per access (Ascend: 0)
    resident_threads: int  # CUDA bwd: threads per SM the register use must allow (others: 0)
    num_stages: int  # Ascend buffer versions (CUDA: 1)
    # CUDA fwd: the grid walks a token tile's hidden blocks first (side-by-side blocks read neighbouring bytes);
    # False: the (token tiles, hidden blocks) grid, token tiles first. Others: unused.
    hidden_inner: bool = True
    # CUDA fwd: rows of the last token tile past the token count read the last token instead of skipping their
    # loads (only their stores are masked), so that ptxas need not branch around each load; False: as chosen.
    clamped_reads: bool = False

    def __post_init__(self):
        check_config(self, DIRECTIONS)
        if (self.backend == 'ascend' or self.direction == 'bwd') and self.token_block != 1:
            raise ValueError(f'a task of this kernel is one token, got token_block {self.token_block}')
        if self.backend == 'cuda':
            unit = self.vector * (self.threads if self.direction == 'bwd' else 1)
            if self.vector < 1 or self.hidden_block % unit:
                raise ValueError(f'the hidden block must hold whole vectors (bwd: on every thread): {self}')
            if self.threads % 32 or self.token_block * self.hidden_block % (self.threads * self.vector):
                raise ValueError(f'threads must be whole warps, each with whole vectors of the tile: {self}')
        if self.clamped_reads and (self.backend != 'cuda' or self.direction != 'fwd'):
            raise ValueError(f'clamped_reads is a CUDA forward field: {self}')


def choose_mhc_pre_apply_mix_config(
    *, backend: Backend, num_cores: int, direction: str, mhc: int, hidden: int
) -> MhcPreApplyMixConfig:
    """Pure choice of the compile-time parameters (no device query). Ascend: the widest hidden block whose bf16
    tiles (fwd: x's mhc_mult rows and o's; bwd: x's and x_grad's mhc_mult rows and o_grad's) fit the UB budget
    in ASCEND_STAGES versions. CUDA: hidden blocks of a power of two up to 1024 columns; fwd with tokens enough
    for CUDA_FWD_TILE_ELEMENTS per thread block on a hidden-first grid, bwd one token per block, up to 128
    threads with whole vectors of every stream row (up to 16 bytes)."""
    if backend == 'ascend':
        rows = mhc + 1 if direction == 'fwd' else 2 * mhc + 1
        block = ascend_hidden_block(hidden, 2 * rows, ASCEND_STAGES)
        return MhcPreApplyMixConfig(backend, direction, mhc, hidden, num_cores, block, 1, 0, 0, 0, ASCEND_STAGES)
    if direction == 'fwd':
        block, tokens = cuda_tile(hidden, CUDA_FWD_TILE_ELEMENTS)
        threads = tokens * block // (CUDA_VECTOR * CUDA_FWD_VECTORS_PER_THREAD)
        return MhcPreApplyMixConfig(
            backend, direction, mhc, hidden, num_cores, block, tokens, threads, CUDA_VECTOR, 0, 1
        )
    block = cuda_hidden_block(hidden, CUDA_MAX_HIDDEN_BLOCK)
    vector = min(CUDA_VECTOR, block // CUDA_BWD_MIN_THREADS)
    threads = min(CUDA_BWD_MAX_THREADS, block // vector)
    return MhcPreApplyMixConfig(
        backend, direction, mhc, hidden, num_cores, block, 1, threads, vector, CUDA_BWD_RESIDENT_THREADS, 1
    )


def make_mhc_pre_apply_mix_kernel(cfg: MhcPreApplyMixConfig):
    """The TileLang prim_func `mhc_pre_apply_mix_fwd_kernel` or `mhc_pre_apply_mix_bwd_kernel` for `cfg` (no
    compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_pre_apply_mix_kernel(cfg)
    return cuda_mhc_pre_apply_mix_kernel(cfg)


@functools.cache
def get_mhc_pre_apply_mix_kernel(cfg: MhcPreApplyMixConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_pre_apply_mix_kernel(cfg), cfg.backend)
