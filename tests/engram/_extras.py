"""Benchmark `extras` of the Engram operators: the kernel configuration the interface chose."""

from __future__ import annotations

import dataclasses


def config_extras(cfg) -> dict:
    """The fields of a kernel config dataclass as JSON values, without `backend` (the cluster names it)."""
    return {key: value for key, value in dataclasses.asdict(cfg).items() if key != 'backend'}
