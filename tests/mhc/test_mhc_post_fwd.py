"""mhc_post_fwd: lowering and configuration (CPU tier), the argument contract and the torch.library forms (CPU
tier), values against the float64 reference (device tier: an NPU, a CUDA GPU or the Ascend C emulator), benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_post_fwd
from cann_ops_tilelang.mhc._mhc_post_common import MAX_ELEMENTS
from cann_ops_tilelang.mhc.mhc_post_fwd_kernel import (
    ASCEND_UB_BUDGET,
    MhcPostFwdConfig,
    ascend_ub_bytes,
    choose_mhc_post_fwd_config,
    make_mhc_post_fwd_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_close, count_bytes
from tests.testing.timing import record_name

from .mhc_post_fwd_ref import mhc_post_fwd_ref
from .mhc_post_inputs import BENCHMARK_PARAMS, post_inputs, shape_params, value_params

KERNEL_NAME = 'mhc_post_fwd_kernel'
LEVEL = get_test_level()
SHAPES = shape_params(LEVEL)
VALUES = value_params(LEVEL)
ARG_NAMES = ('x', 'residual', 'post_layer_mix', 'comb_res_mix')
ARG_DTYPES = (torch.bfloat16, torch.bfloat16, torch.float32, torch.float32)


def make_config(backend: str, mhc: int, hidden: int) -> MhcPostFwdConfig:
    """The configuration on an Ascend 950 (64 vector cores) or an H200 (132 SMs)."""
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_post_fwd_config(backend=backend, mhc=mhc, hidden=hidden, num_cores=num_cores)


def cpu_inputs(s=2, t=3, mhc=4, hidden=64) -> list[torch.Tensor]:
    return list(post_inputs((s, t), mhc, hidden, 'cpu'))


def assert_matches_reference(out, x, residual, post, comb) -> None:
    """fp32 math rounded once to bf16: within half a bf16 ulp (2**-9 relative) of the exact value, plus the fp32
    sum's rounding."""
    expected = mhc_post_fwd_ref(x, residual, post, comb)
    assert (out.dtype, out.shape, out.device) == (torch.bfloat16, residual.shape, residual.device)
    assert_close(out.double(), expected, atol=1e-5, rtol=2**-8)


