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

_INT64_MAX = 2**63 - 1


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


def _ascend_engram_hash_kernel(cfg: EngramHashConfig):
    import tilelang.ascend.language as T

    L, N, E, K = cfg.num_layers, cfg.max_ngram, cfg.num_tables, cfg.num_cols
    has_mask = cfg.has_mask
    B, num_cores, threads, stages = cfg.block_tokens, cfg.num_cores, cfg.threads, cfg.num_stages
    num_tokens = T.dynamic('num_tokens')

    @T.macro
    def body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out):
        with T.Kernel(num_cores) as cid:
            ids_ub = T.alloc_shared((B, N), T.int32)
            m_ub = T.alloc_shared((L, N), T.int64)
            v_ub = T.alloc_shared((L, N - 1, E), T.int32)
            o_ub = T.alloc_shared((L, K), T.int32)
            r_ub = T.alloc_shared((B, K), T.int32)
            if has_mask:
                mask_ub = T.alloc_shared((B,), T.bool)  # image_token_mask of the block
            T.copy(multipliers, m_ub)
            T.copy(vocab_sizes, v_ub)
            T.copy(offsets, o_ub)
            for blk in T.Persistent([T.ceildiv(num_tokens, B)], num_cores, cid, group_size=1, num_stages=stages):
                t0 = blk * B
                nv = T.min(B, num_tokens - t0)
                T.copy(ngram_token_ids[t0 : t0 + B, :], ids_ub)  # tail rows clamped by the DMA
                if has_mask:
                    T.copy(image_token_mask[t0 : t0 + nv], mask_ub[0:nv])
                for layer in T.serial(L):
                    with T.SimtVF(threads=threads):
                        for i, k in T.Parallel(B, K):
                            n = k // E  # order n + 2
                            h = T.alloc_var(T.uint64)
                            h = T.cast(T.cast(ids_ub[i, 0], T.int64), T.uint64) * T.cast(m_ub[layer, 0], T.uint64)
                            for j in T.unroll(1, N):
                                if j <= n + 1:
                                    h = h ^ (
                                        T.cast(T.cast(ids_ub[i, j], T.int64), T.uint64)
                                        * T.cast(m_ub[layer, j], T.uint64)
                                    )
                            row = T.floormod(T.cast(h, T.int64), T.cast(v_ub[layer, n, k % E], T.int64))
                            if has_mask:
                                r_ub[i, k] = T.if_then_else(
                                    mask_ub[i], T.int32(-1), T.cast(row + T.cast(o_ub[layer, k], T.int64), T.int32)
                                )
                            else:
                                r_ub[i, k] = T.cast(row + T.cast(o_ub[layer, k], T.int64), T.int32)
                    T.copy(r_ub[:nv, :], out[layer, t0 : t0 + nv, :])

    return _engram_hash_prim_func(T, body, cfg=cfg, num_tokens=num_tokens)


def _cuda_engram_hash_kernel(cfg: EngramHashConfig):
    import tilelang.language as T

    L, N, E, K = cfg.num_layers, cfg.max_ngram, cfg.num_tables, cfg.num_cols
    has_mask = cfg.has_mask
    B, nt = cfg.block_tokens, cfg.threads
    per_thread = T.ceildiv(B * K, nt)
    num_tokens = T.dynamic('num_tokens')
    u64, i64 = T.uint64, T.int64

    @T.macro
    def body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out):
        # One layer per grid row, so that a block needs the reciprocals of K divisors only.
        with T.Kernel(T.ceildiv(num_tokens, B), L, threads=nt) as (bx, layer):
            tid = T.get_thread_binding()
            divisor = T.alloc_shared((K,), u64)  # |vocab size|
            # 2 * floor((2**63 - 1) / divisor), within 2 * divisor of 2**64 / divisor; 0 for a zero size
            reciprocal = T.alloc_shared((K,), u64)
            for c in T.serial(T.ceildiv(K, nt)):
                col = c * nt + tid
                if col < K:
                    size = T.cast(vocab_sizes[layer, col // E, col % E], i64)
                    magnitude = T.cast(T.if_then_else(size < 0, -size, size), u64)
                    divisor[col] = magnitude
                    reciprocal[col] = T.if_then_else(
                        magnitude == T.uint64(0), T.uint64(0), T.uint64(_INT64_MAX) // magnitude * T.uint64(2)
                    )
            T.sync_threads()
            for q in T.serial(per_thread):
                idx = q * nt + tid
                i = idx // K
                k = idx % K
                t = bx * B + i
                if i < B and t < num_tokens:
                    n = k // E  # order n + 2
                    h = T.alloc_var(u64)
                    h = T.cast(T.cast(ngram_token_ids[t, 0], i64), u64) * T.cast(multipliers[layer, 0], u64)
                    for j in T.unroll(1, N):
                        if j <= n + 1:
                            h = h ^ (
                                T.cast(T.cast(ngram_token_ids[t, j], i64), u64) * T.cast(multipliers[layer, j], u64)
                            )
                    # floormod(int64(h), size) without a 64-bit division (the module docstring).
                    d = divisor[k]
                    # The sign bit by a shift: TVM's simplifier takes a cast from uint64 to be >= 0.
                    negative_h = (h >> T.uint64(63)) != T.uint64(0)
                    a = T.if_then_else(negative_h, ~h, h)  # -h - 1 >= 0 for a negative h
                    r = T.alloc_var(u64)
                    r = a - T.call_pure_extern(u64, '__umul64hi', a, reciprocal[k]) * d
                    r = T.if_then_else(r >= d, r - d, r)
                    r = T.if_then_else(r >= d, r - d, r)
                    r = T.if_then_else(negative_h, d - T.uint64(1) - r, r)
                    row = T.cast(r, i64)
                    row = T.if_then_else(
                        T.cast(vocab_sizes[layer, n, k % E], i64) < 0 and row != 0, row - T.cast(d, i64), row
                    )
                    value = T.cast(row + T.cast(offsets[layer, k], i64), T.int32)
                    if has_mask:
                        out[layer, t, k] = T.if_then_else(image_token_mask[t], T.int32(-1), value)
                    else:
                        out[layer, t, k] = value

    return _engram_hash_prim_func(T, body, cfg=cfg, num_tokens=num_tokens)


def make_engram_hash_kernel(cfg: EngramHashConfig):
    """The TileLang prim_func `engram_hash_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return _ascend_engram_hash_kernel(cfg)
    return _cuda_engram_hash_kernel(cfg)


@functools.cache
def get_engram_hash_kernel(cfg: EngramHashConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_hash_kernel(cfg), cfg.backend)
