"""Kernels of engram_sinkhorn_step (docs/engram.md, "Sinkhorn normalisation").

Per row i of the (rows, D) fp32 matrix M, with r = row_scale, c = col_scale (fp32 math):
    x_j = (r_i * M_ij) * c_j,  row_norm_i = sqrt(sum_j x_j^2)
    r'_i = r_i / (row_norm_i + eps)                          (correctly rounded division; stored in row_scale)
    col_sumsq_partial[p, j] += ((r'_i * M_ij) * c_j)^2       (rows of worker p only)
The products are evaluated in the order of the torch reference, so the terms of both sums are the
reference's; only the order of the sums differs (and the fused multiply-adds of the squares).

One pass over memory: each row of M is read once (kept on chip between the norm and the column
update); row_scale is read and written once; each worker writes its own (D,) partial, no atomics.
P (the number of workers) is fixed by the configuration: the vector cores on Ascend, two blocks per SM
on CUDA; a worker's rows and the order it adds them in are fixed, so the partials are reproducible.
The row count is a runtime size (T.dynamic).

engram_sinkhorn_finalize computes its row norms with this module's row layout (`row_layout`) and the same
accumulation order, so both operators give bit-identical norms for the same row.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

LANES = 64  # fp32 lanes of one 256-byte Ascend vector register
HEAD_DIM_ALIGN = 64
MAX_HEAD_DIM = 8192  # Ascend: col_scale, the column accumulator and two row tiles must fit the UB
CUDA_VEC = 4  # fp32 elements of one 16-byte access: the unit ("chunk") a CUDA thread owns
CUDA_MAX_CHUNKS = 4  # chunks per thread of rows wider than CUDA_NARROW_MAX_HEAD_DIM (G >= 32 threads)
# Rows of at most this many columns: a group of CUDA_NARROW_GROUP threads (half a warp) per row, up to 8 chunks
# per thread, so that a warp reduces two rows at once and its per-row work (the butterfly, the square root,
# the division, the stores of row_norm and row_scale) is shared by two rows (docs/engram.md, "Sinkhorn step:
# rows in flight").
CUDA_NARROW_MAX_HEAD_DIM = 512
CUDA_NARROW_GROUP = 16
CUDA_BLOCK_THREADS = 512  # CUDA threads per block when row groups are at most a warp wide
CUDA_BLOCKS_PER_SM = 2
CUDA_REGS_PER_SM = 65536
ASCEND_TILE_ELEMS = 8192  # fp32 elements of matrix per Ascend task (32 KB), whole rows


def row_layout(head_dim: int) -> tuple[int, int]:
    """CUDA: (G, chunks): G threads share a row, each owning `chunks` 16-byte column chunks
    (chunk k of thread l starts at column (l + k * G) * 4).

    Rows of at most CUDA_NARROW_MAX_HEAD_DIM columns: G = CUDA_NARROW_GROUP (head_dim is a multiple of 64, so
    G divides the row's chunk count). Wider rows: G is the smallest multiple of 32 giving at most
    CUDA_MAX_CHUNKS chunks per thread, preferring a G that divides the row's chunk count (no predicated
    thread)."""
    n4 = head_dim // CUDA_VEC
    if head_dim <= CUDA_NARROW_MAX_HEAD_DIM:
        return CUDA_NARROW_GROUP, n4 // CUDA_NARROW_GROUP
    for g in range(32, 1025, 32):
        c = -(-n4 // g)
        if c <= CUDA_MAX_CHUNKS and n4 % g == 0:
            return g, c
    g = -(-n4 // (CUDA_MAX_CHUNKS * 32)) * 32
    return g, -(-n4 // g)


def _cuda_regs_estimate(chunks: int, rows_in_flight: int = 1, stages: int = 2) -> int:
    """Registers per thread: the column scale and the column sums ((chunks * 4) floats each), the
    rows in flight (rows_in_flight row buffers, twice that when the next ones are prefetched, with their
    row scales and sums), plus addressing; rounded up to the allocation unit of 8 (ptxas -v on sm_90a, the
    chosen layouts: 128 registers at head_dim 256, estimate 128; 230 at head_dim 512, estimate 224; both
    leave two blocks per SM resident)."""
    buffers = rows_in_flight * stages
    return -(-(4 * chunks * (2 + buffers) + 2 * buffers + 24) // 8) * 8


def cuda_row_groups(group_threads: int, chunks: int, rows_in_flight: int, stages: int) -> int:
    """CUDA: row groups per block (W): at most CUDA_BLOCK_THREADS threads, and as many as leave both blocks
    of an SM resident within the register file by _cuda_regs_estimate; groups narrower than a warp fill
    whole warps."""
    regs = _cuda_regs_estimate(chunks, rows_in_flight, stages)
    fit = CUDA_REGS_PER_SM // (CUDA_BLOCKS_PER_SM * group_threads * regs)
    w = min(CUDA_BLOCK_THREADS // group_threads, fit)
    if group_threads < 32:
        w -= w % (32 // group_threads)
    return max(1, w)


def ascend_accumulators(head_dim: int) -> int:
    """Ascend: independent 64-lane sum-of-squares registers per row (a shorter dependency chain)."""
    nchunk = head_dim // LANES
    return next(a for a in (4, 2, 1) if nchunk % a == 0)


def ascend_rows_per_task(head_dim: int) -> int:
    return max(1, ASCEND_TILE_ELEMS // head_dim)


@dataclasses.dataclass(frozen=True)
class EngramSinkhornStepConfig:
    backend: Backend
    head_dim: int
    num_cores: int  # Ascend: vector cores; CUDA: SMs
    num_partials: int  # P: workers, one (head_dim,) partial each (Ascend cores / CUDA blocks)
    rows_per_task: int  # Ascend: rows of one task (UB tile); CUDA: row groups per block (W)
    group_threads: int  # CUDA: threads per row (G); unused on Ascend
    chunks: int  # CUDA: 16-byte chunks per thread; unused on Ascend
    # Ascend: buffer versions of the persistent loop. CUDA: 1 = a row group loads its rows_in_flight rows,
    # then reduces them; 2 = it also loads its next rows_in_flight rows before reducing the current ones.
    num_stages: int
    rows_in_flight: int = 1  # CUDA: rows a row group loads per iteration before reducing them (R); Ascend: 1

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.head_dim % HEAD_DIM_ALIGN or not HEAD_DIM_ALIGN <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f'head_dim must be a multiple of {HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}')
        if self.backend == 'cuda' and self.group_threads * self.chunks * CUDA_VEC < self.head_dim:
            raise ValueError('group_threads * chunks * 4 must cover head_dim')
        if self.backend == 'cuda' and (self.num_stages not in (1, 2) or self.rows_in_flight < 1):
            raise ValueError('CUDA: num_stages must be 1 or 2 and rows_in_flight at least 1')

    @property
    def threads(self) -> int:
        return self.group_threads * self.rows_per_task


def cuda_rows_in_flight(head_dim: int) -> tuple[int, int]:
    """CUDA: (rows_in_flight, num_stages) of a row group, from the H200 sweeps of the variants at 1001, 10001
    and 100001 rows (docs/engram.md, "Sinkhorn step: rows in flight").

    Half-warp rows (head_dim <= CUDA_NARROW_MAX_HEAD_DIM) are loaded four at a time and reduced as four
    independent chains, so that a warp has eight rows in flight. Wider rows (one or more warps per row): one
    row at a time, the next one prefetched, and enough row groups per block (cuda_row_groups) to keep the
    SM's warps busy."""
    g, _ = row_layout(head_dim)
    if g < 32:
        return 4, 1
    return 1, 2


