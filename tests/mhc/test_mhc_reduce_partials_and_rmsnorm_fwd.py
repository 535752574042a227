"""Tests of mhc_reduce_partials_and_rmsnorm_fwd (the split-K partials of the prenorm GEMM summed in split order,
then the RMS normalisation).

CPU tier: the pure configuration chooser, both kernels lowering for the level's shapes (every mhc_mult from 1
to 8 from level 1, n_splits > 1 and several RMS groups on both backends), the contract's typed errors on CPU
tensors, the torch.library form on fake tensors. Device tier (`npu`; the Ascend kernel on the emulator with
--ascend-emulator): values against the float64 reference, the prenorm GEMM end to end from its partials, empty
inputs, bit-identical repeated calls, the configuration a call launches, opcheck; the benchmark with the
peer's shapes.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_reduce_partials_and_rmsnorm_fwd
from cann_ops_tilelang.mhc.mhc_reduce_partials_and_rmsnorm_fwd_kernel import (
    choose_mhc_reduce_partials_and_rmsnorm_fwd_config,
    make_mhc_reduce_partials_and_rmsnorm_fwd_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_close, assert_equal, count_bytes
from tests.testing.timing import record_name

from .mhc_reduce_partials_and_rmsnorm_fwd_ref import (
    mhc_reduce_partials_and_rmsnorm_fwd_ref,
    prenorm_gemm_partials,
    prenorm_mixes,
)
from .norm_fn_cases import (
    BENCHMARK_HIDDEN,
    BENCHMARK_MHC_MULT,
    BENCHMARK_SPLITS,
    BENCHMARK_TOKENS,
    mhc_mult3,
    reduce_fwd_shapes,
)

KERNEL_NAME = 'mhc_reduce_partials_and_rmsnorm_fwd_kernel'
PARAMS = reduce_fwd_shapes(get_test_level())
CORE = reduce_fwd_shapes(0)[0]  # the configuration of the tests whose point is not a shape
GROUP_SIZE, EPS = 4 * 2560, 1e-6
BENCHMARK_PARAMS = generate_samples(
    tokens=BENCHMARK_TOKENS, hidden=BENCHMARK_HIDDEN, mhc_mult=(BENCHMARK_MHC_MULT,), n_splits=(BENCHMARK_SPLITS,)
)


def make_config(backend: str, params: dict):
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_reduce_partials_and_rmsnorm_fwd_config(
        backend=backend, mhc_mult3=params['m3'], groups=params['groups'], n_splits=params['n_splits'],
        num_cores=num_cores,
    )  # fmt: skip


def make_inputs(params: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials of a GEMM over GROUP_SIZE columns per group: products ~ N(0, GROUP_SIZE / S), square sums
    ~ GROUP_SIZE / S each (positive)."""
    s, t, g, m3 = params['n_splits'], params['tokens'], params['groups'], params['m3']
    scale = (GROUP_SIZE / s) ** 0.5
    out_mul_splitted = torch.randn(s, t, g, m3, device=device) * scale
    sqrsum_splitted = (torch.rand(s, t, g, device=device) + 0.5) * (GROUP_SIZE / s)
    return out_mul_splitted, sqrsum_splitted


def make_outputs(params: dict, device) -> tuple[torch.Tensor, ...]:
    """The three output buffers, poisoned: an element the kernel skips stays NaN."""
    t, g, m3 = params['tokens'], params['groups'], params['m3']
    return tuple(torch.full(shape, float('nan'), device=device) for shape in ((t, g, m3), (t, g), (t, m3)))


