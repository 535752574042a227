"""CUDA kernel of per_channel_cast (math and config: per_channel_cast_kernel.py).

A streaming kernel: one thread block of 256 threads per (token block, column tile), x read from global memory
once, into registers; only the column maxima and the inverses go through shared memory.

- Reads: `lanes_per_row` threads cover one row of the tile, each with one 16-byte load (8 bf16, 4 fp32 or 16
  fp8 channels), so a warp reads up to 512 contiguous bytes of a row (coalesced along H); `row_groups` rows are
  read at once and each thread holds `rows_per_thread` rows: with 128-token blocks 16 loads of 16 bytes per
  thread, unrolled and issued before their first use, 64 KiB of x in flight per block. The grid is one
  dimension with the column tiles of a token block adjacent, so the blocks resident at once read whole rows.
- Registers: the raw input stays packed (64 registers for 16 rows of 8 bf16); the maxima are taken on the
  sign-cleared bits (non-negative IEEE values order as their bit patterns) or, for a pre-quantised x, as
  fp32(|x|) * |scale|, so the compiler keeps no fp32 copy of x for the cast. ptxas (CUDA 13.0, sm_90a), no
  spills: with 128-token blocks and bf16 x 146 to 156 registers (one block, 64 KiB of loads, per SM), but 115
  at H 7168 with UE8M0 scales (two blocks); fp32 x 88, a pre-quantised x 96; with 32-token blocks 37 to 79.
- Column maxima: per thread over its rows, then over the row groups through shared memory ((row_groups + 1) x
  block_k fp32, the last row the inverses; 16-byte stores); one thread per channel applies the shared scale
  rule, stores the scale (coalesced fp32, or the UE8M0 byte of its token block in the column-packed word) and
  puts the inverse in shared memory.
- Writes: each thread scales and narrows its registers and stores its channels of each row (8, 4 or 16 bytes
  per thread and row, whole 32-byte sectors per warp).

Rows past T (the last, partial token block) are neither read (they count as 0 in the maxima, which are >= 0)
nor written.

Schedules a config can ask for instead (the tiling experiments of 128-token blocks; the chooser takes none of them,
and each writes the same bytes: the same maxima, scale rule and per-element product): `x_staging` 'shared' (each
row, once read and reduced, goes to a (block_tokens, block_k) tile in shared memory, from which the cast reads it)
or 'reread' (the cast reads x again from global memory, largely from L2), so that no thread holds its rows across
the scale step; `vector_bytes` 8 (half the channels per thread and row); more `threads` (fewer rows per
thread); `min_blocks` (__launch_bounds__' minimum blocks per SM, which caps the registers ptxas may take).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_channel_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
import functools

from ._scale_rules import UE8M0_PACK, cuda_scale_and_inverse


def cuda_per_channel_cast_kernel(cfg):
    """`cfg` is a PerChannelCastConfig (backend "cuda")."""
    import tilelang.language as T

    f32 = T.float32
    hidden, bk, bt, threads = cfg.hidden, cfg.block_k, cfg.block_tokens, cfg.threads
    vec, lanes, groups, rpt = cfg.vector, cfg.lanes_per_row, cfg.row_groups, cfg.rows_per_thread
    in_dtype, sf_dtype = cfg.in_dtype, cfg.sf_dtype
    n_tiles, pack, packed = cfg.num_col_tiles, cfg.sf_pack, cfg.packed_ue8m0
    prequantised = cfg.in_block_channels is not None
    scale_iters = -(-bk // threads)  # channels per thread in the scale step
    held, staged = cfg.x_staging == 'registers', cfg.x_staging == 'shared'
    scale_and_inverse = functools.partial(cuda_scale_and_inverse, T, round_sf=cfg.round_sf, packed_ue8m0=packed)

    num_tokens = T.dynamic('num_tokens')
    num_blocks = T.ceildiv(num_tokens, bt)
    sf_rows = T.ceildiv(num_blocks, pack)
    if prequantised:
        in_bc, in_sf_cols, in_sf_dtype = cfg.in_block_channels, cfg.in_sf_cols, cfg.in_sf_dtype
    else:  # the kernel takes no x_sf
        in_bc = in_sf_cols = in_sf_dtype = None

    def decode_scale(x_sf, row, channel):
        """fp32 scale of x[row, channel] of a pre-quantised x (UE8M0: the byte as an fp32 exponent; E4M3: the byte
        widened, exactly)."""
        if cfg.in_packed_ue8m0:
            return T.reinterpret(T.shift_left(T.cast(x_sf[row, channel // in_bc], T.uint32), T.uint32(23)), f32)
        if cfg.in_e4m3_sf:
            return T.cast(x_sf[row, channel // in_bc], f32)
        return x_sf[row, channel // in_bc]

    # |x| for the maxima, computed so that the compiler need not keep the fp32 values of x for the cast: on the
    # sign-cleared bits, or for a pre-quantised x as fp32(|x|) * |scale| (= |fp32(x) * scale|: the rounding is
    # sign-symmetric). NaN is unspecified either way.
    magnitude_dtype = {'bfloat16': T.uint16, 'float32': T.uint32, 'float8_e4m3fn': T.uint8}[in_dtype]
    sign_cleared = {'bfloat16': 0x7FFF, 'float32': 0x7FFFFFFF, 'float8_e4m3fn': 0x7F}[in_dtype]
    amax_dtype = f32 if prequantised else T.uint32

    def magnitude(value, in_scale):
        bits = T.reinterpret(value, magnitude_dtype) & T.cast(sign_cleared, magnitude_dtype)
        if prequantised:
            return T.cast(T.reinterpret(bits, in_dtype), f32) * T.abs(in_scale)
        return T.cast(bits, T.uint32)

    def amax_f32(amax, v):
        """The thread's maximum of channel v as fp32."""
        if in_dtype == 'bfloat16':
            return T.reinterpret(T.shift_left(amax[v], T.uint32(16)), f32)
        if in_dtype == 'float32':
            return T.reinterpret(amax[v], f32)
        return amax[v]

    def in_hand(r):
        """The registers of the thread's row r: its own held, one reused staged or reread."""
        return r if held else 0

    def decoded(value, in_scale):
        """An element of x as fp32 (a pre-quantised x times its scale)."""
        if prequantised:
            return T.cast(value, f32) * in_scale
        return T.cast(value, f32)

    @T.macro
    def body(x, x_sf, out, out_sf):
        # One grid dimension (up to 2**31 - 1 blocks), the column tiles of a token block adjacent: the blocks
        # resident at once read whole rows of x, contiguous in memory.
        with T.Kernel(num_blocks * n_tiles, threads=threads) as bid:
            if cfg.min_blocks:
                T.annotate_min_blocks_per_sm(cfg.min_blocks)
            b = bid // n_tiles  # token block
            j = bid % n_tiles  # column tile
            xr = T.alloc_local((rpt if held else 1, vec), in_dtype)  # the thread's rows, or the row in hand
            in_scale = T.alloc_local((rpt,), f32)
            amax = T.alloc_local((vec,), amax_dtype)
            partial = T.alloc_local((vec,), f32)
            inverse = T.alloc_local((vec,), f32)
            # Rows 0..groups-1: the row groups' maxima; row `groups`: the inverses (one buffer, so that no
            # allocation planner can place the inverses over maxima that other threads still read).
            shared = T.alloc_shared((groups + 1, bk), f32)
            if staged:
                x_tile = T.alloc_shared((bt, bk), in_dtype)
            tid = T.get_thread_binding(0)
            g = tid // lanes  # row group
            lc = tid % lanes * vec  # first channel of the thread, in the tile
            c0 = j * bk + lc  # ... in the row
            t0 = b * bt

            # Read x: rows t0 + g, t0 + g + groups, ..., one vector_bytes load per row; rows past T read as 0. Staged
            # or reread, each row is reduced into the thread's maxima as it arrives.
            if not held:
                for v in T.vectorized(vec):
                    amax[v] = T.cast(0, amax_dtype)
            for r in T.unroll(rpt):
                row = t0 + r * groups + g
                if row < num_tokens:
                    for v in T.vectorized(vec):
                        xr[in_hand(r), v] = x[row, c0 + v]
                    if prequantised:
                        in_scale[r] = decode_scale(x_sf, row, c0)
                else:
                    for v in T.vectorized(vec):
                        xr[in_hand(r), v] = T.cast(0, in_dtype)
                    if prequantised:
                        in_scale[r] = T.float32(0)
                if not held:
                    if staged:
                        for v in T.vectorized(vec):
                            x_tile[r * groups + g, lc + v] = xr[0, v]
                    for v in T.unroll(vec):
                        amax[v] = T.max(amax[v], magnitude(xr[0, v], in_scale[r]))
            # Column maxima: the thread's rows, then the row groups through shared memory.
            if held:
                for v in T.vectorized(vec):
                    amax[v] = T.cast(0, amax_dtype)
                for r in T.unroll(rpt):
                    for v in T.unroll(vec):
                        amax[v] = T.max(amax[v], magnitude(xr[r, v], in_scale[r]))
            for v in T.unroll(vec):
                partial[v] = amax_f32(amax, v)
            for v in T.vectorized(vec):  # 16-byte stores
                shared[g, lc + v] = partial[v]
            T.sync_threads()
            # One thread per channel: the shared scale rule, the stored scale to GM, the inverse to shared memory.
            for s in T.unroll(scale_iters):
                ch = s * threads + tid
                if ch < bk:
                    a = T.alloc_var(f32)
                    a = shared[0, ch]
                    for k in T.unroll(1, groups):
                        a = T.max(a, shared[k, ch])
                    stored, inv = scale_and_inverse(a)
                    shared[groups, ch] = inv
                    if packed:
                        # Byte b % 4 of the channel's word in scale row b // 4; the last block zeroes the rest.
                        base = (j * bk + ch) * UE8M0_PACK
                        out_sf[b // UE8M0_PACK, base + b % UE8M0_PACK] = stored
                        if b == num_blocks - 1:
                            for k in T.unroll(1, UE8M0_PACK):
                                if b % UE8M0_PACK + k < UE8M0_PACK:
                                    out_sf[b // UE8M0_PACK, base + b % UE8M0_PACK + k] = T.uint8(0)
                    else:
                        out_sf[b, j * bk + ch] = stored
            T.sync_threads()
            for v in T.vectorized(vec):
                inverse[v] = shared[groups, lc + v]
            # Scale and narrow each row (__nv_fp8_e4m3's conversion: nearest even, saturating to +-448): from the
            # registers, or read again from shared memory or from global memory (largely L2).
            for r in T.unroll(rpt):
                row = t0 + r * groups + g
                if row < num_tokens:
                    if not held:
                        for v in T.vectorized(vec):
                            xr[0, v] = x_tile[r * groups + g, lc + v] if staged else x[row, c0 + v]
                    for v in T.vectorized(vec):
                        out[row, c0 + v] = T.cast(decoded(xr[in_hand(r), v], in_scale[r]) * inverse[v], T.float8_e4m3fn)

    if prequantised:

        @T.prim_func
        def per_channel_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            x_sf: T.Tensor((num_tokens, in_sf_cols), in_sf_dtype),
            out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
            out_sf: T.Tensor((sf_rows, cfg.sf_cols), sf_dtype),
        ):
            body(x, x_sf, out, out_sf)

        return per_channel_cast_kernel

    @T.prim_func
    def per_channel_cast_kernel(
        x: T.Tensor((num_tokens, hidden), in_dtype),
        out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        out_sf: T.Tensor((sf_rows, cfg.sf_cols), sf_dtype),
    ):
        body(x, None, out, out_sf)

    return per_channel_cast_kernel
