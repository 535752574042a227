"""unpack_from_e2m1fn_x2: every byte against the e2m1 definition (sign, 2-bit exponent with bias 1, 1 mantissa
bit), the nibble order, shapes and typed errors (CPU tier: plain PyTorch)."""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang.quant import unpack_from_e2m1fn_x2


def _e2m1(code: int) -> float:
    sign = -1.0 if code & 0x8 else 1.0
    exponent, mantissa = (code >> 1) & 0x3, code & 0x1
    magnitude = mantissa * 0.5 if exponent == 0 else (1 + mantissa / 2) * 2.0 ** (exponent - 1)
    return sign * magnitude


@pytest.mark.parametrize('dtype', [torch.uint8, torch.int8])
@pytest.mark.parametrize('out_dtype', [torch.float32, torch.bfloat16])
def test_every_byte_decodes_low_nibble_first(dtype, out_dtype):
    codes = torch.arange(256, dtype=torch.int64)
    x = codes.to(torch.uint8).view(dtype) if dtype == torch.int8 else codes.to(torch.uint8)
    got = unpack_from_e2m1fn_x2(x.reshape(16, 16), out_dtype)
    assert got.shape == (16, 32)
    assert got.dtype == out_dtype
    want = torch.tensor([[_e2m1(c & 0xF), _e2m1(c >> 4)] for c in range(256)]).reshape(16, 32)
    assert torch.equal(got.float(), want)
    assert torch.equal(torch.signbit(got.float()), torch.signbit(want))  # -0.0 (code 8) keeps its sign


@pytest.mark.parametrize(
    ('x', 'kwargs', 'error', 'match'),
    [
        (torch.zeros(4), {}, TypeError, 'x must have dtype torch.int8 or torch.uint8'),
        (torch.zeros((), dtype=torch.uint8), {}, ValueError, 'at least 1 dimension'),
        (torch.zeros(4, dtype=torch.uint8), {'out_dtype': torch.int32}, TypeError, 'out_dtype must be a floating'),
        ([1, 2], {}, TypeError, 'x must be a torch.Tensor, got list'),
    ],
)
def test_rejects(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        unpack_from_e2m1fn_x2(x, **kwargs)
