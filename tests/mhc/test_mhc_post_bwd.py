"""mhc_post_bwd: lowering and configuration (CPU tier), the reference against autograd and the argument contract
(CPU tier), the torch.library forms on fake tensors (CPU tier), values against autograd of the float64 forward
reference and bit-for-bit repeatability (device tier: an NPU, a CUDA GPU or the Ascend C emulator), benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_post_bwd
from cann_ops_tilelang.mhc.mhc_post_bwd import MhcPostBwdResult
from cann_ops_tilelang.mhc.mhc_post_bwd_kernel import (
    ASCEND_UB_BUDGET,
    MhcPostBwdConfig,
    ascend_ub_bytes,
    choose_mhc_post_bwd_config,
    get_mhc_post_bwd_kernel,
    make_mhc_post_bwd_kernel,
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
from tests.testing.numeric import assert_close, assert_equal, count_bytes
from tests.testing.timing import record_name

from .mhc_post_bwd_ref import mhc_post_bwd_ref
from .mhc_post_fwd_ref import mhc_post_fwd_ref
from .mhc_post_inputs import BENCHMARK_PARAMS, post_inputs, shape_params, value_params

KERNEL_NAME = 'mhc_post_bwd_kernel'
LEVEL = get_test_level()
SHAPES = shape_params(LEVEL)
VALUES = value_params(LEVEL)
ARG_NAMES = ('x', 'residual', 'post_layer_mix', 'comb_res_mix', 'd_o')
ARG_DTYPES = (torch.bfloat16, torch.bfloat16, torch.float32, torch.float32, torch.bfloat16)
GRAD_DTYPES = (torch.bfloat16, torch.bfloat16, torch.float32, torch.float32)


def make_config(backend: str, mhc: int, hidden: int) -> MhcPostBwdConfig:
    """The configuration on an Ascend 950 (64 vector cores) or an H200 (132 SMs)."""
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_post_bwd_config(backend=backend, mhc=mhc, hidden=hidden, num_cores=num_cores)


def cpu_inputs(s=2, t=3, mhc=4, hidden=64) -> list[torch.Tensor]:
    return list(post_inputs((s, t), mhc, hidden, 'cpu', d_o=True))


def autograd_grads(x, residual, post, comb, d_o) -> tuple[torch.Tensor, ...]:
    """The gradients of the float64 forward reference by autograd: the oracle of every backward check."""
    leaves = [t.double().requires_grad_() for t in (x, residual, post, comb)]
    out = mhc_post_fwd_ref(*leaves)
    return torch.autograd.grad(out, leaves, d_o.double())


def assert_matches_autograd(result, x, residual, post, comb, d_o) -> None:
    """bf16 gradients: fp32 sums of M products rounded once (half a bf16 ulp, 2**-9 relative); fp32 mix
    gradients: sums over H, within H fp32 roundings of the sum of the terms' magnitudes."""
    hidden = residual.shape[-1]
    for got, want, dtype, name in zip(
        result, autograd_grads(x, residual, post, comb, d_o), GRAD_DTYPES, result._fields, strict=True
    ):
        assert (got.dtype, got.shape, got.device) == (dtype, want.shape, x.device), name
        if dtype == torch.bfloat16:
            assert_close(got.double(), want, atol=1e-5, rtol=2**-8)
        else:
            assert_close(got.double(), want, atol=hidden * 2**-20, rtol=2**-18)


