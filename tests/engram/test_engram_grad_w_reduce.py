"""engram_grad_w_reduce: lowering (CPU tier), argument contract (CPU tier), values and benchmark (device)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang.engram import EngramGradWReduceResult
from cann_ops_tilelang.engram.engram_grad_w_reduce_kernel import (
    choose_engram_grad_w_reduce_config,
    make_engram_grad_w_reduce_kernel,
)
from tests.engram.engram_grad_w_reduce_ref import engram_grad_w_reduce_error_scale, engram_grad_w_reduce_ref
from tests.testing.bench import config_extras, make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import (
    BENCHMARK_HC,
    BENCHMARK_HIDDEN,
    gen_hc,
    gen_hidden,
    generate_samples,
    get_test_level,
)
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import count_bytes

KERNEL_NAME = 'engram_grad_w_reduce_kernel'
BENCHMARK_PARTIALS = 132  # one partial per persistent block of the backward on an H200

LEVEL = get_test_level()
SHAPES = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden)
# P is a runtime size: 1 (a single chunk, mostly padding), 7 (a tail only), 132 (full chunks + tail).
VALUE_PARAMS = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden, num_partials=[1, 7, 132])
BENCHMARK_SHAPES = generate_samples(hc=[BENCHMARK_HC], hidden=BENCHMARK_HIDDEN, num_partials=[BENCHMARK_PARTIALS])


def _inputs(num_partials: int, hc: int, hidden: int, device) -> tuple[torch.Tensor, ...]:
    partial = torch.randn(num_partials, hc, hidden)
    wh = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    we = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    gwh = torch.randn(hc, hidden)
    gwe = torch.randn(hc, hidden)
    return tuple(t.to(device) for t in (partial, wh, we, gwh, gwe))


def _assert_reduced(actual: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor, num_partials: int) -> None:
    """|actual - expected| <= 2 * (P + 2) * 2**-24 * scale, element-wise.

    `scale` is the sum of the magnitudes of every term of the element (|g| + sum_p |partial[p]| * |w|).
    Any order of the P + 1 fp32 additions and the one product is within (P + 2) * 2**-24 * scale of the
    exact value (recursive summation bound), for the kernel and for torch alike; their difference is
    within twice that. The kernel's order (per-tile sequential / strided + tree) differs from torch's.
    """
    assert actual.dtype == torch.float32
    assert actual.shape == expected.shape
    assert actual.device == expected.device
    err = (actual.double() - expected.double()).abs()
    bound = 2 * (num_partials + 2) * 2.0**-24 * scale
    bad = ~(err <= bound)  # NaN fails too
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f'{int(bad.sum())} of {actual.numel()} elements off; first at {first}: '
            f'{actual[first].item()!r} vs {expected[first].item()!r}, bound {bound[first].item():.3g}'
        )


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_grad_w_reduce_ascend_lowers(params):
    cfg = choose_engram_grad_w_reduce_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.hc, cfg.hidden, cfg.num_cores) == ('ascend', params['hc'], params['hidden'], 64)
    assert params['hidden'] % cfg.block_cols == 0
    assert cfg.num_stages == 2
    if params['hidden'] % 2048 == 0 or params['hc'] * params['hidden'] <= 64 * 64:
        assert cfg.num_tiles <= 64  # a single round of blocks over the vector cores
    assert_ascend_kernel_lowers(lambda: make_engram_grad_w_reduce_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_grad_w_reduce_cuda_lowers(params):
    cfg = choose_engram_grad_w_reduce_config(backend='cuda', **params, num_cores=H200_SMS)
    assert (cfg.backend, cfg.hc, cfg.hidden) == ('cuda', params['hc'], params['hidden'])
    assert params['hidden'] % cfg.block_cols == 0
    assert cfg.block_cols <= 256  # TMA box limit
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_grad_w_reduce_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'num_partials' in lowered.source  # P stays a runtime argument
    assert lowered.source.count('__syncthreads()') == 1  # the lane sums meet once; no reduction tree


def test_engram_grad_w_reduce_cuda_tiling_is_checked():
    cfg = choose_engram_grad_w_reduce_config(backend='cuda', hc=4, hidden=4096, num_cores=H200_SMS)
    with pytest.raises(ValueError, match='row lanes'):
        dataclasses.replace(cfg, block_rows=cfg.block_rows + 1)
    with pytest.raises(ValueError, match='column groups'):
        dataclasses.replace(cfg, threads=cfg.block_cols // 4 + 1)


def test_engram_grad_w_reduce_config_benchmark_shapes():
    for hidden in BENCHMARK_HIDDEN:
        cfg = choose_engram_grad_w_reduce_config(backend='cuda', hc=4, hidden=hidden, num_cores=H200_SMS)
        assert cfg.num_tiles == 4 * hidden // cfg.block_cols  # column tiles only: P is never split
        cfg = choose_engram_grad_w_reduce_config(backend='ascend', hc=4, hidden=hidden, num_cores=64)
        assert 32 < cfg.num_tiles <= 64
    with pytest.raises(ValueError, match='backend'):
        choose_engram_grad_w_reduce_config(backend='cpu', hc=4, hidden=4096, num_cores=64)


# ---------------------------------------------------------------- CPU tier: argument contract


def _call(partial, wh, we, gwh, gwe):
    return cann_ops_tilelang.engram_grad_w_reduce(partial, wh, we, gwh, gwe)


_ARG_NAMES = ('grad_w_partial', 'weight_hidden', 'weight_embed', 'grad_weight_hidden', 'grad_weight_embed')
_ARG_DTYPES = (torch.float32, torch.bfloat16, torch.bfloat16, torch.float32, torch.float32)


@pytest.mark.parametrize('index', range(5), ids=_ARG_NAMES)
def test_engram_grad_w_reduce_rejects_non_tensors_and_dtypes(index):
    args = list(_inputs(3, 4, 128, 'cpu'))
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=_ARG_DTYPES[index],
        non_tensors=(args[index].numpy() if args[index].dtype == torch.float32 else 1.0,),
        wrong_dtype=torch.float16,
    )


@pytest.mark.parametrize('index', range(5), ids=_ARG_NAMES)
def test_engram_grad_w_reduce_rejects_shapes(index):
    args = list(_inputs(3, 4, 128, 'cpu'))
    assert_rejects_extra_dimension(_call, args, index, name=_ARG_NAMES[index])
    bad = list(args)
    if index > 0:
        bad[index] = args[index][:, :64].contiguous()
        with pytest.raises(ValueError, match=rf'{_ARG_NAMES[index]} must have shape \(4, 128\)'):
            _call(*bad)


@pytest.mark.parametrize(
    ('hc', 'hidden', 'match'),
    [(0, 128, 'hc'), (9, 128, 'hc'), (4, 96, 'multiple of 64'), (1, 16384 + 64, 'multiple of 64 up to 16384')],
)
def test_engram_grad_w_reduce_rejects_hc_hidden(hc, hidden, match):
    args = _inputs(2, hc, hidden, 'cpu')
    with pytest.raises(ValueError, match=match):
        _call(*args)


@pytest.mark.parametrize('index', range(5), ids=_ARG_NAMES)
def test_engram_grad_w_reduce_rejects_layouts(index):
    args = list(_inputs(3, 4, 128, 'cpu'))
    bad = list(args)
    wide = torch.zeros(*args[index].shape[:-1], 256, dtype=args[index].dtype)
    bad[index] = wide[..., :128]  # rows 256 apart: not contiguous
    with pytest.raises(ValueError, match=f'{_ARG_NAMES[index]} must be contiguous'):
        _call(*bad)
    flat = torch.zeros(args[index].numel() + 1, dtype=args[index].dtype)
    bad[index] = flat[1:].view(args[index].shape)  # contiguous, one element off
    with pytest.raises(ValueError, match=f'{_ARG_NAMES[index]} must start at a 16-byte aligned address'):
        _call(*bad)


def test_engram_grad_w_reduce_rejects_aliasing():
    partial, wh, we, gwh, gwe = _inputs(3, 4, 128, 'cpu')
    with pytest.raises(ValueError, match='grad_weight_hidden and grad_weight_embed must not overlap'):
        _call(partial, wh, we, gwh, gwh)
    both = torch.zeros(2, 4, 128)  # adjacent halves of one buffer do not overlap: they pass to the device check
    with pytest.raises(RuntimeError, match='no kernels'):
        _call(partial, wh, we, both[0], both[1])
    with pytest.raises(ValueError, match='grad_weight_hidden .updated in place. must not alias the input grad_w_p'):
        _call(partial, wh, we, partial[1], gwe)
    with pytest.raises(ValueError, match='grad_weight_embed .updated in place. must not alias the input grad_w_p'):
        _call(partial, wh, we, gwh, partial[2])
    storage = torch.zeros(4 * 128 * 2)
    wh_alias = storage.view(torch.bfloat16)[: 4 * 128].view(4, 128)
    with pytest.raises(ValueError, match='grad_weight_embed .updated in place. must not alias the input weight_hidden'):
        _call(partial, wh_alias, we, gwh, storage[: 4 * 128].view(4, 128))


def test_engram_grad_w_reduce_rejects_devices():
    args = _inputs(3, 4, 128, 'cpu')
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(*args)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(args[0][:0], *args[1:])  # P = 0 is still validated first
    with pytest.raises(RuntimeError, match='one device'):
        _call(*args[:4], args[4].to('meta'))


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_grad_w_reduce_values(params, device):
    num_partials = params['num_partials']
    partial, wh, we, gwh, gwe = _inputs(num_partials, params['hc'], params['hidden'], device)
    inputs = (partial, wh, we, gwh, gwe)
    expected = engram_grad_w_reduce_ref(*inputs)
    scales = engram_grad_w_reduce_error_scale(*inputs)
    partial_before, wh_before, we_before = partial.clone(), wh.clone(), we.clone()

    result = cann_ops_tilelang.engram_grad_w_reduce(*inputs)

    assert isinstance(result, EngramGradWReduceResult)
    assert result.grad_weight_hidden is gwh  # updated in place
    assert result.grad_weight_embed is gwe
    for actual, exp, scale in zip(result, expected, scales, strict=True):
        _assert_reduced(actual, exp, scale, num_partials)
    assert torch.equal(partial, partial_before)  # inputs untouched
    assert torch.equal(wh, wh_before)
    assert torch.equal(we, we_before)


@pytest.mark.npu
def test_engram_grad_w_reduce_accumulates_twice(device):
    """A second call adds on top of the first (in-place accumulation, as in gradient accumulation)."""
    partial, wh, we, gwh, gwe = _inputs(20, 4, 4096, device)
    once = engram_grad_w_reduce_ref(partial, wh, we, gwh, gwe)
    twice = engram_grad_w_reduce_ref(partial, wh, we, *once)
    cann_ops_tilelang.engram_grad_w_reduce(partial, wh, we, gwh, gwe)
    cann_ops_tilelang.engram_grad_w_reduce(partial, wh, we, gwh, gwe)
    for actual, exp, scale in zip(
        (gwh, gwe), twice, engram_grad_w_reduce_error_scale(partial, wh, we, *once), strict=True
    ):
        _assert_reduced(actual, exp, 2 * scale, 2 * 20)


@pytest.mark.npu
def test_engram_grad_w_reduce_no_partials(device):
    partial, wh, we, gwh, gwe = _inputs(0, 4, 192, device)
    before = (gwh.clone(), gwe.clone())
    result = cann_ops_tilelang.engram_grad_w_reduce(partial, wh, we, gwh, gwe)
    assert result.grad_weight_hidden is gwh
    assert result.grad_weight_embed is gwe
    assert torch.equal(gwh, before[0])
    assert torch.equal(gwe, before[1])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_SHAPES, ids=make_param_id)
def test_engram_grad_w_reduce_benchmark(params, device, benchmark_timer, benchmark_record):
    partial, wh, we, gwh, gwe = _inputs(params['num_partials'], params['hc'], params['hidden'], device)
    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_grad_w_reduce(partial, wh, we, gwh, gwe))
    # Read partial, both weights and both gradients; write both gradients.
    num_bytes = count_bytes(partial, wh, we, gwh, gwe, gwh, gwe)
    benchmark_record(
        kernel='engram_grad_w_reduce',
        operation='reduce',
        params=params,
        time_us=time_us,
        bandwidth_gbs=num_bytes / time_us / 1e3,
        extras=config_extras(cann_ops_tilelang.engram_grad_w_reduce.operator.config(partial, wh, we, gwh, gwe)),
    )
