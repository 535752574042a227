"""batched_transpose_weight_sf, the public call: argument contract and typed errors (CPU tier), values through
the public call against the exact reference, bit for bit, with the peer's shapes and strides (device tier: an
accelerator, or the Ascend kernel on the emulator with --ascend-emulator). The kernels themselves:
test_batched_transpose_weight_sf_kernel.py."""

from __future__ import annotations

import importlib

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.quant.batched_transpose_weight_sf import batched_transpose_weight_sf
from cann_ops_tilelang.quant.batched_transpose_weight_sf_kernel import (
    choose_batched_transpose_weight_sf_config,
    get_batched_transpose_weight_sf_kernel,
)
from tests.quant.batched_transpose_weight_sf_ref import (
    batched_transpose_weight_sf_ref,
    exponent_bytes_ref,
    power_of_two_scales,
)
from tests.testing.bench import config_extras, make_param_id
from tests.testing.fast_path import record_launchers
from tests.testing.generator import generate_samples
from tests.testing.numeric import count_bytes

# The module (the package's `batched_transpose_weight_sf` attribute is the function of the same name).
module = importlib.import_module('cann_ops_tilelang.quant.batched_transpose_weight_sf')
SF = torch.ones(2, 3)  # a 256 x 384 weight with 128-blocks
TWO = dict(transpose_sf1s=(False, False), outs=(None, None))  # the other arguments of a batch of two


def _call(sf=(SF,), block_size=128, transpose_sf1s=(False,), outs=(None,)):
    return batched_transpose_weight_sf(sf, block_size, transpose_sf1s, outs)


def _outs_for(sf, block_size=128, transpose_sf1=False):
    """Fresh buffers of exactly the layout the call returns (the reference's), 64-byte aligned."""
    return tuple(
        torch.empty_strided(t.shape, t.stride(), dtype=torch.int32)
        for t in batched_transpose_weight_sf_ref([sf], block_size, [transpose_sf1])[0]
    )


def _column(words: torch.Tensor, rows: int) -> torch.Tensor:
    """words as an (rows, 1) int32 output of strides (1, rows), the layout of a single packed word column."""
    return words.as_strided((rows, 1), (1, rows))


# ---------------------------------------------------------------- CPU tier: argument contract


def test_empty_batch():
    assert batched_transpose_weight_sf([], 128, [], []) == []
    assert batched_transpose_weight_sf((), 32, (), ()) == []


@pytest.mark.parametrize(
    ('kwargs', 'error', 'match'),
    [
        (dict(sf=SF), TypeError, 'sf must be a list or tuple, got Tensor'),
        (dict(transpose_sf1s=True), TypeError, 'transpose_sf1s must be a list or tuple, got bool'),
        (dict(outs=None), TypeError, 'outs must be a list or tuple, got NoneType'),
        (dict(transpose_sf1s=(False, True)), ValueError, 'one entry per weight, got lengths 1, 2, 1'),
        (dict(sf=(SF.numpy(),)), TypeError, r'sf\[0\] must be a torch.Tensor, got ndarray'),
        (dict(sf=(SF, SF.double()), **TWO), TypeError, r'sf\[1\] must have dtype torch.float32, got torch.float64'),
        (dict(sf=(SF[0],)), ValueError, r'sf\[0\] must be \(n / bs, k / bs\) or \(groups, n / bs, k / bs\)'),
        (dict(sf=(torch.ones(1, 1, 1, 1),)), ValueError, r'sf\[0\] must be \(n / bs, k / bs\)'),
        (dict(sf=(torch.ones(3, 2).t(),)), ValueError, r'sf\[0\] must be contiguous'),
        (dict(block_size=128.0), TypeError, 'block_size must be an int, got float'),
        (dict(block_size=True), TypeError, 'block_size must be an int, got bool'),
        (dict(transpose_sf1s=(1,)), TypeError, r'transpose_sf1s\[0\] must be a bool, got int'),
        (dict(block_size=64), ValueError, r'block_size must be one of \(32, 128\), got 64'),
        (dict(sf=(torch.ones(3, 2),), block_size=32), ValueError, 'n = 96, k = 64: both must be positive multiples'),
        (dict(sf=(torch.ones(1, 0),)), ValueError, 'n = 128, k = 0: both must be positive multiples of 128'),
        (dict(), RuntimeError, "no kernels for 'cpu' tensors"),
        (dict(sf=(SF, SF.to('meta')), **TWO), RuntimeError, 'one device'),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        _call(**kwargs)


def test_rejects_outs():
    sf0, sf1 = _outs_for(SF)
    assert (sf0.shape, sf0.stride()) == ((256, 1), (1, 256))
    assert (sf1.shape, sf1.stride()) == ((384, 1), (1, 384))
    with pytest.raises(TypeError, match=r'outs\[0\] must be None or a pair'):
        _call(outs=(sf0,))
    with pytest.raises(TypeError, match=r'outs\[0\]\[1\] must have dtype torch.int32, got torch.int64'):
        _call(outs=((sf0, sf1.long()),))
    with pytest.raises(ValueError, match=r'outs\[0\]\[1\] must have shape \(384, 1\) and strides \(1, 384\)'):
        _call(outs=((sf0, torch.empty(384, 1, dtype=torch.int32)),))  # strides (1, 1)
    with pytest.raises(ValueError, match=r'outs\[0\]\[0\] must have shape \(256, 1\) and strides \(1, 256\)'):
        _call(outs=((sf0[:255], sf1),))
    with pytest.raises(ValueError, match=r'outs\[0\]\[1\] must have shape \(1, 384\) and strides \(384, 1\)'):
        _call(transpose_sf1s=(True,), outs=((sf0, sf1),))  # the other orientation's layout
    base = torch.empty(300, dtype=torch.int32)
    misaligned = base.as_strided((256, 1), (1, 256), (-base.data_ptr() // 4) % 8 + 1)  # 4 bytes past 32
    with pytest.raises(ValueError, match=r'outs\[0\]\[0\] must start at a 32-byte aligned address'):
        _call(outs=((misaligned, sf1),))
    with pytest.raises(RuntimeError, match=r'outs\[0\]\[0\] must be on cpu \(sf\[0\]\), got meta'):
        _call(outs=((sf0.to('meta'), sf1),))
    sf_over = torch.empty(256, dtype=torch.int32)
    with pytest.raises(ValueError, match=r'outs\[0\]\[0\] must not overlap the input sf\[0\]'):
        _call(sf=(sf_over[:6].view(torch.float32).view(2, 3),), outs=((_column(sf_over, 256), sf1),))
    shared = torch.empty(640, dtype=torch.int32)
    with pytest.raises(ValueError, match=r'outs\[0\]\[1\] must not overlap outs\[0\]\[0\]'):
        _call(outs=((_column(shared[:256], 256), _column(shared[128:512], 384)),))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _call(outs=((sf0, sf1),))


def test_rejects_too_large():
    big = torch.empty(128, 1024, 1024, device='meta')  # groups x 131072 x 131072: 2**32 words of sf0
    with pytest.raises(ValueError, match='each must be below 2\\*\\*31'):
        _call(sf=(big,))


def test_one_launcher_per_block_size(monkeypatch):
    """Through the one launcher cache (operator.Launchers): a launcher per (device, backend, block_size), its
    configuration of the backend the device check gave and the device's core count."""
    made, launched = record_launchers(monkeypatch, module._KERNEL, 132)
    monkeypatch.setattr(module, 'require_accelerator', lambda *tensors: 'cuda')
    for block_size in (128, 32, 128):
        _call(sf=(torch.ones(4, 4),), block_size=block_size)
    assert made == [
        (
            get_batched_transpose_weight_sf_kernel,
            choose_batched_transpose_weight_sf_config(backend='cuda', num_cores=132, block_size=block_size),
            torch.device('cpu'),
        )
        for block_size in (128, 32)
    ]
    assert len(launched) == 3


# ---------------------------------------------------------------- device tier: values


def _poisoned_like(buffer, device):
    return torch.empty_strided(buffer.shape, buffer.stride(), dtype=torch.int32, device=device).fill_(-0x5A5A5A5B)


def _assert_pairs(result, expected):
    assert len(result) == len(expected)
    for (sf0, sf1), (ref0, ref1) in zip(result, expected, strict=True):
        for got, want in ((sf0, ref0), (sf1, ref1)):
            assert got.dtype == torch.int32
            assert (got.shape, got.stride()) == (want.shape, want.stride())
            assert torch.equal(got.cpu(), want)


# Several weights in one call: dense and grouped, both orientations, padded last words (Ksf 3, Nsf 5 / 6 with
# 128-blocks), more than one column chunk (Ksf 33 with 128-blocks, 130 with 32-blocks), a grouped weight.
_SHAPES = {
    128: [(2, 3), (5, 33), (3, 6, 2), (1, 1)],
    32: [(8, 4), (12, 132), (2, 4, 8), (4, 4)],
}


@pytest.mark.npu
@pytest.mark.parametrize('block_size', [128, 32])
def test_values(device, block_size):
    gen = torch.Generator().manual_seed(block_size)
    sf = [power_of_two_scales(shape, gen) for shape in _SHAPES[block_size]]
    flags = [False, True, True, False]
    result = batched_transpose_weight_sf([s.to(device) for s in sf], block_size, flags, [None] * len(sf))
    _assert_pairs(result, batched_transpose_weight_sf_ref(sf, block_size, flags))
    # One weight alone (no concatenation), and the same results again.
    alone = batched_transpose_weight_sf([sf[2].to(device)], block_size, [True], [None])
    _assert_pairs(alone, batched_transpose_weight_sf_ref(sf[2:3], block_size, [True]))


@pytest.mark.npu
def test_outs_rewritten_in_place(device):
    block_size = 128
    gen = torch.Generator().manual_seed(7)
    sf = [power_of_two_scales(shape, gen) for shape in ((3, 6, 2), (2, 3), (5, 33))]
    flags = [True, False, False]
    outs = [_outs_for(sf[0], block_size, True), None, _outs_for(sf[2], block_size, False)]
    # Poisoned buffers of the same layouts on the device (every word must be rewritten).
    outs = [None if o is None else tuple(_poisoned_like(b, device) for b in o) for o in outs]
    result = batched_transpose_weight_sf([s.to(device) for s in sf], block_size, flags, outs)
    _assert_pairs(result, batched_transpose_weight_sf_ref(sf, block_size, flags))
    for i in (0, 2):
        assert tuple(result[i]) == outs[i]
        assert all(got is buffer for got, buffer in zip(result[i], outs[i], strict=True))
    # Rewritten again in place: new scales, the same buffers.
    sf = [s * 4 for s in sf]
    again = batched_transpose_weight_sf([s.to(device) for s in sf], block_size, flags, outs)
    _assert_pairs(again, batched_transpose_weight_sf_ref(sf, block_size, flags))
    assert again[0][1] is outs[0][1]


@pytest.mark.npu
def test_not_power_of_two_gives_exponent_byte(device):
    """A scale that is not a positive power of two gives its biased exponent byte (sign and mantissa dropped)."""
    inf = float('inf')
    values = [3.0, -2.0, 0.0, -0.0, 1e-40, inf, -inf, float('nan'), 1.5 * 2.0**-20, 2.0**127, -(2.0**-126), 1.0]
    sf = torch.tensor(values, dtype=torch.float32).view(3, 4)
    expected_bytes = torch.tensor([128, 128, 0, 0, 0, 255, 255, 255, 107, 254, 1, 127])
    assert torch.equal(exponent_bytes_ref(sf).flatten(), expected_bytes)
    for block_size in (128, 32):
        s = sf if block_size == 128 else sf.repeat(4, 4)  # n, k multiples of 128
        result = batched_transpose_weight_sf([s.to(device)], block_size, [False], [None])
        _assert_pairs(result, batched_transpose_weight_sf_ref([s], block_size, [False]))
    sf0 = batched_transpose_weight_sf([sf.to(device)], 128, [False], [None])[0][0].cpu()
    # Row 0 of the weight, scale row 0: bytes 128, 128, 0, 0 little-endian in one word.
    assert sf0[0, 0].item() == 128 | 128 << 8


# ---------------------------------------------------------------- benchmark

# DeepSeek-V3-like batches with 128-blocks: 8 dense weights (the three shapes of an MLA / MLP layer), and the
# grouped up / down projections of 32 experts; the 32-block variant of the experts (MXFP8 weights).
_DENSE = [(7168, 2048), (2048, 7168), (4096, 7168)]
_BATCHES = {
    'dense8': [(None, *_DENSE[i % 3]) for i in range(8)],
    'experts32': [(32, 4096, 7168), (32, 7168, 2048)],
}
BENCHMARK_PARAMS = generate_samples(batch=list(_BATCHES), block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_batched_transpose_weight_sf_benchmark(params, device, benchmark_timer, benchmark_record):
    block_size = params['block']
    gen = torch.Generator().manual_seed(0)
    shapes = [((g,) if g else ()) + (n // block_size, k // block_size) for g, n, k in _BATCHES[params['batch']]]
    sf_cpu = [power_of_two_scales(shape, gen) for shape in shapes]
    sf = [s.to(device) for s in sf_cpu]
    flags = [i % 2 == 1 for i in range(len(sf))]
    result = batched_transpose_weight_sf(sf, block_size, flags, [None] * len(sf))
    _assert_pairs(result, batched_transpose_weight_sf_ref(sf_cpu, block_size, flags))
    outs = list(result)  # the deployment's form: the same buffers rewritten
    time_us = benchmark_timer(lambda: batched_transpose_weight_sf(sf, block_size, flags, outs))
    cfg = choose_batched_transpose_weight_sf_config(
        backend=backend_of(device), num_cores=get_num_cores(device), block_size=block_size
    )
    benchmark_record(
        kernel='quant.batched_transpose_weight_sf',
        operation='transpose',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*sf, *(t for pair in result for t in pair)) / time_us / 1e3,
        extras=config_extras(cfg),
    )
