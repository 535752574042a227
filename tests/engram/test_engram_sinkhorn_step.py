"""engram_sinkhorn_step: lowering (CPU tier), argument contract (CPU tier), values and benchmark (device)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang import engram_sinkhorn_step
from cann_ops_tilelang.engram import EngramSinkhornStepResult
from cann_ops_tilelang.engram.engram_sinkhorn_step_kernel import (
    CUDA_NARROW_MAX_HEAD_DIM,
    choose_engram_sinkhorn_step_config,
    make_engram_sinkhorn_step_kernel,
)
from tests.engram.engram_sinkhorn_step_ref import col_sumsq_for_scale, engram_sinkhorn_step_ref
from tests.engram.lowering_grids import STEP_CUDA_VARIANTS as CUDA_VARIANTS
from tests.engram.lowering_grids import gen_sinkhorn_head_dim
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

KERNEL_NAME = 'engram_sinkhorn_step_kernel'
U32 = 2.0**-24  # unit roundoff of fp32
TINY = 2.0**-126
EPS = 1e-6
MAX_VALUE_ELEMS = 2**27  # value tests keep matrix + fp64 oracle within a few GB


def gen_sinkhorn_rows(level: int) -> list[int]:
    """Row counts: empty, one, fewer rows than workers, tails of every row tile, the benchmark sizes."""
    core = [0, 1, 130]
    default = [7, 1001, 10001]
    full = [100001]
    return list(dict.fromkeys(core + (default if level >= 1 else []) + (full if level >= 2 else [])))


LEVEL = get_test_level()
SHAPES = generate_samples(LEVEL, head_dim=gen_sinkhorn_head_dim)
VALUE_PARAMS = generate_samples(
    LEVEL,
    rows=gen_sinkhorn_rows,
    head_dim=gen_sinkhorn_head_dim,
    where=lambda s: s['rows'] * s['head_dim'] <= MAX_VALUE_ELEMS,
)
BENCHMARK_PARAMS = generate_samples(rows=[1001, 10001, 100001], head_dim=[256, 5120])


def sinkhorn_inputs(rows: int, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A matrix with entries of both signs and positive row / column scales of varied size."""
    matrix = torch.randn(rows, head_dim, device=device)
    row_scale = 0.25 + torch.rand(rows, device=device)
    col_scale = 0.5 + torch.rand(head_dim, device=device)
    return matrix, row_scale, col_scale


def norm_rel_bound(head_dim: int) -> float:
    """Relative error bound of an fp32 row norm against fp64: every x = (r m) c carries two roundings
    (its square four, plus one), any order of the head_dim additions (head_dim - 1) u, the square root
    halves that and adds one rounding."""
    return ((head_dim + 5) / 2 + 1.01) * U32


