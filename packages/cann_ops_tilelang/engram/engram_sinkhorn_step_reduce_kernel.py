"""Kernels of engram_sinkhorn_step_reduce (docs/engram.md, "Sinkhorn normalisation").

    col_sumsq[j] = sum over p of col_sumsq_partial[p, j]      (fp32, P a runtime size)

The order of the fp32 additions is fixed by the configuration alone (never by timing or by the grid), so
repeated calls give bit-identical results. `num_segments` = S names the order: the P rows are cut into S
consecutive segments of L = ceil(P / S) rows; each segment is summed sequentially from +0.0 in row order,
then the S segment sums are added in segment order (sum_0 + sum_1, then + sum_2, ...). Ascend uses S = 1
(plain sequential order p = 0, 1, ..., P - 1); CUDA uses S = 8 so that eight threads per column keep
loads in flight. tests/engram/engram_sinkhorn_step_reduce_ref.py replays this order bit for bit.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

from .engram_sinkhorn_step_kernel import HEAD_DIM_ALIGN, LANES, MAX_HEAD_DIM

_CUDA_VEC = 4  # fp32 elements of one 16-byte access
_CUDA_COLS = 128  # columns of one CUDA block: 32 threads x 4 per segment
_CUDA_SEGMENTS = 8
_CUDA_UNROLL = 8  # independent 16-byte loads per thread in flight


@dataclasses.dataclass(frozen=True)
class EngramSinkhornStepReduceConfig:
    backend: Backend
    head_dim: int
    num_cores: int  # Ascend: vector cores; CUDA: SMs (informational)
    num_segments: int  # S of the summation order (module docstring)
    block_cols: int  # columns of one task (Ascend) / one block (CUDA)
    block_rows: int  # Ascend: partial rows per DMA step; CUDA: loads in flight per thread
    num_stages: int  # Ascend: buffer versions of the partial rows; unused on CUDA

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f'head_dim must be a multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}')
        if self.backend == 'ascend' and (self.num_segments != 1 or self.head_dim % self.block_cols):
            raise ValueError('Ascend: one segment and block_cols dividing head_dim')
        if self.block_rows < 1 or self.num_segments < 1:
            raise ValueError('block_rows and num_segments must be >= 1')

    @property
    def num_tiles(self) -> int:
        return -(-self.head_dim // self.block_cols)


def choose_engram_sinkhorn_step_reduce_config(
    *, backend: Backend, head_dim: int, num_cores: int
) -> EngramSinkhornStepReduceConfig:
    """Pure choice of the compile-time parameters (no device query). P is a runtime size."""
    if backend == 'ascend':
        # The narrowest column tile that keeps the tiles within one round of the cores; 32 KB of
        # partial rows per DMA step, double-buffered.
        divisors = [w for w in (64, 128, 256, 512, 1024, 2048) if head_dim % w == 0]
        cols = next((w for w in divisors if head_dim // w <= num_cores), divisors[-1])
        return EngramSinkhornStepReduceConfig(
            backend,
            head_dim,
            num_cores,
            num_segments=1,
            block_cols=cols,
            block_rows=max(1, 8192 // cols),
            num_stages=2,
        )
    return EngramSinkhornStepReduceConfig(
        backend,
        head_dim,
        num_cores,
        num_segments=_CUDA_SEGMENTS,
        block_cols=_CUDA_COLS,
        block_rows=_CUDA_UNROLL,
        num_stages=1,
    )


def _ascend_kernel(cfg: EngramSinkhornStepReduceConfig):
    import tilelang.ascend.language as T

    D, W, R, stages = cfg.head_dim, cfg.block_cols, cfg.block_rows, cfg.num_stages
    lanes = LANES
    C = W // lanes
    f32 = T.float32
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_sinkhorn_step_reduce_kernel(
        col_sumsq_partial: T.Tensor((num_partials, D), f32),
        col_sumsq: T.Tensor((D,), f32),
    ):
        with T.Kernel(cfg.num_tiles) as t:
            p_ub = T.alloc_shared((R, W), f32)
            acc_ub = T.alloc_shared((W,), f32)
            d0 = t * W
            with T.SimdVF():
                for c in T.serial(C):
                    T.simd.vsts(acc_ub[c * lanes], T.simd.vdup(0.0, f32))
            for k in T.Pipelined(T.ceildiv(num_partials, R), num_stages=stages):
                rows = T.min(R, num_partials - k * R)
                T.copy(col_sumsq_partial[k * R : k * R + rows, d0 : d0 + W], p_ub[0:rows, :])
                with T.SimdVF():
                    for c in T.serial(C):
                        s = T.simd.alloc_var(f32)
                        s = T.simd.vld(acc_ub[c * lanes])
                        for r in T.serial(rows):  # p in increasing order
                            s = T.simd.vadd(s, T.simd.vld(p_ub[r, c * lanes]))
                        T.simd.vsts(acc_ub[c * lanes], s)
            T.copy(acc_ub, col_sumsq[d0 : d0 + W])

    return engram_sinkhorn_step_reduce_kernel


def _cuda_kernel(cfg: EngramSinkhornStepReduceConfig):
    import tilelang.language as T

    D, W, S, U = cfg.head_dim, cfg.block_cols, cfg.num_segments, cfg.block_rows
    ve = _CUDA_VEC
    tpc = W // ve  # threads per segment row of the block
    nt = tpc * S
    guard = D % W != 0  # the last block's columns run past head_dim
    f32 = T.float32
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_sinkhorn_step_reduce_kernel(
        col_sumsq_partial: T.Tensor((num_partials, D), f32),
        col_sumsq: T.Tensor((D,), f32),
    ):
        with T.Kernel(cfg.num_tiles, threads=nt) as b:
            tid = T.get_thread_binding()
            seg = tid // tpc
            col = b * W + (tid % tpc) * ve
            acc = T.alloc_local((ve,), f32)
            buf = T.alloc_local((U * ve,), f32)
            sums = T.alloc_shared((S, W), f32)
            seg_len = T.ceildiv(num_partials, S)
            p0 = seg * seg_len
            p1 = T.min(p0 + seg_len, num_partials)
            for j in T.unroll(ve):
                acc[j] = 0.0
            if not guard or col < D:
                # U independent loads, then U sequential adds: rows past the segment load as +0.0, which
                # leaves the sum unchanged (it starts at +0.0, so it is never -0.0).
                for i in T.serial(T.ceildiv(p1 - p0, U)):
                    for u in T.unroll(U):
                        p = p0 + i * U + u
                        if p < p1:
                            for j in T.vectorized(ve):
                                buf[u * ve + j] = col_sumsq_partial[p, col + j]
                        else:
                            for j in T.unroll(ve):
                                buf[u * ve + j] = 0.0
                    for u in T.unroll(U):
                        for j in T.unroll(ve):
                            acc[j] += buf[u * ve + j]
                for j in T.vectorized(ve):
                    sums[seg, (tid % tpc) * ve + j] = acc[j]
            T.sync_threads()
            if seg == 0 and (not guard or col < D):
                for s in T.unroll(1, S):  # segment order
                    for j in T.unroll(ve):
                        acc[j] += sums[s, (tid % tpc) * ve + j]
                for j in T.vectorized(ve):
                    col_sumsq[col + j] = acc[j]

    return engram_sinkhorn_step_reduce_kernel


def make_engram_sinkhorn_step_reduce_kernel(cfg: EngramSinkhornStepReduceConfig):
    """The TileLang prim_func `engram_sinkhorn_step_reduce_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return _ascend_kernel(cfg)
    return _cuda_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_step_reduce_kernel(cfg: EngramSinkhornStepReduceConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_step_reduce_kernel(cfg), cfg.backend)
