"""Kernels of mhc_sinkhorn_fwd and mhc_sinkhorn_bwd: the configuration, its chooser and the generators.

One thread per token (CUDA threads; Ascend SIMT threads of a VF on a UB block), the token's matrix in
registers (_mhc_sinkhorn_routine.py). The token count is dynamic (`T.dynamic`) and eps a runtime argument;
mhc_mult and repeat fix the unrolled code, so one kernel is compiled per (direction, mhc_mult, repeat).

The backward recomputes the forward's iterates, as TileKernels does, and keeps the input of each of the
2 * repeat - 1 normalisation steps in shared memory (CUDA) or UB (Ascend), laid out [step, element, thread]
(consecutive threads, consecutive words: no bank conflicts). That store bounds repeat (MAX_REPEAT) and sets the
tokens per block. Every thread reduces its own token in a fixed order: the results are bit-identical from run
to run (no atomics).
"""

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mhc_sinkhorn_ascend import ascend_mhc_sinkhorn_bwd_kernel, ascend_mhc_sinkhorn_fwd_kernel
from ._mhc_sinkhorn_cuda import cuda_mhc_sinkhorn_bwd_kernel, cuda_mhc_sinkhorn_fwd_kernel

MHC_MULTS = range(1, 9)  # mhc_mult: the matrix of a token is mhc_mult x mhc_mult
DIRECTIONS = ('fwd', 'bwd')
RECIPROCALS = {'ascend': ('ieee',), 'cuda': ('ieee', 'newton')}
_WORD = 4  # bytes of an fp32
# The backward's iterate store per block: shared memory (opted in above 48 KB) or UB (216 KB with SIMT).
_STORE_BYTES = 128 * 1024
# The largest repeat whose store of one token of the largest matrix fits: (2 * 256 - 1) * 64 * 4 B < 128 KB.
MAX_REPEAT = 256
_CUDA_THREADS = 64  # tokens (threads) per forward block (4001 tokens: 63 blocks); the backward's fit the store
_ASCEND_THREADS = 64  # tokens (SIMT threads) per UB block
_ASCEND_ROW_WORDS = 8  # a UB row of a token's matrix starts on 32 bytes (DMA granularity)


def steps(repeat: int) -> int:
    """Normalisation steps of Sinkhorn with `repeat` rounds: one column step, then (row, column) repeat - 1 times."""
    return 2 * repeat - 1


_CUDA_TOKENS = 16  # tokens per CUDA block, both directions (H200 / H100 measurements, docs/mhc.md)


def store_bytes_per_token(mhc_mult: int, repeat: int) -> int:
    """Bytes the backward keeps per token: the input of every step."""
    return steps(repeat) * mhc_mult * mhc_mult * _WORD


@dataclasses.dataclass(frozen=True)
class MhcSinkhornConfig:
    backend: Backend
    direction: str  # 'fwd' or 'bwd'
    mhc_mult: int
    repeat: int
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    tokens: int  # tokens per CUDA thread block / Ascend UB block, one thread each
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    # 1 / x of the normalisation steps: 'ieee' (correctly rounded) or, CUDA only, 'newton' (the approximate
    # reciprocal and one Newton step, no slow-path branch: _mhc_sinkhorn_cuda.newton_reciprocal)
    reciprocal: str = 'ieee'

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.direction not in DIRECTIONS:
            raise ValueError(f'direction must be one of {DIRECTIONS}, got {self.direction!r}')
        if self.mhc_mult not in MHC_MULTS:
            raise ValueError(f'mhc_mult must be in 1..8, got {self.mhc_mult}')
        if not 1 <= self.repeat <= (MAX_REPEAT if self.direction == 'bwd' else 2**31 - 1):
            raise ValueError(f'repeat {self.repeat} is out of range for the {self.direction} kernel')
        if self.reciprocal not in RECIPROCALS[self.backend]:
            raise ValueError(f'reciprocal must be one of {RECIPROCALS[self.backend]} on {self.backend}')
        if self.num_cores < 1 or self.tokens < 1 or self.num_stages < 1:
            raise ValueError('num_cores, tokens and num_stages must be >= 1')
        if self.direction == 'bwd' and self.tokens * store_bytes_per_token(self.mhc_mult, self.repeat) > _STORE_BYTES:
            raise ValueError(f'{self.tokens} tokens of the backward overflow its {_STORE_BYTES} B store')

    @property
    def row_words(self) -> int:
        """fp32 words of a token's row in a UB block (Ascend): the matrix rounded up to 32 bytes."""
        words = self.mhc_mult * self.mhc_mult
        return -(-words // _ASCEND_ROW_WORDS) * _ASCEND_ROW_WORDS


def _fitting_tokens(limit: int, mhc_mult: int, repeat: int) -> int:
    """The largest power of two <= limit whose backward store fits _STORE_BYTES (1 at least: MAX_REPEAT)."""
    tokens = limit
    while tokens > 1 and tokens * store_bytes_per_token(mhc_mult, repeat) > _STORE_BYTES:
        tokens //= 2
    return tokens


def choose_mhc_sinkhorn_config(
    *, backend: Backend, num_cores: int, direction: str, mhc_mult: int, repeat: int
) -> MhcSinkhornConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    limit = _ASCEND_THREADS if backend == 'ascend' else _CUDA_THREADS
    reciprocal = 'ieee'
    if backend == 'cuda':
        # Measured (docs/mhc.md): the Newton reciprocal, the same bits as IEEE division there, and 16 tokens a
        # block took the forward from 1.1-2.4x TileKernels' time to 0.86-0.95x (H200), the backward from 1.22x to
        # 0.51x (H100, 4001 tokens, repeat 10).
        limit, reciprocal = _CUDA_TOKENS, 'newton'
    tokens = limit if direction == 'fwd' else _fitting_tokens(limit, mhc_mult, repeat)
    return MhcSinkhornConfig(backend, direction, mhc_mult, repeat, num_cores, tokens, 2 if backend == 'ascend' else 1,
                             reciprocal)  # fmt: skip


_GENERATORS = {
    ('ascend', 'fwd'): ascend_mhc_sinkhorn_fwd_kernel,
    ('ascend', 'bwd'): ascend_mhc_sinkhorn_bwd_kernel,
    ('cuda', 'fwd'): cuda_mhc_sinkhorn_fwd_kernel,
    ('cuda', 'bwd'): cuda_mhc_sinkhorn_bwd_kernel,
}


def make_mhc_sinkhorn_kernel(cfg: MhcSinkhornConfig):
    """The TileLang prim_func `mhc_sinkhorn_<direction>_kernel` for `cfg.backend` (no compile)."""
    return _GENERATORS[cfg.backend, cfg.direction](cfg)


@functools.cache
def get_mhc_sinkhorn_kernel(cfg: MhcSinkhornConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_sinkhorn_kernel(cfg), cfg.backend)
