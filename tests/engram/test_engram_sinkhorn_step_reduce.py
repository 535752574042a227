"""engram_sinkhorn_step_reduce: lowering (CPU tier), argument contract (CPU tier), values and benchmark (device)."""

from __future__ import annotations

import inspect

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang import engram_sinkhorn_step, engram_sinkhorn_step_reduce
from cann_ops_tilelang.engram.engram_sinkhorn_step_reduce_kernel import (
    choose_engram_sinkhorn_step_reduce_config,
    make_engram_sinkhorn_step_reduce_kernel,
)
from tests.engram.engram_sinkhorn_step_reduce_ref import (
    engram_sinkhorn_step_reduce_ordered,
    engram_sinkhorn_step_reduce_ref,
)
from tests.engram.engram_sinkhorn_step_ref import engram_sinkhorn_step_ref
from tests.engram.test_engram_sinkhorn_step import EPS, assert_within, gen_sinkhorn_head_dim, sinkhorn_inputs
from tests.testing.bench import config_extras, make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes

KERNEL_NAME = 'engram_sinkhorn_step_reduce_kernel'
U32 = 2.0**-24


def gen_num_partials(level: int) -> list[int]:
    """P: one, fewer than the CUDA segments, one over a multiple of them, the Ascend and H200 step's P,
    and more than one DMA step of partial rows."""
    core = [1, 3, 64, 264]
    default = [8, 9, 200]
    full = [1000]
    return list(dict.fromkeys(core + (default if level >= 1 else []) + (full if level >= 2 else [])))


LEVEL = get_test_level()
SHAPES = generate_samples(LEVEL, head_dim=gen_sinkhorn_head_dim)
VALUE_PARAMS = generate_samples(LEVEL, num_partials=gen_num_partials, head_dim=gen_sinkhorn_head_dim)
BENCHMARK_PARAMS = generate_samples(head_dim=[256, 5120])


def _partials(num_partials: int, head_dim: int, device) -> torch.Tensor:
    """Non-negative like real sums of squares, of widely varying size (so the order matters)."""
    return torch.rand(num_partials, head_dim, device=device) * torch.exp(
        4 * torch.randn(num_partials, 1, device=device)
    )


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_sinkhorn_step_reduce_ascend_lowers(params):
    cfg = choose_engram_sinkhorn_step_reduce_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.head_dim, cfg.num_segments) == ('ascend', params['head_dim'], 1)
    assert params['head_dim'] % cfg.block_cols == 0
    lowered = assert_ascend_kernel_lowers(
        lambda: make_engram_sinkhorn_step_reduce_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'num_partials' in lowered.source  # P stays a runtime argument


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_sinkhorn_step_reduce_cuda_lowers(params):
    cfg = choose_engram_sinkhorn_step_reduce_config(backend='cuda', **params, num_cores=H200_SMS)
    assert (cfg.backend, cfg.head_dim, cfg.num_segments) == ('cuda', params['head_dim'], 8)
    lowered = assert_cuda_kernel_lowers(
        lambda: make_engram_sinkhorn_step_reduce_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'num_partials' in lowered.source
    assert 'atomic' not in lowered.source  # a fixed order, no atomics


def test_engram_sinkhorn_step_reduce_config_is_pure():
    a = choose_engram_sinkhorn_step_reduce_config(backend='ascend', head_dim=5120, num_cores=64)
    assert a == choose_engram_sinkhorn_step_reduce_config(backend='ascend', head_dim=5120, num_cores=64)
    assert a.num_tiles <= 64  # one round of the vector cores
    with pytest.raises(ValueError, match='backend'):
        choose_engram_sinkhorn_step_reduce_config(backend='cpu', head_dim=256, num_cores=64)


def test_engram_sinkhorn_step_reduce_order_reference_is_the_documented_order():
    """The replay helper itself: sequential order for one segment, segment sums added in order for more."""
    partial = torch.tensor([[1.0], [2.0**-24], [2.0**-24], [-1.0]])
    # One segment: 1 + 2**-24 rounds back to 1 (a tie, to even) twice, then 1 - 1 = 0.
    assert engram_sinkhorn_step_reduce_ordered(partial, 1).item() == 0.0
    # Two segments of two rows: 1 and 2**-24 - 1 (exact in fp32), then their sum 2**-24.
    assert engram_sinkhorn_step_reduce_ordered(partial, 2).item() == 2.0**-24
    # Eight segments of one row (four empty): ((1 + 2**-24) + 2**-24) - 1 = 0 again.
    assert engram_sinkhorn_step_reduce_ordered(partial, 8).item() == 0.0


def test_engram_sinkhorn_step_reduce_signature_matches_tile_kernels():
    sig = inspect.signature(cann_ops_tilelang.engram_sinkhorn_step_reduce)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ('col_sumsq_partial', inspect.Parameter.empty),
        ('col_sumsq', inspect.Parameter.empty),
    ]


# ---------------------------------------------------------------- CPU tier: argument contract

_ARG_NAMES = ('col_sumsq_partial', 'col_sumsq')


def _call(partial, col_sumsq):
    return cann_ops_tilelang.engram_sinkhorn_step_reduce(partial, col_sumsq)


def _args(num_partials=5, head_dim=128):
    return [_partials(num_partials, head_dim, 'cpu'), torch.zeros(head_dim)]


@pytest.mark.parametrize('index', range(2), ids=_ARG_NAMES)
def test_engram_sinkhorn_step_reduce_rejects_non_tensors_and_dtypes(index):
    args = _args()
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=torch.float32,
        non_tensors=(args[index].tolist(), None),
        wrong_dtype=torch.float64,
    )


