"""Tests of mhc_reduce_partials_and_rmsnorm_bwd (the gradients of the forward's RMS step with respect to out_mul
and sqrsum, deterministic).

CPU tier: the pure configuration chooser, both kernels lowering for the level's shapes (every mhc_mult from 1
to 8 from level 1, several RMS groups), the contract's typed errors on CPU tensors, the torch.library form on
fake tensors, the float64 reference checked by finite differences (gradcheck). Device tier (`npu`; the Ascend
kernel on the emulator with --ascend-emulator): values against autograd of the forward's reference in float64,
the gradient of the split partials, empty inputs, bit-identical repeated calls, the configuration a call
launches, opcheck; the benchmark with the peer's shapes.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_reduce_partials_and_rmsnorm_bwd
from cann_ops_tilelang.mhc.mhc_reduce_partials_and_rmsnorm_bwd_kernel import (
    choose_mhc_reduce_partials_and_rmsnorm_bwd_config,
    make_mhc_reduce_partials_and_rmsnorm_bwd_kernel,
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

from .mhc_reduce_partials_and_rmsnorm_bwd_ref import mhc_reduce_partials_and_rmsnorm_bwd_ref
from .mhc_reduce_partials_and_rmsnorm_fwd_ref import mhc_reduce_partials_and_rmsnorm_fwd_ref, rms_normalised_mixes
from .norm_fn_cases import BENCHMARK_HIDDEN, BENCHMARK_MHC_MULT, BENCHMARK_TOKENS, mhc_mult3, reduce_bwd_shapes

KERNEL_NAME = 'mhc_reduce_partials_and_rmsnorm_bwd_kernel'
NAME = 'mhc_reduce_partials_and_rmsnorm_bwd'
PARAMS = reduce_bwd_shapes(get_test_level())
CORE = reduce_bwd_shapes(0)[0]  # the configuration of the tests whose point is not a shape
GROUP_SIZE, EPS = 4 * 2560, 1e-6
BENCHMARK_PARAMS = generate_samples(tokens=BENCHMARK_TOKENS, hidden=BENCHMARK_HIDDEN, mhc_mult=(BENCHMARK_MHC_MULT,))


def make_config(backend: str, params: dict):
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_reduce_partials_and_rmsnorm_bwd_config(
        backend=backend, mhc_mult3=params['m3'], groups=params['groups'], num_cores=num_cores
    )


def make_inputs(params: dict, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out_grad ~ N(0, 1); out_mul ~ N(0, GROUP_SIZE) and sqrsum ~ GROUP_SIZE, as the forward's."""
    t, g, m3 = params['tokens'], params['groups'], params['m3']
    out_grad = torch.randn(t, m3, device=device)
    out_mul = torch.randn(t, g, m3, device=device) * GROUP_SIZE**0.5
    sqrsum = (torch.rand(t, g, device=device) + 0.5) * GROUP_SIZE
    return out_grad, out_mul, sqrsum


