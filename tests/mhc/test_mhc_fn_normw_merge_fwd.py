"""Tests of mhc_fn_normw_merge_fwd (out_fn = fn * normw, exact in fp32).

CPU tier: the pure configuration chooser, both kernels lowering for the level's shapes, the contract's typed
errors on CPU tensors, the torch.library form on fake tensors. Device tier (`npu`; the Ascend kernel on the
emulator with --ascend-emulator): values bit for bit against the float64 reference, the configuration a call
launches, opcheck; the benchmark with the peer's shapes.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_fn_normw_merge_fwd
from cann_ops_tilelang.mhc.mhc_fn_normw_merge_fwd_kernel import (
    choose_mhc_fn_normw_merge_fwd_config,
    make_mhc_fn_normw_merge_fwd_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .mhc_fn_normw_merge_fwd_ref import mhc_fn_normw_merge_fwd_ref
from .norm_fn_cases import BENCHMARK_HIDDEN, BENCHMARK_MHC_MULT, fn_shapes, mhc_mult3

KERNEL_NAME = 'mhc_fn_normw_merge_fwd_kernel'
PARAMS = fn_shapes(get_test_level())
CORE = fn_shapes(0)[1]  # the shape of the tests whose point is not a shape
# fn is (mhc_mult3, mhc_mult * hidden)
BENCHMARK_PARAMS = generate_samples(mhc_mult=(BENCHMARK_MHC_MULT,), hidden=BENCHMARK_HIDDEN)


def make_config(backend: str, params: dict):
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_fn_normw_merge_fwd_config(
        backend=backend, rows=params['m3'], hidden=params['k'], num_cores=num_cores
    )


def make_inputs(params: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    fn = torch.randn(params['m3'], params['k'], device=device)
    normw = torch.randn(params['k'], device=device)
    return fn, normw


# CPU tier: configuration and lowering.


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_fn_normw_merge_fwd_kernel_lowers(params, backend):
    cfg = make_config(backend, params)
    assert cfg.hidden % cfg.block_cols == 0
    assert cfg.rows % cfg.block_rows == 0
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lower(lambda: make_mhc_fn_normw_merge_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_mhc_fn_normw_merge_fwd_config_is_pure():
    a = make_config('ascend', {'m3': 24, 'k': 4 * 7168})
    assert a == make_config('ascend', {'m3': 24, 'k': 4 * 7168})
    assert hash(a)
    # Ascend: every row of a column tile; enough tiles for the 64 vector cores.
    assert (a.block_rows, a.block_cols) == (24, 256)
    assert a.hidden // a.block_cols >= ASCEND_950_VECTOR_CORES
    # The widest rows fit too: 80 rows x 64 columns.
    assert make_config('ascend', {'m3': 80, 'k': 64}).block_cols == 64
    c = make_config('cuda', {'m3': 24, 'k': 4 * 7168})
    assert (c.block_rows, c.block_cols, c.threads) == (4, 512, 128)


@pytest.mark.parametrize(
    ('rows', 'hidden', 'match'),
    [(0, 64, r'in \[1, 80\]'), (81, 64, r'in \[1, 80\]'), (24, 96, 'multiple of 64'), (24, 0, 'multiple of 64')],
)
def test_mhc_fn_normw_merge_fwd_config_rejects_sizes(rows, hidden, match):
    for backend in ('ascend', 'cuda'):
        with pytest.raises(ValueError, match=match):
            make_config(backend, {'m3': rows, 'k': hidden})


# CPU tier: the argument contract (validation runs before the device guard).


def _args(m3=24, k=128, **changes):
    args = {'fn': torch.zeros(m3, k), 'normw': torch.zeros(k), 'out_fn': torch.zeros(m3, k)}
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ('changes', 'error', 'match'),
    [
        ({'fn': [[1.0]]}, TypeError, 'fn must be a torch.Tensor, got list'),
        ({'fn': torch.zeros(24, 128, dtype=torch.bfloat16)}, TypeError, 'fn must have dtype torch.float32'),
        ({'normw': torch.zeros(128, dtype=torch.float16)}, TypeError, 'normw must have dtype torch.float32'),
        ({'out_fn': torch.zeros(24, 128, dtype=torch.float64)}, TypeError, 'out_fn must have dtype torch.float32'),
        ({'fn': torch.zeros(24 * 128)}, ValueError, 'fn must have 2 dimensions'),
        ({'normw': torch.zeros(64)}, ValueError, 'normw must have shape'),
        ({'out_fn': torch.zeros(24, 64)}, ValueError, 'out_fn must have shape'),
        ({'fn': torch.zeros(128, 24).t()}, ValueError, 'fn must be contiguous'),
        ({'out_fn': torch.zeros(128, 24).t()}, ValueError, 'out_fn must be contiguous'),
    ],
    ids=['fn-type', 'fn-dtype', 'normw-dtype', 'out-dtype', 'fn-rank', 'normw-shape', 'out-shape', 'fn-layout',
         'out-layout'],
)  # fmt: skip
def test_mhc_fn_normw_merge_fwd_rejects_arguments(changes, error, match):
    with pytest.raises(error, match=match):
        mhc_fn_normw_merge_fwd(**_args(**changes))


@pytest.mark.parametrize(
    ('m3', 'k', 'match'), [(81, 64, r'rows of fn\) must be in \[1, 80\]'), (24, 96, 'positive multiple of 64')]
)
def test_mhc_fn_normw_merge_fwd_rejects_sizes(m3, k, match):
    with pytest.raises(ValueError, match=match):
        mhc_fn_normw_merge_fwd(**_args(m3, k))


def test_mhc_fn_normw_merge_fwd_rejects_too_many_elements():
    fn = torch.empty(80, 2**25, device='meta')  # no memory behind a meta tensor
    with pytest.raises(ValueError, match='fewer than 2\\*\\*31 elements'):
        mhc_fn_normw_merge_fwd(fn, torch.empty(2**25, device='meta'), torch.empty_like(fn))


def test_mhc_fn_normw_merge_fwd_rejects_overlap():
    args = _args()
    with pytest.raises(ValueError, match='out_fn'):
        mhc_fn_normw_merge_fwd(args['fn'], args['normw'], args['fn'])


def test_mhc_fn_normw_merge_fwd_refuses_cpu_tensors():
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_fn_normw_merge_fwd(**_args())


# CPU tier: the torch.library form, on fake tensors.

FORMS = mhc_fn_normw_merge_fwd.operator.forms


def test_mhc_fn_normw_merge_fwd_is_registered():
    assert OPERATORS['mhc_fn_normw_merge_fwd'] is mhc_fn_normw_merge_fwd.operator
    assert list(FORMS) == ['mhc_fn_normw_merge_fwd']
    schema = FORMS['mhc_fn_normw_merge_fwd']._schema
    assert getattr(torch.ops, NAMESPACE).mhc_fn_normw_merge_fwd.default is FORMS['mhc_fn_normw_merge_fwd']
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('out_fn',)
    assert not schema.returns


def test_mhc_fn_normw_merge_fwd_fake_calls():
    """Traced calls take the op: the public call returns out_fn, the op nothing; the typed errors stand."""
    with FakeTensorMode():
        fn, normw = torch.empty(24, 512, device='cuda'), torch.empty(512, device='cuda')
        out_fn = torch.empty_like(fn)
        assert mhc_fn_normw_merge_fwd(fn, normw, out_fn) is out_fn
        assert FORMS['mhc_fn_normw_merge_fwd'](fn, normw, out_fn) is None
        with pytest.raises(TypeError, match='fn must have dtype torch.float32'):
            mhc_fn_normw_merge_fwd(fn.half(), normw, out_fn)
        with pytest.raises(ValueError, match='normw must have shape'):
            FORMS['mhc_fn_normw_merge_fwd'](fn, torch.empty(64, device='cuda'), out_fn)


def test_mhc_fn_normw_merge_fwd_compiles_into_one_graph():
    record = GraphRecorder()

    def merged_twice(fn, normw, out_fn):
        return mhc_fn_normw_merge_fwd(fn, normw, out_fn) * 2

    with FakeTensorMode():
        fn, normw = torch.empty(24, 512, device='cuda'), torch.empty(512, device='cuda')
        result = torch.compile(merged_twice, fullgraph=True, backend=record)(fn, normw, torch.empty_like(fn))
        assert result.shape == fn.shape
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_fn_normw_merge_fwd']) in targets, targets


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_fn_normw_merge_fwd_values(params, device):
    fn, normw = make_inputs(params, device)
    out_fn = torch.full_like(fn, float('nan'))  # poisoned: an element the kernel skips stays NaN
    assert mhc_fn_normw_merge_fwd(fn, normw, out_fn) is out_fn
    assert_equal(out_fn, mhc_fn_normw_merge_fwd_ref(fn, normw).float())  # one correctly rounded product


@pytest.mark.npu
def test_mhc_fn_normw_merge_fwd_errors_after_a_launch(device):
    """Once a configuration has launched (on CUDA the next calls take the fast path), a wrong call still raises
    the contract's typed error."""
    fn, normw = make_inputs(CORE, device)
    out_fn = torch.empty_like(fn)
    mhc_fn_normw_merge_fwd(fn, normw, out_fn)
    with pytest.raises(ValueError, match='out_fn'):
        mhc_fn_normw_merge_fwd(fn, normw, fn)
    with pytest.raises(ValueError, match='out_fn must be contiguous'):
        mhc_fn_normw_merge_fwd(fn, normw, torch.empty(CORE['k'], CORE['m3'], device=device).t())


@pytest.mark.npu
def test_mhc_fn_normw_merge_fwd_config(device):
    fn, normw = make_inputs(CORE, device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_fn_normw_merge_fwd_config(
        backend=backend, rows=CORE['m3'], hidden=CORE['k'], num_cores=num_cores
    )
    assert mhc_fn_normw_merge_fwd.operator.config(fn, normw, torch.empty_like(fn)) == expected


@pytest.mark.npu
def test_mhc_fn_normw_merge_fwd_opcheck(device):
    fn, normw = make_inputs(CORE, device)
    torch.library.opcheck(FORMS['mhc_fn_normw_merge_fwd'], (fn, normw, torch.empty_like(fn)))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_fn_normw_merge_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    m3, k = mhc_mult3(params['mhc_mult']), params['mhc_mult'] * params['hidden']
    fn, normw = make_inputs({'m3': m3, 'k': k}, device)
    out_fn = torch.empty_like(fn)
    mhc_fn_normw_merge_fwd(fn, normw, out_fn)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_fn_normw_merge_fwd(fn, normw, out_fn))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_fn_normw_merge_fwd'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(fn, normw, out_fn) / time_us / 1e3,
    )
