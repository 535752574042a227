"""Kernels of batched_transpose_weight_sf: fp32 power-of-two weight scales -> the two packed UE8M0 layouts of
DeepGEMM (TileKernels 2.1.0's `batched_transpose_weight_sf`).

Semantics. A weight (n, k) quantised in blocks of bs x bs has scales sf (G, Nsf, Ksf) fp32 (G groups, Nsf = n /
bs, Ksf = k / bs). Let e[g, r, c] = (bits(sf[g, r, c]) >> 23) & 0xFF, the scale's biased exponent byte (UE8M0:
exact for a positive power of two; for any other value the sign and mantissa bits are dropped: 3.0 gives 128,
-2.0 gives 128, 0.0 gives 0, inf and NaN give 255). Two int32 outputs, four bytes per word, byte j = bits 8j..8j+7:

    sf0 (the weight's, per row i < n, packed along k):   sf0[g, p, i] byte j = e[g, i // bs, 4 p + j]
    sf1 (the transpose's, per column c < k, along n):    sf1[g, q, c] byte j = e[g, 4 q + j, c // bs]

stored as (G, P0, n) and (G, P1, k) int32 (P0 = ceil(Ksf / 4), P1 = ceil(Nsf / 4)); a byte whose block index is
past Ksf (sf0) or Nsf (sf1) is 0. The interface views them MN-major as the peer does.

One launch covers a batch of weights: their scales concatenated into one flat fp32 buffer (`sf_flat`), their
outputs regions of one flat int32 buffer (`out_flat`), a weight table (`weights`, one row per weight, WEIGHT_FIELDS
int32) and a task map (`task_weight`, the weight of each task). A task is (weight, group g, quad q of four scale
rows, chunk of cfg.chunk_cols scale columns): it reads sf[g, 4q : 4q + 4, chunk] and writes sf1[g, q, chunk * bs]
(chunk_cols * bs words in a row) and, for each word column p of the chunk, sf0[g, p, 4 q bs : 4 (q + 1) bs].
Every output word is written by exactly one task, so the result does not depend on the order of the tasks.

Index arithmetic is int32: the interface keeps every flat buffer below 2**31 elements (MAX_ELEMENTS).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

from ._batched_transpose_weight_sf_ascend import ascend_batched_transpose_weight_sf_kernel
from ._batched_transpose_weight_sf_cuda import cuda_batched_transpose_weight_sf_kernel
from ._scale_rules import UE8M0_PACK

BLOCK_SIZES = (32, 128)  # scale block of the weights (the peer: 32 or 128; its Ascend side only 32)
WEIGHT_MULTIPLE = 128  # n and k must be multiples of it (the peer's rule; DeepGEMM's tiles)
CHUNK_WORDS = 4096  # words of sf1 one task writes (and at most of sf0): 16 KiB each
MAX_ELEMENTS = 2**31 - 1  # int32 indices of the flat buffers
CUDA_THREADS = 256
# Columns of the weight table: the task map's first task of the weight, its groups, Nsf, Ksf, and the offsets
# (elements) of its scales in sf_flat and of its sf0 / sf1 regions in out_flat.
WEIGHT_FIELDS = ('first_task', 'groups', 'sf_rows', 'sf_cols', 'sf_offset', 'sf0_offset', 'sf1_offset')
ROWS_PER_TASK = UE8M0_PACK  # scale rows of one task: the bytes of one sf1 word


@dataclasses.dataclass(frozen=True)
class BatchedTransposeWeightSfConfig:
    backend: Backend
    block_size: int  # bs: weight rows / columns per scale
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, one block per task)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    # Fixed by the layout, not configuration (class attributes, not fields): the backends read them from `cfg`.
    rows_per_task = ROWS_PER_TASK
    weight_columns = len(WEIGHT_FIELDS)
    threads = CUDA_THREADS  # CUDA threads per block

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f'block_size must be one of {BLOCK_SIZES}, got {self.block_size}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.num_stages < 1:
            raise ValueError(f'num_stages must be >= 1, got {self.num_stages}')

    @property
    def chunk_cols(self) -> int:
        """Scale columns of one task (a multiple of 4: whole sf0 words)."""
        return chunk_cols(self.block_size)


def chunk_cols(block_size: int) -> int:
    """Scale columns of one task: CHUNK_WORDS output words of sf1 (a multiple of 4: whole sf0 words)."""
    return CHUNK_WORDS // block_size


def tasks_per_group(block_size: int, sf_rows: int, sf_cols: int) -> int:
    """Tasks of one group of a weight with (sf_rows, sf_cols) scales: quads of rows times column chunks."""
    return -(-sf_rows // ROWS_PER_TASK) * -(-sf_cols // chunk_cols(block_size))


def choose_batched_transpose_weight_sf_config(
    *, backend: Backend, num_cores: int, block_size: int
) -> BatchedTransposeWeightSfConfig:
    """Pure choice of the compile-time parameters (no device query); invalid values raise ValueError."""
    if backend not in ('ascend', 'cuda'):
        raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')
    return BatchedTransposeWeightSfConfig(backend, block_size, num_cores, 2 if backend == 'ascend' else 1)


def make_batched_transpose_weight_sf_kernel(cfg: BatchedTransposeWeightSfConfig):
    """The TileLang prim_func for `cfg.backend` (no compile). Arguments: sf_flat (num_sf,) float32, weights
    (num_weights, len(WEIGHT_FIELDS)) int32, task_weight (num_tasks,) int32, out_flat (num_words,) int32; all
    sizes dynamic, num_tasks >= 1."""
    if cfg.backend == 'ascend':
        return ascend_batched_transpose_weight_sf_kernel(cfg)
    return cuda_batched_transpose_weight_sf_kernel(cfg)


@functools.cache
def get_batched_transpose_weight_sf_kernel(cfg: BatchedTransposeWeightSfConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_batched_transpose_weight_sf_kernel(cfg), cfg.backend)
