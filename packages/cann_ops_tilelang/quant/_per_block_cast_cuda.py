"""CUDA kernel of per_block_cast (math and config: per_block_cast_kernel.py).

A streaming kernel: x is read from global memory once, into registers, and each fp8 byte is written once.

Work split. One thread block per (token block, column tile): bt rows by block_k channels, about 32 KiB of x
(the chooser's target; at least one channel block wide), which for T = 4001 and H = 4096..7168 gives
1000-3600 thread blocks, so the last wave of the grid is a small part of the run. The grid is one flat
dimension, column tile fastest, so neighbouring thread blocks stream neighbouring channels of the same rows.
Each thread owns CUDA_VECTOR = 16 consecutive channels of `rows_per_thread` rows (rows `rows_per_pass` apart):
its loads are 16 bytes wide (two per row for bf16, four for fp32) and all of them are issued before the first
use, so a thread has its whole share (32-256 bytes) in flight and a thread block its whole tile. At 40-84
registers per thread (ptxas, sm_90a, no spills) 3-5 blocks of 256 threads are resident per SM: 96-192 KiB in
flight per SM, several times what the H200's HBM needs per SM to stay busy (bandwidth x latency / 132, about
25 KiB), so the stream does not wait on one block's barrier. Each row's 16 fp8 bytes go out as one 16-byte
store. Whether it reaches 90 % of the copy bandwidth is not measured here (no GPU in this session).

Block maxima. A thread reduces its 16 x rows_per_thread values to one |x| maximum (in fp32; bf16 widens
exactly). The threads of one channel block are bc / 16 neighbouring lanes of each row and 32 / threads_per_row
rows of each warp: an xor-shuffle butterfly over those lane bits leaves the warp's maximum in every lane; one
lane per (warp, channel block) puts it into shared memory, and after the one barrier of the kernel every
thread reads the warps' maxima of its channel block and computes the scale and inverse itself
(_scale_rules.cuda_cast_scale_and_inverse: a few instructions, no second barrier). The first row of threads stores
the scales; the last column tile's threads store the zero padding bytes of a packed UE8M0 row. Rows past T (the
last token block) load as zeros, which change no maximum, and are not stored.

FP4 output: each row's 16 elements of a thread are rounded to e2m1 codes (fp4.cuda_e2m1_code: compares on the
grid's midpoints, the same rounding as the Ascend kernel; sm_90 has no FP4 conversion), packed two a byte, and
go out as one 8-byte store. The scale, whatever its format (fp32, power of two, UE8M0, E4M3), comes from the
domain's rule (_scale_rules.cuda_cast_scale_and_inverse), shared with the Ascend kernel.

Mode 'sf_only' skips the data stores; mode 'precomputed' skips the reduction (no barrier, no shared memory):
each thread reads its block's fp32 (or e4m3) scale (an L1 / L2 hit for all but the first thread of the block)
and takes its IEEE reciprocal (__frcp_rn: correctly rounded whatever the fast-math flags; TileLang compiles
without them). The e4m3 narrowing is __nv_fp8_e4m3's (nearest even, saturating to +-448, NaN kept), which also
saturates the overflow of a precomputed or E4M3 scale; the e2m1 rounding saturates by construction.

Column-major scales (cfg.col_major_sf): the first row of threads stores the block's scales at out_sf[k, b] of the
transposed view (packed UE8M0: byte 4 b + k % 4 of byte row k // 4), one store per scale as in the row-major
kernel, only a row stride apart instead of side by side: `groups` stores of 4 (or 1) bytes per thread block, next
to the tile's bt x block_k data bytes. Neighbouring token blocks' scales share the same sectors, merged in L2.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_block_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
import functools

from ._scale_rules import col_major_scales, cuda_cast_scale_and_inverse, cuda_inverse_of, scale_index
from .fp4 import cuda_e2m1_code

_WARP = 32


def _log2(n: int) -> int:
    return n.bit_length() - 1


def cuda_per_block_cast_kernel(cfg):
    """`cfg` is a PerBlockCastConfig (backend "cuda")."""
    import tilelang.language as T

    f32 = T.float32
    hidden, bk, bt, bc = cfg.hidden, cfg.block_k, cfg.block_tokens, cfg.block_channels
    in_dtype, sf_dtype, mode = cfg.in_dtype, cfg.sf_dtype, cfg.mode
    fp4, data_dtype = cfg.fp4, cfg.data_dtype
    writes_data, computes_sf = cfg.writes_data, cfg.computes_sf
    n_tiles, groups, padding, num_blocks = cfg.num_col_tiles, cfg.groups_per_tile, cfg.sf_padding, cfg.num_blocks
    threads, tpr, rp, rows = cfg.threads, cfg.threads_per_row, cfg.rows_per_pass, cfg.rows_per_thread
    vec = bk // tpr  # channels per thread and row (CUDA_VECTOR)
    load_vec = 16 // (2 if in_dtype == 'bfloat16' else 4)  # elements of one 16-byte load
    group_lanes = bc // vec  # neighbouring lanes of a row in one channel block
    num_warps = threads // _WARP
    scale_and_inverse = functools.partial(
        cuda_cast_scale_and_inverse,
        T, fmt=cfg.fmt, round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=cfg.e4m3_sf,
    )  # fmt: skip
    # Lane bits that differ between the threads of one channel block within a warp: the bits below
    # log2(group_lanes) (neighbouring segments of a row), and those from log2(tpr) up (the warp's rows).
    shuffle_bits = [1 << k for k in range(_log2(group_lanes))] + [1 << k for k in range(_log2(tpr), _log2(_WARP))]

    num_tokens = T.dynamic('num_tokens')
    sf_rows = T.ceildiv(num_tokens, bt)
    col_major, packed_sf = cfg.col_major_sf, cfg.packed_ue8m0

    sf_at = functools.partial(scale_index, col_major=cfg.col_major_sf, packed=cfg.packed_ue8m0)

    @T.macro
    def body(x, out, out_sf, sf):
        with T.Kernel(sf_rows * n_tiles, threads=threads) as bid:
            b = bid // n_tiles
            j = bid % n_tiles
            tid = T.get_thread_binding()
            seg = tid % tpr  # 16-channel segment of the tile's rows
            row0 = tid // tpr  # first of the thread's rows in the token block
            g = seg // group_lanes  # channel block within the tile
            col = j * bk + seg * vec
            xv = T.alloc_local((rows, vec), in_dtype)
            inverse = T.alloc_var(f32)

            for r in T.unroll(rows):
                t = b * bt + r * rp + row0
                if t < num_tokens:
                    for h in T.unroll(vec // load_vec):
                        for e in T.vectorized(load_vec):
                            xv[r, h * load_vec + e] = x[t, col + h * load_vec + e]
                else:
                    for e in T.unroll(vec):
                        xv[r, e] = T.cast(0, in_dtype)

            if computes_sf:
                red = T.alloc_shared((num_warps, groups), f32)
                amax = T.alloc_var(f32)
                amax = T.float32(0.0)
                for r in T.unroll(rows):
                    for e in T.unroll(vec):
                        amax = T.max(amax, T.abs(T.cast(xv[r, e], f32)))
                for bit in shuffle_bits:
                    amax = T.max(amax, T.shfl_xor(amax, bit))
                lane = tid % _WARP
                if lane < tpr and lane % group_lanes == 0:
                    red[tid // _WARP, g] = amax
                T.sync_threads()
                amax = red[0, g]
                for w in T.unroll(1, num_warps):
                    amax = T.max(amax, red[w, g])
                stored, inv = scale_and_inverse(amax)
                inverse = inv
                if tid < tpr and tid % group_lanes == 0:
                    out_sf[sf_at(b, j * groups + g)] = stored
                if padding > 0:  # noqa: SIM102 (a Python-level switch around a device-side condition)
                    if j == n_tiles - 1 and tid < padding:
                        out_sf[sf_at(b, num_blocks + tid)] = T.uint8(0)
            else:
                inverse = cuda_inverse_of(T, T.cast(sf[b, j * groups + g], f32))

            if writes_data and fp4:
                codes = T.alloc_local((vec,), T.uint32)
                packed = T.alloc_local((vec // 2,), T.int8)
                for r in T.unroll(rows):
                    t = b * bt + r * rp + row0
                    if t < num_tokens:
                        for e in T.unroll(vec):
                            codes[e] = cuda_e2m1_code(T, T.cast(xv[r, e], f32) * inverse)
                        for i in T.unroll(vec // 2):
                            packed[i] = T.cast(codes[2 * i] | (codes[2 * i + 1] << T.uint32(4)), T.int8)
                        for i in T.vectorized(vec // 2):  # the row's 8 bytes in one store
                            out[t, col // 2 + i] = packed[i]
            elif writes_data:
                for r in T.unroll(rows):
                    t = b * bt + r * rp + row0
                    if t < num_tokens:
                        for e in T.vectorized(vec):
                            # __nv_fp8_e4m3's conversion: nearest even, saturating to +-448, NaN kept.
                            out[t, col + e] = T.cast(T.cast(xv[r, e], f32) * inverse, T.float8_e4m3fn)

    out_sf_type = T.Tensor((sf_rows, cfg.sf_cols), sf_dtype)
    if col_major:  # the transposed column-major scales: rows of stride sf_stride >= ceil(T / bt)
        out_sf_type = col_major_scales(T, sf_rows, cfg.sf_cols, sf_dtype, packed=packed_sf)
    if mode == 'cast':

        @T.prim_func
        def per_block_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            out: T.Tensor((num_tokens, cfg.data_cols), data_dtype),
            out_sf: out_sf_type,
        ):
            body(x, out, out_sf, None)

    elif mode == 'sf_only':

        @T.prim_func
        def per_block_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            out_sf: out_sf_type,
        ):
            body(x, None, out_sf, None)

    else:

        @T.prim_func
        def per_block_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            sf: T.Tensor((sf_rows, cfg.sf_cols), sf_dtype),
            out: T.Tensor((num_tokens, cfg.data_cols), data_dtype),
        ):
            body(x, out, None, sf)

    return per_block_cast_kernel
