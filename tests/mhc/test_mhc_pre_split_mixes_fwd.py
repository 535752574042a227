"""Tests of mhc_pre_split_mixes_fwd.

CPU tier: the argument contract on CPU tensors, the torch.library form on fake tensors. Device tier (`npu`;
the Ascend kernel on the emulator with `--ascend-emulator`): the three mixes against the float64 reference for
every mhc_mult of the level, 0 tokens, the configuration, opcheck; the benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_pre_split_mixes_fwd
from cann_ops_tilelang.mhc._mixes_kernel import choose_mhc_mixes_config
from cann_ops_tilelang.mhc.mhc_pre_split_mixes_fwd import MhcPreSplitMixesFwdResult
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.numeric import assert_close, count_bytes
from tests.testing.timing import record_name

from .mhc_pre_split_mixes_fwd_ref import mhc_pre_split_mixes_fwd_ref
from .mixes_cases import BENCHMARK_MULT, BENCHMARK_TOKENS, gen_mhc_mult, gen_num_tokens, logits

POST_MULT, EPS = 2.0, 1e-2
PARAMS = generate_samples(get_test_level(), mhc_mult=gen_mhc_mult, num_tokens=gen_num_tokens)
BENCHMARK_PARAMS = generate_samples(mhc_mult=[BENCHMARK_MULT], num_tokens=BENCHMARK_TOKENS)
FORM = mhc_pre_split_mixes_fwd.operator.forms['mhc_pre_split_mixes_fwd']


def make_args(num_tokens: int, mhc_mult: int, device='cpu') -> list:
    width = mhc_mult * (mhc_mult + 2)
    nan = float('nan')
    return [
        logits(num_tokens, width, device),
        torch.rand(3, device=device) + 0.5,
        torch.randn(width, device=device),
        torch.full((num_tokens, mhc_mult), nan, device=device),
        torch.full((num_tokens, mhc_mult), nan, device=device),
        torch.full((num_tokens, mhc_mult * mhc_mult), nan, device=device),
        POST_MULT,
        EPS,
    ]


# CPU tier: the argument contract.


@pytest.mark.parametrize(
    ('index', 'make', 'error', 'match'),
    [
        (0, lambda a: a.tolist(), TypeError, 'input_mixes must be a torch.Tensor'),
        (0, lambda a: a.double(), TypeError, 'input_mixes must have dtype torch.float32'),
        (0, lambda a: torch.ones(5, 25), ValueError, r'input_mixes.shape\[1\] must be mhc_mult \* \(mhc_mult \+ 2\)'),
        (1, lambda a: torch.ones(1), ValueError, r'mhc_scale must have shape \(3,\)'),
        (2, lambda a: torch.ones(23), ValueError, r'mhc_base must have shape \(24,\)'),
        (4, lambda a: torch.ones(5, 3), ValueError, r'post_layer_mix must have shape \(5, 4\)'),
        (5, lambda a: torch.ones(5, 4, 4), ValueError, 'comb_res_mix must have 2 dimensions'),
        (5, lambda a: torch.ones(16, 5).t(), ValueError, 'comb_res_mix must be contiguous'),
        (6, lambda a: float('inf'), ValueError, 'mhc_post_mult_value'),
    ],
    ids=['non-tensor', 'dtype', 'width', 'scale', 'base', 'post', 'comb-rank', 'comb-strides', 'post-mult'],
)
def test_mhc_pre_split_mixes_fwd_rejects(index, make, error, match):
    args = make_args(5, 4)
    args[index] = make(args[index])
    with pytest.raises(error, match=match):
        mhc_pre_split_mixes_fwd(*args)


def test_mhc_pre_split_mixes_fwd_rejects_sizes_and_overlap():
    with pytest.raises(ValueError, match=r'mhc_mult \(pre_layer_mix.shape\[1\]\) must be in \[1, 8\], got 9'):
        mhc_pre_split_mixes_fwd(*make_args(3, 9))
    args = make_args(5, 4)
    args[4] = args[3]  # post written over pre
    with pytest.raises(ValueError, match='post_layer_mix'):
        mhc_pre_split_mixes_fwd(*args)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_pre_split_mixes_fwd(*make_args(0, 4))


def test_mhc_pre_split_mixes_fwd_traced():
    schema = FORM._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('pre_layer_mix', 'post_layer_mix', 'comb_res_mix')
    with FakeTensorMode():
        args = make_args(40, 4, 'cuda')
        result = mhc_pre_split_mixes_fwd(*args)
        assert isinstance(result, MhcPreSplitMixesFwdResult)
        assert all(r is a for r, a in zip(result, args[3:6], strict=True))
        assert FORM(*args) is None
        with pytest.raises(TypeError, match='input_mixes must have dtype torch.float32'):
            FORM(args[0].half(), *args[1:])
    record = GraphRecorder()

    def step(*args):
        pre, post, comb = mhc_pre_split_mixes_fwd(*args, POST_MULT, EPS)
        return pre + post, comb

    with FakeTensorMode():
        args = make_args(40, 4, 'cuda')[:6]
        torch.compile(step, fullgraph=True, backend=record)(*args)
    assert len(record.graphs) == 1
    assert str(FORM) in record.targets()


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_pre_split_mixes_fwd_values(params, device):
    mhc_mult = params['mhc_mult']
    args = make_args(params['num_tokens'], mhc_mult, device)
    result = mhc_pre_split_mixes_fwd(*args)  # the buffers were NaN: every element is written
    assert all(r is a for r, a in zip(result, args[3:6], strict=True))
    expected = mhc_pre_split_mixes_fwd_ref(*args[:3], mhc_mult, POST_MULT, EPS)
    for actual, ref in zip(result, expected, strict=True):
        assert_close(actual.double(), ref, atol=1e-6, rtol=1e-6)


@pytest.mark.npu
def test_mhc_pre_split_mixes_fwd_empty_and_config(device):
    args = make_args(0, 3, device)
    assert tuple(mhc_pre_split_mixes_fwd(*args)) == tuple(args[3:6])
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_mixes_config(backend=backend, num_cores=num_cores, kind='split_fwd', mhc_mult=3)
    assert mhc_pre_split_mixes_fwd.operator.config(*args) == expected


@pytest.mark.npu
def test_mhc_pre_split_mixes_fwd_opcheck(device):
    torch.library.opcheck(FORM, tuple(make_args(37, 4, device)))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_pre_split_mixes_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    args = make_args(params['num_tokens'], params['mhc_mult'], device)
    mhc_pre_split_mixes_fwd(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_pre_split_mixes_fwd(*args))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_pre_split_mixes_fwd'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*args[:6]) / time_us / 1e3,
    )