# ---------------------------------------------------------------- CPU tier: configurations, lowering, reference


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_mhc_post_bwd_ascend_kernel_lowers(params):
    cfg = make_config('ascend', params['mhc'], params['hidden'])
    assert (cfg.backend, cfg.mhc, cfg.hidden, cfg.num_cores) == ('ascend', params['mhc'], params['hidden'], 64)
    assert params['hidden'] % cfg.tile == 0
    assert ascend_ub_bytes(cfg.mhc, cfg.tile) <= ASCEND_UB_BUDGET
    lowered = assert_ascend_kernel_lowers(lambda: make_mhc_post_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert '__simd_vf__' in lowered.source


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_mhc_post_bwd_cuda_kernel_lowers(params):
    cfg = make_config('cuda', params['mhc'], params['hidden'])
    assert cfg.threads * cfg.chunks * 8 >= params['hidden']
    lowered = assert_cuda_kernel_lowers(lambda: make_mhc_post_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    # Deterministic: the mix gradients are reduced without atomics.
    assert 'atomic' not in lowered.source.lower()
    assert 'uint4' in lowered.source


@pytest.mark.parametrize(
    ('hidden', 'threads', 'chunks'),
    [(64, 64, 1), (2560, 64, 5), (4096, 128, 4), (7168, 128, 7), (16384, 256, 8), (8256, 160, 7)],
)
def test_mhc_post_bwd_cuda_threads(hidden, threads, chunks):
    """A whole number of 16-byte chunks a thread where a choice divides the row (H / 8 chunks), at most 8."""
    cfg = make_config('cuda', 4, hidden)
    assert (cfg.threads, cfg.chunks) == (threads, chunks)


def test_mhc_post_bwd_ascend_tiles():
    assert make_config('ascend', 4, 7168).tile == 7168  # a token's row in one step
    cfg = make_config('ascend', 8, 4096)
    assert cfg.tile == 2048
    assert ascend_ub_bytes(8, cfg.tile) <= ASCEND_UB_BUDGET < ascend_ub_bytes(8, 4096)


@pytest.mark.parametrize(('mhc', 'hidden'), [(1, 64), (3, 192), (4, 128)])
def test_mhc_post_bwd_ref_is_autograd(mhc, hidden):
    """The written-out gradients equal autograd's of the forward reference (float64)."""
    args = cpu_inputs(2, 3, mhc, hidden)
    for written, grad in zip(mhc_post_bwd_ref(*args), autograd_grads(*args), strict=True):
        torch.testing.assert_close(written, grad, rtol=1e-12, atol=1e-12)


def test_mhc_post_fwd_ref_passes_gradcheck():
    """Autograd of the forward reference is the backward's oracle: torch's finite-difference check of it (float64,
    small sizes: one numerical derivative per input element)."""
    s, t, mhc, hidden = 1, 2, 3, 8
    leaves = [
        torch.randn(shape, dtype=torch.float64, requires_grad=True)
        for shape in ((s, t, hidden), (s, t, mhc, hidden), (s, t, mhc, 1), (s, t, mhc, mhc))
    ]
    assert torch.autograd.gradcheck(mhc_post_fwd_ref, leaves)


# ---------------------------------------------------------------- CPU tier: the argument contract


@pytest.mark.parametrize('index', range(5), ids=ARG_NAMES)
def test_mhc_post_bwd_rejects_type_and_dtype(index):
    assert_rejects_non_tensor_and_dtype(
        mhc_post_bwd, cpu_inputs(), index, name=ARG_NAMES[index], dtype=ARG_DTYPES[index],
        non_tensors=([1.0], None), wrong_dtype=torch.float16,
    )  # fmt: skip


@pytest.mark.parametrize('index', range(5), ids=ARG_NAMES)
def test_mhc_post_bwd_rejects_rank(index):
    assert_rejects_extra_dimension(mhc_post_bwd, cpu_inputs(), index, name=ARG_NAMES[index])


@pytest.mark.parametrize(
    ('index', 'shape', 'match'),
    [
        (0, (2, 3, 128), r'x must have shape \(2, 3, 64\)'),
        (2, (2, 3, 4, 4), r'post_layer_mix must have shape \(2, 3, 4, 1\)'),
        (3, (2, 3, 4, 1), r'comb_res_mix must have shape \(2, 3, 4, 4\)'),
        (4, (2, 3, 4, 128), r'd_o must have shape \(2, 3, 4, 64\)'),
        (4, (3, 2, 4, 64), r'd_o must have shape \(2, 3, 4, 64\)'),
    ],
)
def test_mhc_post_bwd_rejects_shape(index, shape, match):
    args = cpu_inputs()
    args[index] = torch.zeros(shape, dtype=args[index].dtype)
    with pytest.raises(ValueError, match=match):
        mhc_post_bwd(*args)


@pytest.mark.parametrize(
    ('mhc', 'hidden', 'match'),
    [(9, 64, r'must be in 1\.\.8, got 9'), (4, 32, 'multiple of 64, got 32')],
)
def test_mhc_post_bwd_rejects_sizes(mhc, hidden, match):
    with pytest.raises(ValueError, match=match):
        mhc_post_bwd(*cpu_inputs(mhc=mhc, hidden=hidden))


@pytest.mark.parametrize('index', range(5), ids=ARG_NAMES)
def test_mhc_post_bwd_rejects_non_contiguous(index):
    args = cpu_inputs()
    args[index] = args[index].transpose(0, 1).contiguous().transpose(0, 1)  # same shape, strides of (T, S, ...)
    with pytest.raises(ValueError, match=f'{ARG_NAMES[index]} must be contiguous'):
        mhc_post_bwd(*args)


@pytest.mark.parametrize('leading', [(2, 3), (1, 0)])
def test_mhc_post_bwd_refuses_cpu_tensors(leading):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_post_bwd(*cpu_inputs(*leading))


# ---------------------------------------------------------------- CPU tier: torch.library forms on fake tensors

FORMS = mhc_post_bwd.operator.forms


def fake_inputs(s=2, t=3, mhc=4, hidden=128) -> list[torch.Tensor]:
    """Inside FakeTensorMode: CUDA tensors without a GPU."""
    bf16 = torch.bfloat16
    return [
        torch.empty((s, t, hidden), dtype=bf16, device='cuda'),
        torch.empty((s, t, mhc, hidden), dtype=bf16, device='cuda'),
        torch.empty((s, t, mhc, 1), device='cuda'),
        torch.empty((s, t, mhc, mhc), device='cuda'),
        torch.empty((s, t, mhc, hidden), dtype=bf16, device='cuda'),
    ]


def test_mhc_post_bwd_is_declared():
    assert OPERATORS['mhc_post_bwd'] is mhc_post_bwd.operator
    assert list(FORMS) == ['mhc_post_bwd']
    schema = FORMS['mhc_post_bwd']._schema
    assert getattr(torch.ops, NAMESPACE).mhc_post_bwd.default is FORMS['mhc_post_bwd']
    assert not any(a.alias_info is not None for a in schema.arguments)  # writes no input
    assert len(schema.returns) == 4


def test_mhc_post_bwd_fake_output():
    with FakeTensorMode():
        args = fake_inputs()
        for result in (mhc_post_bwd(*args), MhcPostBwdResult(*FORMS['mhc_post_bwd'](*args))):
            assert isinstance(result, MhcPostBwdResult)
            for got, like, dtype in zip(result, args[:4], GRAD_DTYPES, strict=True):
                assert (got.shape, got.dtype, got.device, got.is_contiguous()) == (like.shape, dtype, like.device, True)


def test_mhc_post_bwd_fake_calls_raise_the_typed_errors():
    with FakeTensorMode():
        args = fake_inputs()
        for call in (mhc_post_bwd, FORMS['mhc_post_bwd']):
            with pytest.raises(TypeError, match='d_o must have dtype torch.bfloat16'):
                call(*args[:4], args[4].float())
            with pytest.raises(ValueError, match=r'must be in 1\.\.8'):
                call(*fake_inputs(mhc=9))


def test_mhc_post_bwd_compiles_into_one_graph():
    record = GraphRecorder()

    def step(*args):
        result = mhc_post_bwd(*args)
        return result.d_x * 2, result.d_comb_res_mix.sum()

    with FakeTensorMode():
        args = fake_inputs()
        doubled, total = torch.compile(step, fullgraph=True, backend=record)(*args)
        assert doubled.shape == args[0].shape
        assert total.shape == ()
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_post_bwd']) in targets, targets


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUES, ids=make_param_id)
def test_mhc_post_bwd_values(params, device):
    args = post_inputs(params['leading'], params['mhc'], params['hidden'], device, d_o=True)
    result = mhc_post_bwd(*args)
    assert isinstance(result, MhcPostBwdResult)
    assert_matches_autograd(result, *args)


@pytest.mark.npu
def test_mhc_post_bwd_is_deterministic(device):
    """The same bits run to run (the mix gradients are sums over H: any atomic order would show)."""
    args = post_inputs((2, 33), 4, 256, device, d_o=True, seed=3)
    first = mhc_post_bwd(*args)
    for _ in range(2):
        for a, b in zip(first, mhc_post_bwd(*args), strict=True):
            assert_equal(a, b)


@pytest.mark.npu
def test_mhc_post_bwd_ascend_tiles_of_a_row(device):
    """The Ascend kernel's accumulation over several hidden tiles of a token (the chooser takes one tile up to
    several thousand columns): a configuration with 64-column tiles, launched directly."""
    if config.backend_of(device) != 'ascend':
        pytest.skip('the Ascend kernel configuration')
    mhc, hidden, n = 3, 192, 5
    cfg = MhcPostBwdConfig('ascend', mhc, hidden, config.get_num_cores(device), tile=64)
    args = post_inputs((1, n), mhc, hidden, device, d_o=True, seed=5)
    x, residual, post, comb, d_o = args
    result = MhcPostBwdResult(*(torch.empty_like(t) for t in (x, residual, post, comb)))
    if device.type == 'cpu':  # the emulator (imported by the test plugin for such a run)
        import cann_ops_ascend_emu

        kernel = cann_ops_ascend_emu.compile_prim_func(make_mhc_post_bwd_kernel(cfg))
    else:
        kernel = get_mhc_post_bwd_kernel(cfg)
    kernel(
        x.view(n, hidden), residual.view(n, mhc, hidden), post.view(n, mhc), comb.view(n, mhc, mhc),
        d_o.view(n, mhc, hidden), result.d_x.view(n, hidden), result.d_residual.view(n, mhc, hidden),
        result.d_post_layer_mix.view(n, mhc), result.d_comb_res_mix.view(n, mhc, mhc),
    )  # fmt: skip
    assert_matches_autograd(result, *args)


@pytest.mark.npu
def test_mhc_post_bwd_config(device):
    args = post_inputs((1, 2), 4, 128, device, d_o=True)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_post_bwd_config(backend=backend, mhc=4, hidden=128, num_cores=num_cores)
    assert mhc_post_bwd.operator.config(*args) == expected


@pytest.mark.npu
def test_mhc_post_bwd_opcheck(device):
    torch.library.opcheck(FORMS['mhc_post_bwd'], post_inputs((2, 3), 4, 128, device, d_o=True))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_post_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    args = post_inputs(params['leading'], params['mhc'], params['hidden'], device, d_o=True)
    result = mhc_post_bwd(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_post_bwd(*args))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_post_bwd'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*args, *result) / time_us / 1e3,
    )