def test_engram_sinkhorn_step_reduce_rejects_shapes():
    args = _args()
    for index in range(2):
        assert_rejects_extra_dimension(_call, args, index, name=_ARG_NAMES[index])
    with pytest.raises(ValueError, match=r'col_sumsq must have shape \(128,\)'):
        _call(args[0], torch.zeros(64))
    for head_dim in (0, 96, 8192 + 64):
        with pytest.raises(ValueError, match='head_dim must be a positive multiple of 64 up to 8192'):
            _call(torch.zeros(3, head_dim), torch.zeros(head_dim))


def test_engram_sinkhorn_step_reduce_rejects_layouts():
    partial, col_sumsq = _args()
    with pytest.raises(ValueError, match='col_sumsq_partial must be contiguous'):
        _call(torch.zeros(5, 256)[:, ::2], col_sumsq)
    with pytest.raises(ValueError, match='col_sumsq must be contiguous'):
        _call(partial, torch.zeros(256)[::2])
    with pytest.raises(ValueError, match='col_sumsq_partial must start at a 16-byte aligned address'):
        _call(torch.zeros(5 * 128 + 1)[1:].view(5, 128), col_sumsq)
    with pytest.raises(ValueError, match='col_sumsq must start at a 16-byte aligned address'):
        _call(partial, torch.zeros(129)[1:])


def test_engram_sinkhorn_step_reduce_rejects_aliasing_and_devices():
    partial, col_sumsq = _args()
    with pytest.raises(ValueError, match='col_sumsq .written in place. must not alias the input col_sumsq_partial'):
        _call(partial, partial[2])
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(partial, col_sumsq)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(partial[:0], col_sumsq)  # P = 0 is still validated first
    with pytest.raises(RuntimeError, match='one device'):
        _call(partial, col_sumsq.to('meta'))


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_step_reduce_values(params, device):
    num_partials, head_dim = params['num_partials'], params['head_dim']
    partial = _partials(num_partials, head_dim, device)
    partial_before = partial.clone()
    col_sumsq = torch.full((head_dim,), float('nan'), device=device)  # poisoned: every column is written
    cfg = engram_sinkhorn_step_reduce.operator.config(partial, col_sumsq)

    result = cann_ops_tilelang.engram_sinkhorn_step_reduce(partial, col_sumsq)

    assert result is col_sumsq
    assert torch.equal(partial, partial_before)
    # Bit for bit the documented order of the device's configuration.
    assert_equal(col_sumsq, engram_sinkhorn_step_reduce_ordered(partial, cfg.num_segments))
    # And within (P + S) u of the sum of the (non-negative) partials of the fp64 sum.
    exact = engram_sinkhorn_step_reduce_ref(partial)
    assert_within(col_sumsq, exact, (num_partials + cfg.num_segments + 1) * U32 * exact, 'col_sumsq')
    # Reproducible: repeated calls give the same bits.
    for _ in range(3):
        again = torch.full_like(col_sumsq, float('nan'))
        cann_ops_tilelang.engram_sinkhorn_step_reduce(partial, again)
        assert_equal(again, col_sumsq)


@pytest.mark.npu
def test_engram_sinkhorn_step_reduce_no_partials(device):
    col_sumsq = torch.full((256,), float('nan'), device=device)
    result = cann_ops_tilelang.engram_sinkhorn_step_reduce(torch.zeros(0, 256, device=device), col_sumsq)
    assert result is col_sumsq
    assert_equal(col_sumsq, torch.zeros(256, device=device))  # the empty sum


@pytest.mark.npu
@pytest.mark.parametrize(
    'params', [{'rows': 10001, 'head_dim': 256}, {'rows': 1001, 'head_dim': 5120}], ids=make_param_id
)
def test_engram_sinkhorn_step_then_reduce(params, device):
    """step + reduce is the column sum of squares of the updated iterate (the spec's pair of calls)."""
    matrix, row_scale, col_scale = sinkhorn_inputs(params['rows'], params['head_dim'], device)
    ref = engram_sinkhorn_step_ref(matrix, row_scale, col_scale, EPS)
    _, partial = cann_ops_tilelang.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
    col_sumsq = torch.empty(params['head_dim'], device=device)
    cann_ops_tilelang.engram_sinkhorn_step_reduce(partial, col_sumsq)
    # The step's r' is within ~(D / 2) u of the oracle's, which the squares double; the sums add rows u.
    bound = ((params['head_dim'] + 12) + params['rows'] + partial.shape[0] + 64) * U32 * ref.col_sumsq
    assert_within(col_sumsq, ref.col_sumsq, bound, 'col_sumsq after step + reduce')


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_step_reduce_benchmark(params, device, benchmark_timer, benchmark_record):
    """Partials of the shape engram_sinkhorn_step makes on this device (its P, which the cluster implies)."""
    head_dim = params['head_dim']
    matrix, row_scale, col_scale = sinkhorn_inputs(1, head_dim, device)
    num_partials = engram_sinkhorn_step.operator.config(matrix, row_scale, col_scale, EPS).num_partials
    partial = _partials(num_partials, head_dim, device)
    col_sumsq = torch.empty(head_dim, device=device)
    cann_ops_tilelang.engram_sinkhorn_step_reduce(partial, col_sumsq)
    cfg = engram_sinkhorn_step_reduce.operator.config(partial, col_sumsq)
    assert_equal(col_sumsq, engram_sinkhorn_step_reduce_ordered(partial, cfg.num_segments))

    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_sinkhorn_step_reduce(partial, col_sumsq))
    benchmark_record(
        kernel='engram_sinkhorn_step_reduce',
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(partial, col_sumsq) / time_us / 1e3,
        extras=config_extras(cfg),
    )
