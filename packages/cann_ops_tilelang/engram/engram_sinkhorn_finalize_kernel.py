"""Kernels of engram_sinkhorn_finalize (docs/engram.md, "Sinkhorn normalisation").

Per row i of the (rows, D) fp32 matrix M, with r = row_scale, c = col_scale (fp32 math):
    x_j = (r_i * M_ij) * c_j,  n_i = sqrt(sum_j x_j^2)
    s_i = alpha * (r_i / (n_i + eps))                      (correctly rounded division)
    out_ij = (s_i * M_ij) * c_j
The operations and their order are the torch reference's, except the order of the sum of squares. The
norm is accumulated exactly as engram_sinkhorn_step accumulates it (its row layout and order), so for
the same row both operators see the same norm, and s_i is alpha times the row scale the step would store.

One pass over memory: each row of M is read once and kept on chip between the norm and the output.
The row count is a runtime size (T.dynamic).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

from .engram_sinkhorn_step_kernel import (
    CUDA_VEC,
    HEAD_DIM_ALIGN,
    LANES,
    MAX_HEAD_DIM,
    ascend_accumulators,
    ascend_rows_per_task,
    cuda_row_macros,
    row_layout,
)

# Rows per block of row groups at most a warp wide: at head_dim 256 on the H200, 32 rows per block were
# slower at 1001 and 10001 rows (fewer blocks than SMs, then fewer waves) and no faster at 100001.
CUDA_FINALIZE_ROWS_PER_BLOCK = 16
# Rows per row group (R): each thread already has its chunks of a row in flight, and with half-warp rows
# (head_dim <= 512) a warp has two rows; R = 2 and 4 were no faster in the same sweep.
CUDA_FINALIZE_ROWS_IN_FLIGHT = 1


@dataclasses.dataclass(frozen=True)
class EngramSinkhornFinalizeConfig:
    backend: Backend
    head_dim: int
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is rows / W)
    rows_per_task: int  # Ascend: rows of one task (UB tile); CUDA: row groups per block (W)
    group_threads: int  # CUDA: threads per row (G); unused on Ascend
    chunks: int  # CUDA: 16-byte chunks per thread; unused on Ascend
    num_stages: int  # Ascend buffer versions of the persistent loop; unused on CUDA
    rows_in_flight: int = 1  # CUDA: rows per row group (R), loaded before any is reduced; Ascend: 1

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f'head_dim must be a multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}')
        if self.backend == 'cuda' and self.group_threads * self.chunks * CUDA_VEC < self.head_dim:
            raise ValueError('group_threads * chunks * 4 must cover head_dim')
        if self.rows_in_flight < 1:
            raise ValueError('rows_in_flight must be at least 1')

    @property
    def threads(self) -> int:
        return self.group_threads * self.rows_per_task


def choose_engram_sinkhorn_finalize_config(
    *, backend: Backend, head_dim: int, num_cores: int
) -> EngramSinkhornFinalizeConfig:
    """Pure choice of the compile-time parameters (no device query). The row count is a runtime size."""
    if backend == 'ascend':
        return EngramSinkhornFinalizeConfig(
            backend,
            head_dim,
            num_cores,
            rows_per_task=ascend_rows_per_task(head_dim),
            group_threads=0,
            chunks=0,
            num_stages=2,
            rows_in_flight=1,
        )
    # The step's row layout (same norms: G and chunks; W and R do not change a row's sum).
    g, chunks = row_layout(head_dim)
    r = CUDA_FINALIZE_ROWS_IN_FLIGHT
    # Groups of at most a warp: CUDA_FINALIZE_ROWS_PER_BLOCK rows per block, each group on its own R rows, no
    # barrier; wider rows: one row group per block.
    w = max(1, CUDA_FINALIZE_ROWS_PER_BLOCK // r) if g <= 32 else 1
    return EngramSinkhornFinalizeConfig(
        backend, head_dim, num_cores, rows_per_task=w, group_threads=g, chunks=chunks, num_stages=1, rows_in_flight=r
    )


def _ascend_kernel(cfg: EngramSinkhornFinalizeConfig):
    import tilelang.ascend.language as T

    D, R, stages = cfg.head_dim, cfg.rows_per_task, cfg.num_stages
    grid = cfg.num_cores
    lanes = LANES
    nchunk = D // lanes
    A = ascend_accumulators(D)
    rp = max(8, R)  # per-row scales padded to 32 bytes
    f32 = T.float32
    rows = T.dynamic('rows')

    @T.prim_func
    def engram_sinkhorn_finalize_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        out: T.Tensor((rows, D), f32),
        eps: T.float32,
        alpha: T.float32,
    ):
        with T.Kernel(grid) as cid:
            c_ub = T.alloc_shared((D,), f32)
            m_ub = T.alloc_shared((R, D), f32)  # M, then the output in place
            rs_ub = T.alloc_shared((rp,), f32)
            T.annotate_buffer_versions({c_ub: 1, m_ub: stages, rs_ub: stages})
            T.copy(col_scale, c_ub)
            for task in T.Persistent([T.ceildiv(rows, R)], grid, cid, group_size=1, num_stages=stages):
                r0 = task * R
                valid = T.min(R, rows - r0)
                T.copy(matrix[r0 : r0 + valid, :], m_ub[0:valid, :])
                T.copy(row_scale[r0 : r0 + valid], rs_ub[0:valid])
                with T.SimdVF():
                    for i in T.serial(valid):
                        sc = T.simd.vld(rs_ub[i], dist='BRC_B32')
                        acc = T.simd.alloc_local((A,), f32)
                        for a in T.unroll(A, explicit=True):
                            acc[a] = T.simd.vdup(0.0, f32)
                        for g in T.serial(nchunk // A):
                            for a in T.unroll(A, explicit=True):
                                off = (g * A + a) * lanes
                                x = T.simd.vmul(T.simd.vmul(sc, T.simd.vld(m_ub[i, off])), T.simd.vld(c_ub[off]))
                                T.simd.vmula(acc[a], x, x)
                        if A == 4:
                            acc[0] = T.simd.vadd(T.simd.vadd(acc[0], acc[2]), T.simd.vadd(acc[1], acc[3]))
                        elif A == 2:
                            acc[0] = T.simd.vadd(acc[0], acc[1])
                        nrm = T.simd.vsqrt(T.simd.vcadd(acc[0]))
                        s = T.simd.vmuls(T.simd.vdiv(sc, T.simd.vadds(nrm, eps)), alpha)
                        sb = T.simd.vdupv(s)
                        # Each chunk is loaded before it is overwritten and never loaded again: no barrier.
                        for c in T.serial(nchunk):
                            mv = T.simd.vld(m_ub[i, c * lanes])
                            y = T.simd.vmul(T.simd.vmul(sb, mv), T.simd.vld(c_ub[c * lanes]))
                            T.simd.vsts(m_ub[i, c * lanes], y)
                T.copy(m_ub[0:valid, :], out[r0 : r0 + valid, :])

    return engram_sinkhorn_finalize_kernel


def _cuda_kernel(cfg: EngramSinkhornFinalizeConfig):
    import tilelang.language as T

    D, W, G, nc, R = cfg.head_dim, cfg.rows_per_task, cfg.group_threads, cfg.chunks, cfg.rows_in_flight
    nt = cfg.threads
    nw = max(1, G // 32)  # warps per row group
    ve = CUDA_VEC
    L = nc * ve  # floats of one row per thread
    guard = (D // ve) % G != 0  # some threads' last chunk lies past the row
    f32 = T.float32
    rows = T.dynamic('rows')
    load_col_scale, row_sumsq = cuda_row_macros(cfg)

    @T.prim_func
    def engram_sinkhorn_finalize_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        out: T.Tensor((rows, D), f32),
        eps: T.float32,
        alpha: T.float32,
    ):
        # Block b holds rows b * W * R + r * W + w (r < R) for its W row groups: R rows per group, all
        # loaded before any is reduced (R independent reductions), the column scale loaded once for them.
        with T.Kernel(T.ceildiv(rows, W * R), threads=nt) as b:
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            tid = T.get_thread_binding()
            lane = tid % G
            w = tid // G
            c_l = T.alloc_local((L,), f32)
            m_l = T.alloc_local((R * L,), f32)
            rs_l = T.alloc_local((R,), f32)
            ss = T.alloc_local((R,), f32)
            tot = T.alloc_local((R,), f32)
            s = T.alloc_var(f32)
            red = T.alloc_shared((1, R, W, nw), f32)
            load_col_scale(c_l, col_scale, lane)
            # Rows past the last are zeros and are not stored; the barrier of a group wider than a warp
            # is outside every row condition, so all threads of the block reach it.
            for r in T.unroll(R):
                if (b * R + r) * W + w < rows:
                    for k in T.unroll(nc):
                        col = (lane + k * G) * ve
                        if not guard or col < D:
                            for j in T.vectorized(ve):
                                m_l[r * L + k * ve + j] = matrix[(b * R + r) * W + w, col + j]
                        else:
                            for j in T.unroll(ve):
                                m_l[r * L + k * ve + j] = 0.0
                    rs_l[r] = row_scale[(b * R + r) * W + w]
                else:
                    for e in T.unroll(L):
                        m_l[r * L + e] = 0.0
                    rs_l[r] = 0.0
            # The step's accumulation of each row's norm (its macro: same order, same bits).
            row_sumsq(tot, ss, rs_l, m_l, c_l, red, 0, w, lane)
            for r in T.unroll(R):
                if (b * R + r) * W + w < rows:
                    s = alpha * (rs_l[r] / (T.sqrt(tot[r]) + eps))
                    for k in T.unroll(nc):
                        col = (lane + k * G) * ve
                        if not guard or col < D:
                            for j in T.vectorized(ve):
                                out[(b * R + r) * W + w, col + j] = (s * m_l[r * L + k * ve + j]) * c_l[k * ve + j]

    return engram_sinkhorn_finalize_kernel


def make_engram_sinkhorn_finalize_kernel(cfg: EngramSinkhornFinalizeConfig):
    """The TileLang prim_func `engram_sinkhorn_finalize_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return _ascend_kernel(cfg)
    return _cuda_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_finalize_kernel(cfg: EngramSinkhornFinalizeConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_finalize_kernel(cfg), cfg.backend)
