"""Tests of mhc_expand_bwd (TileKernels 2.1.0's expand_to_mhc_bwd).

CPU tier: the argument contract on CPU tensors (typed errors before the device guard); the torch.library form
(schema, fake kernel, typed errors and torch.compile on fake tensors). The kernels' lowering and configuration:
test_mhc_expand_kernel.py. Device tier (`npu`; on a CPU-only host the Ascend kernels on the emulator with
`--ascend-emulator`): values bit for bit against the fp32 reference of the kernels' summation order, the float64
gradient check against autograd of mhc_expand_fwd's reference, the same bits run to run, every mhc_mult of the
level, empty inputs, the configuration query, opcheck; the benchmark (`benchmark`, the peer's shapes).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_expand_bwd
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import config_extras, make_param_id
from tests.testing.graphs import GraphRecorder
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .expand_apply_cases import BENCHMARK_PARAMS, NUM_TOKENS, PARAMS, assert_within, bf16, expand_config, poisoned
from .mhc_expand_bwd_ref import expand_grad_bound, mhc_expand_bwd_ref, mhc_expand_grad_ref

KERNEL_NAME = 'mhc_expand_bwd_kernel'
FORMS = mhc_expand_bwd.operator.forms


def _buffers(num_tokens=4, mhc=4, hidden=256, device='cpu'):
    """(o_grad, x_grad) of zeros (also on fake CUDA devices, where random numbers cannot be drawn)."""
    o_grad = torch.zeros(num_tokens, mhc, hidden, dtype=torch.bfloat16, device=device)
    return o_grad, torch.zeros(num_tokens, hidden, dtype=torch.bfloat16, device=device)


# CPU tier: the argument contract (validation runs before the device guard).


@pytest.mark.parametrize(
    ('make', 'error', 'match'),
    [
        (lambda g, xg: (g.tolist(), xg), TypeError, 'o_grad must be a torch.Tensor, got list'),
        (lambda g, xg: (g.float(), xg), TypeError, 'o_grad must have dtype torch.bfloat16, got torch.float32'),
        (lambda g, xg: (g, xg.float()), TypeError, 'x_grad must have dtype torch.bfloat16, got torch.float32'),
        (lambda g, xg: (g[:, 0], xg), ValueError, 'o_grad must have 3 dimensions'),
        (lambda g, xg: (g, xg[:3]), ValueError, r'x_grad must have shape \(4, 256\), got \(3, 256\)'),
        (lambda g, xg: (torch.zeros(4, 0, 256, dtype=g.dtype), xg), ValueError, r'mhc_mult must be in \[1, 8\]'),
        (lambda g, xg: (g[..., :64], xg[:, :64].contiguous()), ValueError, 'o_grad must be contiguous'),
        (
            lambda g, xg: (torch.zeros(4, 4, 100, dtype=g.dtype), torch.zeros(4, 100, dtype=g.dtype)),
            ValueError,
            'hidden must be a positive multiple of 64, got 100',
        ),
        (
            lambda g, xg: (g, torch.zeros(4 * 256 + 1, dtype=g.dtype)[1:].view(4, 256)),
            ValueError,
            'x_grad must start at a 16-byte aligned address',
        ),
        (
            lambda g, xg: (g, g.view(-1)[: xg.numel()].view(xg.shape)),
            ValueError,
            r'x_grad \(written in place\) must not alias the input o_grad',
        ),
    ],
    ids=[
        'not-a-tensor',
        'o_grad-dtype',
        'x_grad-dtype',
        'o_grad-rank',
        'x_grad-tokens',
        'mhc-mult',
        'strided',
        'hidden',
        'misaligned',
        'alias',
    ],
)
def test_mhc_expand_bwd_rejects(make, error, match):
    with pytest.raises(error, match=match):
        mhc_expand_bwd(*make(*_buffers()))


def test_mhc_expand_bwd_rejects_too_many_elements():
    o_grad = torch.empty(2**18, 8, 1024, dtype=torch.bfloat16, device='meta')  # 2**31 elements: no memory behind
    x_grad = torch.empty(2**18, 1024, dtype=torch.bfloat16, device='meta')
    with pytest.raises(ValueError, match=r'tokens \* mhc_mult \* hidden must be at most 1073741824'):
        mhc_expand_bwd(o_grad, x_grad)


@pytest.mark.parametrize('num_tokens', [4, 0])
def test_mhc_expand_bwd_refuses_cpu_tensors(num_tokens):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_expand_bwd(*_buffers(num_tokens))


# CPU tier: the torch.library form, on fake tensors.


def test_mhc_expand_bwd_op_is_registered():
    assert OPERATORS['mhc_expand_bwd'] is mhc_expand_bwd.operator
    assert list(FORMS) == ['mhc_expand_bwd']
    assert getattr(torch.ops, NAMESPACE).mhc_expand_bwd.default is FORMS['mhc_expand_bwd']
    schema = FORMS['mhc_expand_bwd']._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert (written, len(schema.returns)) == (['x_grad'], 0)


def test_mhc_expand_bwd_fake_calls():
    with FakeTensorMode():
        o_grad, x_grad = _buffers(device='cuda')
        assert mhc_expand_bwd(o_grad, x_grad) is x_grad
        assert FORMS['mhc_expand_bwd'](o_grad, x_grad) is None
        for call in (mhc_expand_bwd, FORMS['mhc_expand_bwd']):
            with pytest.raises(TypeError, match='x_grad must have dtype torch.bfloat16'):
                call(o_grad, x_grad.float())
            with pytest.raises(ValueError, match=r'x_grad must have shape \(4, 256\)'):
                call(o_grad, _buffers(3, device='cuda')[1])
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(*_buffers())


def test_mhc_expand_bwd_compiles_into_one_graph():
    record = GraphRecorder()

    def step(o_grad, x_grad):
        return mhc_expand_bwd(o_grad, x_grad) + 1

    with FakeTensorMode():
        o_grad, x_grad = _buffers(device='cuda')
        result = torch.compile(step, fullgraph=True, backend=record)(o_grad, x_grad)
        assert (result.shape, result.dtype) == (x_grad.shape, x_grad.dtype)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_expand_bwd']) in targets, targets


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_expand_bwd_values(params, device):
    """Bit for bit against the fp32 sum in stream order; within the rounding bound of the float64 gradient
    (autograd of mhc_expand_fwd's reference); the same bits on a second run."""
    mhc, hidden = params['sizes']
    for num_tokens in NUM_TOKENS:
        o_grad = bf16(num_tokens, mhc, hidden, device=device)
        x_grad = poisoned(num_tokens, hidden, device=device)
        assert mhc_expand_bwd(o_grad, x_grad) is x_grad
        assert_equal(x_grad.cpu(), mhc_expand_bwd_ref(o_grad.cpu()))
        expected = mhc_expand_grad_ref(o_grad.cpu())
        assert_within(x_grad, expected, expand_grad_bound(o_grad.cpu(), expected), 'x_grad')
        again = poisoned(num_tokens, hidden, device=device)
        assert_equal(mhc_expand_bwd(o_grad, again), x_grad)


@pytest.mark.npu
def test_mhc_expand_bwd_empty(device):
    o_grad, x_grad = _buffers(0, device=device)
    assert mhc_expand_bwd(o_grad, x_grad) is x_grad


@pytest.mark.npu
def test_mhc_expand_bwd_config_and_source(device, monkeypatch, capsys):
    o_grad, x_grad = _buffers(device=device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    assert mhc_expand_bwd.operator.config(o_grad, x_grad) == expand_config(backend, 'bwd', 4, 256, num_cores)
    monkeypatch.setenv(config.PRINT_KERNEL_SOURCE_ENV, '1')
    mhc_expand_bwd(o_grad, x_grad)
    assert KERNEL_NAME in capsys.readouterr().out


@pytest.mark.npu
def test_mhc_expand_bwd_opcheck(device):
    torch.library.opcheck(FORMS['mhc_expand_bwd'], _buffers(device=device))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_expand_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    o_grad = bf16(params['num_tokens'], params['mhc'], params['hidden'], device=device)
    x_grad = poisoned(params['num_tokens'], params['hidden'], device=device)
    mhc_expand_bwd(o_grad, x_grad)  # compile and warm up outside the timing
    assert_equal(x_grad.cpu(), mhc_expand_bwd_ref(o_grad.cpu()))
    time_us = benchmark_timer(lambda: mhc_expand_bwd(o_grad, x_grad))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_expand_bwd'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(o_grad, x_grad) / time_us / 1e3,
        extras=config_extras(mhc_expand_bwd.operator.config(o_grad, x_grad)),
    )