def choose_engram_sinkhorn_step_config(*, backend: Backend, head_dim: int, num_cores: int) -> EngramSinkhornStepConfig:
    """Pure choice of the compile-time parameters (no device query). The row count is a runtime size."""
    if backend == 'ascend':
        return EngramSinkhornStepConfig(
            backend,
            head_dim,
            num_cores,
            num_partials=num_cores,
            rows_per_task=ascend_rows_per_task(head_dim),
            group_threads=0,
            chunks=0,
            num_stages=2,
            rows_in_flight=1,
        )
    g, chunks = row_layout(head_dim)
    r, stages = cuda_rows_in_flight(head_dim)
    # As many row groups per block as leave both blocks of an SM resident (each group on its own rows;
    # groups wider than a warp meet at a barrier per row). Two blocks per SM: P = 2 * SMs partials.
    w = cuda_row_groups(g, chunks, r, stages)
    return EngramSinkhornStepConfig(
        backend,
        head_dim,
        num_cores,
        num_partials=num_cores * CUDA_BLOCKS_PER_SM,
        rows_per_task=w,
        group_threads=g,
        chunks=chunks,
        num_stages=stages,
        rows_in_flight=r,
    )


def cuda_row_macros(cfg):
    """CUDA: the two macros the step and finalize kernels build a row's norm with, for a configuration with
    head_dim, group_threads (G), chunks and rows_in_flight (R); one home, so that both operators give the
    same bits for the same row.

    load_col_scale(c_l, col_scale, lane): the column scale of the thread's chunks, zeros past the row.
    row_sumsq(tot, ss, rs_l, m_l, c_l, red, parity, w, lane): per row r of the R rows in m_l (scales in rs_l),
    tot[r] = the row's sum of ((rs * m) * c) ** 2: each thread's elements in order, then the lanes of its
    warp (of its group, where G < 32: the same butterfly over G lanes), then the warps of a group wider than
    one, through red[parity, r, w, warp] (a barrier: reach it from every thread).
    """
    import tilelang.language as T

    D, G, nc, R = cfg.head_dim, cfg.group_threads, cfg.chunks, cfg.rows_in_flight
    nw = max(1, G // 32)
    levels = max(0, G.bit_length() - 1)  # butterfly steps of a group of G < 32 lanes
    ve = CUDA_VEC
    L = nc * ve
    guard = (D // ve) % G != 0

    @T.macro
    def load_col_scale(c_l, col_scale, lane):
        for k in T.unroll(nc):
            col = (lane + k * G) * ve
            if not guard or col < D:
                for j in T.vectorized(ve):
                    c_l[k * ve + j] = col_scale[col + j]
            else:
                for j in T.unroll(ve):
                    c_l[k * ve + j] = 0.0

    @T.macro
    def row_sumsq(tot, ss, rs_l, m_l, c_l, red, parity, w, lane):
        for r in T.unroll(R):
            ss[r] = 0.0
            for e in T.unroll(L):
                x = (rs_l[r] * m_l[r * L + e]) * c_l[e]
                ss[r] += x * x
        if G >= 32:
            for r in T.unroll(R):
                tot[r] = T.warp_reduce_sum(ss[r])
        else:
            # A group of G < 32 lanes (aligned within its warp): the butterfly of warp_reduce_sum over
            # its own lanes (offsets G / 2, ..., 1 stay inside the group).
            for r in T.unroll(R):
                tot[r] = ss[r]
            for k in T.unroll(levels):
                for r in T.unroll(R):
                    tot[r] = tot[r] + T.shfl_xor(tot[r], (G // 2) >> k)
        if nw > 1:
            if lane % 32 == 0:
                for r in T.unroll(R):
                    red[parity, r, w, lane // 32] = tot[r]
            T.sync_threads()
            for r in T.unroll(R):
                tot[r] = red[parity, r, w, 0]
                for q2 in T.unroll(1, nw):
                    tot[r] += red[parity, r, w, q2]

    return load_col_scale, row_sumsq


def _ascend_kernel(cfg: EngramSinkhornStepConfig):
    import tilelang.ascend.language as T

    D, P, R, stages = cfg.head_dim, cfg.num_partials, cfg.rows_per_task, cfg.num_stages
    lanes = LANES
    nchunk = D // lanes
    A = ascend_accumulators(D)
    rp = max(8, R)  # per-row stats rows padded to 32 bytes
    f32 = T.float32
    rows = T.dynamic('rows')

    @T.prim_func
    def engram_sinkhorn_step_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        row_norm: T.Tensor((rows,), f32),
        col_sumsq_partial: T.Tensor((P, D), f32),
        eps: T.float32,
    ):
        with T.Kernel(P) as cid:
            c_ub = T.alloc_shared((D,), f32)
            acc_ub = T.alloc_shared((D,), f32)  # this core's column sums of squares
            m_ub = T.alloc_shared((R, D), f32)
            rs_ub = T.alloc_shared((rp,), f32)
            nrm_ub = T.alloc_shared((rp,), f32)
            rsn_ub = T.alloc_shared((rp,), f32)
            T.annotate_buffer_versions(
                {c_ub: 1, acc_ub: 1, m_ub: stages, rs_ub: stages, nrm_ub: stages, rsn_ub: stages}
            )
            T.copy(col_scale, c_ub)
            with T.SimdVF():
                for c in T.serial(nchunk):
                    T.simd.vsts(acc_ub[c * lanes], T.simd.vdup(0.0, f32))
            for task in T.Persistent([T.ceildiv(rows, R)], P, cid, group_size=1, num_stages=stages):
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
                        rsn = T.simd.vdiv(sc, T.simd.vadds(nrm, eps))
                        T.simd.vsts(nrm_ub[i], nrm, dist='ONEPT_B32')
                        T.simd.vsts(rsn_ub[i], rsn, dist='ONEPT_B32')
                        rb = T.simd.vdupv(rsn)
                        # The previous row's acc_ub stores must land before this row loads them.
                        T.simd.mem_bar('VST_VLD')
                        for c in T.serial(nchunk):
                            mv = T.simd.vld(m_ub[i, c * lanes])
                            y = T.simd.vmul(T.simd.vmul(rb, mv), T.simd.vld(c_ub[c * lanes]))
                            s = T.simd.alloc_var(f32)
                            s = T.simd.vld(acc_ub[c * lanes])
                            T.simd.vmula(s, y, y)
                            T.simd.vsts(acc_ub[c * lanes], s)
                T.copy(nrm_ub[0:valid], row_norm[r0 : r0 + valid])
                T.copy(rsn_ub[0:valid], row_scale[r0 : r0 + valid])
            # Every vector store of acc_ub done before the store to GM (cores without tasks write zeros).
            T.ascend_pipe_barrier('PIPE_ALL')
            T.copy(acc_ub, col_sumsq_partial[cid, :])

    return engram_sinkhorn_step_kernel


def _cuda_kernel(cfg: EngramSinkhornStepConfig):
    import tilelang.language as T

    D, P, W, G, nc = cfg.head_dim, cfg.num_partials, cfg.rows_per_task, cfg.group_threads, cfg.chunks
    R, S = cfg.rows_in_flight, cfg.num_stages
    nt = cfg.threads
    nw = max(1, G // 32)  # warps per row group
    ve = CUDA_VEC
    L = nc * ve  # floats of one row per thread
    guard = (D // ve) % G != 0  # some threads' last chunk lies past the row
    f32 = T.float32
    rows = T.dynamic('rows')
    load_col_scale, row_sumsq = cuda_row_macros(cfg)

    @T.macro
    def load_rows(dst, dst_rs, matrix, row_scale, it, lo, w, lane, cnt):
        # The R rows j = it * R + r of group w (rows lo + w + j * W); rows past the group's last are zeros.
        for r in T.unroll(R):
            j = it * R + r
            if j < cnt:
                for k in T.unroll(nc):
                    col = (lane + k * G) * ve
                    if not guard or col < D:
                        for v in T.vectorized(ve):
                            dst[r * L + k * ve + v] = matrix[lo + w + j * W, col + v]
                    else:
                        for v in T.unroll(ve):
                            dst[r * L + k * ve + v] = 0.0
                dst_rs[r] = row_scale[lo + w + j * W]
            else:
                for e in T.unroll(L):
                    dst[r * L + e] = 0.0
                dst_rs[r] = 0.0

    @T.prim_func
    def engram_sinkhorn_step_kernel(
        matrix: T.Tensor((rows, D), f32),
        row_scale: T.Tensor((rows,), f32),
        col_scale: T.Tensor((D,), f32),
        row_norm: T.Tensor((rows,), f32),
        col_sumsq_partial: T.Tensor((P, D), f32),
        eps: T.float32,
    ):
        with T.Kernel(P, threads=nt) as b:
            # `red` alternates by iteration parity, so the one barrier per iteration is all it needs.
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            if CUDA_BLOCKS_PER_SM * nt * _cuda_regs_estimate(nc, R, S) <= CUDA_REGS_PER_SM:
                # Both blocks of an SM resident (the partials assume one wave), without spills: the
                # chooser sizes W so that the estimate fits; a variant that does not is left to ptxas.
                T.annotate_min_blocks_per_sm(CUDA_BLOCKS_PER_SM)
            tid = T.get_thread_binding()
            lane = tid % G
            w = tid // G
            c_l = T.alloc_local((L,), f32)
            m_l = T.alloc_local((R * L,), f32)
            rs_l = T.alloc_local((R,), f32)
            m_n = T.alloc_local((R * L if S > 1 else 1,), f32)
            rs_n = T.alloc_local((R if S > 1 else 1,), f32)
            a_l = T.alloc_local((L,), f32)
            ss = T.alloc_local((R,), f32)
            tot = T.alloc_local((R,), f32)
            nrm = T.alloc_var(f32)
            rsn = T.alloc_var(f32)
            acc = T.alloc_var(f32)
            red = T.alloc_shared((2, R, W, nw), f32)
            comb = T.alloc_shared((W if W > 1 else 1, D), f32)
            load_col_scale(c_l, col_scale, lane)
            for e in T.unroll(L):
                a_l[e] = 0.0
            # Block b owns rows [lo, lo + n): rows // P or rows // P + 1 of them; group w takes every W-th
            # (cnt rows), R of them per iteration, in row order: the order of each column sum is the same
            # for every R and S (and as with one row at a time).
            q = rows // P
            rem = rows % P
            lo = b * q + T.min(b, rem)
            n = q + T.if_then_else(b < rem, 1, 0)
            cnt = T.max(T.ceildiv(n - w, W), 0)
            # One trip count for the whole block (group 0 has the most rows): the barrier of a row group
            # wider than a warp is reached by every thread; groups past their last row skip the updates.
            iters = T.ceildiv(T.ceildiv(n, W), R)
            if S > 1:
                # Software pipelining: the next R rows of this group are loaded (m_n, rs_n) before the
                # current R are reduced, so up to 2 R rows per group are in flight.
                load_rows(m_n, rs_n, matrix, row_scale, 0, lo, w, lane, cnt)
            for it in T.serial(iters):
                if S > 1:
                    for e in T.unroll(R * L):
                        m_l[e] = m_n[e]
                    for r in T.unroll(R):
                        rs_l[r] = rs_n[r]
                    if it + 1 < iters:
                        load_rows(m_n, rs_n, matrix, row_scale, it + 1, lo, w, lane, cnt)
                else:
                    load_rows(m_l, rs_l, matrix, row_scale, it, lo, w, lane, cnt)
                # R independent sums and warp reductions (each row's in the one fixed order).
                row_sumsq(tot, ss, rs_l, m_l, c_l, red, it % 2, w, lane)
                for r in T.unroll(R):
                    if it * R + r < cnt:
                        row = lo + w + (it * R + r) * W
                        nrm = T.sqrt(tot[r])
                        rsn = rs_l[r] / (nrm + eps)
                        if lane == 0:
                            row_norm[row] = nrm
                            row_scale[row] = rsn
                        for e in T.unroll(L):
                            y = (rsn * m_l[r * L + e]) * c_l[e]
                            a_l[e] += y * y
            if W == 1:
                for k in T.unroll(nc):
                    col = (lane + k * G) * ve
                    if not guard or col < D:
                        for j in T.vectorized(ve):
                            col_sumsq_partial[b, col + j] = a_l[k * ve + j]
            else:
                # W groups of one block: add their sums in the fixed order w = 0, 1, ..., W - 1.
                for k in T.unroll(nc):
                    col = (lane + k * G) * ve
                    if not guard or col < D:
                        for j in T.vectorized(ve):
                            comb[w, col + j] = a_l[k * ve + j]
                T.sync_threads()
                for k in T.serial(T.ceildiv(D, nt)):
                    col = k * nt + tid
                    if col < D:
                        acc = comb[0, col]
                        for w2 in T.unroll(1, W):
                            acc += comb[w2, col]
                        col_sumsq_partial[b, col] = acc

    return engram_sinkhorn_step_kernel


def make_engram_sinkhorn_step_kernel(cfg: EngramSinkhornStepConfig):
    """The TileLang prim_func `engram_sinkhorn_step_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return _ascend_kernel(cfg)
    return _cuda_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_step_kernel(cfg: EngramSinkhornStepConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_step_kernel(cfg), cfg.backend)
