"""Kernels of engram_hash: n-gram token ids -> rows of the hashed embedding tables.

For layer l, token t, order n = 2..N and table e (k = (n - 2) * E + e):

    p_i        = int64(ids[t, i]) * multipliers[l, i]            (wrapping, computed in uint64)
    h_n        = p_0 xor p_1 xor ... xor p_(n-1)
    out[l,t,k] = int32(floormod(h_n, vocab_sizes[l, n-2, e]) + offsets[layer, k])

floormod takes the sign of the divisor (torch `%`, Python semantics), for either sign of the vocab
size; a zero vocab size gives an unspecified row. The final sum is formed in int64 and wrapped to
int32, as the int64 reference does before its cast. Exact integer math: bit-exact on every backend.

The CUDA kernel forms the floormod without a 64-bit division per element (a long software routine on a
GPU): with d = |size| <= 2**31 and m = 2 * floor((2**63 - 1) / d), computed once per block and column,
q = mulhi64(a, m) is floor(a / d) or at most 2 below it for any a < 2**64, so a - q * d needs at most two
subtractions of d. A negative h is taken as a = -h - 1 (then the result is d - 1 - (a mod d)), and a
negative size gives that remainder minus d unless it is 0.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend bodies. They do not import this module (no import circle): they get the prim_func signature
# (_engram_hash_prim_func) as an argument.
from ._engram_hash_ascend import ascend_engram_hash_kernel
from ._engram_hash_cuda import cuda_engram_hash_kernel


@dataclasses.dataclass(frozen=True)
class EngramHashConfig:
    backend: Backend
    num_layers: int  # L
    max_ngram: int  # N: ids per token; hashes of orders 2..N
    num_tables: int  # E: tables per n-gram order
    num_cores: int  # Ascend: vector cores of the persistent grid; CUDA: SMs (informational)
    block_tokens: int  # tokens per task (Ascend) / per thread block (CUDA)
    threads: int  # SIMT threads (Ascend T.SimtVF) / CUDA threads per block
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    has_mask: bool = False  # the kernel takes image_token_mask (T,) bool: -1 rows for image tokens

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.num_layers < 1 or self.max_ngram < 2 or self.num_tables < 1:
            raise ValueError(f'need num_layers >= 1, max_ngram >= 2, num_tables >= 1, got {self}')

    @property
    def num_cols(self) -> int:
        """K = (N - 1) * E output columns per layer and token."""
        return (self.max_ngram - 1) * self.num_tables


def choose_engram_hash_config(
    *, backend: Backend, num_layers: int, max_ngram: int, num_tables: int, num_cores: int, has_mask: bool = False
) -> EngramHashConfig:
    """Pure choice of the compile-time parameters (no device query). T is a runtime size."""
    cols = (max_ngram - 1) * num_tables
    if backend == 'ascend':
        # ~32 KB of int32 results per task (one layer at a time), tokens a power of two in 8..512.
        block = 512
        while block > 8 and block * cols > 8192:
            block //= 2
        return EngramHashConfig(backend, num_layers, max_ngram, num_tables, num_cores, block, 256, 2, has_mask)
    # CUDA: a block of one layer per grid row computes the reciprocals of its K divisors once, so each of its
    # 256 threads takes about two (token, column) elements (the smallest power-of-two token block with
    # block * K >= 512): one element per thread left the reciprocals' 64-bit divisions a large share, four
    # or more left too few blocks at small T (measured side by side: README, Performance).
    threads = 256
    block = 1
    while block < 256 and block * cols < 2 * threads:
        block *= 2
    return EngramHashConfig(backend, num_layers, max_ngram, num_tables, num_cores, block, threads, 1, has_mask)


def _engram_hash_prim_func(T, body, *, cfg: EngramHashConfig, num_tokens):
    """The prim_func `engram_hash_kernel` around a backend's kernel body, a T.macro taking (ngram_token_ids,
    multipliers, vocab_sizes, offsets, image_token_mask, out); image_token_mask (T,) bool is an argument only
    when cfg.has_mask (None otherwise). `T` is the backend's language module."""
    L, N, E, K = cfg.num_layers, cfg.max_ngram, cfg.num_tables, cfg.num_cols
    if cfg.has_mask:

        @T.prim_func
        def engram_hash_kernel(
            ngram_token_ids: T.Tensor((num_tokens, N), T.int32),
            multipliers: T.Tensor((L, N), T.int64),
            vocab_sizes: T.Tensor((L, N - 1, E), T.int32),
            offsets: T.Tensor((L, K), T.int32),
            image_token_mask: T.Tensor((num_tokens,), T.bool),
            out: T.Tensor((L, num_tokens, K), T.int32),
        ):
            body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out)

    else:

        @T.prim_func
        def engram_hash_kernel(
            ngram_token_ids: T.Tensor((num_tokens, N), T.int32),
            multipliers: T.Tensor((L, N), T.int64),
            vocab_sizes: T.Tensor((L, N - 1, E), T.int32),
            offsets: T.Tensor((L, K), T.int32),
            out: T.Tensor((L, num_tokens, K), T.int32),
        ):
            body(ngram_token_ids, multipliers, vocab_sizes, offsets, None, out)

    return engram_hash_kernel


def make_engram_hash_kernel(cfg: EngramHashConfig):
    """The TileLang prim_func `engram_hash_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_engram_hash_kernel(cfg, _engram_hash_prim_func)
    return cuda_engram_hash_kernel(cfg, _engram_hash_prim_func)


@functools.cache
def get_engram_hash_kernel(cfg: EngramHashConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_hash_kernel(cfg), cfg.backend)
