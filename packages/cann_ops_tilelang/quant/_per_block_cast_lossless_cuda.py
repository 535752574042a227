"""CUDA kernel of per_block_cast_lossless (math and config: per_block_cast_lossless_kernel.py).

One thread block per (output token block, column tile): bto rows by block_k channels, about 16 Ki elements
(8 KiB of FP4 in, 16 KiB of e4m3 out). Three phases, two barriers:

1. the threads read the tile's input scales (a few hundred at most) and keep their biased exponents in shared
   memory (fp32 bits 23..30, or the UE8M0 byte); rows past T are not read;
2. one thread per output block takes the maximum M over its input exponents, E = max(M, 6) - 6, stores the
   output scale (fp32 bits E << 23 or the UE8M0 byte; with cfg.col_major_sf at its place in the transposed
   column-major view, scale_index) and keeps E in shared memory; the last column tile's threads also store a
   packed row's zero padding bytes;
3. each thread converts CUDA_VECTOR = 32 consecutive elements of a row per step (one 16-byte FP4 load, two
   16-byte e4m3 stores), consecutive threads on consecutive pieces of a row: the exponent offset
   d = max(e - E, -16) of each 16-element half, each nibble's fp32 built on the bits (0, 2 ** (d - 1), or
   (m << 22) + ((126 + d) << 23), the code's sign), narrowed by __nv_fp8_e4m3's conversion (nearest even,
   exact within the bound). All of a thread's loads are issued before the first conversion.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import functools

from ._scale_rules import col_major_scales, scale_index

CUDA_VECTOR = 32  # elements per thread and step: 16 bytes of FP4
_HALF = 16  # elements sharing one exponent offset (the smallest input block)


def cuda_per_block_cast_lossless_kernel(cfg):
    """`cfg` is a PerBlockCastLosslessConfig (backend "cuda")."""
    import tilelang.language as T

    i32, u32 = T.int32, T.uint32
    hidden, bk, threads, steps = cfg.hidden, cfg.block_k, cfg.threads, cfg.cuda_steps
    bti, bci, bto, bco = cfg.in_block_tokens, cfg.in_block_channels, cfg.out_block_tokens, cfg.out_block_channels
    in_packed, out_packed = cfg.in_packed, cfg.out_packed
    gin, gout, gpo, sm = cfg.in_groups, cfg.out_groups, cfg.in_per_out, cfg.sf_rows_per_task
    n_tiles, padding, num_blocks = cfg.num_col_tiles, cfg.out_sf_padding, cfg.out_blocks
    pieces = bk // CUDA_VECTOR  # pieces of one row
    per_token = bti == 1
    headroom, min_offset = cfg.headroom, cfg.min_offset

    num_tokens = T.dynamic('num_tokens')
    in_sf_rows = num_tokens if per_token else T.ceildiv(num_tokens, bti)
    out_sf_rows = T.ceildiv(num_tokens, bto)
    out_sf_type = T.Tensor((out_sf_rows, cfg.out_sf_cols), cfg.out_sf_dtype)
    if cfg.col_major_sf:  # the transposed column-major scales: rows of stride sf_stride >= ceil(T / bto)
        out_sf_type = col_major_scales(T, out_sf_rows, cfg.out_sf_cols, cfg.out_sf_dtype, packed=out_packed)
    sf_at = functools.partial(scale_index, col_major=cfg.col_major_sf, packed=out_packed)

    def element(code, base):
        """e4m3 of e2m1 `code` (uint32 0..15) times 2**d, base = (126 + d) << 23 (uint32): exact on the bits."""
        magnitude = code & u32(7)
        bits = T.Select(magnitude == u32(0), u32(0), T.Select(magnitude == u32(1), base, (magnitude << u32(22)) + base))
        bits = bits | ((code & u32(8)) << u32(28))
        return T.cast(T.reinterpret(bits, T.float32), T.float8_e4m3fn)

    @T.prim_func
    def per_block_cast_lossless_kernel(
        x: T.Tensor((num_tokens, hidden // 2), T.uint8),
        x_sf: T.Tensor((in_sf_rows, cfg.in_sf_cols), cfg.in_sf_dtype),
        out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        out_sf: out_sf_type,
    ):
        with T.Kernel(out_sf_rows * n_tiles, threads=threads) as bid:
            b = bid // n_tiles
            j = bid % n_tiles
            tid = T.get_thread_binding()
            t0 = b * bto
            s0 = t0 if per_token else t0 // bti
            sf_valid = T.min(bto, num_tokens - t0) if per_token else T.ceildiv(T.min(bto, num_tokens - t0), bti)
            exps = T.alloc_shared((sm, gin), i32)
            out_exps = T.alloc_shared((gout,), i32)
            xv = T.alloc_local((steps, CUDA_VECTOR // 2), T.uint8)
            ov = T.alloc_local((_HALF,), T.float8_e4m3fn)

            # The FP4 loads first: in flight while the scales are reduced.
            for s in T.unroll(steps):
                p = s * threads + tid
                t = t0 + p // pieces
                col = j * (bk // 2) + p % pieces * (CUDA_VECTOR // 2)
                if t < num_tokens:
                    for e in T.vectorized(CUDA_VECTOR // 2):
                        xv[s, e] = x[t, col + e]

            for k in T.serial(T.ceildiv(sm * gin, threads)):
                idx = k * threads + tid
                if idx < sm * gin:
                    r = idx // gin
                    g = idx % gin
                    if r < sf_valid:
                        if in_packed:
                            exps[r, g] = T.cast(x_sf[s0 + r, j * gin + g], i32)
                        else:
                            exps[r, g] = T.cast(
                                (T.reinterpret(x_sf[s0 + r, j * gin + g], u32) >> u32(23)) & u32(0xFF), i32
                            )
            T.sync_threads()

            for k in T.serial(T.ceildiv(gout, threads)):
                o = k * threads + tid
                if o < gout:
                    top = T.alloc_var(i32)
                    top = 0
                    for r in T.serial(sf_valid):
                        for i in T.unroll(gpo):
                            top = T.max(top, exps[r, o * gpo + i])
                    out_exp = T.max(top, headroom) - headroom
                    out_exps[o] = out_exp
                    if out_packed:
                        out_sf[sf_at(b, j * gout + o)] = T.cast(out_exp, T.uint8)
                    else:
                        out_sf[sf_at(b, j * gout + o)] = T.reinterpret(T.cast(out_exp, u32) << u32(23), T.float32)
            if padding > 0:  # noqa: SIM102 (a Python-level switch around a device-side condition)
                if j == n_tiles - 1 and tid < padding:
                    out_sf[sf_at(b, num_blocks + tid)] = T.uint8(0)
            T.sync_threads()

            for s in T.unroll(steps):
                p = s * threads + tid
                row = p // pieces
                t = t0 + row
                c = p % pieces * CUDA_VECTOR  # first channel of the piece within the tile
                if t < num_tokens:
                    g_row = row if per_token else row // bti
                    for h in T.unroll(CUDA_VECTOR // _HALF):
                        ch = c + h * _HALF
                        d = T.max(exps[g_row, ch // bci] - out_exps[ch // bco], min_offset)
                        base = T.cast(d + 126, u32) << u32(23)
                        for e in T.unroll(_HALF):
                            byte = T.cast(xv[s, h * (_HALF // 2) + e // 2], u32)
                            ov[e] = element((byte >> u32(e % 2 * 4)) & u32(0xF), base)
                        for e in T.vectorized(_HALF):
                            out[t, j * bk + ch + e] = ov[e]

    return per_block_cast_lossless_kernel
