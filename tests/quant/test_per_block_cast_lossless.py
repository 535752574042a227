"""per_block_cast_lossless, the public operator: argument contract and torch.library forms (CPU tier), values
through the public call against the reference, bit for bit, and the lossless round trip through cast_back's
decoding (device tier: an accelerator, or the Ascend kernels on the emulator with --ascend-emulator). The kernels
themselves: test_per_block_cast_lossless_kernel.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.config import backend_of
from cann_ops_tilelang.quant._quant_tensor import QuantTensor
from cann_ops_tilelang.quant.per_block_cast_lossless import per_block_cast_lossless
from tests.quant.cast_ref import assert_peer_layout, logical_sf_bytes, tma_col_major_sf, ue8m0_to_fp32
from tests.quant.per_block_cast_lossless_ref import (
    decode,
    input_exponents,
    per_block_cast_lossless_ref,
    random_exponents,
    random_fp4,
    scales_of,
)
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal, count_bytes

LEVEL = get_test_level()
VARIANTS = by_level(
    LEVEL,
    # level 0: two kernel configurations, each compiled once per run
    core=[
        dict(x_block=(1, 32), out_block=(32, 32), in_sf='ue8m0', out_sf='ue8m0'),
        dict(x_block=(1, 16), out_block=(128, 128), in_sf='fp32', out_sf='fp32'),
    ],
    default=generate_samples(
        x_block=[(1, 32), (1, 16), (32, 32)],
        out_block=[(32, 32), (128, 128), (64, 128)],
        in_sf=['fp32', 'ue8m0'],
        out_sf=['fp32', 'ue8m0'],
    ),
)
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 161), default=(300,), full=(4001,))
HIDDEN = 1152  # 9 blocks of 128 (a padded UE8M0 row), 36 of 32
D = torch.zeros(4, 128, dtype=torch.int8)  # (T, H) = (4, 256)
Q = (D, torch.ones(4, 8))


def _cast(x, variant, **kwargs):
    packed = variant['out_sf'] == 'ue8m0'
    return per_block_cast_lossless(x, 'e4m3', variant['x_block'], variant['out_block'], round_sf=packed,
                                   use_packed_ue8m0=packed, **kwargs)  # fmt: skip


def _inputs(num_tokens: int, hidden: int, variant: dict, device, low: int = 110, high: int = 140):
    bti, bci = variant['x_block']
    rows = num_tokens if bti == 1 else -(-num_tokens // bti)
    exps = random_exponents(rows, hidden // bci, low, high)
    sf = scales_of(exps, variant['in_sf'] == 'ue8m0')
    sf = sf.view(torch.int32) if variant['in_sf'] == 'ue8m0' else sf
    return random_fp4(num_tokens, hidden).to(device), sf.to(device)


def _assert_matches(result: QuantTensor, x, variant) -> None:
    packed = variant['out_sf'] == 'ue8m0'
    data, sf = x[0].cpu(), x[1].cpu()
    sf = sf.view(torch.uint8) if sf.dtype == torch.int32 else sf
    ref, ref_sf = per_block_cast_lossless_ref(data, sf, variant['x_block'], variant['out_block'], out_packed=packed)
    assert_equal(result.data.cpu().view(torch.uint8), ref.view(torch.uint8))
    assert_equal(result.sf.cpu().view(torch.uint8) if packed else result.sf.cpu(), ref_sf)


# ---------------------------------------------------------------- CPU tier: argument contract


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((D, 'e4m3', (1, 32), (32, 32)), {}, TypeError, r'x must be a tuple \(data, sf\) of 2 tensors'),
        (((D.view(torch.uint8), Q[1]), 'e4m3', (1, 32), (32, 32)), {}, TypeError, r'x\[0\] must have dtype torch.int8'),
        (((D, Q[1].half()), 'e4m3', (1, 32), (32, 32)), {}, TypeError, r'x\[1\] must have dtype torch.float32 or'),
        ((Q, 'e2m1', (1, 32), (32, 32)), {}, ValueError, "fmt must be 'e4m3'"),
        ((Q, 'e4m3', (1, 32, 1), (32, 32)), {}, ValueError, r'x_block_size must be \(tokens, channels\)'),
        ((Q, 'e4m3', (2, 32), (32, 32)), {}, ValueError, r'x_block_size\[0\] \(tokens per scale\) must be one of'),
        ((Q, 'e4m3', (1, 8), (32, 32)), {}, ValueError, r'x_block_size\[1\] \(channels per scale\) must be one of'),
        ((Q, 'e4m3', (1, 32), (16, 32)), {}, ValueError, r'out_block_size\[0\] \(tokens per scale\) must be one of'),
        ((Q, 'e4m3', (1, 32), (32, 256)), {}, ValueError, r'out_block_size\[1\] \(channels per scale\) must be one'),
        ((Q, 'e4m3', (64, 32), (32, 32)), {}, ValueError, r'must be a multiple of x_block_size \(64, 32\)'),
        ((Q, 'e4m3', (1, 64), (32, 32)), {}, ValueError, r'must be a multiple of x_block_size \(1, 64\)'),
        ((Q, 'e4m3', (1, 32), (32, 32)), {'use_tma_aligned_col_major_sf': True}, RuntimeError, "no kernels for 'cpu'"),
        ((Q, 'e4m3', (1, 32), (32, 32)), {'use_packed_ue8m0': True}, ValueError, 'needs round_sf=True'),
        (((D[:, :32].clone(), torch.ones(4, 2)), 'e4m3', (1, 32), (32, 32)), {}, ValueError,
         'hidden size must be a positive multiple of 128'),
        ((Q, 'e4m3', (1, 16), (32, 32)), {}, ValueError, r'x\[1\] must have shape \(4, 16\)'),
        (((D, torch.ones(4, 8, dtype=torch.int32)), 'e4m3', (1, 32), (32, 32)), {}, ValueError,
         r'x\[1\] must have shape \(4, 2\)'),
        (((D, torch.ones(1, 8)), 'e4m3', (32, 32), (32, 32)), {'out': (torch.empty(4, 256), torch.empty(1, 8))},
         TypeError, r'out\[0\] must have dtype torch.float8_e4m3fn'),
        (((D, torch.ones(8, 4).t()), 'e4m3', (1, 32), (32, 32)), {}, ValueError, r'x\[1\] must have a contiguous'),
        ((Q, 'e4m3', (1, 32), (32, 32)), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_per_block_cast_lossless_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        per_block_cast_lossless(*args, **kwargs)


def test_per_block_cast_lossless_rejects_out_buffers():
    data = torch.empty(4, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r'out\[1\] must have shape \(1, 2\), got \(1, 8\)'):
        per_block_cast_lossless(Q, 'e4m3', (1, 32), (32, 128), out=(data, torch.empty(1, 8)))
    with pytest.raises(TypeError, match=r'out\[1\] must have dtype torch.int32'):
        per_block_cast_lossless(Q, 'e4m3', (1, 32), (32, 32), round_sf=True, use_packed_ue8m0=True,
                                out=(data, torch.empty(1, 2)))  # fmt: skip
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_block_cast_lossless(Q, 'e4m3', (1, 32), (32, 128), out=(data, torch.empty(1, 2)))


def test_per_block_cast_lossless_fake_tensors(monkeypatch):
    """While torch traces (fake tensors): the forms' fake kernels give the eager call's outputs."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    with FakeTensorMode():
        x = (torch.empty(161, 576, dtype=torch.int8), torch.empty(161, 9, dtype=torch.int32))
        result = per_block_cast_lossless(x, 'e4m3', (1, 32), (64, 32), round_sf=True, use_packed_ue8m0=True)
        assert isinstance(result, QuantTensor)
        assert (result.data.shape, result.data.dtype) == ((161, 1152), torch.float8_e4m3fn)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((3, 9), torch.int32)
        x = (torch.empty(161, 576, dtype=torch.int8), torch.empty(6, 72))
        result = per_block_cast_lossless(x, 'e4m3', (32, 16), (128, 128))
        assert (tuple(result.sf.shape), result.sf.dtype) == ((2, 9), torch.float32)
        result = per_block_cast_lossless(x, 'e4m3', (32, 16), (128, 128), True)  # column-major: (1, R) on Ascend
        assert (tuple(result.sf.shape), result.sf.stride()) == ((2, 9), (1, 2))


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_block_cast_lossless_values(variant, num_tokens, device):
    x = _inputs(num_tokens, HIDDEN, variant, device)
    result = _cast(x, variant)
    _assert_matches(result, x, variant)
    poisoned = (torch.full_like(result.data.view(torch.uint8), 0x7F), torch.full_like(result.sf, -1))
    buffers = tuple(t.view(r.dtype) for t, r in zip(poisoned, result, strict=True))
    again = _cast(x, variant, out=buffers)
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    _assert_matches(again, x, variant)


