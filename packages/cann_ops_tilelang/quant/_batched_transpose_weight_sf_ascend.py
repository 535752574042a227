"""Ascend 950 kernel of batched_transpose_weight_sf (math and task split: batched_transpose_weight_sf_kernel.py).

A persistent loop over the tasks on the vector cores, two buffer versions. Per task: the (at most) 4 scale rows
of the chunk land in UB (one DMA per row that exists), and one SIMD VF

1. takes each row's exponent bytes, 64 lanes per register, lanes outside the weight zeroed (a tail mask);
   stores them packed one byte per lane (PK4_B32): read as words these are sf0's words of the row, and ORs them
   shifted by 8 j into sf1's words (one per scale column);
2. broadcasts every sf1 word over its bs output words (BRC_B32 load, bs / 64 stores or one 32-lane store);
3. broadcasts every sf0 word (a 32-bit broadcast load over the packed bytes) over its bs words in row p.

sf1's chunk goes back to GM in one DMA, sf0's as one DMA per word column p (4 * bs words, fewer in the last
quad of rows).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

from ._scale_rules import LANES


def ascend_batched_transpose_weight_sf_kernel(cfg):
    """`cfg` is a BatchedTransposeWeightSfConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    u32 = T.uint32
    bs, cc, stages, grid = cfg.block_size, cfg.chunk_cols, cfg.num_stages, cfg.num_cores
    rows_max = cfg.rows_per_task
    regs = -(-cc // LANES)  # registers per scale row
    cols_ub = regs * LANES
    stores = max(1, bs // LANES)  # full-register stores per broadcast word (bs = 32: one 32-lane store)

    num_sf = T.dynamic('num_sf')
    num_weights = T.dynamic('num_weights')
    num_tasks = T.dynamic('num_tasks')
    num_words = T.dynamic('num_words')

    def broadcast(dst, src, half):
        # Plain Python, not a macro (dst must reach vsts as a buffer access, not a value): the caller's statement
        # emits the returned store.
        if bs < LANES:
            return S.vsts(dst, T.reinterpret(src, 'int32x64'), half, dist='NORM_B32', extent=bs)
        return S.vsts(dst, T.reinterpret(src, 'int32x64'))

    @T.macro
    def pack_vf(in_ub, w0_ub, w1_ub, out0_ub, out1_ub, rows, cols):
        with T.SimdVF():
            zero = S.vdup(0, u32)
            byte = S.vdup(0xFF, u32)
            half = S.pset(32, 'PAT_VL32')
            for v in T.serial(regs):
                w1 = S.alloc_var(u32)
                w1 = S.vdup(0, u32)
                for j in T.unroll(rows_max, explicit=True):
                    # Lanes past the weight's columns, and rows past its last, give zero bytes.
                    live = T.if_then_else(j < rows, T.max(T.min(cols - v * LANES, LANES), 0), 0)
                    valid = S.update_mask(live, 32)
                    bits = T.reinterpret(S.vld(in_ub[j, v * LANES]), 'uint32x64')
                    e = S.vsel(S.vand(S.vshrs(bits, 23), byte), zero, valid)
                    S.vsts(w0_ub[j, v * LANES], T.reinterpret(e, 'uint8x256'), dist='PK4_B32')
                    w1 = S.vor(w1, S.vshls(e, 8 * j))
                S.vsts(w1_ub[v * LANES], w1)
            S.mem_bar('VST_VLD')
            for c in T.serial(cols):
                word = S.vld(w1_ub[c], dist='BRC_B32')
                for h in T.unroll(stores, explicit=True):
                    broadcast(out1_ub[c * bs + h * LANES], word, half)
            for p in T.serial(T.ceildiv(cols, rows_max)):
                for j in T.serial(rows):
                    word = S.vld(w0_ub[j, p * rows_max], dist='BRC_B32')  # 4 packed bytes as one 32-bit lane
                    for h in T.unroll(stores, explicit=True):
                        broadcast(out0_ub[p, j * bs + h * LANES], word, half)

    @T.prim_func
    def batched_transpose_weight_sf_kernel(
        sf_flat: T.Tensor((num_sf,), T.float32),
        weights: T.Tensor((num_weights, cfg.weight_columns), T.int32),
        task_weight: T.Tensor((num_tasks,), T.int32),
        out_flat: T.Tensor((num_words,), T.int32),
    ):
        with T.Kernel(grid) as cid:
            in_ub = T.alloc_shared((rows_max, cols_ub), T.float32)
            w0_ub = T.alloc_shared((rows_max, cols_ub), T.uint8)
            w1_ub = T.alloc_shared((cols_ub,), u32)
            out1_ub = T.alloc_shared((cc * bs,), T.int32)
            out0_ub = T.alloc_shared((cc // rows_max, rows_max * bs), T.int32)
            # in_ub is written by conditional DMAs (rows that exist), which multi-buffering does not take.
            T.annotate_buffer_versions({in_ub: 1, out1_ub: stages, out0_ub: stages, w0_ub: 1, w1_ub: 1})
            for task in T.Persistent([num_tasks], grid, cid, group_size=1, num_stages=stages):
                w = task_weight[task]
                local = task - weights[w, 0]
                sf_rows = weights[w, 2]
                sf_cols = weights[w, 3]
                # What the interface builds (lets the index arithmetic simplify).
                T.assume(local >= 0 and sf_rows > 0 and sf_cols > 0)
                chunks = T.ceildiv(sf_cols, cc)
                quads = T.ceildiv(sf_rows, rows_max)
                g = local // (quads * chunks)
                q = local % (quads * chunks) // chunks
                c0 = local % chunks * cc
                rows = T.min(rows_max, sf_rows - q * rows_max)
                cols = T.min(cc, sf_cols - c0)
                n = sf_rows * bs
                k = sf_cols * bs
                sf_base = weights[w, 4] + g * sf_rows * sf_cols + q * rows_max * sf_cols + c0
                sf0_base = weights[w, 5] + g * T.ceildiv(sf_cols, rows_max) * n + c0 // rows_max * n
                sf0_base = sf0_base + q * rows_max * bs
                sf1_base = weights[w, 6] + g * quads * k + q * k + c0 * bs
                for j in T.unroll(rows_max, explicit=True):
                    if j < rows:
                        T.copy(sf_flat[sf_base + j * sf_cols : sf_base + j * sf_cols + cols], in_ub[j, 0:cols])
                pack_vf(in_ub, w0_ub, w1_ub, out0_ub, out1_ub, rows, cols)
                T.copy(out1_ub[0 : cols * bs], out_flat[sf1_base : sf1_base + cols * bs])
                for p in T.serial(T.ceildiv(cols, rows_max)):
                    T.copy(out0_ub[p, 0 : rows * bs], out_flat[sf0_base + p * n : sf0_base + p * n + rows * bs])

    return batched_transpose_weight_sf_kernel
