"""Tests of mhc_fn_normw_merge_bwd (fn_grad += out_fn_grad * normw, normw_grad += column sums of
out_fn_grad * fn, deterministic).

CPU tier: the pure configuration chooser, both kernels lowering for the level's shapes, the contract's typed
errors on CPU tensors, the torch.library form on fake tensors. Device tier (`npu`; the Ascend kernel on the
emulator with --ascend-emulator): values against autograd of the forward's reference in float64, bit-identical
repeated calls, the configuration a call launches, opcheck; the benchmark with the peer's shapes.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_fn_normw_merge_bwd
from cann_ops_tilelang.mhc.mhc_fn_normw_merge_bwd_kernel import (
    choose_mhc_fn_normw_merge_bwd_config,
    make_mhc_fn_normw_merge_bwd_kernel,
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

from .mhc_fn_normw_merge_bwd_ref import mhc_fn_normw_merge_bwd_ref
from .norm_fn_cases import BENCHMARK_HIDDEN, BENCHMARK_MHC_MULT, fn_shapes, mhc_mult3

KERNEL_NAME = 'mhc_fn_normw_merge_bwd_kernel'
PARAMS = fn_shapes(get_test_level())
CORE = fn_shapes(0)[1]  # the shape of the tests whose point is not a shape
# fn is (mhc_mult3, mhc_mult * hidden)
BENCHMARK_PARAMS = generate_samples(mhc_mult=(BENCHMARK_MHC_MULT,), hidden=BENCHMARK_HIDDEN)


def make_config(backend: str, params: dict):
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_fn_normw_merge_bwd_config(
        backend=backend, rows=params['m3'], hidden=params['k'], num_cores=num_cores
    )


def make_inputs(params: dict, device) -> tuple[torch.Tensor, ...]:
    """fn, normw, out_fn_grad and the two gradient buffers (non-zero: the operator adds to them)."""
    m3, k = params['m3'], params['k']
    return tuple(torch.randn(shape, device=device) for shape in ((m3, k), (k,), (m3, k), (m3, k), (k,)))


# CPU tier: configuration and lowering.


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_fn_normw_merge_bwd_kernel_lowers(params, backend):
    cfg = make_config(backend, params)
    assert cfg.hidden % cfg.block_cols == 0
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lower(lambda: make_mhc_fn_normw_merge_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_mhc_fn_normw_merge_bwd_config_is_pure():
    a = make_config('ascend', {'m3': 24, 'k': 4 * 7168})
    assert a == make_config('ascend', {'m3': 24, 'k': 4 * 7168})
    assert hash(a)
    assert a.block_cols == 128
    assert a.hidden // a.block_cols >= ASCEND_950_VECTOR_CORES
    assert make_config('ascend', {'m3': 80, 'k': 8 * 7168}).block_cols == 64  # three 80 x 64 tiles, twice
    c = make_config('cuda', {'m3': 24, 'k': 4 * 7168})
    assert (c.block_cols, c.threads, c.row_groups, c.batch) == (128, 128, 4, 6)  # 4 ranges of 6 rows
    assert make_config('cuda', {'m3': 3, 'k': 192}).block_cols == 64


# CPU tier: the argument contract (validation runs before the device guard).

NAMES = ('fn', 'normw', 'out_fn_grad', 'fn_grad', 'normw_grad')


def _args(m3=24, k=128, **changes):
    args = dict(zip(NAMES, (torch.zeros(m3, k), torch.zeros(k), torch.zeros(m3, k), torch.zeros(m3, k),
                            torch.zeros(k)), strict=True))  # fmt: skip
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ('changes', 'error', 'match'),
    [
        ({'out_fn_grad': None}, TypeError, 'out_fn_grad must be a torch.Tensor, got NoneType'),
        ({'fn': torch.zeros(24, 128, dtype=torch.bfloat16)}, TypeError, 'fn must have dtype torch.float32'),
        ({'fn_grad': torch.zeros(24, 128, dtype=torch.bfloat16)}, TypeError, 'fn_grad must have dtype'),
        ({'normw_grad': torch.zeros(128, dtype=torch.float64)}, TypeError, 'normw_grad must have dtype'),
        ({'out_fn_grad': torch.zeros(24, 64)}, ValueError, 'out_fn_grad must have shape'),
        ({'normw_grad': torch.zeros(64)}, ValueError, 'normw_grad must have shape'),
        ({'fn_grad': torch.zeros(128, 24).t()}, ValueError, 'fn_grad must be contiguous'),
        ({'normw': torch.zeros(256)[::2]}, ValueError, 'normw must be contiguous'),
    ],
    ids=['type', 'fn-dtype', 'fn_grad-dtype', 'normw_grad-dtype', 'grad-shape', 'normw_grad-shape',
         'fn_grad-layout', 'normw-layout'],
)  # fmt: skip
def test_mhc_fn_normw_merge_bwd_rejects_arguments(changes, error, match):
    with pytest.raises(error, match=match):
        mhc_fn_normw_merge_bwd(**_args(**changes))


def test_mhc_fn_normw_merge_bwd_rejects_sizes():
    with pytest.raises(ValueError, match=r'rows of fn\) must be in \[1, 80\]'):
        mhc_fn_normw_merge_bwd(**_args(m3=99))
    with pytest.raises(ValueError, match='positive multiple of 64'):
        mhc_fn_normw_merge_bwd(**_args(k=100))


@pytest.mark.parametrize(('written', 'other'), [('fn_grad', 'out_fn_grad'), ('fn_grad', 'fn'), ('normw_grad', 'normw')])
def test_mhc_fn_normw_merge_bwd_rejects_overlap(written, other):
    args = _args()
    args[written] = args[other]
    with pytest.raises(ValueError, match=written):
        mhc_fn_normw_merge_bwd(**args)


def test_mhc_fn_normw_merge_bwd_refuses_cpu_tensors():
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_fn_normw_merge_bwd(**_args())


# CPU tier: the torch.library form, on fake tensors.

FORMS = mhc_fn_normw_merge_bwd.operator.forms


def test_mhc_fn_normw_merge_bwd_is_registered():
    assert OPERATORS['mhc_fn_normw_merge_bwd'] is mhc_fn_normw_merge_bwd.operator
    assert list(FORMS) == ['mhc_fn_normw_merge_bwd']
    assert getattr(torch.ops, NAMESPACE).mhc_fn_normw_merge_bwd.default is FORMS['mhc_fn_normw_merge_bwd']
    schema = FORMS['mhc_fn_normw_merge_bwd']._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('fn_grad', 'normw_grad')
    assert not schema.returns


def test_mhc_fn_normw_merge_bwd_fake_calls():
    with FakeTensorMode():
        args = [torch.empty(s, device='cuda') for s in ((24, 512), (512,), (24, 512), (24, 512), (512,))]
        result = mhc_fn_normw_merge_bwd(*args)
        assert result.fn_grad is args[3]
        assert result.normw_grad is args[4]
        assert FORMS['mhc_fn_normw_merge_bwd'](*args) is None
        with pytest.raises(ValueError, match='normw_grad must have shape'):
            mhc_fn_normw_merge_bwd(*args[:4], torch.empty(64, device='cuda'))


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_fn_normw_merge_bwd_values(params, device):
    """Against autograd of the forward's float64 reference, accumulated into the given buffers."""
    fn, normw, out_fn_grad, fn_grad, normw_grad = make_inputs(params, device)
    expected_fn_grad, expected_normw_grad = mhc_fn_normw_merge_bwd_ref(fn, normw, out_fn_grad, fn_grad, normw_grad)
    result = mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
    assert result.fn_grad is fn_grad
    assert result.normw_grad is normw_grad
    # fn_grad: one fp32 multiply-add per element; normw_grad: a sum of M3 + 1 terms of size ~1.
    assert_close(fn_grad.double(), expected_fn_grad, atol=1e-6, rtol=1e-6)
    assert_close(normw_grad.double(), expected_normw_grad, atol=2e-6 * params['m3'], rtol=1e-6)


