"""Kernels of engram_grad_w_reduce: finish the Engram weight gradients from per-block partials.

    s[h, d] = sum_p partial[p, h, d]                      (fp32, P is a runtime size)
    grad_weight_hidden[h, d] += s[h, d] * float(we[h, d])  (in place)
    grad_weight_embed[h, d]  += s[h, d] * float(wh[h, d])  (in place)

One pass: every partial element is read once, the two weights and the two gradients once each.
The work is split over column tiles (h, d0:d0 + block_cols); each tile loops over P in chunks of
`block_rows` partial rows.

Summation order (fp32): Ascend adds the rows of a tile in order p = 0, 1, ..., P - 1. CUDA: the tile's
threads are (row lane, 16-byte column group) pairs; lane l adds rows l, l + L, l + 2L, ... in order, then
the L lane sums of a column are added in lane order. Both differ from torch's order, so results agree with
an fp32 reference within a few ulps of sum_p |partial[p]| (see the tests).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

_LANES = 64  # fp32 lanes of one 256-byte Ascend vector register
_CUDA_VEC = 4  # fp32 elements of one 16-byte CUDA access


@dataclasses.dataclass(frozen=True)
class EngramGradWReduceConfig:
    backend: Backend
    hc: int
    hidden: int
    num_cores: int  # Ascend vector cores / CUDA SMs: the tiles are sized to fill them in one round
    block_cols: int  # W: columns of one tile, divides hidden
    block_rows: int  # R: partial rows loaded per step
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend: buffer versions of the partial rows (double buffering); unused on CUDA

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.hidden % self.block_cols != 0 or self.block_cols % _LANES != 0:
            raise ValueError(f'block_cols {self.block_cols} must be a multiple of {_LANES} dividing {self.hidden}')
        if self.block_rows < 1:
            raise ValueError(f'block_rows must be >= 1, got {self.block_rows}')
        if self.backend == 'cuda':
            groups = self.block_cols // _CUDA_VEC
            if self.threads % groups or self.block_rows % (self.threads // groups):
                raise ValueError(
                    f'CUDA tiling: threads {self.threads} must be a multiple of the {groups} column groups and '
                    f'block_rows {self.block_rows} a multiple of the {self.threads // max(1, groups)} row lanes'
                )

    @property
    def num_tiles(self) -> int:
        return self.hc * (self.hidden // self.block_cols)


def choose_engram_grad_w_reduce_config(
    *, backend: Backend, hc: int, hidden: int, num_cores: int
) -> EngramGradWReduceConfig:
    """Pure choice of the compile-time parameters (no device query). P is a runtime size."""
    divisors = [w for w in (64, 128, 256, 512, 1024, 2048) if hidden % w == 0]  # ascending; 64 always divides
    if backend == 'ascend':
        # One tile per vector core in a single round: the narrowest tile that keeps the grid within the
        # cores (the widest candidate when none does; the extra blocks then run in further rounds);
        # 32 KB of partial rows per step, double-buffered.
        cols = next((w for w in divisors if hc * hidden // w <= num_cores), divisors[-1])
        return EngramGradWReduceConfig(
            backend,
            hc,
            hidden,
            num_cores,
            block_cols=cols,
            block_rows=max(1, min(32, 8192 // cols)),
            threads=0,
            num_stages=2,
        )
    # CUDA: 64-column tiles (hc * H / 64 blocks, several per SM) of 128 threads: 16 column groups x 8 row
    # lanes, each lane with 9 independent 16-byte row loads per step (2 steps for P = 132).
    return EngramGradWReduceConfig(
        backend, hc, hidden, num_cores, block_cols=_LANES, block_rows=72, threads=128, num_stages=1
    )


def _ascend_engram_grad_w_reduce_kernel(cfg: EngramGradWReduceConfig):
    import tilelang.ascend.language as T

    hc, hidden, W, R, stages = cfg.hc, cfg.hidden, cfg.block_cols, cfg.block_rows, cfg.num_stages
    n_d = hidden // W
    num_tiles = cfg.num_tiles
    lanes = _LANES
    C = W // lanes
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_grad_w_reduce_kernel(
        grad_w_partial: T.Tensor((num_partials, hc, hidden), T.float32),
        weight_hidden: T.Tensor((hc, hidden), T.bfloat16),
        weight_embed: T.Tensor((hc, hidden), T.bfloat16),
        grad_weight_hidden: T.Tensor((hc, hidden), T.float32),
        grad_weight_embed: T.Tensor((hc, hidden), T.float32),
    ):
        with T.Kernel(num_tiles) as t:
            p_ub = T.alloc_shared((R, W), T.float32)
            acc_ub = T.alloc_shared((W,), T.float32)
            wh_ub = T.alloc_shared((W,), T.bfloat16)
            we_ub = T.alloc_shared((W,), T.bfloat16)
            gh_ub = T.alloc_shared((W,), T.float32)
            ge_ub = T.alloc_shared((W,), T.float32)
            h = t // n_d
            d0 = (t % n_d) * W
            T.copy(weight_hidden[h, d0 : d0 + W], wh_ub)
            T.copy(weight_embed[h, d0 : d0 + W], we_ub)
            T.copy(grad_weight_hidden[h, d0 : d0 + W], gh_ub)
            T.copy(grad_weight_embed[h, d0 : d0 + W], ge_ub)
            with T.SimdVF():
                for c in T.serial(C):
                    T.simd.vsts(acc_ub[c * lanes], T.simd.vdup(0.0, T.float32))
            for k in T.Pipelined(T.ceildiv(num_partials, R), num_stages=stages):
                rows = T.min(R, num_partials - k * R)
                T.copy(grad_w_partial[k * R : k * R + rows, h, d0 : d0 + W], p_ub[0:rows, :])
                with T.SimdVF():
                    for c in T.serial(C):
                        s = T.simd.alloc_var(T.float32)
                        s = T.simd.vld(acc_ub[c * lanes])
                        for r in T.serial(rows):
                            s = T.simd.vadd(s, T.simd.vld(p_ub[r, c * lanes]))
                        T.simd.vsts(acc_ub[c * lanes], s)
            with T.SimdVF():
                for c in T.serial(C):
                    s = T.simd.vld(acc_ub[c * lanes])
                    whv = T.simd.vcvt(T.simd.vld(wh_ub[c * lanes], dist='UNPK_B16'), T.float32)
                    wev = T.simd.vcvt(T.simd.vld(we_ub[c * lanes], dist='UNPK_B16'), T.float32)
                    gh = T.simd.vadd(T.simd.vld(gh_ub[c * lanes]), T.simd.vmul(s, wev))
                    ge = T.simd.vadd(T.simd.vld(ge_ub[c * lanes]), T.simd.vmul(s, whv))
                    T.simd.vsts(gh_ub[c * lanes], gh)
                    T.simd.vsts(ge_ub[c * lanes], ge)
            T.copy(gh_ub, grad_weight_hidden[h, d0 : d0 + W])
            T.copy(ge_ub, grad_weight_embed[h, d0 : d0 + W])

    return engram_grad_w_reduce_kernel


def _cuda_engram_grad_w_reduce_kernel(cfg: EngramGradWReduceConfig):
    import tilelang.language as T

    hc, hidden, W, R, nt = cfg.hc, cfg.hidden, cfg.block_cols, cfg.block_rows, cfg.threads
    n_d = hidden // W
    G = W // _CUDA_VEC  # column groups (16-byte fp32 vectors) of a tile
    L = nt // G  # row lanes: thread (lane, group) sums rows lane, lane + L, ... of its group
    U = R // L  # independent row loads per lane and step
    f32 = T.float32
    num_partials = T.dynamic('num_partials')

    @T.prim_func
    def engram_grad_w_reduce_kernel(
        grad_w_partial: T.Tensor((num_partials, hc, hidden), T.float32),
        weight_hidden: T.Tensor((hc, hidden), T.bfloat16),
        weight_embed: T.Tensor((hc, hidden), T.bfloat16),
        grad_weight_hidden: T.Tensor((hc, hidden), T.float32),
        grad_weight_embed: T.Tensor((hc, hidden), T.float32),
    ):
        with T.Kernel(cfg.num_tiles, threads=nt) as bx:
            tid = T.get_thread_binding()
            h = bx // n_d
            col = (bx % n_d) * W + (tid % G) * _CUDA_VEC
            lane = tid // G
            acc = T.alloc_local((_CUDA_VEC,), f32)
            rows = T.alloc_local((U * _CUDA_VEC,), f32)
            lane_sums = T.alloc_shared((L, W), f32)
            s = T.alloc_local((_CUDA_VEC,), f32)
            wh = T.alloc_local((_CUDA_VEC,), T.bfloat16)
            we = T.alloc_local((_CUDA_VEC,), T.bfloat16)
            gh = T.alloc_local((_CUDA_VEC,), f32)
            ge = T.alloc_local((_CUDA_VEC,), f32)
            for j in T.vectorized(_CUDA_VEC):
                acc[j] = 0.0
            if lane == 0:  # the threads that finish the tile: these loads fly while the partials stream in
                for j in T.vectorized(_CUDA_VEC):
                    wh[j] = weight_hidden[h, col + j]
                for j in T.vectorized(_CUDA_VEC):
                    we[j] = weight_embed[h, col + j]
                for j in T.vectorized(_CUDA_VEC):
                    gh[j] = grad_weight_hidden[h, col + j]
                for j in T.vectorized(_CUDA_VEC):
                    ge[j] = grad_weight_embed[h, col + j]
            # All U loads of a step are issued before the first add (one memory round trip per step); rows
            # past P load zeros. The lane's running sum takes its rows in increasing p.
            for k in T.serial(T.ceildiv(num_partials, R)):
                for u in T.unroll(U):
                    p = k * R + u * L + lane
                    if p < num_partials:
                        for j in T.vectorized(_CUDA_VEC):
                            rows[u * _CUDA_VEC + j] = grad_w_partial[p, h, col + j]
                    else:
                        for j in T.vectorized(_CUDA_VEC):
                            rows[u * _CUDA_VEC + j] = 0.0
                for u in T.unroll(U):
                    for j in T.unroll(_CUDA_VEC):
                        acc[j] += rows[u * _CUDA_VEC + j]
            # One barrier: the L lane sums of each column meet in shared memory, lane 0 adds them in order.
            for j in T.vectorized(_CUDA_VEC):
                lane_sums[lane, (tid % G) * _CUDA_VEC + j] = acc[j]
            T.sync_threads()
            if lane == 0:
                for j in T.vectorized(_CUDA_VEC):
                    s[j] = lane_sums[0, tid * _CUDA_VEC + j]
                for r in T.unroll(1, L):
                    for j in T.unroll(_CUDA_VEC):
                        s[j] += lane_sums[r, tid * _CUDA_VEC + j]
                for j in T.unroll(_CUDA_VEC):
                    gh[j] += s[j] * T.cast(we[j], f32)
                    ge[j] += s[j] * T.cast(wh[j], f32)
                for j in T.vectorized(_CUDA_VEC):
                    grad_weight_hidden[h, col + j] = gh[j]
                for j in T.vectorized(_CUDA_VEC):
                    grad_weight_embed[h, col + j] = ge[j]

    return engram_grad_w_reduce_kernel


def make_engram_grad_w_reduce_kernel(cfg: EngramGradWReduceConfig):
    """The TileLang prim_func `engram_grad_w_reduce_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return _ascend_engram_grad_w_reduce_kernel(cfg)
    return _cuda_engram_grad_w_reduce_kernel(cfg)


@functools.cache
def get_engram_grad_w_reduce_kernel(cfg: EngramGradWReduceConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_grad_w_reduce_kernel(cfg), cfg.backend)
