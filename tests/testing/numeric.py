"""Numerical assertions and byte counts shared by the operator tests."""

from __future__ import annotations

import torch


def _check_meta(actual: torch.Tensor, expected: torch.Tensor, *, strides: bool) -> None:
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        raise TypeError(f'expected two tensors, got {type(actual).__name__} and {type(expected).__name__}')
    assert actual.dtype == expected.dtype, f'dtype {actual.dtype} != {expected.dtype}'
    assert actual.shape == expected.shape, f'shape {tuple(actual.shape)} != {tuple(expected.shape)}'
    assert actual.device == expected.device, f'device {actual.device} != {expected.device}'
    if strides and actual.numel() > 1:
        assert actual.stride() == expected.stride(), f'stride {actual.stride()} != {expected.stride()}'


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        int_dtype = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.contiguous().view(int_dtype)
    return t


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, *, check_stride: bool = True) -> None:
    """Bit-exact equality, including dtype, shape, stride and device (NaN equals the same NaN)."""
    _check_meta(actual, expected, strides=check_stride)
    a, e = _bits(actual), _bits(expected)
    mismatch = a != e
    if bool(mismatch.any()):
        count = int(mismatch.sum())
        first = tuple(int(i) for i in mismatch.nonzero()[0])
        raise AssertionError(
            f'{count} of {actual.numel()} elements differ; first at {first}: '
            f'{actual[first].item()!r} != {expected[first].item()!r}'
        )


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - cosine-like similarity in float64: 0 for identical tensors, scale-free, NaN-propagating."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if float(denominator) == 0.0:
        return 0.0
    return float(1.0 - 2.0 * (x * y).sum() / denominator)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float, check_stride: bool = False
) -> None:
    """Element-wise |a - e| <= atol + rtol * |e| with dtype/shape/device checks; NaN never passes."""
    _check_meta(actual, expected, strides=check_stride)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=False)


def count_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes a kernel must move for these tensors (each read or written once); None is skipped."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