# CPU tier: configuration and lowering.


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_reduce_partials_and_rmsnorm_fwd_kernel_lowers(params, backend):
    cfg = make_config(backend, params)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lower(lambda: make_mhc_reduce_partials_and_rmsnorm_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_mhc_reduce_partials_and_rmsnorm_fwd_config_is_pure():
    params = {'n_splits': 16, 'groups': 1, 'm3': 24}
    a = make_config('ascend', params)
    assert a == make_config('ascend', params)
    assert hash(a)
    assert a.tokens == 64  # 64 tokens x 24 mixes (rows of 32 bytes): 6 KB tiles
    assert make_config('ascend', {'n_splits': 1, 'groups': 16, 'm3': 80}).tokens == 8  # the smallest task
    c = make_config('cuda', params)
    assert (c.tokens, c.threads) == (10, 256)  # 240 outputs, one thread each, in whole warps


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [({'mhc_mult3': 81}, r'in \[1, 80\]'), ({'groups': 17}, r'groups in \[1, 16\]'), ({'n_splits': 0}, 'n_splits')],
)
def test_mhc_reduce_partials_and_rmsnorm_fwd_config_rejects_sizes(kwargs, match):
    sizes = {'mhc_mult3': 24, 'groups': 1, 'n_splits': 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        choose_mhc_reduce_partials_and_rmsnorm_fwd_config(backend='cuda', num_cores=H200_SMS, **sizes)


# CPU tier: the argument contract (validation runs before the device guard).


def _args(s=2, t=5, g=1, m3=24, device='cpu', **changes):
    args = {
        'out_mul_splitted': torch.zeros(s, t, g, m3, device=device),
        'sqrsum_splitted': torch.zeros(s, t, g, device=device),
        'out_mul': torch.zeros(t, g, m3, device=device),
        'sqrsum': torch.zeros(t, g, device=device),
        'out': torch.zeros(t, m3, device=device),
        'rms_group_size': 256,
        'rms_eps': 1e-6,
        'n_splits': s,
    }
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ('changes', 'error', 'match'),
    [
        ({'out_mul_splitted': 1.0}, TypeError, 'out_mul_splitted must be a torch.Tensor, got float'),
        ({'sqrsum_splitted': torch.zeros(2, 5, 1, dtype=torch.bfloat16)}, TypeError, 'sqrsum_splitted must have dtype'),
        ({'out': torch.zeros(5, 24, dtype=torch.float64)}, TypeError, 'out must have dtype torch.float32'),
        ({'out_mul_splitted': torch.zeros(2, 5, 24)}, ValueError, 'out_mul_splitted must have 4 dimensions'),
        ({'sqrsum_splitted': torch.zeros(2, 6, 1)}, ValueError, 'sqrsum_splitted must have shape'),
        ({'out_mul': torch.zeros(5, 1, 25)}, ValueError, 'out_mul must have shape'),
        ({'sqrsum': torch.zeros(5, 2)}, ValueError, 'sqrsum must have shape'),
        ({'out': torch.zeros(4, 24)}, ValueError, 'out must have shape'),
        ({'out': torch.zeros(24, 5).t()}, ValueError, 'out must be contiguous'),
        ({'n_splits': 3}, ValueError, r'n_splits \(3\) must be the first size of out_mul_splitted \(2\)'),
        ({'n_splits': 2.0}, TypeError, 'n_splits'),
        ({'rms_group_size': 0}, ValueError, 'rms_group_size must be >= 1'),
        ({'rms_eps': -1e-6}, ValueError, 'rms_eps must be >= 0'),
        ({'rms_eps': float('nan')}, ValueError, 'rms_eps'),
    ],
    ids=['type', 'sq-dtype', 'out-dtype', 'rank', 'sq-tokens', 'out_mul-mixes', 'sqrsum-groups', 'out-tokens',
         'out-layout', 'n_splits', 'n_splits-type', 'group-size', 'eps-negative', 'eps-nan'],
)  # fmt: skip
def test_mhc_reduce_partials_and_rmsnorm_fwd_rejects_arguments(changes, error, match):
    with pytest.raises(error, match=match):
        mhc_reduce_partials_and_rmsnorm_fwd(**_args(**changes))


@pytest.mark.parametrize(
    ('sizes', 'match'),
    [({'m3': 81}, r'mhc_mult3 \(rows of fn\) must be in \[1, 80\]'), ({'g': 17}, r'RMS groups must be in \[1, 16\]')],
)
def test_mhc_reduce_partials_and_rmsnorm_fwd_rejects_sizes(sizes, match):
    with pytest.raises(ValueError, match=match):
        mhc_reduce_partials_and_rmsnorm_fwd(**_args(**sizes))


