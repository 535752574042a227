"""CUDA kernel of cast_back (math, layouts and config: cast_back_kernel.py).

A streaming kernel without shared memory. A thread block covers block_m rows x block_k columns; its threads
form threads // threads_k rows of threads_k threads, and each thread owns 16 consecutive columns
(VEC_ELEMS) of rows_per_thread consecutive rows:
  - it first issues all its loads: one 16-byte load of fp8 per row, then the scales: one fp32 / UE8M0 load
    per row (per-token scales) or per thread (token blocks: rows_per_thread divides block_tokens, so its rows
    share a token block), and for channel blocks the 16 channels' scales once for all its rows (four
    16-byte loads of fp32, or of UE8M0 words whose byte j is token block 4r + j);
  - then per row: fp8 -> fp32 (exact, cvt.rn.f16x2.e4m3x2 pairs), one fp32 multiply by the scale, the
    cast to the output (cvt.rn.bf16x2.f32: nearest even; or fp32 as it is) and 16-byte stores.
Neighbouring threads own neighbouring 16-byte pieces of a row, so each warp instruction reads 512 contiguous
bytes (block_k is at least 512 wherever hidden has such a divisor). With rows_per_thread = 4 a thread keeps
64 bytes of loads in flight; at the ~55 registers this takes, ~1100 threads are resident per H200 SM, about
70 KB of reads in flight per SM, twice what Little's law asks of 4.8 TB/s over 132 SMs at ~1 us latency.
E4M3 scales are widened by a conversion where they are loaded. FP4 data (per-token scales, _cuda_fp4_kernel): one
row per thread block, 16 columns per thread from one 8-byte load, each nibble decoded on its bits (unrolled, so
the nibble shifts are constants), one fp32 multiply, 16-byte stores.
Column-major scales (cfg.col_major_sf, row blocks): the same loads, each thread's scale from x_sf.T[k, r] of its
scale row r = t // block_tokens (packed UE8M0: byte k % 4 of word k // 4 of row r) of a row stride that is a launch
argument; the scales of neighbouring thread blocks (tokens, token blocks) lie side by side, so their loads share
sectors in L2.
A short last block (H = 64 * odd, 128-channel blocks; e4m3 or FP4 data) needs nothing of its own: the tiles cover
H in whole registers, and a thread's 16 columns, in one block either way, read the scale at col // 128, for the last 64
columns the short block's.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by cast_back_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
import functools

from ._scale_rules import UE8M0_PACK, col_major_scales, scale_index
from .fp4 import cuda_e2m1_value

VEC_ELEMS = 16  # columns per thread: one 16-byte fp8 load (FP4: 8 bytes)
_UE8M0_SHIFT = 23


def cuda_scales_type(T, cfg, num_tokens, stride_name='sf_stride'):
    """The prim_func parameter type of the scales x_sf of cast_back's `cfg` for the dynamic `num_tokens` (its
    layouts: cast_back_kernel.py); column-major ones of a row stride named `stride_name`."""
    num_token_blocks = num_tokens if cfg.block_tokens == 1 else T.ceildiv(num_tokens, cfg.block_tokens)
    sf_shape = (
        (T.ceildiv(num_token_blocks, UE8M0_PACK), cfg.sf_cols)
        if cfg.packed_ue8m0 and cfg.channel_blocks
        else (num_token_blocks, cfg.sf_cols)
    )
    if cfg.col_major_sf:  # the transposed column-major scales: rows of stride sf_stride >= R (scale rows)
        return col_major_scales(
            T, num_token_blocks, cfg.sf_cols, cfg.sf_dtype, packed=cfg.packed_ue8m0, stride_name=stride_name
        )
    return T.Tensor(sf_shape, cfg.sf_dtype)


def cuda_ue8m0_to_f32(T, byte):
    """A UE8M0 byte as its fp32 scale: the fp32 whose bits are byte << 23."""
    return T.reinterpret(T.shift_left(T.cast(byte, T.uint32), T.uint32(_UE8M0_SHIFT)), T.float32)


def cuda_scale_of(T, cfg, value):
    """An x_sf element of cast_back's `cfg` (row blocks) as its fp32 scale (exact: UE8M0 and E4M3 widen exactly)."""
    if cfg.packed_ue8m0:
        return cuda_ue8m0_to_f32(T, value)
    return T.cast(value, T.float32) if cfg.e4m3_sf else value