def make_outputs(params: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The two gradient buffers, poisoned: an element the kernel skips stays NaN."""
    t, g, m3 = params['tokens'], params['groups'], params['m3']
    return torch.full((t, g, m3), float('nan'), device=device), torch.full((t, g), float('nan'), device=device)


# CPU tier: configuration, lowering, the reference.


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_reduce_partials_and_rmsnorm_bwd_kernel_lowers(params, backend):
    cfg = make_config(backend, params)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lower(lambda: make_mhc_reduce_partials_and_rmsnorm_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_mhc_reduce_partials_and_rmsnorm_bwd_config_is_pure():
    params = {'groups': 1, 'm3': 24}
    a = make_config('ascend', params)
    assert a == make_config('ascend', params)
    assert hash(a)
    assert a.tokens == 64
    assert make_config('ascend', {'groups': 16, 'm3': 80}).tokens == 8
    c = make_config('cuda', params)
    assert (c.tokens, c.threads) == (10, 256)  # 240 outputs, one thread each, in whole warps
    with pytest.raises(ValueError, match=r'groups in \[1, 16\]'):
        make_config('cuda', {'groups': 0, 'm3': 24})


def test_mhc_reduce_partials_and_rmsnorm_bwd_reference_gradcheck():
    """The float64 reference's autograd agrees with finite differences, and with the closed form the kernels
    compute (out_mul_grad = out_grad * rstd, sqrsum_grad = -rstd**3 / (2 * group size) * out_grad . out_mul)."""
    out_grad, out_mul, sqrsum = (t.double() for t in make_inputs({'tokens': 3, 'groups': 2, 'm3': 8}, 'cpu'))
    group_size = 64  # sums of squares of a few units: finite differences stay well conditioned
    sqrsum = sqrsum / GROUP_SIZE * group_size
    out_mul = out_mul / GROUP_SIZE**0.5
    torch.autograd.gradcheck(
        lambda m, s: rms_normalised_mixes(m, s, group_size, EPS),
        (out_mul.requires_grad_(), sqrsum.requires_grad_()),
    )
    out_mul_grad, sqrsum_grad = mhc_reduce_partials_and_rmsnorm_bwd_ref(out_grad, out_mul, sqrsum, group_size, EPS)
    rstd = (sqrsum.detach() / group_size + EPS).rsqrt()
    assert_close(out_mul_grad, out_grad.unsqueeze(1) * rstd.unsqueeze(-1), atol=1e-12, rtol=1e-12)
    dot = (out_grad.unsqueeze(1) * out_mul.detach()).sum(-1)
    assert_close(sqrsum_grad, -0.5 * rstd**3 / group_size * dot, atol=1e-12, rtol=1e-12)


# CPU tier: the argument contract (validation runs before the device guard).


def _args(t=5, g=1, m3=24, device='cpu', **changes):
    args = {
        'out_grad': torch.zeros(t, m3, device=device),
        'out_mul': torch.zeros(t, g, m3, device=device),
        'sqrsum': torch.zeros(t, g, device=device),
        'out_mul_grad': torch.zeros(t, g, m3, device=device),
        'sqrsum_grad': torch.zeros(t, g, device=device),
        'rms_group_size': 256,
        'rms_eps': 1e-6,
    }
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ('changes', 'error', 'match'),
    [
        ({'out_grad': (1.0,)}, TypeError, 'out_grad must be a torch.Tensor, got tuple'),
        ({'out_mul': torch.zeros(5, 1, 24, dtype=torch.bfloat16)}, TypeError, 'out_mul must have dtype'),
        ({'sqrsum_grad': torch.zeros(5, 1, dtype=torch.float64)}, TypeError, 'sqrsum_grad must have dtype'),
        ({'out_mul': torch.zeros(5, 24)}, ValueError, 'out_mul must have 3 dimensions'),
        ({'out_grad': torch.zeros(5, 25)}, ValueError, r'out_mul must have shape \(5, 1, 25\)'),
        ({'sqrsum': torch.zeros(6, 1)}, ValueError, 'sqrsum must have shape'),
        ({'out_mul_grad': torch.zeros(5, 2, 24)}, ValueError, 'out_mul_grad must have shape'),
        ({'out_mul_grad': torch.zeros(24, 1, 5).permute(2, 1, 0)}, ValueError, 'out_mul_grad must be contiguous'),
        ({'rms_group_size': 0}, ValueError, 'rms_group_size must be >= 1'),
        ({'rms_group_size': 1.5}, TypeError, 'rms_group_size'),
        ({'rms_eps': -1.0}, ValueError, 'rms_eps must be >= 0'),
        ({'rms_eps': float('inf')}, ValueError, 'rms_eps'),
    ],
    ids=['type', 'out_mul-dtype', 'sqrsum_grad-dtype', 'rank', 'mixes', 'tokens', 'groups', 'layout', 'group-size',
         'group-size-type', 'eps-negative', 'eps-inf'],
)  # fmt: skip
def test_mhc_reduce_partials_and_rmsnorm_bwd_rejects_arguments(changes, error, match):
    with pytest.raises(error, match=match):
        mhc_reduce_partials_and_rmsnorm_bwd(**_args(**changes))


def test_mhc_reduce_partials_and_rmsnorm_bwd_rejects_sizes():
    with pytest.raises(ValueError, match=r'must be in \[1, 80\]'):
        mhc_reduce_partials_and_rmsnorm_bwd(**_args(m3=81))
    with pytest.raises(ValueError, match=r'RMS groups must be in \[1, 16\]'):
        mhc_reduce_partials_and_rmsnorm_bwd(**_args(g=17))
    with pytest.raises(ValueError, match='exceed the int32 index range'):
        mhc_reduce_partials_and_rmsnorm_bwd(**_args(t=2**25, g=16, m3=8, device='meta'))


@pytest.mark.parametrize(('written', 'other'), [('out_mul_grad', 'out_mul'), ('sqrsum_grad', 'sqrsum')])
def test_mhc_reduce_partials_and_rmsnorm_bwd_rejects_overlap(written, other):
    args = _args()
    args[written] = args[other]
    with pytest.raises(ValueError, match=written):
        mhc_reduce_partials_and_rmsnorm_bwd(**args)


def test_mhc_reduce_partials_and_rmsnorm_bwd_refuses_cpu_tensors():
    for t in (5, 0):
        with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
            mhc_reduce_partials_and_rmsnorm_bwd(**_args(t=t))


# CPU tier: the torch.library form, on fake tensors.

FORMS = mhc_reduce_partials_and_rmsnorm_bwd.operator.forms


def test_mhc_reduce_partials_and_rmsnorm_bwd_is_registered():
    assert OPERATORS[NAME] is mhc_reduce_partials_and_rmsnorm_bwd.operator
    assert list(FORMS) == [NAME]
    assert getattr(torch.ops, NAMESPACE).mhc_reduce_partials_and_rmsnorm_bwd.default is FORMS[NAME]
    schema = FORMS[NAME]._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('out_mul_grad', 'sqrsum_grad')
    assert not schema.returns


def test_mhc_reduce_partials_and_rmsnorm_bwd_fake_calls():
    with FakeTensorMode():
        args = _args(t=130, device='cuda')
        result = mhc_reduce_partials_and_rmsnorm_bwd(**args)
        assert result.out_mul_grad is args['out_mul_grad']
        assert result.sqrsum_grad is args['sqrsum_grad']
        assert FORMS[NAME](*args.values()) is None
        with pytest.raises(ValueError, match='rms_group_size must be >= 1'):
            mhc_reduce_partials_and_rmsnorm_bwd(**{**args, 'rms_group_size': 0})


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_reduce_partials_and_rmsnorm_bwd_values(params, device):
    """Against autograd of the forward's RMS step in float64."""
    out_grad, out_mul, sqrsum = make_inputs(params, device)
    outputs = make_outputs(params, device)
    result = mhc_reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, *outputs, GROUP_SIZE, EPS)
    assert result.out_mul_grad is outputs[0]
    assert result.sqrsum_grad is outputs[1]
    expected = mhc_reduce_partials_and_rmsnorm_bwd_ref(out_grad, out_mul, sqrsum, GROUP_SIZE, EPS)
    rstd = GROUP_SIZE**-0.5  # about 1 / rms: the scale of out_mul_grad; sqrsum_grad ~ sqrt(M3) * rstd**2
    assert_close(result.out_mul_grad.double(), expected[0], atol=1e-6 * rstd, rtol=1e-5)
    assert_close(result.sqrsum_grad.double(), expected[1], atol=1e-5 * params['m3'] ** 0.5 * rstd**2, rtol=1e-4)


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_bwd_gives_the_partials_gradient(device):
    """Chained to the forward's sums, the kernel's gradients are those of every split's partials: autograd of the
    whole forward reference (partials -> out) in float64."""
    params, n_splits = {**CORE, 'tokens': 9}, 4
    out_grad, _, _ = make_inputs(params, device)
    out_mul_splitted = torch.randn(n_splits, 9, 1, params['m3'], device=device) * (GROUP_SIZE / n_splits) ** 0.5
    sqrsum_splitted = (torch.rand(n_splits, 9, 1, device=device) + 0.5) * (GROUP_SIZE / n_splits)
    parts = (out_mul_splitted.double().requires_grad_(), sqrsum_splitted.double().requires_grad_())
    out = mhc_reduce_partials_and_rmsnorm_fwd_ref(*parts, GROUP_SIZE, EPS)[2]
    expected = torch.autograd.grad(out, parts, out_grad.double())
    out_mul = out_mul_splitted.sum(0)
    sqrsum = sqrsum_splitted.sum(0)
    outputs = make_outputs(params, device)
    mhc_reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, *outputs, GROUP_SIZE, EPS)
    rstd = GROUP_SIZE**-0.5
    assert_close(outputs[0].double().expand(n_splits, -1, -1, -1), expected[0], atol=1e-6 * rstd, rtol=1e-4)
    assert_close(outputs[1].double().expand(n_splits, -1, -1), expected[1], atol=1e-5 * rstd**2, rtol=1e-4)


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_bwd_empty(device):
    params = {**CORE, 'tokens': 0}
    outputs = make_outputs(params, device)
    result = mhc_reduce_partials_and_rmsnorm_bwd(*make_inputs(params, device), *outputs, GROUP_SIZE, EPS)
    assert result.out_mul_grad is outputs[0]
    assert result.sqrsum_grad is outputs[1]


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_bwd_is_deterministic(device):
    inputs = make_inputs(CORE, device)
    first, second = make_outputs(CORE, device), make_outputs(CORE, device)
    mhc_reduce_partials_and_rmsnorm_bwd(*inputs, *first, GROUP_SIZE, EPS)
    mhc_reduce_partials_and_rmsnorm_bwd(*inputs, *second, GROUP_SIZE, EPS)
    for a, b in zip(first, second, strict=True):
        assert_equal(a, b)


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_bwd_errors_after_a_launch(device):
    """Once a configuration has launched (on CUDA the next calls take the fast path), a wrong call still raises
    the contract's typed error."""
    inputs, outputs = make_inputs(CORE, device), make_outputs(CORE, device)
    mhc_reduce_partials_and_rmsnorm_bwd(*inputs, *outputs, GROUP_SIZE, EPS)
    with pytest.raises(ValueError, match='rms_eps must be >= 0'):
        mhc_reduce_partials_and_rmsnorm_bwd(*inputs, *outputs, GROUP_SIZE, -EPS)
    with pytest.raises(ValueError, match=r'out_mul_grad \(written in place\) must not alias'):
        mhc_reduce_partials_and_rmsnorm_bwd(*inputs, inputs[1], outputs[1], GROUP_SIZE, EPS)
    strided = torch.empty(CORE['tokens'], 2, device=device)[:, :1]
    with pytest.raises(ValueError, match='sqrsum_grad must be contiguous'):
        mhc_reduce_partials_and_rmsnorm_bwd(*inputs, outputs[0], strided, GROUP_SIZE, EPS)


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_bwd_config(device):
    args = (*make_inputs(CORE, device), *make_outputs(CORE, device), GROUP_SIZE, EPS)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_reduce_partials_and_rmsnorm_bwd_config(
        backend=backend, mhc_mult3=CORE['m3'], groups=CORE['groups'], num_cores=num_cores
    )
    assert mhc_reduce_partials_and_rmsnorm_bwd.operator.config(*args) == expected


@pytest.mark.npu
def test_mhc_reduce_partials_and_rmsnorm_bwd_opcheck(device):
    params = {**CORE, 'tokens': 9}
    args = (*make_inputs(params, device), *make_outputs(params, device), GROUP_SIZE, EPS)
    torch.library.opcheck(FORMS[NAME], args)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_reduce_partials_and_rmsnorm_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    shape = {'tokens': params['tokens'], 'groups': 1, 'm3': mhc_mult3(params['mhc_mult'])}
    inputs, outputs = make_inputs(shape, device), make_outputs(shape, device)
    group_size = params['mhc_mult'] * params['hidden']

    def run():
        return mhc_reduce_partials_and_rmsnorm_bwd(*inputs, *outputs, group_size, EPS)

    run()  # compile and warm up outside the timing
    time_us = benchmark_timer(run)
    benchmark_record(
        kernel=record_name('mhc', NAME),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*inputs, *outputs) / time_us / 1e3,
    )
