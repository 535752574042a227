"""engram_sinkhorn_finalize: lowering (CPU tier), argument contract (CPU tier), values and benchmark (device)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang import engram_sinkhorn_finalize
from cann_ops_tilelang.engram.engram_sinkhorn_finalize_kernel import (
    choose_engram_sinkhorn_finalize_config,
    make_engram_sinkhorn_finalize_kernel,
)
from cann_ops_tilelang.engram.engram_sinkhorn_step_kernel import choose_engram_sinkhorn_step_config
from tests.engram.engram_sinkhorn_finalize_ref import engram_sinkhorn_finalize_ref
from tests.engram.lowering_grids import FINALIZE_CUDA_VARIANTS as CUDA_VARIANTS
from tests.engram.test_engram_sinkhorn_step import (
    EPS,
    MAX_VALUE_ELEMS,
    TINY,
    U32,
    assert_within,
    gen_sinkhorn_head_dim,
    gen_sinkhorn_rows,
    norm_rel_bound,
    sinkhorn_inputs,
)
from tests.testing.bench import config_extras, make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes

KERNEL_NAME = 'engram_sinkhorn_finalize_kernel'
ALPHA = 0.75

LEVEL = get_test_level()
SHAPES = generate_samples(LEVEL, head_dim=gen_sinkhorn_head_dim)
VALUE_PARAMS = generate_samples(
    LEVEL,
    rows=gen_sinkhorn_rows,
    head_dim=gen_sinkhorn_head_dim,
    where=lambda s: s['rows'] * s['head_dim'] <= MAX_VALUE_ELEMS,
)
BENCHMARK_PARAMS = generate_samples(rows=[1001, 10001, 100001], head_dim=[256, 5120])


def _check_values(out, matrix, row_scale, col_scale, eps, alpha) -> None:
    """Against the fp64 oracle: the norm within norm_rel_bound, then five roundings (the sum with eps, the
    quotient, alpha, and the two products)."""
    expected = engram_sinkhorn_finalize_ref(matrix, row_scale, col_scale, eps, alpha)
    bound = (norm_rel_bound(matrix.shape[1]) + 6 * U32) * expected.abs() + TINY
    assert_within(out, expected, bound, 'finalize')


def _check_matches_step(out, matrix, row_scale, col_scale, eps, alpha) -> None:
    """Bit for bit ((alpha * r') * M) * c with r' the row scale engram_sinkhorn_step computes (same norms)."""
    r = row_scale.clone()
    cann_ops_tilelang.engram_sinkhorn_step(matrix, r, col_scale, eps)
    assert_equal(out, ((alpha * r)[:, None] * matrix) * col_scale)


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_sinkhorn_finalize_ascend_lowers(params):
    cfg = choose_engram_sinkhorn_finalize_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.head_dim, cfg.num_cores) == ('ascend', params['head_dim'], ASCEND_950_VECTOR_CORES)
    step = choose_engram_sinkhorn_step_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert cfg.rows_per_task == step.rows_per_task
    lowered = assert_ascend_kernel_lowers(
        lambda: make_engram_sinkhorn_finalize_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'rows' in lowered.source
    assert 'vdiv_0ulp' in lowered.source


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_sinkhorn_finalize_cuda_lowers(params):
    cfg = choose_engram_sinkhorn_finalize_config(backend='cuda', **params, num_cores=H200_SMS)
    step = choose_engram_sinkhorn_step_config(backend='cuda', **params, num_cores=H200_SMS)
    # The step's row layout: the same threads add the same squares in the same order (same norms); the
    # row groups per block and rows per group do not change a row's sum.
    assert (cfg.group_threads, cfg.chunks) == (step.group_threads, step.chunks)
    assert cfg.threads <= 1024
    lowered = assert_cuda_kernel_lowers(
        lambda: make_engram_sinkhorn_finalize_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'float4' in lowered.source


@pytest.mark.parametrize('variant', CUDA_VARIANTS, ids=make_param_id)
def test_engram_sinkhorn_finalize_cuda_variants_lower(variant):
    variant = dict(variant)
    base = choose_engram_sinkhorn_finalize_config(backend='cuda', head_dim=variant.pop('head_dim'), num_cores=H200_SMS)
    cfg = dataclasses.replace(base, **variant)
    lowered = assert_cuda_kernel_lowers(
        lambda: make_engram_sinkhorn_finalize_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'float4' in lowered.source
    assert ('__syncthreads' in lowered.source) == (cfg.group_threads > 32)


def test_engram_sinkhorn_finalize_config_is_pure():
    a = choose_engram_sinkhorn_finalize_config(backend='cuda', head_dim=256, num_cores=132)
    assert a == choose_engram_sinkhorn_finalize_config(backend='cuda', head_dim=256, num_cores=132)
    assert (a.group_threads, a.rows_per_task, a.rows_in_flight, a.threads) == (16, 16, 1, 256)  # 16 rows per block
    with pytest.raises(ValueError, match='backend'):
        choose_engram_sinkhorn_finalize_config(backend='cpu', head_dim=256, num_cores=64)


def test_engram_sinkhorn_finalize_signature_matches_tile_kernels():
    sig = inspect.signature(cann_ops_tilelang.engram_sinkhorn_finalize)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ('matrix', inspect.Parameter.empty),
        ('row_scale', inspect.Parameter.empty),
        ('col_scale', inspect.Parameter.empty),
        ('eps', inspect.Parameter.empty),
        ('alpha', inspect.Parameter.empty),
        ('out', None),  # positional in the reference library too
    ]


# ---------------------------------------------------------------- CPU tier: argument contract

_ARG_NAMES = ('matrix', 'row_scale', 'col_scale')


def _call(matrix, row_scale, col_scale, eps=EPS, alpha=ALPHA, out=None):
    return cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, eps, alpha, out)


@pytest.mark.parametrize('index', range(3), ids=_ARG_NAMES)
def test_engram_sinkhorn_finalize_rejects_non_tensors_and_dtypes(index):
    args = list(sinkhorn_inputs(5, 128, 'cpu'))
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=torch.float32,
        non_tensors=(args[index].numpy(), 2),
        wrong_dtype=torch.float16,
    )


@pytest.mark.parametrize('index', range(3), ids=_ARG_NAMES)
def test_engram_sinkhorn_finalize_rejects_shapes(index):
    args = list(sinkhorn_inputs(5, 128, 'cpu'))
    assert_rejects_extra_dimension(_call, args, index, name=_ARG_NAMES[index])
    with pytest.raises(ValueError, match='head_dim must be a positive multiple of 64 up to 8192'):
        _call(*sinkhorn_inputs(5, 100, 'cpu'))


def test_engram_sinkhorn_finalize_rejects_scalars():
    args = sinkhorn_inputs(5, 128, 'cpu')
    with pytest.raises(TypeError, match='eps must be a float'):
        _call(*args, eps='1e-6')
    with pytest.raises(TypeError, match='alpha must be a float'):
        _call(*args, alpha=None)
    with pytest.raises(ValueError, match='alpha must be a finite number'):
        _call(*args, alpha=float('inf'))


def test_engram_sinkhorn_finalize_rejects_out():
    args = sinkhorn_inputs(5, 128, 'cpu')
    with pytest.raises(TypeError, match='out must have dtype torch.float32'):
        _call(*args, out=torch.empty(5, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r'out must have shape \(5, 128\)'):
        _call(*args, out=torch.empty(5, 64))
    with pytest.raises(ValueError, match='out must be contiguous'):
        _call(*args, out=torch.empty(128, 5).t())
    with pytest.raises(ValueError, match='out must start at a 16-byte aligned address'):
        _call(*args, out=torch.empty(5 * 128 + 1)[1:].view(5, 128))
    with pytest.raises(ValueError, match='out must not alias the input matrix'):
        _call(*args, out=args[0])
    storage = torch.zeros(6 * 128)
    with pytest.raises(ValueError, match='out must not alias the input row_scale'):
        _call(args[0], storage[:5], args[2], out=storage[:640].view(5, 128))
    with pytest.raises(RuntimeError, match='out must be on cpu'):
        _call(*args, out=torch.empty(5, 128, device='meta'))


def test_engram_sinkhorn_finalize_rejects_layouts_and_devices():
    matrix, row_scale, col_scale = sinkhorn_inputs(5, 128, 'cpu')
    with pytest.raises(ValueError, match='matrix must be contiguous'):
        _call(torch.zeros(5, 256)[:, ::2], row_scale, col_scale)
    with pytest.raises(ValueError, match='row_scale must be contiguous'):
        _call(matrix, torch.zeros(10)[::2], col_scale)
    with pytest.raises(ValueError, match='col_scale must start at a 16-byte aligned address'):
        _call(matrix, row_scale, torch.zeros(129)[1:])
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(matrix, row_scale, col_scale)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(matrix[:0], row_scale[:0], col_scale)  # rows = 0 is still validated first
    with pytest.raises(RuntimeError, match='one device'):
        _call(matrix, row_scale.to('meta'), col_scale)


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_finalize_values(params, device):
    rows, head_dim = params['rows'], params['head_dim']
    matrix, row_scale, col_scale = sinkhorn_inputs(rows, head_dim, device)
    inputs_before = [t.clone() for t in (matrix, row_scale, col_scale)]

    out = cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, ALPHA)

    assert out.dtype == torch.float32
    assert out.shape == (rows, head_dim)
    assert out.device == matrix.device
    for t, before in zip((matrix, row_scale, col_scale), inputs_before, strict=True):
        assert torch.equal(t, before)  # nothing is updated in place
    _check_values(out, matrix, row_scale, col_scale, EPS, ALPHA)
    _check_matches_step(out, matrix, row_scale, col_scale, EPS, ALPHA)

    buf = torch.full_like(out, float('nan'))  # poisoned: an element the kernel skips stays NaN
    res = cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, ALPHA, buf)
    assert res is buf
    assert_equal(buf, out)  # and the same bits on every call


@pytest.mark.npu
@pytest.mark.parametrize('alpha', [1.0, -2.5, 0.0], ids=lambda a: f'alpha={a}')
# Level 0: a head_dim of its values tests (the finalize and step kernels are compiled per head_dim).
@pytest.mark.parametrize('head_dim', by_level(LEVEL, core=[256], default=[1088]), ids=lambda d: f'head_dim={d}')
def test_engram_sinkhorn_finalize_alpha_and_views(alpha, head_dim, device):
    """Any finite alpha; a row-range view of a larger matrix and an `out` view inside a larger buffer
    (nothing written outside it); zero rows give zeros."""
    big, r_big, col_scale = sinkhorn_inputs(400, head_dim, device)
    big[10:12] = 0.0
    matrix, row_scale = big[3:303], r_big[3:303]
    out_big = torch.full((302, head_dim), float('nan'), device=device)
    out = out_big[1:301]
    cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, alpha, out=out)
    assert bool(out_big[0].isnan().all())
    assert bool(out_big[301].isnan().all())
    _check_values(out, matrix, row_scale, col_scale, EPS, alpha)
    _check_matches_step(out, matrix, row_scale, col_scale, EPS, alpha)
    assert bool((out[7:9] == 0).all())  # signed zeros: the sign of alpha * 0


@pytest.mark.npu
def test_engram_sinkhorn_finalize_empty(device):
    matrix, row_scale, col_scale = sinkhorn_inputs(0, 256, device)
    out = cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, ALPHA)
    assert out.shape == (0, 256)
    buf = torch.empty(0, 256, device=device)
    assert cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, ALPHA, buf) is buf


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_finalize_benchmark(params, device, benchmark_timer, benchmark_record):
    matrix, row_scale, col_scale = sinkhorn_inputs(params['rows'], params['head_dim'], device)
    out = torch.empty_like(matrix)
    cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, ALPHA, out)
    _check_matches_step(out, matrix, row_scale, col_scale, EPS, ALPHA)

    time_us = benchmark_timer(
        lambda: cann_ops_tilelang.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, ALPHA, out)
    )
    benchmark_record(
        kernel='engram_sinkhorn_finalize',
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(matrix, row_scale, col_scale, out) / time_us / 1e3,
        extras=config_extras(engram_sinkhorn_finalize.operator.config(matrix, row_scale, col_scale, EPS, ALPHA, out)),
    )