def test_mhc_reduce_partials_and_rmsnorm_fwd_rejects_too_many_tokens():
    args = _args(s=16, t=2**24, m3=24, device='meta')  # no memory behind a meta tensor
    with pytest.raises(ValueError, match='exceed the int32 index range'):
        mhc_reduce_partials_and_rmsnorm_fwd(**args)


@pytest.mark.parametrize(('written', 'other'), [('out_mul', 'out_mul_splitted'), ('sqrsum', 'sqrsum_splitted')])
def test_mhc_reduce_partials_and_rmsnorm_fwd_rejects_overlap(written, other):
    args = _args(s=1)
    args[written] = args[other][0]
    with pytest.raises(ValueError, match=written):
        mhc_reduce_partials_and_rmsnorm_fwd(**args)


def test_mhc_reduce_partials_and_rmsnorm_fwd_refuses_cpu_tensors():
    for t in (5, 0):  # no CPU fallback, not even without tokens
        with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
            mhc_reduce_partials_and_rmsnorm_fwd(**_args(t=t))


# CPU tier: the torch.library form, on fake tensors.

FORMS = mhc_reduce_partials_and_rmsnorm_fwd.operator.forms
NAME = 'mhc_reduce_partials_and_rmsnorm_fwd'


def test_mhc_reduce_partials_and_rmsnorm_fwd_is_registered():
    assert OPERATORS[NAME] is mhc_reduce_partials_and_rmsnorm_fwd.operator
    assert list(FORMS) == [NAME]
    assert getattr(torch.ops, NAMESPACE).mhc_reduce_partials_and_rmsnorm_fwd.default is FORMS[NAME]
    schema = FORMS[NAME]._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('out_mul', 'sqrsum', 'out')
    assert not schema.returns


