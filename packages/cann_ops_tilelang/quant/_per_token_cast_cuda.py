"""CUDA kernel of per_token_cast (math and config: per_token_cast_kernel.py).

One thread block per (token, column tile): the tile is read once into registers as fp32 (bf16 widens
exactly), reduced to one |x| maximum per block, and each element is scaled and narrowed to float8_e4m3fn.
Mode 'sf_only' skips the fp8 stores; mode 'precomputed' takes the IEEE reciprocals of the given fp32 scales
instead of the reduction (the saturating narrowing caps what they overflow).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
import functools

from ._scale_rules import cuda_inverse_of, cuda_scale_and_inverse


def cuda_per_token_cast_kernel(cfg):
    """`cfg` is a PerTokenCastConfig (backend "cuda")."""
    import tilelang.language as T

    hidden, bk, bs = cfg.hidden, cfg.block_k, cfg.block_size
    groups, n_tiles = cfg.groups_per_tile, cfg.num_col_tiles
    padding, num_blocks = cfg.sf_padding, cfg.num_blocks
    in_dtype, sf_dtype = cfg.in_dtype, cfg.sf_dtype
    scale_and_inverse = functools.partial(
        cuda_scale_and_inverse, T, round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0
    )

    writes_data, computes_sf = cfg.writes_data, cfg.computes_sf
    num_tokens = T.dynamic('num_tokens')

    @T.macro
    def body(x, out, out_sf, sf):
        # Tokens on grid x (up to 2**31 - 1 blocks; y stops at 65535), column tiles on y.
        with T.Kernel(num_tokens, n_tiles, threads=cfg.threads) as (t, j):
            if computes_sf:
                # The tile stays in x's dtype in registers (half the registers for bf16, so more tiles in flight per
                # SM); its |x| maximum is exact in any dtype and widens exactly.
                xv = T.alloc_fragment((groups, bs), in_dtype)
                amax = T.alloc_fragment((groups,), in_dtype)
                inverse = T.alloc_fragment((groups,), T.float32) if writes_data else None
                for g, k in T.Parallel(groups, bs):
                    xv[g, k] = x[t, j * bk + g * bs + k]
                T.reduce_absmax(xv, amax, dim=1)
                for g in T.Parallel(groups):
                    if writes_data:
                        out_sf[t, j * groups + g], inverse[g] = scale_and_inverse(T.cast(amax[g], T.float32))
                    else:
                        out_sf[t, j * groups + g] = scale_and_inverse(T.cast(amax[g], T.float32))[0]
                if writes_data:
                    for g, k in T.Parallel(groups, bs):
                        # __nv_fp8_e4m3's conversion: nearest even, saturating to +-448, NaN kept.
                        out[t, j * bk + g * bs + k] = T.cast(T.cast(xv[g, k], T.float32) * inverse[g], T.float8_e4m3fn)
                if padding > 0 and j == n_tiles - 1:
                    for p in T.serial(padding):
                        out_sf[t, num_blocks + p] = T.uint8(0)
            else:
                # One streaming pass: the scale's load and reciprocal are the same for a thread's vector of a block.
                for g, k in T.Parallel(groups, bs):
                    out[t, j * bk + g * bs + k] = T.cast(
                        T.cast(x[t, j * bk + g * bs + k], T.float32) * cuda_inverse_of(T, sf[t, j * groups + g]),
                        T.float8_e4m3fn,
                    )

    sf_shape = (num_tokens, cfg.sf_cols)
    if cfg.mode == 'cast':

        @T.prim_func
        def per_token_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
            out_sf: T.Tensor(sf_shape, sf_dtype),
        ):
            body(x, out, out_sf, None)

    elif cfg.mode == 'sf_only':

        @T.prim_func
        def per_token_cast_kernel(x: T.Tensor((num_tokens, hidden), in_dtype), out_sf: T.Tensor(sf_shape, sf_dtype)):
            body(x, None, out_sf, None)

    else:

        @T.prim_func
        def per_token_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            sf: T.Tensor(sf_shape, T.float32),
            out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        ):
            body(x, out, None, sf)

    return per_token_cast_kernel
