"""Tensor transforms around attention: rotary position embedding (experimental: not exported from the root package
yet)."""

from .apply_rotary import apply_rotary

__all__ = ['apply_rotary']