@pytest.mark.npu
def test_mhc_fn_normw_merge_bwd_is_deterministic(device):
    fn, normw, out_fn_grad, fn_grad, normw_grad = make_inputs(CORE, device)
    first = [t.clone() for t in (fn_grad, normw_grad)]
    second = [t.clone() for t in (fn_grad, normw_grad)]
    mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, *first)
    mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, *second)
    for a, b in zip(first, second, strict=True):
        assert_equal(a, b)


@pytest.mark.npu
def test_mhc_fn_normw_merge_bwd_errors_after_a_launch(device):
    """Once a configuration has launched (on CUDA the next calls take the fast path), a wrong call still raises
    the contract's typed error."""
    fn, normw, out_fn_grad, fn_grad, normw_grad = make_inputs(CORE, device)
    mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
    with pytest.raises(ValueError, match='normw_grad'):
        mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw)
    with pytest.raises(ValueError, match='fn_grad must be contiguous'):
        mhc_fn_normw_merge_bwd(
            fn, normw, out_fn_grad, torch.empty(CORE['k'], CORE['m3'], device=device).t(), normw_grad
        )


@pytest.mark.npu
def test_mhc_fn_normw_merge_bwd_config(device):
    args = make_inputs(CORE, device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_fn_normw_merge_bwd_config(
        backend=backend, rows=CORE['m3'], hidden=CORE['k'], num_cores=num_cores
    )
    assert mhc_fn_normw_merge_bwd.operator.config(*args) == expected


@pytest.mark.npu
def test_mhc_fn_normw_merge_bwd_opcheck(device):
    torch.library.opcheck(FORMS['mhc_fn_normw_merge_bwd'], make_inputs(CORE, device))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_fn_normw_merge_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    m3, k = mhc_mult3(params['mhc_mult']), params['mhc_mult'] * params['hidden']
    args = make_inputs({'m3': m3, 'k': k}, device)
    mhc_fn_normw_merge_bwd(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_fn_normw_merge_bwd(*args))
    fn, normw, out_fn_grad, fn_grad, normw_grad = args
    benchmark_record(
        kernel=record_name('mhc', 'mhc_fn_normw_merge_bwd'),
        operation='bwd',
        params=params,
        time_us=time_us,
        # fn_grad and normw_grad are read and written
        bandwidth_gbs=count_bytes(fn, normw, out_fn_grad, fn_grad, fn_grad, normw_grad, normw_grad) / time_us / 1e3,
    )
