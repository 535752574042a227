"""Engram: hashed n-gram memory lookups gated into hyper-connection hidden states."""

__all__: list[str] = []
