"""The Sinkhorn family's shared code: sizes, the row layout and the CUDA row-norm macros.

engram_sinkhorn_step, engram_sinkhorn_finalize, engram_sinkhorn_step_reduce and
engram_sinkhorn_momentum_update import it (never their kernel modules from each other). The step and
finalize kernels build a row's norm from the same layout (`row_layout`) and the same macros
(`cuda_row_macros`; on Ascend the same `ascend_accumulators`), so both give the same bits for the same row.
"""

# No `from __future__ import annotations`: cuda_row_macros builds TileLang macros.

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


def ascend_accumulators(head_dim: int) -> int:
    """Ascend: independent 64-lane sum-of-squares registers per row (a shorter dependency chain)."""
    nchunk = head_dim // LANES
    return next(a for a in (4, 2, 1) if nchunk % a == 0)


def ascend_rows_per_task(head_dim: int) -> int:
    return max(1, ASCEND_TILE_ELEMS // head_dim)


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
