"""engram_fused_weight: lowering (CPU tier), argument contract (CPU tier), values and benchmark (device)."""

from __future__ import annotations

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang import engram_fused_weight
from cann_ops_tilelang.engram.engram_fused_weight_kernel import (
    choose_engram_fused_weight_config,
    make_engram_fused_weight_kernel,
)
from tests.engram.engram_fused_weight_ref import engram_fused_weight_ref
from tests.testing.bench import config_extras, make_param_id
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
from tests.testing.numeric import assert_equal, count_bytes

KERNEL_NAME = 'engram_fused_weight_kernel'

LEVEL = get_test_level()
SHAPES = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden)
# The Engram benchmark grid without its token axis: the weights do not depend on T.
BENCHMARK_SHAPES = generate_samples(hc=[BENCHMARK_HC], hidden=BENCHMARK_HIDDEN)


def _weights(hc: int, hidden: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    wh = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    we = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    return wh.to(device), we.to(device)


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_fused_weight_ascend_lowers(params):
    cfg = choose_engram_fused_weight_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.hc, cfg.hidden, cfg.num_cores) == ('ascend', params['hc'], params['hidden'], 64)
    assert params['hidden'] % cfg.block == 0
    assert cfg.num_stages == 2
    assert_ascend_kernel_lowers(lambda: make_engram_fused_weight_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_fused_weight_cuda_lowers(params):
    cfg = choose_engram_fused_weight_config(backend='cuda', **params, num_cores=H200_SMS)
    assert (cfg.backend, cfg.hc, cfg.hidden) == ('cuda', params['hc'], params['hidden'])
    assert params['hidden'] % cfg.block == 0
    assert cfg.block <= 1024
    assert_cuda_kernel_lowers(lambda: make_engram_fused_weight_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_engram_fused_weight_config_is_pure_and_hashable():
    a = choose_engram_fused_weight_config(backend='ascend', hc=4, hidden=7168, num_cores=64)
    b = choose_engram_fused_weight_config(backend='ascend', hc=4, hidden=7168, num_cores=64)
    assert a == b
    assert hash(a) == hash(b)
    assert a.num_tasks >= 64  # every vector core gets a task at the benchmark shape
    with pytest.raises(ValueError, match='backend'):
        choose_engram_fused_weight_config(backend='cpu', hc=4, hidden=7168, num_cores=64)


# ---------------------------------------------------------------- CPU tier: argument contract


def test_engram_fused_weight_rejects_non_tensors():
    wh, we = _weights(4, 128, 'cpu')
    with pytest.raises(TypeError, match='weight_hidden must be a torch.Tensor'):
        cann_ops_tilelang.engram_fused_weight(wh.tolist(), we)
    with pytest.raises(TypeError, match='weight_embed must be a torch.Tensor'):
        cann_ops_tilelang.engram_fused_weight(wh, None)


def test_engram_fused_weight_rejects_dtypes():
    wh, we = _weights(4, 128, 'cpu')
    with pytest.raises(TypeError, match='weight_hidden must have dtype torch.bfloat16'):
        cann_ops_tilelang.engram_fused_weight(wh.float(), we)
    with pytest.raises(TypeError, match='weight_embed must have dtype torch.bfloat16'):
        cann_ops_tilelang.engram_fused_weight(wh, we.half())
    with pytest.raises(TypeError, match='out must have dtype torch.float32'):
        cann_ops_tilelang.engram_fused_weight(wh, we, out=torch.empty(4, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    ('hc', 'hidden', 'match'),
    [
        (0, 128, 'hc'),
        (9, 128, 'hc'),
        (4, 100, 'multiple of 64'),
        (4, 16384 + 64, 'multiple of 64 up to 16384'),
    ],
)
def test_engram_fused_weight_rejects_hc_hidden(hc, hidden, match):
    wh = torch.ones(hc, hidden, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        cann_ops_tilelang.engram_fused_weight(wh, wh.clone())


def test_engram_fused_weight_rejects_shapes():
    wh, we = _weights(4, 128, 'cpu')
    with pytest.raises(ValueError, match='weight_hidden must have 2 dimensions'):
        cann_ops_tilelang.engram_fused_weight(wh.unsqueeze(0), we)
    with pytest.raises(ValueError, match=r'weight_embed must have shape \(4, 128\)'):
        cann_ops_tilelang.engram_fused_weight(wh, we[:3])
    with pytest.raises(ValueError, match=r'out must have shape \(4, 128\)'):
        cann_ops_tilelang.engram_fused_weight(wh, we, out=torch.empty(4, 64))


def test_engram_fused_weight_rejects_layouts():
    wh, we = _weights(4, 256, 'cpu')
    strided = torch.ones(4, 256, 2, dtype=torch.bfloat16)[..., 0]
    with pytest.raises(ValueError, match='weight_hidden must be contiguous'):
        cann_ops_tilelang.engram_fused_weight(strided, we)
    with pytest.raises(ValueError, match='weight_embed must be contiguous'):
        cann_ops_tilelang.engram_fused_weight(wh, strided)
    misaligned = torch.ones(4 * 256 + 1, dtype=torch.bfloat16)[1:].view(4, 256)  # contiguous, 2-byte offset
    with pytest.raises(ValueError, match='weight_embed must start at a 16-byte aligned address'):
        cann_ops_tilelang.engram_fused_weight(wh, misaligned)
    with pytest.raises(ValueError, match='out must be contiguous'):
        cann_ops_tilelang.engram_fused_weight(wh, we, out=torch.empty(256, 4).t())
    out = torch.empty(4 * 256 + 1)[1:].view(4, 256)
    with pytest.raises(ValueError, match='out must start at a 16-byte aligned address'):
        cann_ops_tilelang.engram_fused_weight(wh, we, out=out)


def test_engram_fused_weight_rejects_aliasing_out():
    hc, hidden = 4, 128
    storage = torch.empty(hc * hidden * 4, dtype=torch.uint8)
    wh = storage[: hc * hidden * 2].view(torch.bfloat16).view(hc, hidden)
    we = torch.ones(hc, hidden, dtype=torch.bfloat16)
    out = storage.view(torch.float32).view(hc, hidden)  # overlaps weight_hidden
    with pytest.raises(ValueError, match='out must not alias the input weight_hidden'):
        cann_ops_tilelang.engram_fused_weight(wh, we, out=out)


def test_engram_fused_weight_rejects_devices():
    wh, we = _weights(4, 128, 'cpu')
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        cann_ops_tilelang.engram_fused_weight(wh, we)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        cann_ops_tilelang.engram_fused_weight(wh, we, out=torch.empty(4, 128))
    with pytest.raises(RuntimeError, match='out must be on cpu'):
        cann_ops_tilelang.engram_fused_weight(wh, we, out=torch.empty(4, 128, device='meta'))
    with pytest.raises(RuntimeError, match='one device'):
        cann_ops_tilelang.engram_fused_weight(wh, we.to('meta'))


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_fused_weight_values(params, device):
    wh, we = _weights(params['hc'], params['hidden'], device)
    out = cann_ops_tilelang.engram_fused_weight(wh, we)
    # Bit-exact: a product of two bf16 values (8 significant bits each) is exact in fp32.
    assert_equal(out, engram_fused_weight_ref(wh, we))

    buf = torch.full_like(out, float('nan'))  # poisoned: an element the kernel skips stays NaN
    res = cann_ops_tilelang.engram_fused_weight(wh, we, out=buf)
    assert res is buf
    assert_equal(buf, engram_fused_weight_ref(wh, we))


@pytest.mark.npu
def test_engram_fused_weight_special_values(device):
    """Signed zeros, subnormal and huge bf16 values, infinities (never inf * 0, which is NaN of any payload)."""
    hc, hidden = 3, 192
    tiny = torch.finfo(torch.bfloat16).tiny
    big = torch.finfo(torch.bfloat16).max
    pool = torch.tensor([0.0, -0.0, tiny, -tiny / 4, tiny / 128, big, -big, 1.0, -3.0, 1e-30, 7e30])
    wh = pool[torch.randint(len(pool), (hc, hidden))].to(torch.bfloat16)
    we = pool[torch.randint(len(pool), (hc, hidden))].to(torch.bfloat16)
    wh[0, :64] = float('inf')
    we[0, :64] = torch.tensor([1.0, -2.0, big, tiny]).repeat(16).to(torch.bfloat16)
    wh, we = wh.to(device), we.to(device)
    assert_equal(cann_ops_tilelang.engram_fused_weight(wh, we), engram_fused_weight_ref(wh, we))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_SHAPES, ids=make_param_id)
def test_engram_fused_weight_benchmark(params, device, benchmark_timer, benchmark_record):
    wh, we = _weights(params['hc'], params['hidden'], device)
    out = torch.empty(params['hc'], params['hidden'], dtype=torch.float32, device=device)
    cann_ops_tilelang.engram_fused_weight(wh, we, out=out)
    assert_equal(out, engram_fused_weight_ref(wh, we))

    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_fused_weight(wh, we, out=out))
    benchmark_record(
        kernel='engram_fused_weight',
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(wh, we, out) / time_us / 1e3,
        extras=config_extras(engram_fused_weight.operator.config(wh, we, out=out)),
    )