def max_rows_per_partial(cfg, rows: int) -> int:
    """Rows one worker adds up, at most: Ascend cores take row tiles round-robin, CUDA blocks even ranges."""
    if cfg.backend == 'ascend':
        tasks = -(-rows // cfg.rows_per_task)
        return -(-tasks // cfg.num_partials) * cfg.rows_per_task
    return -(-rows // cfg.num_partials)


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    err = (actual.double() - expected.double()).abs()
    bad = ~(err <= bound)  # NaN fails too
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f'{what}: {int(bad.sum())} of {actual.numel()} elements off; first at {first}: '
            f'{actual[first].item()!r} vs {expected[first].item()!r}, bound {bound[first].item():.3g}'
        )


def check_step(matrix, r_before, col_scale, result, r_after, eps, cfg) -> None:
    """The step's outputs against the fp64 oracle, with the bounds derived in the helpers above."""
    rows, head_dim = matrix.shape
    ref = engram_sinkhorn_step_ref(matrix, r_before, col_scale, eps)
    assert result.row_norm.dtype == torch.float32
    assert result.row_norm.shape == (rows,)
    eps_n = norm_rel_bound(head_dim)
    assert_within(result.row_norm, ref.row_norm, eps_n * ref.row_norm + TINY, 'row_norm')
    # row_scale' is the correctly rounded quotient of r and fl32(row_norm + eps), bit for bit (an fp64
    # quotient rounded to fp32 is the correctly rounded fp32 quotient).
    denom = (result.row_norm + eps).double()
    assert_equal(r_after, (r_before.double() / denom).float())
    assert_within(r_after, ref.row_scale, (eps_n + 3 * U32) * ref.row_scale.abs() + TINY, 'row_scale')
    # The partials: the column sums for the kernel's own row scale, each worker adding its rows in order
    # (one worker's sum: (rows per worker + W + 6) u of the sum, W <= 32 groups per CUDA block).
    partial = result.col_sumsq_partial
    assert partial.dtype == torch.float32
    assert partial.shape == (cfg.num_partials, head_dim)
    expected = col_sumsq_for_scale(matrix, r_after, col_scale)
    depth = max_rows_per_partial(cfg, rows) + 32 + 6
    assert_within(partial.double().sum(0), expected, depth * U32 * expected + TINY, 'sum of col_sumsq_partial')
    assert bool((partial >= 0).all())  # sums of squares
    assert int(partial.ne(0).any(dim=1).sum()) <= max(rows, 0)  # workers without rows contribute zeros


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_sinkhorn_step_ascend_lowers(params):
    cfg = choose_engram_sinkhorn_step_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.head_dim, cfg.num_partials) == ('ascend', params['head_dim'], ASCEND_950_VECTOR_CORES)
    assert cfg.rows_per_task * params['head_dim'] <= 8192  # 32 KB matrix tiles
    lowered = assert_ascend_kernel_lowers(
        lambda: make_engram_sinkhorn_step_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'rows' in lowered.source  # the row count stays a runtime argument
    assert 'vdiv_0ulp' in lowered.source  # the correctly rounded division


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_sinkhorn_step_cuda_lowers(params):
    cfg = choose_engram_sinkhorn_step_config(backend='cuda', **params, num_cores=H200_SMS)
    assert (cfg.backend, cfg.head_dim, cfg.num_partials) == ('cuda', params['head_dim'], 2 * H200_SMS)
    if params['head_dim'] <= CUDA_NARROW_MAX_HEAD_DIM:
        assert cfg.group_threads == 16  # half a warp per row
        assert cfg.chunks <= 8
        assert cfg.threads % 32 == 0  # whole warps of row groups
    else:
        assert cfg.group_threads % 32 == 0
        assert cfg.chunks <= 4  # four (chunks * 4)-float register arrays per thread
    assert cfg.threads <= 1024
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_sinkhorn_step_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'float4' in lowered.source  # 16-byte row loads
    assert 'atomic' not in lowered.source  # one partial per block


@pytest.mark.parametrize('variant', CUDA_VARIANTS, ids=make_param_id)
def test_engram_sinkhorn_step_cuda_variants_lower(variant):
    variant = dict(variant)
    base = choose_engram_sinkhorn_step_config(backend='cuda', head_dim=variant.pop('head_dim'), num_cores=H200_SMS)
    cfg = dataclasses.replace(base, **variant)
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_sinkhorn_step_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'float4' in lowered.source
    assert 'atomic' not in lowered.source
    assert ('__syncthreads' in lowered.source) == (cfg.rows_per_task > 1 or cfg.group_threads > 32)


def test_engram_sinkhorn_step_config_is_pure():
    a = choose_engram_sinkhorn_step_config(backend='cuda', head_dim=5120, num_cores=132)
    assert a == choose_engram_sinkhorn_step_config(backend='cuda', head_dim=5120, num_cores=132)
    assert hash(a) == hash(choose_engram_sinkhorn_step_config(backend='cuda', head_dim=5120, num_cores=132))
    assert (a.group_threads, a.chunks, a.rows_per_task) == (320, 4, 1)  # 1280 chunks over 320 threads
    assert (a.rows_in_flight, a.num_stages) == (1, 2)  # one row at a time, the next one prefetched
    b = choose_engram_sinkhorn_step_config(backend='cuda', head_dim=256, num_cores=132)
    assert (b.group_threads, b.chunks, b.rows_per_task) == (16, 4, 16)  # half a warp per row, 8 warps per block
    assert (b.rows_in_flight, b.num_stages) == (4, 1)  # four rows per group loaded before they are reduced
    c = choose_engram_sinkhorn_step_config(backend='cuda', head_dim=512, num_cores=132)
    assert (c.group_threads, c.chunks, c.rows_per_task, c.rows_in_flight, c.num_stages) == (16, 8, 8, 4, 1)
    e = choose_engram_sinkhorn_step_config(backend='cuda', head_dim=128, num_cores=132)
    assert (e.group_threads, e.chunks, e.rows_per_task, e.threads) == (16, 2, 24, 384)  # whole warps
    d = choose_engram_sinkhorn_step_config(backend='cuda', head_dim=1024, num_cores=132)
    assert (d.group_threads, d.chunks, d.rows_per_task, d.rows_in_flight, d.num_stages) == (64, 4, 5, 1, 2)
    with pytest.raises(ValueError, match='backend'):
        choose_engram_sinkhorn_step_config(backend='cpu', head_dim=256, num_cores=64)
    with pytest.raises(ValueError, match='head_dim'):
        choose_engram_sinkhorn_step_config(backend='ascend', head_dim=96, num_cores=64)


def test_engram_sinkhorn_step_signature_matches_tile_kernels():
    sig = inspect.signature(cann_ops_tilelang.engram_sinkhorn_step)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ('matrix', inspect.Parameter.empty),
        ('row_scale', inspect.Parameter.empty),
        ('col_scale', inspect.Parameter.empty),
        ('eps', inspect.Parameter.empty),
    ]


# ---------------------------------------------------------------- CPU tier: argument contract

_ARG_NAMES = ('matrix', 'row_scale', 'col_scale')


def _call(matrix, row_scale, col_scale, eps=EPS):
    return cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, eps)


@pytest.mark.parametrize('index', range(3), ids=_ARG_NAMES)
def test_engram_sinkhorn_step_rejects_non_tensors_and_dtypes(index):
    args = list(sinkhorn_inputs(5, 128, 'cpu'))
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=torch.float32,
        non_tensors=(args[index].numpy(), 1.0),
        wrong_dtype=torch.bfloat16,
    )


@pytest.mark.parametrize('index', range(3), ids=_ARG_NAMES)
def test_engram_sinkhorn_step_rejects_shapes(index):
    args = list(sinkhorn_inputs(5, 128, 'cpu'))
    assert_rejects_extra_dimension(_call, args, index, name=_ARG_NAMES[index])
    if index > 0:
        bad = list(args)
        bad[index] = args[index][1:].contiguous()
        expected = r'\(5,\)' if index == 1 else r'\(128,\)'
        with pytest.raises(ValueError, match=rf'{_ARG_NAMES[index]} must have shape {expected}'):
            _call(*bad)


@pytest.mark.parametrize('head_dim', [0, 32, 96, 8192 + 64])
def test_engram_sinkhorn_step_rejects_head_dim(head_dim):
    with pytest.raises(ValueError, match='head_dim must be a positive multiple of 64 up to 8192'):
        _call(*sinkhorn_inputs(3, head_dim, 'cpu'))


def test_engram_sinkhorn_step_rejects_scalars():
    args = sinkhorn_inputs(5, 128, 'cpu')
    for bad in ('1e-6', None, False):
        with pytest.raises(TypeError, match='eps must be a float'):
            _call(*args, bad)
    with pytest.raises(ValueError, match='eps must be a finite number'):
        _call(*args, float('nan'))


@pytest.mark.parametrize('index', range(3), ids=_ARG_NAMES)
def test_engram_sinkhorn_step_rejects_layouts(index):
    args = list(sinkhorn_inputs(5, 128, 'cpu'))
    bad = list(args)
    wide = torch.zeros(*args[index].shape[:-1], 2 * args[index].shape[-1])
    bad[index] = wide[..., ::2]
    with pytest.raises(ValueError, match=f'{_ARG_NAMES[index]} must be contiguous'):
        _call(*bad)
    if index != 1:  # row_scale is read element by element: any fp32 address
        flat = torch.zeros(args[index].numel() + 1)
        bad[index] = flat[1:].view(args[index].shape)
        with pytest.raises(ValueError, match=f'{_ARG_NAMES[index]} must start at a 16-byte aligned address'):
            _call(*bad)


def test_engram_sinkhorn_step_rejects_aliasing():
    matrix, _row_scale, col_scale = sinkhorn_inputs(128, 128, 'cpu')
    with pytest.raises(ValueError, match='row_scale .updated in place. must not alias the input matrix'):
        _call(matrix, matrix[3], col_scale)
    with pytest.raises(ValueError, match='row_scale .updated in place. must not alias the input col_scale'):
        _call(matrix, col_scale, col_scale)
    storage = torch.zeros(256)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):  # adjacent, not overlapping
        _call(matrix, storage[:128], storage[128:])


def test_engram_sinkhorn_step_rejects_devices():
    args = sinkhorn_inputs(5, 128, 'cpu')
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(*args)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(args[0][:0], args[1][:0], args[2])  # rows = 0 is still validated first
    with pytest.raises(RuntimeError, match='one device'):
        _call(args[0], args[1], args[2].to('meta'))
    huge = torch.empty(2**18 + 1, 8192, device='meta')
    with pytest.raises(ValueError, match='at most 2..31 - 1 elements'):
        _call(huge, torch.empty(2**18 + 1, device='meta'), torch.empty(8192, device='meta'))


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_step_values(params, device):
    rows, head_dim = params['rows'], params['head_dim']
    matrix, row_scale, col_scale = sinkhorn_inputs(rows, head_dim, device)
    m_before, r_before, c_before = matrix.clone(), row_scale.clone(), col_scale.clone()
    cfg = engram_sinkhorn_step.operator.config(matrix, row_scale, col_scale, EPS)

    result = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)

    assert isinstance(result, EngramSinkhornStepResult)
    row_norm, partial = result  # a plain 2-tuple for callers of the reference library
    assert row_norm.device == partial.device == matrix.device
    assert torch.equal(matrix, m_before)  # inputs other than row_scale untouched
    assert torch.equal(col_scale, c_before)
    check_step(matrix, r_before, col_scale, result, row_scale, EPS, cfg)


@pytest.mark.npu
@pytest.mark.parametrize(
    'params', [{'rows': 1001, 'head_dim': 256}, {'rows': 130, 'head_dim': 5120}], ids=make_param_id
)
def test_engram_sinkhorn_step_is_reproducible(params, device):
    """Fixed worker ranges and orders: the same inputs give bit-identical outputs, call after call."""
    matrix, row_scale, col_scale = sinkhorn_inputs(params['rows'], params['head_dim'], device)
    r0 = row_scale.clone()
    first = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
    r1 = row_scale.clone()
    for _ in range(3):
        row_scale.copy_(r0)
        again = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
        assert_equal(again.row_norm, first.row_norm)
        assert_equal(again.col_sumsq_partial, first.col_sumsq_partial)
        assert_equal(row_scale, r1)


# Level 0 runs the next tests at a head_dim of its values tests (one kernel per head_dim: compiled once).
@pytest.mark.npu
@pytest.mark.parametrize('head_dim', by_level(LEVEL, core=[256], default=[320]), ids=lambda d: f'head_dim={d}')
def test_engram_sinkhorn_step_iterates(head_dim, device):
    """Three steps in a row (the Sinkhorn loop without the column update): each against the oracle of its
    own input scale; after a step the row norms of the new iterate are 1 up to eps and rounding."""
    matrix, row_scale, col_scale = sinkhorn_inputs(777, head_dim, device)
    for _ in range(3):
        r_before = row_scale.clone()
        cfg = engram_sinkhorn_step.operator.config(matrix, row_scale, col_scale, EPS)
        result = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
        check_step(matrix, r_before, col_scale, result, row_scale, EPS, cfg)
    assert torch.allclose(result.row_norm, torch.ones_like(result.row_norm), rtol=1e-5, atol=0)


@pytest.mark.npu
@pytest.mark.parametrize('head_dim', by_level(LEVEL, core=[64], default=[192]), ids=lambda d: f'head_dim={d}')
def test_engram_sinkhorn_step_views_and_special_rows(head_dim, device):
    """A row-range view of a larger matrix (rows outside untouched); zero rows give norm 0 and scale r / eps."""
    big, r_big, col_scale = sinkhorn_inputs(300, head_dim, device)
    big[105:110] = 0.0
    matrix, row_scale = big[100:250], r_big[100:250]
    r_big_before = r_big.clone()
    cfg = engram_sinkhorn_step.operator.config(matrix, row_scale, col_scale, EPS)
    result = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
    assert torch.equal(r_big[:100], r_big_before[:100])
    assert torch.equal(r_big[250:], r_big_before[250:])
    check_step(matrix, r_big_before[100:250], col_scale, result, row_scale, EPS, cfg)
    assert_equal(result.row_norm[5:10], torch.zeros(5, device=device))


@pytest.mark.npu
def test_engram_sinkhorn_step_empty(device):
    matrix, row_scale, col_scale = sinkhorn_inputs(0, 256, device)
    cfg = engram_sinkhorn_step.operator.config(matrix, row_scale, col_scale, EPS)
    result = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
    assert result.row_norm.shape == (0,)
    assert_equal(result.col_sumsq_partial, torch.zeros(cfg.num_partials, 256, device=device))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_step_benchmark(params, device, benchmark_timer, benchmark_record):
    matrix, row_scale, col_scale = sinkhorn_inputs(params['rows'], params['head_dim'], device)
    result = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
    # Each call rescales row_scale again (the Sinkhorn loop); the traffic per call is the same.
    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS))
    # Read the matrix, both scales and row_scale; write row_scale, row_norm and the partials.
    num_bytes = count_bytes(matrix, row_scale, col_scale, row_scale, *result)
    benchmark_record(
        kernel='engram_sinkhorn_step',
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=num_bytes / time_us / 1e3,
        extras=config_extras(engram_sinkhorn_step.operator.config(matrix, row_scale, col_scale, EPS)),
    )
