"""per_token_cast_and_cast_back, the public operator: argument contract and its torch.library form (CPU tier),
values through the public call against the reference, bit for bit, in place and on strided rows (device tier: an
accelerator, or the Ascend kernel on the emulator with --ascend-emulator). The kernels themselves:
test_per_token_cast_and_cast_back_kernel.py."""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang.quant import cast_back, per_token_cast, per_token_cast_and_cast_back
from cann_ops_tilelang.quant.per_token_cast_and_cast_back import access_width
from tests.quant.cast_ref import scaled_rows
from tests.quant.per_token_cast_and_cast_back_ref import per_token_cast_and_cast_back_ref
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal

LEVEL = get_test_level()
# Level 0: configurations test_per_token_cast_and_cast_back_kernel.py compiles anyway (H = 1152).
VARIANTS = by_level(
    LEVEL,
    core=[dict(dtype='bfloat16', block=32, round_sf=False), dict(dtype='float32', block=128, round_sf=True)],
    default=generate_samples(dtype=['bfloat16', 'float32'], block=[32, 64, 128], round_sf=[False, True]),
)
X = torch.zeros(4, 256, dtype=torch.bfloat16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, every NaN as one pattern (the NaN of inf * 0 is the platform's)."""
    t = t.cpu()
    bits = t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)
    return torch.where(torch.isnan(t), -1, bits)


@pytest.mark.parametrize(
    ('args', 'error', 'match'),
    [
        ((X.half(), 'e4m3', 32), TypeError, 'x must have dtype torch.bfloat16 or torch.float32'),
        ((X.t(), 'e4m3', 32), ValueError, 'x must have a contiguous last dimension'),
        ((X, 'e5m2', 32), ValueError, r"fmt must be one of \('e4m3', 'e2m1'\)"),
        ((X, 'e4m3', 8), ValueError, r'num_per_channels must be one of \(16, 32, 64, 128\), got 8'),
        ((X, 'e4m3', 32, True, True), ValueError, 'use_e4m3_sf=True and round_sf=True exclude each other'),
        ((X, 'e2m1', 16, False, True), RuntimeError, "no kernels for 'cpu' tensors"),  # NVFP4's round trip
        ((X[:, :192], 'e4m3', 128), ValueError, 'multiple of 128 for num_per_channels 128'),
        ((X, 'e4m3', 32), RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)
def test_per_token_cast_and_cast_back_rejects(args, error, match):
    with pytest.raises(error, match=match):
        per_token_cast_and_cast_back(*args)


def test_access_width_follows_address_and_row_stride():
    rows = torch.zeros(8, 1152 + 8, dtype=torch.bfloat16)
    assert access_width(rows[:, :1152]) == 8  # 16-byte aligned rows of a 16-byte aligned buffer
    assert access_width(rows[:, 4:1156]) == 4  # 8 bytes in
    assert access_width(rows[:1, 1:1153]) == 1  # one row: its stride does not count, its address does
    assert access_width(torch.zeros(8, 1154, dtype=torch.float32)[:, :1152]) == 2  # an 8-byte row stride


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_per_token_cast_and_cast_back_values(variant, device):
    block, round_sf = variant['block'], variant['round_sf']
    x = scaled_rows(37, 1152, variant['dtype'], device)
    expected = per_token_cast_and_cast_back_ref(x.cpu(), block, round_sf=round_sf)
    assert per_token_cast_and_cast_back(x, 'e4m3', block, round_sf) is x
    assert_equal(_bits(x), _bits(expected))
    # Rows of a wider buffer: only the view's elements change.
    wide = scaled_rows(37, 1152 + 64, variant['dtype'], device)
    before = wide.clone()
    view = wide[:, 64:]
    expected = per_token_cast_and_cast_back_ref(view.cpu(), block, round_sf=round_sf)
    per_token_cast_and_cast_back(view, 'e4m3', block, round_sf)
    assert_equal(_bits(view), _bits(expected))
    assert torch.equal(wide[:, :64], before[:, :64])
    empty = x[:0]
    assert per_token_cast_and_cast_back(empty, 'e4m3', block, round_sf) is empty


# The data and scale formats beyond e4m3 with fp32 / power-of-two scales (each a kernel of its own). Level 0: NVFP4's
# round trip (e2m1 data, 16-channel E4M3 scales, bf16 x); level 1 every format, block and scale format.
_SCALES = {'fp32': (False, False), 'pow2': (True, False), 'e4m3': (False, True)}  # (round_sf, use_e4m3_sf)
FORMAT_VARIANTS = by_level(
    LEVEL,
    core=[dict(dtype='bfloat16', block=16, fmt='e2m1', sf='e4m3')],
    default=generate_samples(
        dtype=['bfloat16', 'float32'], block=[16, 32, 64, 128], fmt=['e4m3', 'e2m1'], sf=list(_SCALES)
    ),
)


@pytest.mark.npu
@pytest.mark.parametrize('variant', FORMAT_VARIANTS, ids=make_param_id)
def test_per_token_cast_and_cast_back_formats(variant, device):
    """FP4 data and E4M3 scales (TileKernels' fmt / use_e4m3_sf), any block: the reference's values, bit for bit,
    and those of cast_back(per_token_cast(x, ...)), the definition, on the same device; strided rows alike."""
    block, fmt = variant['block'], variant['fmt']
    round_sf, e4m3_sf = _SCALES[variant['sf']]
    x = scaled_rows(37, 1152, variant['dtype'], device)
    x[0, :16] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0, 2.5, 1.25] * 2, dtype=x.dtype)  # signed zeros, ties
    quantised = per_token_cast(x, fmt, block, round_sf=round_sf, use_e4m3_sf=e4m3_sf)
    composed = cast_back(quantised, 'fp32', (1, block)).to(x.dtype)
    expected = per_token_cast_and_cast_back_ref(x.cpu(), block, round_sf=round_sf, fmt=fmt, e4m3_sf=e4m3_sf)
    assert per_token_cast_and_cast_back(x, fmt, block, round_sf, e4m3_sf) is x
    assert_equal(_bits(x), _bits(expected))
    assert_equal(_bits(x), _bits(composed))
    wide = scaled_rows(37, 1152 + 64, variant['dtype'], device)
    view = wide[:, 64:]
    expected = per_token_cast_and_cast_back_ref(view.cpu(), block, round_sf=round_sf, fmt=fmt, e4m3_sf=e4m3_sf)
    per_token_cast_and_cast_back(view, fmt, block, round_sf, e4m3_sf)
    assert_equal(_bits(view), _bits(expected))