# Column-major output scales (use_tma_aligned_col_major_sf), kernels of their own. Level 0: packed UE8M0 of (32, 32)
# blocks (whole words per Ascend task: 12 of a task's 384 channels); level 1 fp32 scales of two block shapes and
# UE8M0 of (64, 64) blocks at H 4096.
COL_MAJOR_VARIANTS = by_level(
    LEVEL,
    core=[dict(x_block=(1, 32), out_block=(32, 32), in_sf='ue8m0', out_sf='ue8m0')],
    default=[
        dict(x_block=(1, 32), out_block=(32, 32), in_sf='ue8m0', out_sf='ue8m0'),
        dict(x_block=(1, 16), out_block=(128, 128), in_sf='fp32', out_sf='fp32'),
        dict(x_block=(32, 32), out_block=(64, 128), in_sf='ue8m0', out_sf='fp32'),
        dict(x_block=(1, 32), out_block=(64, 64), in_sf='fp32', out_sf='ue8m0', hidden=4096),
    ],
)


@pytest.mark.npu
@pytest.mark.parametrize('variant', COL_MAJOR_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 161), default=(1, 300)))
def test_per_block_cast_lossless_col_major_values(variant, num_tokens, device):
    """Column-major scales: the row-major call's data and scale values, in TileKernels' column-major layout (its
    strides and padded buffer), into new buffers or given ones."""
    x = _inputs(num_tokens, variant.get('hidden', HIDDEN), variant, device)
    rows = _cast(x, variant)
    result = _cast(x, variant, use_tma_aligned_col_major_sf=True)
    assert_equal(result.data.cpu().view(torch.uint8), rows.data.cpu().view(torch.uint8))
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(rows.sf))
    sf_rows = -(-num_tokens // variant['out_block'][0])
    assert_peer_layout(result.sf, sf_rows, variant['out_sf'], backend_of(device))
    buffers = (torch.empty_like(result.data), tma_col_major_sf(tuple(result.sf.shape), result.sf.dtype,
                                                                backend_of(device), device))  # fmt: skip
    again = _cast(x, variant, use_tma_aligned_col_major_sf=True, out=buffers)
    assert again.sf is buffers[1]
    assert_equal(logical_sf_bytes(again.sf), logical_sf_bytes(rows.sf))


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS[:1], ids=make_param_id)
@pytest.mark.parametrize('spread', [14, 15])
def test_per_block_cast_lossless_round_trip(variant, spread, device):
    """Scales within 2**14 of their output block's largest: the decoded values are unchanged, bit for bit; one
    binade more: the smallest values round (nothing asserts, nothing is synchronised)."""
    x = _inputs(161, HIDDEN, variant, device, low=150 - spread, high=150)
    result = _cast(x, variant)
    in_sf = x[1].cpu().view(torch.uint8) if x[1].dtype == torch.int32 else x[1].cpu()
    in_exp = input_exponents(in_sf, HIDDEN, variant['x_block'][1])
    before = decode(x[0].cpu(), ue8m0_to_fp32(in_exp.to(torch.uint8)), variant['x_block'])
    out_sf = result.sf.cpu()
    if out_sf.dtype == torch.int32:
        out_sf = ue8m0_to_fp32(out_sf.view(torch.uint8)[:, : HIDDEN // variant['out_block'][1]])
    after = decode(result.data.cpu(), out_sf, variant['out_block'])
    if spread == 14:
        assert_equal(after, before)
    else:
        assert not torch.equal(after, before)


# The peer's shapes: tokens multiples of 128, hidden 4096 / 7168, (1, 32) UE8M0 input scales to (128, 128) fp32
# or (32, 32) UE8M0 output scales.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4096, 8192], hidden=[4096, 7168], out_block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_per_block_cast_lossless_benchmark(params, device, benchmark_timer, benchmark_record):
    out_block = (params['out_block'],) * 2
    variant = dict(x_block=(1, 32), out_block=out_block, in_sf='ue8m0',
                   out_sf='fp32' if params['out_block'] == 128 else 'ue8m0')  # fmt: skip
    x = _inputs(params['num_tokens'], params['hidden'], variant, device)
    result = _cast(x, variant)
    _assert_matches(result, x, variant)
    time_us = benchmark_timer(lambda: _cast(x, variant, out=result))
    packed = variant['out_sf'] == 'ue8m0'
    cfg = per_block_cast_lossless.operator.config(x, 'e4m3', (1, 32), out_block, round_sf=packed,
                                                  use_packed_ue8m0=packed)  # fmt: skip
    benchmark_record(
        kernel='quant.per_block_cast_lossless',
        operation='cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )
