"""CUDA kernel of per_token_cast_and_cast_back (math and config: per_token_cast_and_cast_back_kernel.py).

One thread block per (token, column tile): the tile is read once into registers (16-byte loads, x's dtype),
reduced to one |x| maximum per block, and each element is scaled, narrowed to float8_e4m3fn (the saturating
conversion) or rounded to an e2m1 code (fp4.cuda_e2m1_code, as per_token_cast), widened back exactly, multiplied by
the block's scale (fp32, or an E4M3 scale widened) and written back in place (16-byte stores): x is read once and
written once.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_and_cast_back_kernel.py, never the other way round (no import circle).
import functools

from ._scale_rules import cuda_cast_scale_and_inverse
from .fp4 import cuda_e2m1_code, cuda_e2m1_value


def cuda_per_token_cast_and_cast_back_kernel(cfg):
    """`cfg` is a PerTokenCastAndCastBackConfig (backend "cuda")."""
    import tilelang.language as T

    hidden, bk, bs = cfg.hidden, cfg.block_k, cfg.block_size
    groups, n_tiles = cfg.groups_per_tile, cfg.num_col_tiles
    in_dtype = cfg.in_dtype
    f32 = T.float32

    num_tokens = T.dynamic('num_tokens')
    x_stride = T.dynamic('x_stride')

    scale_and_inverse = functools.partial(
        cuda_cast_scale_and_inverse, T, fmt=cfg.fmt, round_sf=cfg.round_sf, packed_ue8m0=False, e4m3_sf=cfg.e4m3_sf
    )

    def round_trip(value):
        """fp32 -> the nearest value of the data format, in fp32 (exact): e4m3 by __nv_fp8_e4m3's conversion
        (nearest even, saturating to +-448, NaN kept), e2m1 by its code."""
        if cfg.fmt == 'e2m1':
            return cuda_e2m1_value(T, cuda_e2m1_code(T, value))
        return T.cast(T.cast(value, T.float8_e4m3fn), f32)

    @T.prim_func
    def per_token_cast_and_cast_back_kernel(x: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype)):
        # Tokens on grid x (up to 2**31 - 1 blocks; y stops at 65535), column tiles on y.
        with T.Kernel(num_tokens, n_tiles, threads=cfg.threads) as (t, j):
            # The host guarantees row starts aligned to the access width (cfg.vec elements).
            T.evaluate(T.assume(x_stride % cfg.vec == 0))
            # The tile stays in x's dtype in registers; its |x| maximum is exact in any dtype and widens exactly.
            xv = T.alloc_fragment((groups, bs), in_dtype)
            amax = T.alloc_fragment((groups,), in_dtype)
            sf = T.alloc_fragment((groups,), f32)
            inverse = T.alloc_fragment((groups,), f32)
            for g, k in T.Parallel(groups, bs):
                xv[g, k] = x[t, j * bk + g * bs + k]
            T.reduce_absmax(xv, amax, dim=1)
            for g in T.Parallel(groups):
                if cfg.e4m3_sf:  # the E4M3 scale widens exactly
                    scale, inverse[g] = scale_and_inverse(T.cast(amax[g], f32))
                    sf[g] = T.cast(scale, f32)
                else:
                    sf[g], inverse[g] = scale_and_inverse(T.cast(amax[g], f32))
            if cfg.fmt == 'e4m3' and not cfg.e4m3_sf:
                for g, k in T.Parallel(groups, bs):
                    x[t, j * bk + g * bs + k] = T.cast(round_trip(T.cast(xv[g, k], f32) * inverse[g]) * sf[g], in_dtype)
            else:
                # The round trip into registers first, then a plain copy: the stores keep their 16-byte vectors
                # (TileLang does not vectorize a store of the e2m1 selects).
                yv = T.alloc_fragment((groups, bs), in_dtype)
                for g, k in T.Parallel(groups, bs):
                    yv[g, k] = T.cast(round_trip(T.cast(xv[g, k], f32) * inverse[g]) * sf[g], in_dtype)
                for g, k in T.Parallel(groups, bs):
                    x[t, j * bk + g * bs + k] = yv[g, k]

    return per_token_cast_and_cast_back_kernel
