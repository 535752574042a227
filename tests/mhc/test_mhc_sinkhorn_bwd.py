"""Tests of mhc_sinkhorn_bwd.

CPU tier: the Ascend 950 and CUDA kernels lower for every configuration of the level (UB and shared memory
within bounds at the largest repeat); the argument contract on CPU tensors; the torch.library form on fake
tensors. Device tier (`npu`; the Ascend kernels on the CPU with `--ascend-emulator`): the gradient against
float64 autograd of the reference for every mhc_mult of the level, bit-identical repeated runs, no tokens,
opcheck; the benchmark (`benchmark`) at the peer's shapes.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_sinkhorn_bwd
from cann_ops_tilelang.mhc.mhc_sinkhorn_kernel import MAX_REPEAT, choose_mhc_sinkhorn_config, make_mhc_sinkhorn_kernel
from cann_ops_tilelang.operator import OPERATORS
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.lowering import assert_ascend_kernel_lowers, assert_cuda_kernel_lowers
from tests.testing.numeric import assert_close, count_bytes
from tests.testing.timing import record_name

from .mhc_sinkhorn_bwd_ref import mhc_sinkhorn_bwd_ref
from .mhc_sinkhorn_fwd_ref import mhc_sinkhorn_fwd_ref
from .sinkhorn_cases import ATOL, EPS, RTOL, distinct_configs, gen_cases, make_config, random_logits

KERNEL_NAME = 'mhc_sinkhorn_bwd_kernel'
CASES = gen_cases(get_test_level())
# The largest store (mhc_mult 8 at MAX_REPEAT: one token per block) lowers within UB and shared memory.
CONFIGS = [*distinct_configs(CASES), {'mhc_mult': 8, 'repeat': MAX_REPEAT}]
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], mhc_mult=[4], repeat=[10, 20])


# CPU tier: lowering.


@pytest.mark.parametrize('params', CONFIGS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_mhc_sinkhorn_bwd_kernel_lowers(backend, params):
    cfg = make_config(backend, 'bwd', params['mhc_mult'], params['repeat'])
    assert (cfg.backend, cfg.direction, cfg.mhc_mult, cfg.repeat) == (backend, 'bwd', params['mhc_mult'],
                                                                      params['repeat'])  # fmt: skip
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowers(lambda: make_mhc_sinkhorn_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


# CPU tier: the argument contract.


def _call(shape=(4, 4, 4), repeat=3, eps=EPS, **changes):
    x = changes.get('x', torch.zeros(shape))
    grad_output = changes.get('grad_output', torch.zeros(x.shape))
    grad_input = changes.get('grad_input', torch.zeros(x.shape))
    return mhc_sinkhorn_bwd(grad_output, x, grad_input, repeat, eps)


@pytest.mark.parametrize(
    ('changes', 'error', 'match'),
    [
        ({'grad_output': (1.0,)}, TypeError, 'grad_output must be a torch.Tensor, got tuple'),
        ({'x': torch.zeros(4, 4, 4, dtype=torch.float16)}, TypeError, 'x must have dtype torch.float32'),
        ({'grad_input': torch.zeros(4, 4, 4, dtype=torch.bfloat16)}, TypeError, 'grad_input must have dtype'),
        ({'shape': (16,)}, ValueError, r'x must have shape \(\.\.\., mhc_mult, mhc_mult\)'),
        ({'shape': (2, 3, 4)}, ValueError, r'mhc_mult in 1\.\.8, got \(2, 3, 4\)'),
        ({'grad_output': torch.zeros(5, 4, 4)}, ValueError, 'grad_output must have shape'),
        ({'grad_input': torch.zeros(4, 16)}, ValueError, 'grad_input must have shape'),
        ({'grad_output': torch.zeros(4, 4, 4).transpose(1, 2)}, ValueError, 'grad_output must be contiguous'),
        ({'repeat': 0}, ValueError, r'repeat must be in \[1, 256\], got 0'),
        ({'repeat': MAX_REPEAT + 1}, ValueError, r'repeat must be in \[1, 256\], got 257'),
        ({'repeat': 3.5}, TypeError, 'repeat must be an int'),
        ({'eps': float('inf')}, ValueError, 'eps must be a finite number'),
    ],
    ids=lambda v: v if isinstance(v, str) and ' ' not in v else None,
)
def test_mhc_sinkhorn_bwd_rejects(changes, error, match):
    with pytest.raises(error, match=match):
        _call(**changes)


def test_mhc_sinkhorn_bwd_rejects_overlap():
    x, g = torch.zeros(4, 4, 4), torch.zeros(4, 4, 4)
    for grad_input, name in ((x, 'x'), (g, 'grad_output')):
        with pytest.raises(ValueError, match=rf'grad_input \(written in place\) must not alias the input {name}'):
            mhc_sinkhorn_bwd(g, x, grad_input, 3, EPS)
    both = torch.zeros(6, 4, 4)
    with pytest.raises(ValueError, match=r'grad_input \(written in place\) must not alias the input x'):
        mhc_sinkhorn_bwd(g, both[:4], both[2:], 3, EPS)


def test_mhc_sinkhorn_bwd_refuses_cpu_tensors():
    x = torch.zeros(4, 4, 4)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_sinkhorn_bwd(torch.zeros_like(x), x, torch.zeros_like(x), 3, EPS)


# CPU tier: the torch.library form on fake tensors.

FORMS = mhc_sinkhorn_bwd.operator.forms


def test_mhc_sinkhorn_bwd_is_declared():
    assert OPERATORS['mhc_sinkhorn_bwd'] is mhc_sinkhorn_bwd.operator
    assert list(FORMS) == ['mhc_sinkhorn_bwd']
    schema = FORMS['mhc_sinkhorn_bwd']._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('grad_input',)
    assert [a.name for a in schema.arguments] == ['grad_output', 'x', 'grad_input', 'repeat', 'eps']


def test_mhc_sinkhorn_bwd_fake_calls():
    with FakeTensorMode():
        x = torch.empty(6, 8, 8, device='cuda')
        grad_input = torch.empty_like(x)
        assert mhc_sinkhorn_bwd(torch.empty_like(x), x, grad_input, 20, EPS) is grad_input
        with pytest.raises(ValueError, match='repeat must be in'):
            mhc_sinkhorn_bwd(torch.empty_like(x), x, grad_input, MAX_REPEAT + 1, EPS)
        with pytest.raises(ValueError, match='grad_output must have shape'):
            mhc_sinkhorn_bwd(torch.empty(2, 8, 8, device='cuda'), x, grad_input, 20, EPS)


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', CASES, ids=make_param_id)
def test_mhc_sinkhorn_bwd_values(params, device):
    x = random_logits(params['shape'], device)
    grad_output = torch.randn(params['shape'], device=device)
    grad_input = torch.full_like(x, float('nan'))  # poisoned: an element the kernel skips stays NaN
    assert mhc_sinkhorn_bwd(grad_output, x, grad_input, params['repeat'], EPS) is grad_input
    expected = mhc_sinkhorn_bwd_ref(grad_output.cpu(), x.cpu(), params['repeat'], EPS)
    assert_close(grad_input.cpu().double(), expected, atol=ATOL, rtol=RTOL)
    # Deterministic: every thread sums its own token in a fixed order, so a second run is bit-identical.
    again = mhc_sinkhorn_bwd(grad_output, x, torch.empty_like(x), params['repeat'], EPS)
    assert torch.equal(again, grad_input)


@pytest.mark.npu
def test_mhc_sinkhorn_bwd_is_the_gradient_of_the_forward_reference(device):
    """The float64 reference itself passes torch.autograd.gradcheck, so the oracle above is the derivative."""
    x = random_logits((3, 4, 4), 'cpu').double().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: mhc_sinkhorn_fwd_ref(t, 3, 1e-3), (x,))
    logits = random_logits((130, 4, 4), device)
    grad_output = torch.randn_like(logits)
    result = mhc_sinkhorn_bwd(grad_output, logits, torch.empty_like(logits), 3, 1e-3)
    # A directional check through finite differences of the reference, independent of autograd.
    direction = torch.randn(logits.shape, dtype=torch.float64)
    step = 1e-6
    base = logits.cpu().double()
    plus = mhc_sinkhorn_fwd_ref(base + step * direction, 3, 1e-3)
    minus = mhc_sinkhorn_fwd_ref(base - step * direction, 3, 1e-3)
    numeric = ((plus - minus) / (2 * step) * grad_output.cpu().double()).sum()
    analytic = (result.cpu().double() * direction).sum()
    assert abs(numeric - analytic) <= 1e-4 * max(1.0, abs(float(numeric)))


@pytest.mark.npu
@pytest.mark.parametrize('shape', [(0, 4, 4), (3, 0, 2, 2)], ids=lambda s: f'shape={s}')
def test_mhc_sinkhorn_bwd_without_tokens(shape, device):
    x = torch.empty(shape, device=device)
    grad_input = torch.empty_like(x)
    assert mhc_sinkhorn_bwd(torch.empty_like(x), x, grad_input, 3, EPS) is grad_input


@pytest.mark.npu
def test_mhc_sinkhorn_bwd_config(device):
    x = random_logits((5, 4, 4), device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_sinkhorn_config(backend=backend, num_cores=num_cores, direction='bwd', mhc_mult=4,
                                          repeat=3)  # fmt: skip
    assert mhc_sinkhorn_bwd.operator.config(torch.empty_like(x), x, torch.empty_like(x), 3, EPS) == expected


@pytest.mark.npu
def test_mhc_sinkhorn_bwd_opcheck(device):
    x = random_logits((130, 4, 4), device)
    torch.library.opcheck(FORMS['mhc_sinkhorn_bwd'], (torch.randn_like(x), x, torch.empty_like(x), 3, EPS))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_sinkhorn_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    m, repeat = params['mhc_mult'], params['repeat']
    x = random_logits((params['num_tokens'], m, m), device)
    grad_output, grad_input = torch.randn_like(x), torch.empty_like(x)
    mhc_sinkhorn_bwd(grad_output, x, grad_input, repeat, EPS)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_sinkhorn_bwd(grad_output, x, grad_input, repeat, EPS))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_sinkhorn_bwd'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(grad_output, x, grad_input) / time_us / 1e3,
        extras=config_extras(mhc_sinkhorn_bwd.operator.config(grad_output, x, grad_input, repeat, EPS)),
    )
