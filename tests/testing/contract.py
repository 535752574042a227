"""Assertions on the argument contract of the public operators (the CPU-tier contract tests use them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pytest
import torch


def assert_rejects_non_tensor_and_dtype(
    call: Callable[..., object],
    args: Sequence[object],
    index: int,
    *,
    name: str,
    dtype: torch.dtype,
    non_tensors: Iterable[object],
    wrong_dtype: torch.dtype,
) -> None:
    """call(*args) with args[index] replaced raises TypeError: by each of `non_tensors` ('<name> must be a
    torch.Tensor') and by that tensor cast to `wrong_dtype` ('<name> must have dtype <dtype>')."""
    bad = list(args)
    for value in non_tensors:
        bad[index] = value
        with pytest.raises(TypeError, match=f'{name} must be a torch.Tensor'):
            call(*bad)
    bad[index] = args[index].to(wrong_dtype)
    with pytest.raises(TypeError, match=f'{name} must have dtype {dtype}'):
        call(*bad)


def assert_rejects_extra_dimension(
    call: Callable[..., object], args: Sequence[object], index: int, *, name: str
) -> None:
    """call(*args) with args[index] given a leading size-1 dimension raises ValueError ('<name> must have
    <ndim> dimensions')."""
    bad = list(args)
    bad[index] = args[index].unsqueeze(0)
    with pytest.raises(ValueError, match=f'{name} must have {args[index].dim()} dimensions'):
        call(*bad)
