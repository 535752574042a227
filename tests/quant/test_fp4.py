"""unpack_from_e2m1fn_x2: every byte against the e2m1 definition (sign, 2-bit exponent with bias 1, 1 mantissa
bit), the nibble order, shapes and typed errors; the e2m1 rounding of the FP4 casts' kernels against the reference
(CPU tier: plain PyTorch)."""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang.quant import unpack_from_e2m1fn_x2
from cann_ops_tilelang.quant.fp4 import E2M1_MAX, E2M1_MIDPOINTS, E2M1_VALUES, cuda_e2m1_code
from tests.quant.cast_ref import e2m1_codes_ref, pack_e2m1_ref


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


# ---------------------------------------------------------------- the e2m1 rounding of the FP4 casts


class TorchPrimExprs:
    """The few `tilelang.language` names fp4.cuda_e2m1_code uses, on CPU tensors (uint32 as int64 values), so
    the CUDA kernel's own rounding function runs here, element by element as the kernel does."""

    @staticmethod
    def uint32(value):
        return torch.tensor(value, dtype=torch.int64)

    @staticmethod
    def float32(value):
        return torch.tensor(value, dtype=torch.float32)

    abs = staticmethod(torch.abs)
    Select = staticmethod(torch.where)

    @staticmethod
    def reinterpret(value, dtype):
        assert dtype is TorchPrimExprs.uint32
        return value.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _midpoint_rule(values: torch.Tensor) -> torch.Tensor:
    """The CUDA kernel's e2m1 codes (fp4.cuda_e2m1_code; the Ascend macro makes the same compares, checked on the
    emulator by the casts' tests)."""
    return cuda_e2m1_code(TorchPrimExprs, values).to(torch.uint8)


def _around(points, ulps: int = 3) -> torch.Tensor:
    """fp32 values within `ulps` units in the last place of each of `points` (positive)."""
    bits = torch.tensor(points, dtype=torch.float32).view(torch.int32)
    return (bits[:, None] + torch.arange(-ulps, ulps + 1)).flatten().view(torch.float32)


def test_midpoints_are_the_grid_and_its_ties():
    assert E2M1_MAX == 6.0
    assert E2M1_MIDPOINTS == (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def test_kernel_rounding_matches_the_reference():
    """Nearest even on the grid, bit for bit against the reference's distance-based rounding: every midpoint and
    grid value and their neighbours, random values of every binade the casts produce, and the special values."""
    torch.manual_seed(0)
    specials = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-38, 6.0, 6.5, 7.0, 1e30, float('inf'), -float('inf')])
    magnitudes = torch.cat(
        [
            _around(E2M1_MIDPOINTS),
            _around([v for v in E2M1_VALUES[1:8]]),
            torch.rand(1 << 20) * 8,
            torch.exp2(torch.rand(1 << 16) * 40 - 30),
            specials.abs(),
        ]
    )
    values = torch.cat([magnitudes, -magnitudes, specials])
    assert torch.equal(_midpoint_rule(values), e2m1_codes_ref(values))
    nan = torch.tensor([float('nan')])
    assert _midpoint_rule(nan).item() & 0x7 == e2m1_codes_ref(nan).item() & 0x7 == 7  # NaN saturates to 6


def test_reference_codes_decode_to_the_nearest_value():
    """The reference's codes packed (low nibble first) and decoded by unpack_from_e2m1fn_x2 are the nearest
    grid values, ties to the even code, saturating at 6, the sign kept."""
    torch.manual_seed(1)
    values = torch.cat([torch.randn(4096) * 3, torch.tensor([0.25, -0.75, 2.5, -5.0, 9.0, -0.0, 1.75, 3.5])])
    decoded = unpack_from_e2m1fn_x2(pack_e2m1_ref(e2m1_codes_ref(values)[None]))[0]
    nearest = (values.abs().clamp(max=6)[:, None] - torch.tensor(E2M1_VALUES[:8])).abs().min(dim=1).values
    assert torch.equal((values.abs().clamp(max=6) - decoded.abs()).abs(), nearest)
    assert torch.equal(torch.signbit(decoded), torch.signbit(values))
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert unpack_from_e2m1fn_x2(pack_e2m1_ref(e2m1_codes_ref(ties.repeat(2))[None]))[0, :7].tolist() == [
        0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0,
    ]  # fmt: skip
