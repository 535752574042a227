"""Stable, filterable pytest IDs for parameter dicts."""

from __future__ import annotations

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
