"""Kernels of mhc_expand_fwd and mhc_expand_bwd, one family: the copy of a token's hidden row onto its mhc_mult
streams and its adjoint, the sum of the streams.

    fwd: o[t, m, h] = x[t, h]                                   (bf16, exact)
    bwd: x_grad[t, h] = bf16(((g[t, 0, h] + g[t, 1, h]) + ...) + g[t, M - 1, h])   (g = o_grad, fp32 sums)

The sum runs over the streams in order, in fp32, rounded once to bf16 (nearest even) on both backends, which
therefore give the same bits; no reduction crosses a thread or a core, so the backward is deterministic.

Supported: bf16, mhc_mult 1 .. 8, hidden a positive multiple of 64, any token count (dynamic; the interface
skips empty inputs), tokens * mhc_mult * hidden <= 2**30 (_mhc_expand_apply_common.py).

One generator builds the Ascend 950 kernel (_mhc_expand_ascend.py) or the CUDA kernel (_mhc_expand_cuda.py),
chosen by `cfg.backend`.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._mhc_expand_apply_common import ASCEND_STAGES, CUDA_TILE_THREADS, ascend_hidden_block, check_config, cuda_tile
from ._mhc_expand_ascend import ascend_mhc_expand_kernel
from ._mhc_expand_cuda import cuda_mhc_expand_kernel

DIRECTIONS = ('fwd', 'bwd')


@dataclasses.dataclass(frozen=True)
class MhcExpandConfig:
    backend: Backend
    direction: str  # 'fwd' (x -> o) or 'bwd' (o_grad -> x_grad)
    mhc: int  # mhc_mult: streams per token
    hidden: int
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    hidden_block: int  # hidden columns per task (Ascend) / per thread block (CUDA); divides hidden
    token_block: int  # tokens per CUDA thread block (Ascend: 1, a task is one token's hidden block)
    threads: int  # CUDA threads per block (Ascend: 0)
    num_stages: int  # Ascend buffer versions of the persistent loop (CUDA: 1)

    def __post_init__(self):
        check_config(self, DIRECTIONS)
        if self.backend == 'ascend' and self.token_block != 1:
            raise ValueError(f'an Ascend task is one token, got token_block {self.token_block}')


def choose_mhc_expand_config(
    *, backend: Backend, num_cores: int, direction: str, mhc: int, hidden: int
) -> MhcExpandConfig:
    """Pure choice of the compile-time parameters (no device query). Ascend: the widest hidden block whose tiles
    (x's row; bwd also the mhc_mult rows of o_grad) fit the UB budget in ASCEND_STAGES versions. CUDA: hidden
    blocks of a power of two up to 1024 columns, and tokens enough for CUDA_TILE_ELEMENTS per thread block
    (_mhc_expand_apply_common.cuda_tile)."""
    if backend == 'ascend':
        rows = 1 if direction == 'fwd' else mhc + 1
        block = ascend_hidden_block(hidden, 2 * rows, ASCEND_STAGES)
        return MhcExpandConfig(backend, direction, mhc, hidden, num_cores, block, 1, 0, ASCEND_STAGES)
    block, tokens = cuda_tile(hidden)
    return MhcExpandConfig(backend, direction, mhc, hidden, num_cores, block, tokens, CUDA_TILE_THREADS, 1)


def make_mhc_expand_kernel(cfg: MhcExpandConfig):
    """The TileLang prim_func `mhc_expand_fwd_kernel` or `mhc_expand_bwd_kernel` for `cfg` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_expand_kernel(cfg)
    return cuda_mhc_expand_kernel(cfg)


@functools.cache
def get_mhc_expand_kernel(cfg: MhcExpandConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_expand_kernel(cfg), cfg.backend)
