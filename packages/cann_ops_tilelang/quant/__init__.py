"""Quantisation: FP8 / FP4 casts with per-block scale factors, their inverses, and plain or stochastic-rounding
casts (experimental: not exported from the root package yet)."""

from ._quant_tensor import QuantTensor
from .batched_transpose_weight_sf import batched_transpose_weight_sf
from .cast import cast
from .cast_back import cast_back, per_token_cast_back
from .fp4 import unpack_from_e2m1fn_x2
from .per_block_cast import per_block_cast, per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only
from .per_block_cast_lossless import per_block_cast_lossless
from .per_channel_cast import per_channel_cast
from .per_token_cast import per_token_cast, per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only
from .per_token_cast_and_cast_back import per_token_cast_and_cast_back

__all__: list[str] = [
    'QuantTensor',
    'batched_transpose_weight_sf',
    'cast',
    'cast_back',
    'per_block_cast',
    'per_block_cast_lossless',
    'per_block_cast_with_precomputed_sf',
    'per_block_cast_with_sf_only',
    'per_channel_cast',
    'per_token_cast',
    'per_token_cast_and_cast_back',
    'per_token_cast_back',
    'per_token_cast_with_precomputed_sf',
    'per_token_cast_with_sf_only',
    'unpack_from_e2m1fn_x2',
]