def cuda_cast_back_kernel(cfg):
    """`cfg` is a CastBackConfig (backend "cuda")."""
    import tilelang.language as T

    f32 = T.float32
    hidden, bm, bk = cfg.hidden, cfg.block_m, cfg.block_k
    bt, bc = cfg.block_tokens, cfg.block_channels
    out_dtype = cfg.out_dtype
    packed, channel = cfg.packed_ue8m0, cfg.channel_blocks
    tk, rpt, threads = cfg.threads_k, cfg.rows_per_thread, cfg.threads
    n_tiles = cfg.num_col_tiles
    per_token = bt == 1
    store_vec = 16 // (2 if out_dtype == 'bfloat16' else 4)  # output elements per 16-byte store

    num_tokens = T.dynamic('num_tokens')
    sf_type = cuda_scales_type(T, cfg, num_tokens)

    sf_at = functools.partial(scale_index, col_major=cfg.col_major_sf, packed=cfg.packed_ue8m0)

    def scale_slot(i):
        # Per token each row has its scale; in a token block one serves all the thread's rows.
        return i if per_token else 0

    scale_of = functools.partial(cuda_scale_of, T, cfg)

    def e2m1_to_f32(byte, high):
        """The fp32 value (exact) of the low (high = 0) or high nibble of an FP4 byte."""
        code = T.shift_right(T.cast(T.cast(byte, T.uint8), T.uint32), T.uint32(4 * high)) & T.uint32(0xF)
        return cuda_e2m1_value(T, code)

    if cfg.fp4:
        return _cuda_fp4_kernel(T, cfg, num_tokens, sf_type, sf_at, scale_of, e2m1_to_f32)

    @T.prim_func
    def cast_back_kernel(
        x: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        x_sf: sf_type,
        out: T.Tensor((num_tokens, hidden), out_dtype),
    ):
        # Row tiles on grid x (up to 2**31 - 1 blocks; y stops at 65535), column tiles on y.
        with T.Kernel(T.ceildiv(num_tokens, bm), n_tiles, threads=threads) as (bx, by):
            tid = T.get_thread_binding()
            col = by * bk + tid % tk * VEC_ELEMS
            row0 = bx * bm + tid // tk * rpt
            xr = T.alloc_local((rpt, VEC_ELEMS), T.float8_e4m3fn)
            for i in T.unroll(rpt):
                if row0 + i < num_tokens:
                    for v in T.vectorized(VEC_ELEMS):
                        xr[i, v] = x[row0 + i, col + v]
            if channel:
                # The 16 channels' scales of the thread's token block (all its rows lie in it).
                sc = T.alloc_local((VEC_ELEMS,), f32)
                if row0 < num_tokens:
                    block = row0 // bt
                    if packed:
                        words = T.alloc_local((UE8M0_PACK * VEC_ELEMS,), T.uint8)
                        for v in T.vectorized(UE8M0_PACK * VEC_ELEMS):
                            words[v] = x_sf[block // UE8M0_PACK, col * UE8M0_PACK + v]
                        part = block % UE8M0_PACK
                        for v in T.unroll(VEC_ELEMS):
                            # Byte `part` of channel v's word, by selects on static indices (registers, not a
                            # dynamically indexed local array).
                            w = UE8M0_PACK * v
                            byte = T.if_then_else(
                                part == 0,
                                words[w],
                                T.if_then_else(
                                    part == 1, words[w + 1], T.if_then_else(part == 2, words[w + 2], words[w + 3])
                                ),
                            )
                            sc[v] = cuda_ue8m0_to_f32(T, byte)
                    else:
                        for v in T.vectorized(VEC_ELEMS):
                            sc[v] = x_sf[block, col + v]
            else:
                # One scale per row (per token) or one for all the thread's rows (token blocks).
                sc = T.alloc_local((rpt if per_token else 1,), f32)
                for i in T.unroll(rpt if per_token else 1):
                    if row0 + i < num_tokens:
                        sc[i] = scale_of(x_sf[sf_at((row0 + i) // bt, col // bc)])
            for i in T.unroll(rpt):
                if row0 + i < num_tokens:
                    for h in T.unroll(VEC_ELEMS // store_vec):
                        for v in T.vectorized(store_vec):
                            if channel:
                                out[row0 + i, col + h * store_vec + v] = T.cast(
                                    T.cast(xr[i, h * store_vec + v], f32) * sc[h * store_vec + v], out_dtype
                                )
                            else:
                                out[row0 + i, col + h * store_vec + v] = T.cast(
                                    T.cast(xr[i, h * store_vec + v], f32) * sc[scale_slot(i)], out_dtype
                                )

    return cast_back_kernel


def _cuda_fp4_kernel(T, cfg, num_tokens, sf_type, sf_at, scale_of, e2m1_to_f32):
    """FP4 data, per-token scales (cfg.block_tokens 1, block_m 1): one row per thread block, each thread 16
    columns from one 8-byte load; their scale (blocks of at least 16 channels hold a thread's columns) from one
    load."""
    out_dtype, bc, bk, tk = cfg.out_dtype, cfg.block_channels, cfg.block_k, cfg.threads_k
    store_vec = 16 // (2 if out_dtype == 'bfloat16' else 4)
    half = VEC_ELEMS // 2

    @T.prim_func
    def cast_back_kernel(
        x: T.Tensor((num_tokens, cfg.data_cols), T.int8),
        x_sf: sf_type,
        out: T.Tensor((num_tokens, cfg.hidden), out_dtype),
    ):
        with T.Kernel(num_tokens, cfg.num_col_tiles, threads=cfg.threads) as (bx, by):
            tid = T.get_thread_binding()
            col = by * bk + tid % tk * VEC_ELEMS
            xr = T.alloc_local((half,), T.int8)
            for v in T.vectorized(half):
                xr[v] = x[bx, col // 2 + v]
            scale = scale_of(x_sf[sf_at(bx, col // bc)])
            # Unrolled, so each nibble's shift is a constant; then the 16-byte stores.
            values = T.alloc_local((VEC_ELEMS,), out_dtype)
            for v in T.unroll(VEC_ELEMS):
                values[v] = T.cast(e2m1_to_f32(xr[v // 2], v % 2) * scale, out_dtype)
            for h in T.unroll(VEC_ELEMS // store_vec):
                for v in T.vectorized(store_vec):
                    out[bx, col + h * store_vec + v] = values[h * store_vec + v]

    return cast_back_kernel