def test_mhc_reduce_partials_and_rmsnorm_fwd_fake_calls():
    with FakeTensorMode():
        args = _args(s=16, t=130, device='cuda')
        result = mhc_reduce_partials_and_rmsnorm_fwd(**args)
        assert (result.out_mul, result.sqrsum, result.out) == (args['out_mul'], args['sqrsum'], args['out'])
        assert FORMS[NAME](*args.values()) is None
        with pytest.raises(ValueError, match='n_splits'):
            mhc_reduce_partials_and_rmsnorm_fwd(**{**args, 'n_splits': 4})


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_reduce_partials_and_rmsnorm_fwd_values(params, device):
    out_mul_splitted, sqrsum_splitted = make_inputs(params, device)
    outputs = make_outputs(params, device)
    result = mhc_reduce_partials_and_rmsnorm_fwd(
        out_mul_splitted, sqrsum_splitted, *outputs, GROUP_SIZE, EPS, params['n_splits']
    )
    assert all(a is b for a, b in zip(result, outputs, strict=True))
    expected = mhc_reduce_partials_and_rmsnorm_fwd_ref(out_mul_splitted, sqrsum_splitted, GROUP_SIZE, EPS)
    scale = GROUP_SIZE**0.5  # of out_mul and of each group's term of out (1/rms is about 1)
    # fp32 sums of n_splits terms, then of `groups` terms, which may cancel: errors of a few ulps of the terms.
    assert_close(result.out_mul.double(), expected[0], atol=1e-6 * scale, rtol=1e-5)
    assert_close(result.sqrsum.double(), expected[1], atol=0, rtol=1e-5)
    assert_close(result.out.double(), expected[2], atol=2e-6 * scale * params['groups'] ** 0.5, rtol=1e-5)


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_fwd_prenorm_gemm(device):
    """The partials of a real split-K GEMM (x of the core's tokens, fn of 24 rows): out is the prenorm GEMM's
    RMS-normalised mixes, (x @ fn^T) / rms(x)."""
    n_splits, tokens, m3, hidden = CORE['n_splits'], CORE['tokens'], CORE['m3'], 4 * 256
    x = torch.randn(tokens, hidden, device=device)
    fn = torch.randn(m3, hidden, device=device) / hidden**0.5
    out_mul_splitted, sqrsum_splitted = prenorm_gemm_partials(x, fn, n_splits)
    outputs = make_outputs(CORE, device)
    mhc_reduce_partials_and_rmsnorm_fwd(out_mul_splitted, sqrsum_splitted, *outputs, hidden, EPS, n_splits)
    assert_close(outputs[2].double(), prenorm_mixes(x, fn, EPS), atol=1e-5, rtol=1e-5)
    assert_close(outputs[1].double()[:, 0], x.double().square().sum(-1), atol=0, rtol=1e-5)


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_fwd_empty(device):
    """No token: nothing is launched, the (empty) buffers come back."""
    params = {**CORE, 'tokens': 0}
    outputs = make_outputs(params, device)
    result = mhc_reduce_partials_and_rmsnorm_fwd(*make_inputs(params, device), *outputs, GROUP_SIZE, EPS, 16)
    assert all(a is b for a, b in zip(result, outputs, strict=True))


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_fwd_is_deterministic(device):
    inputs = make_inputs(CORE, device)
    first, second = make_outputs(CORE, device), make_outputs(CORE, device)
    mhc_reduce_partials_and_rmsnorm_fwd(*inputs, *first, GROUP_SIZE, EPS, CORE['n_splits'])
    mhc_reduce_partials_and_rmsnorm_fwd(*inputs, *second, GROUP_SIZE, EPS, CORE['n_splits'])
    for a, b in zip(first, second, strict=True):
        assert_equal(a, b)


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_fwd_errors_after_a_launch(device):
    """Once a configuration has launched (on CUDA the next calls take the fast path), a wrong call still raises
    the contract's typed error."""
    inputs, outputs = make_inputs(CORE, device), make_outputs(CORE, device)
    mhc_reduce_partials_and_rmsnorm_fwd(*inputs, *outputs, GROUP_SIZE, EPS, CORE['n_splits'])
    with pytest.raises(ValueError, match='n_splits'):
        mhc_reduce_partials_and_rmsnorm_fwd(*inputs, *outputs, GROUP_SIZE, EPS, CORE['n_splits'] + 1)
    with pytest.raises(ValueError, match='rms_group_size must be >= 1'):
        mhc_reduce_partials_and_rmsnorm_fwd(*inputs, *outputs, 0, EPS, CORE['n_splits'])
    strided = torch.empty(CORE['m3'], CORE['tokens'], device=device).t()
    with pytest.raises(ValueError, match='out must be contiguous'):
        mhc_reduce_partials_and_rmsnorm_fwd(*inputs, *outputs[:2], strided, GROUP_SIZE, EPS, CORE['n_splits'])


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_fwd_config(device):
    args = (*make_inputs(CORE, device), *make_outputs(CORE, device), GROUP_SIZE, EPS, CORE['n_splits'])
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_reduce_partials_and_rmsnorm_fwd_config(
        backend=backend, mhc_mult3=CORE['m3'], groups=CORE['groups'], n_splits=CORE['n_splits'],
        num_cores=num_cores,
    )  # fmt: skip
    assert mhc_reduce_partials_and_rmsnorm_fwd.operator.config(*args) == expected


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_fwd_opcheck(device):
    params = {**CORE, 'tokens': 9}
    args = (*make_inputs(params, device), *make_outputs(params, device), GROUP_SIZE, EPS, params['n_splits'])
    torch.library.opcheck(FORMS[NAME], args)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_reduce_partials_and_rmsnorm_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    shape = {'n_splits': params['n_splits'], 'tokens': params['tokens'], 'groups': 1,
             'm3': mhc_mult3(params['mhc_mult'])}  # fmt: skip
    inputs, outputs = make_inputs(shape, device), make_outputs(shape, device)
    group_size = params['mhc_mult'] * params['hidden']

    def run():
        return mhc_reduce_partials_and_rmsnorm_fwd(*inputs, *outputs, group_size, EPS, params['n_splits'])

    run()  # compile and warm up outside the timing
    time_us = benchmark_timer(run)
    benchmark_record(
        kernel=record_name('mhc', NAME),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*inputs, *outputs) / time_us / 1e3,
    )
