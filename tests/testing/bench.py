"""Stable, filterable pytest IDs for parameter dicts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

_DTYPE_NAMES = {
    torch.bfloat16: 'bf16',
    torch.float16: 'fp16',
    torch.float32: 'fp32',
    torch.int32: 'int32',
    torch.int64: 'int64',
}


def format_param_value(value) -> str:
    if isinstance(value, torch.dtype):
        return _DTYPE_NAMES.get(value, str(value).removeprefix('torch.'))
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, (tuple, list)):
        return 'x'.join(format_param_value(v) for v in value)
    raise TypeError(f'cannot make a stable test ID from a {type(value).__name__}: {value!r}')


def make_param_id(params: Mapping) -> str:
    """'hc=4-hidden=4096-num_tokens=4001' (keys in the dict's order), for `ids=` of parametrize."""
    if not isinstance(params, Mapping):
        raise TypeError(f'make_param_id expects a dict of parameters, got {type(params).__name__}')
    return '-'.join(f'{key}={format_param_value(value)}' for key, value in params.items())


def config_extras(cfg) -> dict:
    """Benchmark `extras`: the fields of the kernel config dataclass the interface chose, as JSON values, without
    `backend` (the cluster names it)."""
    return {key: value for key, value in dataclasses.asdict(cfg).items() if key != 'backend'}
