"""per_block_cast, per_block_cast_with_sf_only and per_block_cast_with_precomputed_sf, the public operators:
argument contract and torch.library forms (CPU tier), values through the public calls against the reference, bit
for bit, for e4m3 and FP4 (e2m1) data with fp32, power-of-two, UE8M0 and E4M3 scales (device tier: an
accelerator, or the Ascend kernels on the emulator with --ascend-emulator). The kernels themselves:
test_per_block_cast_kernel.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.quant import (
    QuantTensor,
    per_block_cast,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)
from tests.quant.cast_ref import scaled_rows
from tests.quant.per_block_cast_ref import per_block_cast_precomputed_ref, per_block_cast_ref
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal, count_bytes

LEVEL = get_test_level()
# scale formats (round_sf, use_packed_ue8m0, use_e4m3_sf)
_FORMATS = {'fp32': (False, False, False), 'pow2': (True, False, False), 'ue8m0': (True, True, False),
            'e4m3': (False, False, True)}  # fmt: skip
VARIANTS = by_level(
    LEVEL,
    # level 0: two e4m3 and two FP4 configurations per mode, each compiled once per run (the FP4 'cast' of the
    # first and the 'precomputed' of the second are test_per_block_cast_kernel.py's level-0 kernels)
    core=[
        dict(dtype='bfloat16', block=(128, 128), sf='fp32', fmt='e4m3'),
        dict(dtype='float32', block=(32, 64), sf='ue8m0', fmt='e4m3'),
        dict(dtype='bfloat16', block=(32, 32), sf='ue8m0', fmt='e2m1'),
        dict(dtype='float32', block=(128, 128), sf='e4m3', fmt='e2m1'),
    ],
    default=generate_samples(
        dtype=['bfloat16', 'float32'], block=[(32, 32), (128, 128), (64, 128), (16, 16)], sf=list(_FORMATS),
        fmt=['e4m3', 'e2m1'],
    ),
)  # fmt: skip
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 161), default=(300,), full=(4001,))
HIDDEN = 1088  # 17 blocks of 64: a padded UE8M0 row; 128-channel blocks take 1152
X = torch.zeros(4, 256, dtype=torch.bfloat16)


def _hidden(block) -> int:
    return HIDDEN if block[1] <= 64 else 1152


def _flags(sf: str) -> dict:
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf)


def _cast(x, block=(128, 128), sf='fp32', fmt='e4m3', **kwargs):
    return per_block_cast(x, fmt, block, **_flags(sf), **kwargs)


def _assert_matches(result: QuantTensor, x: torch.Tensor, block, sf: str, fmt: str = 'e4m3') -> None:
    """Data and scale bytes equal the reference's (the inputs hold no inf or NaN: no NaN products)."""
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    data, scales = per_block_cast_ref(x.cpu(), *block, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
    assert_equal(result.data.cpu().view(torch.uint8), data.view(torch.uint8))
    assert_equal(result.sf.cpu().view(torch.uint8), scales.view(torch.uint8))


# ---------------------------------------------------------------- CPU tier: argument contract


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((X.half(), 'e4m3', (32, 32)), {}, TypeError, 'x must have dtype torch.bfloat16 or torch.float32'),
        ((X, 'e5m2', (32, 32)), {}, ValueError, r"fmt must be one of \('e4m3', 'e2m1'\), got 'e5m2'"),
        ((X, 'e2m1', (32, 32)), {'use_e4m3_sf': True, 'round_sf': True}, ValueError, 'use_e4m3_sf=True and round_sf'),
        ((X, 'e2m1', (32, 32)), {'use_e4m3_sf': 1}, TypeError, 'use_e4m3_sf must be a bool, got int'),
        ((X[:, :192].clone(), 'e2m1', (32, 128)), {}, ValueError, 'multiple of 128 for 128 channels per scale'),
        ((X, 'e4m3', 32), {}, TypeError, 'block_size must be a tuple of ints, got 32'),
        ((X, 'e4m3', (32,)), {}, ValueError, r'block_size must be \(tokens, channels\), got \(32,\)'),
        ((X, 'e4m3', (8, 32)), {}, ValueError,
         r'block_size\[0\] \(tokens per scale\) must be one of \(16, 32, 64, 128\), got 8'),
        ((X, 'e4m3', (32, 256)), {}, ValueError, r'block_size\[1\] \(channels per scale\) must be one of'),
        ((X, 'e4m3', (32, 32)), {'use_packed_ue8m0': True}, ValueError, 'use_packed_ue8m0=True needs round_sf=True'),
        ((X, 'e4m3', (32, 32)), {'use_tma_aligned_col_major_sf': True}, ValueError, 'is not supported yet'),
        ((X[:, :192].clone(), 'e4m3', (32, 128)), {}, ValueError, 'multiple of 128 for 128 channels per scale'),
        ((X, 'e4m3', (32, 32)), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, 'e2m1', (32, 32)), {'use_e4m3_sf': True}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_per_block_cast_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        per_block_cast(*args, **kwargs)


def test_per_block_cast_rejects_out_buffers():
    data, scales = torch.empty(4, 256, dtype=torch.float8_e4m3fn), torch.empty(1, 4)
    with pytest.raises(ValueError, match=r'out\[1\] must have shape \(1, 4\), got \(1, 2\)'):
        _cast(X, (32, 64), out=(data, scales[:, :2]))
    with pytest.raises(TypeError, match=r'out\[1\] must have dtype torch.int32'):
        _cast(X, (32, 64), 'ue8m0', out=(data, scales))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(X, (32, 64), out=(data, scales))
    fp4, e4m3_scales = torch.empty(4, 128, dtype=torch.int8), torch.empty(1, 4, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r'out\[0\] must have shape \(4, 128\), got \(4, 256\)'):
        _cast(X, (32, 64), 'e4m3', 'e2m1', out=(fp4.repeat(1, 2), e4m3_scales))
    with pytest.raises(TypeError, match=r'out\[1\] must have dtype torch.float8_e4m3fn'):
        _cast(X, (32, 64), 'e4m3', 'e2m1', out=(fp4, scales))
    with pytest.raises(TypeError, match=r'out\[0\] must have dtype torch.int8'):
        _cast(X, (32, 64), 'fp32', 'e2m1', out=(data, scales))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(X, (32, 64), 'e4m3', 'e2m1', out=(fp4, e4m3_scales))


def test_per_block_cast_halves_reject():
    with pytest.raises(ValueError, match=r'out_sf must have shape \(1, 2\), got \(1, 1\)'):
        per_block_cast_with_sf_only(X, 'e4m3', (128, 128), out_sf=torch.empty(1, 1))
    with pytest.raises(
        ValueError, match=r'sf must have shape \(1, 2\) \(one per block of \(128, 128\)\), got \(2, 2\)'
    ):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(2, 2))
    with pytest.raises(TypeError, match='sf must have dtype torch.float32'):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(1, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match='precomputed scales are fp32: use_packed_ue8m0=True is not supported'):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(1, 2), round_sf=True,
                                           use_packed_ue8m0=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(1, 2))
    e4m3_scales = torch.ones(1, 2).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match='sf must have dtype torch.float8_e4m3fn with use_e4m3_sf=True'):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), torch.ones(1, 2), use_e4m3_sf=True)
    with pytest.raises(TypeError, match='sf must have dtype torch.float32 with use_e4m3_sf=False'):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), e4m3_scales)
    with pytest.raises(ValueError, match='use_e4m3_sf=True and round_sf=True exclude each other'):
        per_block_cast_with_sf_only(X, 'e2m1', (128, 128), round_sf=True, use_e4m3_sf=True)
    with pytest.raises(TypeError, match=r'out must have dtype torch.int8'):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), torch.ones(1, 2),
                                           out=torch.empty(4, 128, dtype=torch.float8_e4m3fn))  # fmt: skip
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), e4m3_scales, use_e4m3_sf=True)


