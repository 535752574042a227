"""Normalisation: RMSNorm forward (residual add, out_scale, optional FP8 per-token cast) and backward
(experimental: not exported from the root package yet; docs/norm.md)."""

from .norm_backward import norm_backward
from .norm_forward import norm_forward
from .norm_forward_and_per_token_cast import norm_forward_and_per_token_cast

__all__ = ['norm_backward', 'norm_forward', 'norm_forward_and_per_token_cast']
