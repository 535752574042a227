"""per_channel_cast, the public operator: argument contract and torch.library forms (CPU tier), values through the
public call against the reference, bit for bit, for bf16 / fp32 inputs and for per-token quantised ones (device
tier: an accelerator, or the Ascend kernels on the emulator with --ascend-emulator). The kernels themselves:
test_per_channel_cast_kernel.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.quant import QuantTensor, per_channel_cast, per_token_cast
from tests.quant.cast_ref import scaled_rows
from tests.quant.per_channel_cast_ref import per_channel_cast_ref
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal, count_bytes

LEVEL = get_test_level()
_FORMATS = {'fp32': (False, False), 'pow2': (True, False), 'ue8m0': (True, True)}
VARIANTS = by_level(
    LEVEL,
    core=[dict(dtype='bfloat16', block=128, sf='fp32'), dict(dtype='float32', block=32, sf='ue8m0')],
    default=generate_samples(dtype=['bfloat16', 'float32'], block=[32, 128], sf=list(_FORMATS)),
)
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 161), default=(300,), full=(4001,))
HIDDEN = 320  # five registers of 64 channels
X = torch.zeros(4, 256, dtype=torch.bfloat16)
Q = (X.to(torch.float8_e4m3fn), torch.ones(4, 2))
E4M3_SF = torch.ones(4, 8).to(torch.float8_e4m3fn)  # E4M3 input scales of 32-channel blocks


def _cast(x, block=128, sf='fp32', **kwargs):
    round_sf, packed = _FORMATS[sf]
    return per_channel_cast(x, 'e4m3', block, round_sf, use_packed_ue8m0=packed, **kwargs)


def _nan_as_positive(data: torch.Tensor) -> torch.Tensor:
    return torch.where(data & 0x7F == 0x7F, 0x7F, data).to(torch.uint8)


def _assert_matches(result: QuantTensor, expected: tuple[torch.Tensor, torch.Tensor], packed: bool) -> None:
    data, scales = expected
    assert_equal(_nan_as_positive(result.data.cpu().view(torch.uint8)), _nan_as_positive(data.view(torch.uint8)))
    assert_equal(result.sf.cpu().view(torch.uint8) if packed else result.sf.cpu(), scales)


# ---------------------------------------------------------------- CPU tier: argument contract


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((X.half(), 'e4m3', 32), {}, TypeError, 'x must have dtype torch.bfloat16 or torch.float32 or'),
        ((X.to(torch.float8_e4m3fn), 'e4m3', 32), {}, TypeError, 'x must be bf16 or fp32, or a quantised tensor'),
        ((X, 'e2m1', 32), {}, ValueError, "fmt must be 'e4m3'"),
        ((X, 'e4m3', 64), {}, ValueError, r'num_per_tokens must be one of \(32, 128\), got 64'),
        ((X, 'e4m3', 32, False, 128), {}, ValueError, 'num_per_channels is for a quantised x'),
        ((X, 'e4m3', 32), {'use_packed_ue8m0': True}, ValueError, 'use_packed_ue8m0=True needs round_sf=True'),
        ((X[:, :96].contiguous(), 'e4m3', 32), {}, ValueError, 'positive multiple of 64'),
        ((Q, 'e4m3', 32), {}, ValueError, r'a quantised x \(data, sf\) needs num_per_channels'),
        ((Q, 'e4m3', 32, False, 64), {}, ValueError, r'num_per_channels must be one of \(32, 128\), got 64'),
        (((Q[0], torch.ones(4, 3)), 'e4m3', 32, False, 128), {}, ValueError, r'x\[1\] must have shape \(4, 2\)'),
        (((Q[0], torch.ones(4, 1, dtype=torch.int32)), 'e4m3', 32, False, 32), {}, ValueError,
         r'x\[1\] must have shape \(4, 2\) \(torch.int32 scales\)'),
        (((X, torch.ones(4, 2)), 'e4m3', 32, False, 128), {}, TypeError, r'x\[0\] of a quantised x must be float8'),
        (((Q[0],), 'e4m3', 32, False, 128), {}, TypeError, r'x must be a tuple \(data, sf\) of 2 tensors'),
        ((X, 'e4m3', 32), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((Q, 'e4m3', 32, False, 128), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        (((Q[0], E4M3_SF[:, :1]), 'e4m3', 32, False, 32), {}, ValueError,
         r'x\[1\] must have shape \(4, 8\) \(torch.float8_e4m3fn scales\), got \(4, 1\)'),
        (((Q[0], E4M3_SF[:, :1].half()), 'e4m3', 32, False, 32), {}, TypeError, r'x\[1\] must have dtype'),
        (((Q[0], E4M3_SF), 'e4m3', 32, False, 32), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_per_channel_cast_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        per_channel_cast(*args, **kwargs)


def test_per_channel_cast_fake_tensors(monkeypatch):
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    with FakeTensorMode():
        x = torch.empty(161, HIDDEN, dtype=torch.float32)
        result = _cast(x, 32, 'ue8m0')
        assert isinstance(result, QuantTensor)
        assert (result.data.shape, result.data.dtype) == ((161, HIDDEN), torch.float8_e4m3fn)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((2, HIDDEN), torch.int32)  # 6 token blocks, 4 per word
        q = (torch.empty(161, 256, dtype=torch.float8_e4m3fn), torch.empty(161, 2))
        rescaled = per_channel_cast(q, 'e4m3', 128, num_per_channels=128)
        assert (tuple(rescaled.sf.shape), rescaled.sf.dtype) == ((2, 256), torch.float32)
        q = (q[0], torch.empty(161, 8, dtype=torch.float8_e4m3fn))  # E4M3 input scales
        rescaled = per_channel_cast(q, 'e4m3', 32, True, 32, use_packed_ue8m0=True)
        assert (rescaled.data.shape, rescaled.data.dtype) == ((161, 256), torch.float8_e4m3fn)
        assert (tuple(rescaled.sf.shape), rescaled.sf.dtype) == ((2, 256), torch.int32)


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_channel_cast_values(variant, num_tokens, device):
    block, sf = variant['block'], variant['sf']
    round_sf, packed = _FORMATS[sf]
    x = scaled_rows(num_tokens, HIDDEN, variant['dtype'], device)
    result = _cast(x, block, sf)
    _assert_matches(result, per_channel_cast_ref(x.cpu(), block, round_sf=round_sf, packed_ue8m0=packed), packed)
    buffers = (torch.empty_like(result.data), torch.full_like(result.sf, -1))
    again = _cast(x, block, sf, out=buffers)
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    _assert_matches(again, per_channel_cast_ref(x.cpu(), block, round_sf=round_sf, packed_ue8m0=packed), packed)


@pytest.mark.npu
@pytest.mark.parametrize(('in_block', 'in_sf'), [(128, 'fp32'), (32, 'ue8m0'), (32, 'e4m3')])
def test_per_channel_cast_rescales_a_per_token_cast(in_block, in_sf, device):
    """The weight-gradient path: x cast per token (per_token_cast: fp32, UE8M0 or E4M3 scales), then rescaled
    per channel."""
    in_round, in_packed = _FORMATS.get(in_sf, (False, False))
    x = scaled_rows(161, 256, 'bfloat16', device)
    quantised = per_token_cast(
        x, 'e4m3', in_block, round_sf=in_round, use_packed_ue8m0=in_packed, use_e4m3_sf=in_sf == 'e4m3'
    )
    result = per_channel_cast(quantised, 'e4m3', 32, True, in_block, use_packed_ue8m0=True)
    in_sf_bytes = quantised.sf.cpu().view(torch.uint8) if in_packed else quantised.sf.cpu()
    expected = per_channel_cast_ref(
        quantised.data.cpu(), 32, round_sf=True, packed_ue8m0=True, x_sf=in_sf_bytes, in_block_channels=in_block,
        in_packed_ue8m0=in_packed,
    )  # fmt: skip
    _assert_matches(result, expected, True)


# The peer's shapes (tokens multiples of 128, hidden 4096 / 7168): 128-token fp32 and 32-token UE8M0 scales.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4096, 8192], hidden=[4096, 7168], block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_per_channel_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = params['block'], 'fp32' if params['block'] == 128 else 'ue8m0'
    round_sf, packed = _FORMATS[sf]
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    result = _cast(x, block, sf)
    _assert_matches(result, per_channel_cast_ref(x.cpu(), block, round_sf=round_sf, packed_ue8m0=packed), packed)
    time_us = benchmark_timer(lambda: _cast(x, block, sf, out=result))
    cfg = per_channel_cast.operator.config(x, 'e4m3', block, round_sf, use_packed_ue8m0=packed)
    benchmark_record(
        kernel='quant.per_channel_cast',
        operation='cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )
