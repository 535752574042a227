"""The prim_func signature of the per_token_cast kernels, one for both backends (the backend bodies differ, the
arguments do not).

Imported by _per_token_cast_ascend.py and _per_token_cast_cuda.py (it imports neither: no import circle).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the local shape variables.
from ._scale_rules import col_major_scales


def per_token_cast_prim_func(T, cfg, num_tokens, x_type, body, x_sf_type=None):
    """`per_token_cast_kernel` of `cfg.mode` around a backend's `body(x, out, out_sf, sf, key)` macro: 'cast'
    (x, out, out_sf), with cfg.stochastic also the int32 key of the seed (passed on as uint32); 'sf_only' (x,
    out_sf); 'precomputed' (x, sf, out); 'recast' (x, x_sf, out, out_sf): x a quantised tensor's e4m3 data, x_sf
    its scales of type `x_sf_type` (passed on as `sf`). `x_type`: x's tensor type (contiguous, or rows of a stride
    symbol); the scales row-major (T, sf_cols) or, with cfg.col_major_sf, the transposed column-major view
    (col_major_scales)."""
    sf_shape = (num_tokens, cfg.sf_cols)
    data_shape = (num_tokens, cfg.data_cols)
    out_sf_type = T.Tensor(sf_shape, cfg.sf_dtype)
    if cfg.col_major_sf:  # the transposed column-major scales: rows of stride sf_stride >= T
        out_sf_type = col_major_scales(T, num_tokens, cfg.sf_cols, cfg.sf_dtype, packed=cfg.packed_ue8m0)
    if cfg.mode == 'cast' and cfg.stochastic:

        @T.prim_func
        def per_token_cast_kernel(
            x: x_type,
            out: T.Tensor(data_shape, cfg.data_storage),
            out_sf: out_sf_type,
            key: T.int32,
        ):
            body(x, out, out_sf, None, T.Cast('uint32', key))

    elif cfg.mode == 'cast':

        @T.prim_func
        def per_token_cast_kernel(
            x: x_type,
            out: T.Tensor(data_shape, cfg.data_storage),
            out_sf: out_sf_type,
        ):
            body(x, out, out_sf, None, None)

    elif cfg.mode == 'recast':

        @T.prim_func
        def per_token_cast_kernel(
            x: x_type,
            x_sf: x_sf_type,
            out: T.Tensor(data_shape, cfg.data_storage),
            out_sf: out_sf_type,
        ):
            body(x, out, out_sf, x_sf, None)

    elif cfg.mode == 'sf_only':

        @T.prim_func
        def per_token_cast_kernel(x: x_type, out_sf: out_sf_type):
            body(x, None, out_sf, None, None)

    else:

        @T.prim_func
        def per_token_cast_kernel(
            x: x_type,
            sf: T.Tensor(sf_shape, cfg.sf_dtype),
            out: T.Tensor(data_shape, cfg.data_storage),
        ):
            body(x, out, None, sf, None)

    return per_token_cast_kernel