# ---------------------------------------------------------------- CPU tier: configurations and lowering


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_mhc_post_fwd_ascend_kernel_lowers(params):
    cfg = make_config('ascend', params['mhc'], params['hidden'])
    assert (cfg.backend, cfg.mhc, cfg.hidden, cfg.num_cores) == ('ascend', params['mhc'], params['hidden'], 64)
    assert params['hidden'] % cfg.tile == 0
    assert ascend_ub_bytes(cfg.mhc, cfg.tile, cfg.stages) <= ASCEND_UB_BUDGET
    lowered = assert_ascend_kernel_lowers(lambda: make_mhc_post_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert '__simd_vf__' in lowered.source


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_mhc_post_fwd_cuda_kernel_lowers(params):
    cfg = make_config('cuda', params['mhc'], params['hidden'])
    assert (cfg.backend, cfg.num_cores, cfg.threads) == ('cuda', H200_SMS, 256)
    lowered = assert_cuda_kernel_lowers(lambda: make_mhc_post_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    # 16-byte accesses of x, residual and out; no atomics, no shared memory.
    assert 'uint4' in lowered.source
    assert 'atomic' not in lowered.source.lower()


def test_mhc_post_fwd_ascend_tiles():
    """The widest tile dividing H whose buffers fit: H whole up to the budget, 7168 in two for M = 4, narrower
    with more branches."""
    assert make_config('ascend', 4, 4096).tile == 4096
    assert make_config('ascend', 4, 7168).tile == 3584
    cfg = make_config('ascend', 8, 7168)
    assert 7168 % cfg.tile == 0
    assert ascend_ub_bytes(8, cfg.tile, cfg.stages) <= ASCEND_UB_BUDGET
    assert ascend_ub_bytes(8, 2 * cfg.tile, cfg.stages) > ASCEND_UB_BUDGET or 7168 % (2 * cfg.tile)


@pytest.mark.parametrize(
    ('fields', 'match'),
    [
        ({'backend': 'cpu'}, 'backend must be'),
        ({'mhc': 9}, r'mhc must be in 1\.\.8'),
        ({'hidden': 96}, 'multiple of 64'),
        ({'num_cores': 0}, 'num_cores'),
        ({'threads': 100}, 'threads must be'),
        ({'tile': 192}, 'dividing hidden'),
        ({'stages': 4}, 'stages'),
    ],
)
def test_mhc_post_fwd_config_rejects(fields, match):
    with pytest.raises(ValueError, match=match):
        MhcPostFwdConfig(**{'backend': 'ascend', 'mhc': 4, 'hidden': 128, 'num_cores': 64, 'tile': 128} | fields)


# ---------------------------------------------------------------- CPU tier: the argument contract


@pytest.mark.parametrize('index', range(4), ids=ARG_NAMES)
def test_mhc_post_fwd_rejects_type_and_dtype(index):
    wrong = torch.float16
    assert_rejects_non_tensor_and_dtype(
        mhc_post_fwd, cpu_inputs(), index, name=ARG_NAMES[index], dtype=ARG_DTYPES[index],
        non_tensors=([1.0], None), wrong_dtype=wrong,
    )  # fmt: skip


@pytest.mark.parametrize('index', range(4), ids=ARG_NAMES)
def test_mhc_post_fwd_rejects_rank(index):
    assert_rejects_extra_dimension(mhc_post_fwd, cpu_inputs(), index, name=ARG_NAMES[index])


@pytest.mark.parametrize(
    ('index', 'shape', 'match'),
    [
        (0, (2, 3, 128), r'x must have shape \(2, 3, 64\)'),
        (0, (3, 2, 64), r'x must have shape \(2, 3, 64\)'),
        (2, (2, 3, 4, 2), r'post_layer_mix must have shape \(2, 3, 4, 1\)'),
        (3, (2, 3, 4, 3), r'comb_res_mix must have shape \(2, 3, 4, 4\)'),
    ],
)
def test_mhc_post_fwd_rejects_shape(index, shape, match):
    args = cpu_inputs()
    args[index] = torch.zeros(shape, dtype=args[index].dtype)
    with pytest.raises(ValueError, match=match):
        mhc_post_fwd(*args)


@pytest.mark.parametrize(
    ('mhc', 'hidden', 'match'),
    [(9, 64, r'mhc_mult \(residual.shape\[2\]\) must be in 1\.\.8, got 9'), (4, 96, 'multiple of 64, got 96')],
)
def test_mhc_post_fwd_rejects_sizes(mhc, hidden, match):
    with pytest.raises(ValueError, match=match):
        mhc_post_fwd(*cpu_inputs(mhc=mhc, hidden=hidden))


def test_mhc_post_fwd_rejects_too_many_elements():
    # meta tensors: no memory behind the sizes
    s, t, m, h = 1, MAX_ELEMENTS // (4 * 4096) + 1, 4, 4096
    args = [
        torch.empty((s, t, h), dtype=torch.bfloat16, device='meta'),
        torch.empty((s, t, m, h), dtype=torch.bfloat16, device='meta'),
        torch.empty((s, t, m, 1), device='meta'),
        torch.empty((s, t, m, m), device='meta'),
    ]
    with pytest.raises(ValueError, match=f'at most {MAX_ELEMENTS} elements'):
        mhc_post_fwd(*args)


@pytest.mark.parametrize('index', range(4), ids=ARG_NAMES)
def test_mhc_post_fwd_rejects_non_contiguous(index):
    args = cpu_inputs()
    args[index] = args[index].transpose(0, 1).contiguous().transpose(0, 1)  # same shape, strides of (T, S, ...)
    with pytest.raises(ValueError, match=f'{ARG_NAMES[index]} must be contiguous'):
        mhc_post_fwd(*args)


@pytest.mark.parametrize(
    ('make_out', 'error', 'match'),
    [
        (lambda r: r.tolist(), TypeError, 'out must be a torch.Tensor'),
        (lambda r: r.float(), TypeError, 'out must have dtype torch.bfloat16'),
        (lambda r: r[:, :2].clone(), ValueError, 'out must have shape'),
        (lambda r: r.transpose(0, 1).contiguous().transpose(0, 1), ValueError, 'out must be contiguous'),
        (lambda r: r, ValueError, 'out must not alias the input residual'),
        (lambda r: torch.empty_like(r, device='meta'), RuntimeError, 'out must be on cpu'),
    ],
    ids=['not-a-tensor', 'dtype', 'shape', 'non-contiguous', 'alias', 'device'],
)
def test_mhc_post_fwd_rejects_out(make_out, error, match):
    args = cpu_inputs()
    with pytest.raises(error, match=match):
        mhc_post_fwd(*args, make_out(args[1]))


@pytest.mark.parametrize('leading', [(2, 3), (1, 0)])
def test_mhc_post_fwd_refuses_cpu_tensors(leading):
    # No CPU fallback, not even for empty inputs.
    args = cpu_inputs(*leading)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_post_fwd(*args)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_post_fwd(*args, out=torch.empty_like(args[1]))


# ---------------------------------------------------------------- CPU tier: torch.library forms on fake tensors

OPS = {'mhc_post_fwd': (), 'mhc_post_fwd_out': ('out',)}
FORMS = mhc_post_fwd.operator.forms


def fake_inputs(s=2, t=3, mhc=4, hidden=128) -> list[torch.Tensor]:
    """Inside FakeTensorMode: CUDA tensors without a GPU."""
    return [
        torch.empty((s, t, hidden), dtype=torch.bfloat16, device='cuda'),
        torch.empty((s, t, mhc, hidden), dtype=torch.bfloat16, device='cuda'),
        torch.empty((s, t, mhc, 1), device='cuda'),
        torch.empty((s, t, mhc, mhc), device='cuda'),
    ]


def test_mhc_post_fwd_is_declared():
    assert OPERATORS['mhc_post_fwd'] is mhc_post_fwd.operator
    assert list(FORMS) == list(OPS)


@pytest.mark.parametrize('name', sorted(OPS))
def test_mhc_post_fwd_op_is_registered(name):
    assert getattr(getattr(torch.ops, NAMESPACE), name).default is FORMS[name]
    schema = FORMS[name]._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == OPS[name]
    assert all(r.alias_info is None for r in schema.returns)


def test_mhc_post_fwd_fake_output():
    with FakeTensorMode():
        args = fake_inputs()
        contiguous = torch.empty(args[1].shape, device='meta').stride()
        for result in (mhc_post_fwd(*args), FORMS['mhc_post_fwd'](*args)):
            assert (result.shape, result.dtype, result.stride(), result.device) == (
                args[1].shape, torch.bfloat16, contiguous, args[1].device,
            )  # fmt: skip
        out = torch.empty_like(args[1])
        assert mhc_post_fwd(*args, out=out) is out
        assert FORMS['mhc_post_fwd_out'](*args, out) is None


def test_mhc_post_fwd_fake_calls_raise_the_typed_errors():
    with FakeTensorMode():
        args = fake_inputs()
        for call in (mhc_post_fwd, FORMS['mhc_post_fwd']):
            with pytest.raises(TypeError, match='x must have dtype torch.bfloat16'):
                call(args[0].half(), *args[1:])
            with pytest.raises(ValueError, match=r'mhc_mult .* must be in 1\.\.8'):
                call(*fake_inputs(mhc=9))
        with pytest.raises(ValueError, match='out must not alias the input residual'):
            mhc_post_fwd(*args, out=args[1])


def test_mhc_post_fwd_compiles_into_one_graph():
    record = GraphRecorder()

    def both_forms(x, residual, post, comb, out):
        return mhc_post_fwd(x, residual, post, comb) * 2, mhc_post_fwd(x, residual, post, comb, out=out)

    with FakeTensorMode():
        args = fake_inputs()
        doubled, written = torch.compile(both_forms, fullgraph=True, backend=record)(*args, torch.empty_like(args[1]))
        assert doubled.shape == written.shape == args[1].shape
    assert len(record.graphs) == 1
    targets = record.targets()
    assert {str(overload) for overload in FORMS.values()} <= targets, targets


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUES, ids=make_param_id)
def test_mhc_post_fwd_values(params, device):
    args = post_inputs(params['leading'], params['mhc'], params['hidden'], device)
    out = mhc_post_fwd(*args)
    assert_matches_reference(out, *args)
    poisoned = torch.full_like(args[1], float('nan'))  # an element the kernel skips stays NaN
    assert mhc_post_fwd(*args, poisoned) is poisoned
    assert torch.equal(poisoned, out)  # one order of the sums: the same bits either way


@pytest.mark.npu
def test_mhc_post_fwd_mixes_per_token(device):
    """Each token takes its own mixes (a kernel reading another token's would still be close on average):
    one-hot mixes select exactly one input per output branch, bit for bit."""
    s, t, mhc, hidden = 1, 5, 4, 128
    x, residual, _, _ = post_inputs((s, t), mhc, hidden, device)
    post = torch.zeros(s, t, mhc, 1, device=device)
    comb = torch.zeros(s, t, mhc, mhc, device=device)
    for token in range(t):
        for o in range(mhc):
            comb[0, token, (o + token) % mhc, o] = 1.0
        post[0, token, token % mhc, 0] = 1.0
    out = mhc_post_fwd(x, residual, post, comb)
    for token in range(t):
        for o in range(mhc):
            expected = residual[0, token, (o + token) % mhc].float() + (o == token % mhc) * x[0, token].float()
            assert torch.equal(out[0, token, o], expected.bfloat16())


@pytest.mark.npu
def test_mhc_post_fwd_config(device):
    args = post_inputs((1, 2), 4, 128, device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_post_fwd_config(backend=backend, mhc=4, hidden=128, num_cores=num_cores)
    assert mhc_post_fwd.operator.config(*args) == expected


@pytest.mark.npu
def test_mhc_post_fwd_opcheck(device):
    args = post_inputs((2, 3), 4, 128, device)
    torch.library.opcheck(FORMS['mhc_post_fwd'], args)
    torch.library.opcheck(FORMS['mhc_post_fwd_out'], (*args, torch.empty_like(args[1])))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_post_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    args = post_inputs(params['leading'], params['mhc'], params['hidden'], device)
    out = torch.empty_like(args[1])
    mhc_post_fwd(*args, out)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_post_fwd(*args, out))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_post_fwd'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*args, out) / time_us / 1e3,
    )