def test_per_block_cast_fake_tensors(monkeypatch):
    """While torch traces (fake tensors): the forms' fake kernels give the eager call's outputs."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    with FakeTensorMode():
        x = torch.empty(161, 1088, dtype=torch.float32)
        result = _cast(x, (64, 64), 'ue8m0')
        assert isinstance(result, QuantTensor)
        assert (result.data.shape, result.data.dtype) == ((161, 1088), torch.float8_e4m3fn)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((3, 5), torch.int32)
        sf = per_block_cast_with_sf_only(x, 'e4m3', (128, 64))
        assert (tuple(sf.shape), sf.dtype) == ((2, 17), torch.float32)
        data = per_block_cast_with_precomputed_sf(x, 'e4m3', (128, 64), sf)
        assert (tuple(data.shape), data.dtype) == ((161, 1088), torch.float8_e4m3fn)
        # FP4 (two codes a byte) with E4M3 scales, and with UE8M0 ones.
        result = _cast(x, (32, 32), 'e4m3', 'e2m1')
        assert (result.data.shape, result.data.dtype) == ((161, 544), torch.int8)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((6, 34), torch.float8_e4m3fn)
        result = _cast(x, (32, 32), 'ue8m0', 'e2m1')
        assert (tuple(result.sf.shape), result.sf.dtype) == ((6, 9), torch.int32)
        sf = per_block_cast_with_sf_only(x, 'e2m1', (128, 64), use_e4m3_sf=True)
        assert (tuple(sf.shape), sf.dtype) == ((2, 17), torch.float8_e4m3fn)
        data = per_block_cast_with_precomputed_sf(x, 'e2m1', (128, 64), sf, use_e4m3_sf=True)
        assert (tuple(data.shape), data.dtype) == ((161, 544), torch.int8)


def test_per_block_cast_torch_library_schemas():
    """The functional forms carry use_e4m3_sf after use_packed_ue8m0, as per_token_cast's."""
    for name in ('per_block_cast', 'per_block_cast_with_sf_only', 'per_block_cast_with_precomputed_sf'):
        schema = str(getattr(torch.ops.cann_ops_tilelang, name).default._schema)
        assert 'bool use_packed_ue8m0, bool use_e4m3_sf' in schema


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_block_cast_values(variant, num_tokens, device):
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    x = scaled_rows(num_tokens, _hidden(block), variant['dtype'], device)
    result = _cast(x, block, sf, fmt)
    _assert_matches(result, x, block, sf, fmt)
    poisoned = (
        torch.full_like(result.data.view(torch.uint8), 0x7F),
        torch.full_like(result.sf.view(torch.uint8), 0xA5),
    )
    buffers = tuple(t.view(r.dtype) for t, r in zip(poisoned, result, strict=True))
    again = _cast(x, block, sf, fmt, out=buffers)
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    _assert_matches(again, x, block, sf, fmt)
    # The halves: the scales alone are the full cast's; its data again from fp32 / e4m3 scales.
    scales = per_block_cast_with_sf_only(x, fmt, block, **_flags(sf))
    assert_equal(scales.cpu().view(torch.uint8), result.sf.cpu().view(torch.uint8))
    if sf != 'ue8m0':
        data = per_block_cast_with_precomputed_sf(x, fmt, block, scales, use_e4m3_sf=sf == 'e4m3')
        expected = per_block_cast_precomputed_ref(x.cpu(), scales.cpu(), *block, fmt)
        assert_equal(data.cpu().view(torch.uint8), expected.view(torch.uint8))


