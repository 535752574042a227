"""Quantisation: FP8 casts with per-block scale factors (experimental: not exported from the root package yet)."""

from ._quant_tensor import QuantTensor
from .per_token_cast import per_token_cast

__all__: list[str] = ['QuantTensor', 'per_token_cast']
