"""CUDA kernel of norm_forward and norm_forward_and_per_token_cast (math, config and the prim_func signature:
norm_forward_kernel.py).

One thread block per row. Thread `tid` owns the row's 16-byte chunks tid, tid + threads, ... (coalesced loads and
stores, every load of the row issued before any use), kept in registers from the loads to the stores: the sum of
squares is reduced by warp shuffles and one shared-memory step, then each thread scales its own elements. The
cast's block of `block_size` channels is block_size / chunk consecutive chunks, so consecutive lanes of one warp:
its |y| maximum is a butterfly of xor shuffles over those lanes, and the scale rule is the quant domain's
(_scale_rules.cuda_cast_scale_and_inverse), the data conversion per_token_cast's. The config's schedule fields
(min_blocks, late_weight, narrow_row: NormForwardConfig) move the weight's loads, narrow what is held and cap the
registers; none changes the arithmetic.

A short last block (H = 64 * odd, 128-channel blocks) takes no code of its own: the row's H / chunk chunks are an
odd multiple of half a block's lanes, and the threads a multiple of a block's lanes (whole warps), so the block's
missing half is chunks past the row that some threads own, zeros under the row's `guard` (then always on), which
join the block's butterfly; its first lane, inside the row, stores its scale (index H // 128).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by norm_forward_kernel.py, never the other way round (no import circle).
import functools

from cann_ops_tilelang.quant._scale_rules import cuda_cast_scale_and_inverse, scale_index

from ._norm_common import CUDA_CHUNK_BYTES, DTYPE_BYTES, cuda_assume_strides, row_strides


def cuda_norm_forward_kernel(cfg, prim_func):
    """`cfg` is a NormForwardConfig (backend "cuda"); `prim_func` the signature builder forward_prim_func."""
    import tilelang.language as T

    f32 = T.float32
    hidden, dtype, nt, nc = cfg.hidden, cfg.dtype, cfg.threads, cfg.chunks
    ve = CUDA_CHUNK_BYTES // DTYPE_BYTES[dtype]
    guard = (hidden // ve) % nt != 0  # the last chunk of some threads is past the row
    nw = nt // 32
    with_weight, with_residual, with_rstd, cast = cfg.with_weight, cfg.with_residual, cfg.with_rstd, cfg.cast
    writes_y, separate_bf16 = cfg.writes_y, cfg.separate_bf16
    early_weight = with_weight and not cfg.late_weight
    narrow = cfg.narrow_row
    bs = cfg.block_size
    lanes_per_block = bs // ve if cast else 1
    padding = cfg.sf_cols - cfg.num_blocks
    # xor distances of the butterfly over a block's lanes: lanes_per_block / 2, ..., 1
    shuffle_steps = tuple(1 << k for k in reversed(range(lanes_per_block.bit_length() - 1)))
    inv_hidden = 1.0 / hidden

    sf_at = functools.partial(scale_index, col_major=cfg.col_major_sf, packed=cfg.packed_ue8m0)
    strides = row_strides(T, cfg, cfg.row_tensors)  # {} for contiguous rows

    @T.macro
    def body(x, weight, residual, residual_out, out, rstd, data, sf, out_bf16, eps, out_scale, num_tokens):
        with T.Kernel(num_tokens, threads=nt) as t:
            if cfg.min_blocks:
                T.annotate_min_blocks_per_sm(cfg.min_blocks)
            if cfg.strided_rows:  # each row stride a whole number of 16-byte chunks, so the chunks stay vectors
                cuda_assume_strides(T, strides, ve)
            tid = T.get_thread_binding()
            x_l = T.alloc_local((nc * ve,), dtype)  # x, then r rounded to x's dtype, then y (narrow_row)
            res_l = T.alloc_local((nc * ve,), dtype)
            w_l = T.alloc_local((nc * ve,), dtype)
            if not narrow:
                v_l = T.alloc_local((nc * ve,), f32)  # r, then y rounded to x's dtype
            b_l = T.alloc_local((nc * ve,), T.bfloat16)  # y as bf16 (fp32 x with the bf16 output)
            acc = T.alloc_local((1,), f32)
            rs = T.alloc_local((1,), f32)
            amax = T.alloc_local((1,), f32)
            red = T.alloc_shared((nw,), f32)

            # Every load of the row before any use.
            for c in T.unroll(nc):
                col = (tid + c * nt) * ve
                if not guard or col < hidden:
                    for j in T.vectorized(ve):
                        x_l[c * ve + j] = x[t, col + j]
                    if with_residual:
                        for j in T.vectorized(ve):
                            res_l[c * ve + j] = residual[t, col + j]
                    if early_weight:
                        for j in T.vectorized(ve):
                            w_l[c * ve + j] = weight[col + j]
            acc[0] = 0.0
            for c in T.unroll(nc):
                col = (tid + c * nt) * ve
                if not guard or col < hidden:
                    if with_residual:
                        for j in T.unroll(ve):
                            x_l[c * ve + j] = T.cast(
                                T.cast(x_l[c * ve + j], f32) + T.cast(res_l[c * ve + j], f32), dtype
                            )
                        for j in T.vectorized(ve):
                            residual_out[t, col + j] = x_l[c * ve + j]
                    for j in T.unroll(ve):
                        if narrow:
                            r = T.cast(x_l[c * ve + j], f32)
                            acc[0] += r * r
                        else:
                            v_l[c * ve + j] = T.cast(x_l[c * ve + j], f32)
                            acc[0] += v_l[c * ve + j] * v_l[c * ve + j]
                else:
                    for j in T.unroll(ve):
                        if narrow:
                            x_l[c * ve + j] = T.cast(0.0, dtype)
                        else:
                            v_l[c * ve + j] = 0.0
            acc[0] = T.warp_reduce_sum(acc[0])
            if tid % 32 == 0:
                red[tid // 32] = acc[0]
            T.sync_threads()
            acc[0] = red[0]
            for q in T.unroll(1, nw):
                acc[0] += red[q]
            rs[0] = T.rsqrt(acc[0] * T.float32(inv_hidden) + eps)
            if with_rstd and tid == 0:
                rstd[t] = rs[0]

            for c in T.unroll(nc):
                col = (tid + c * nt) * ve
                if not guard or col < hidden:
                    if cfg.late_weight:
                        for j in T.vectorized(ve):
                            w_l[c * ve + j] = weight[col + j]
                    for j in T.unroll(ve):
                        scale = T.cast(w_l[c * ve + j], f32) * out_scale if with_weight else out_scale
                        y = (T.cast(x_l[c * ve + j], f32) if narrow else v_l[c * ve + j]) * rs[0] * scale
                        x_l[c * ve + j] = T.cast(y, dtype)  # y rounded: what `out` holds and the cast reads
                        if not narrow:
                            v_l[c * ve + j] = T.cast(x_l[c * ve + j], f32)
                        if separate_bf16:
                            b_l[c * ve + j] = T.cast(y, T.bfloat16)
                    if writes_y:
                        for j in T.vectorized(ve):
                            out[t, col + j] = x_l[c * ve + j]
                    if separate_bf16:
                        for j in T.vectorized(ve):
                            out_bf16[t, col + j] = b_l[c * ve + j]

            if cast:
                for c in T.unroll(nc):
                    col = (tid + c * nt) * ve
                    amax[0] = 0.0
                    for j in T.unroll(ve):
                        amax[0] = T.max(amax[0], T.abs(T.cast(x_l[c * ve + j], f32) if narrow else v_l[c * ve + j]))
                    # Lanes past the row (amax 0) join the shuffles, which need the whole warp.
                    for step in shuffle_steps:
                        amax[0] = T.max(amax[0], T.shfl_xor(amax[0], step))
                    stored, inverse = cuda_cast_scale_and_inverse(
                        T, amax[0], fmt='e4m3', round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=False
                    )
                    if not guard or col < hidden:
                        if tid % lanes_per_block == 0:
                            sf[sf_at(t, col // bs)] = stored
                        for j in T.vectorized(ve):
                            # __nv_fp8_e4m3's conversion: nearest even, saturating to +-448 (per_token_cast's).
                            data[t, col + j] = T.cast(
                                (T.cast(x_l[c * ve + j], f32) if narrow else v_l[c * ve + j]) * inverse,
                                T.float8_e4m3fn,
                            )
                if padding > 0 and tid < padding:
                    sf[sf_at(t, cfg.num_blocks + tid)] = T.uint8(0)

    return prim_func(T, cfg, body, strides)