# The peer's shapes (tokens multiples of 128, hidden 4096 / 7168), DeepSeek-V3's 128 x 128 fp32 and 32 x 32 UE8M0.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4096, 8192], hidden=[4096, 7168], block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_per_block_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = (params['block'],) * 2, 'fp32' if params['block'] == 128 else 'ue8m0'
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    result = _cast(x, block, sf)
    _assert_matches(result, x, block, sf)
    time_us = benchmark_timer(lambda: _cast(x, block, sf, out=result))
    cfg = per_block_cast.operator.config(x, 'e4m3', block, **_flags(sf))
    benchmark_record(
        kernel='quant.per_block_cast',
        operation='cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )


# FP4 at the same shapes: 32 x 32 blocks with UE8M0 scales (the peer's Ascend block) and 128 x 128 with fp32 ones.
FP4_BENCHMARK_PARAMS = generate_samples(num_tokens=[4096, 8192], hidden=[4096, 7168], block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', FP4_BENCHMARK_PARAMS, ids=make_param_id)
def test_per_block_cast_fp4_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = (params['block'],) * 2, 'fp32' if params['block'] == 128 else 'ue8m0'
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    result = _cast(x, block, sf, 'e2m1')
    _assert_matches(result, x, block, sf, 'e2m1')
    time_us = benchmark_timer(lambda: _cast(x, block, sf, 'e2m1', out=result))
    cfg = per_block_cast.operator.config(x, 'e2m1', block, **_flags(sf))
    benchmark_record(
        kernel='quant.per_block_cast',
        operation='cast_fp4',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )
