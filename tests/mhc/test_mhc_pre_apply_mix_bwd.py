"""Tests of mhc_pre_apply_mix_bwd (TileKernels 2.1.0's mhc_pre_apply_mix_bwd).

CPU tier: the argument contract on CPU tensors (typed errors before the device guard); the torch.library form
(schema, fake kernel, typed errors and torch.compile on fake tensors). The kernels' lowering and configuration:
test_mhc_pre_apply_mix_kernel.py. Device tier (`npu`; on a CPU-only host the Ascend kernels on the emulator with
`--ascend-emulator`): the float64 gradient check against autograd of mhc_pre_apply_mix_fwd's reference (x_grad
accumulated, mix_grad returned) within the kernels' rounding bounds, the same bits run to run, every mhc_mult of
the level, empty inputs, the configuration query, opcheck; the benchmark (`benchmark`, the peer's shapes).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_pre_apply_mix_bwd
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import config_extras, make_param_id
from tests.testing.graphs import GraphRecorder
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .expand_apply_cases import BENCHMARK_PARAMS, NUM_TOKENS, PARAMS, assert_within, bf16, mix, pre_apply_mix_config
from .mhc_pre_apply_mix_bwd_ref import mhc_pre_apply_mix_bwd_ref, mix_grad_bound, x_grad_bound

KERNEL_NAME = 'mhc_pre_apply_mix_bwd_kernel'
FORMS = mhc_pre_apply_mix_bwd.operator.forms


def _buffers(num_tokens=4, mhc=4, hidden=256, device='cpu'):
    """(o_grad, x, mix, x_grad) of zeros (also on fake CUDA devices, where random numbers cannot be drawn)."""
    return (
        torch.zeros(num_tokens, hidden, dtype=torch.bfloat16, device=device),
        torch.zeros(num_tokens, mhc, hidden, dtype=torch.bfloat16, device=device),
        torch.zeros(num_tokens, mhc, dtype=torch.float32, device=device),
        torch.zeros(num_tokens, mhc, hidden, dtype=torch.bfloat16, device=device),
    )


def _random(num_tokens, mhc, hidden, device):
    return (
        bf16(num_tokens, hidden, device=device),
        bf16(num_tokens, mhc, hidden, device=device),
        mix(num_tokens, mhc, device),
        bf16(num_tokens, mhc, hidden, device=device),
    )


# CPU tier: the argument contract (validation runs before the device guard).


@pytest.mark.parametrize(
    ('make', 'error', 'match'),
    [
        (lambda g, x, w, xg: (g, x, w, None), TypeError, 'x_grad must be a torch.Tensor, got NoneType'),
        (lambda g, x, w, xg: (g.half(), x, w, xg), TypeError, 'o_grad must have dtype torch.bfloat16'),
        (lambda g, x, w, xg: (g, x, w.double(), xg), TypeError, 'mix must have dtype torch.float32'),
        (lambda g, x, w, xg: (g, x, w, xg.float()), TypeError, 'x_grad must have dtype torch.bfloat16'),
        (lambda g, x, w, xg: (g, x, w, xg[:, :3]), ValueError, r'x_grad must have shape \(4, 4, 256\)'),
        (lambda g, x, w, xg: (g, x, w[:3], xg), ValueError, r'mix must have shape \(4, 4\), got \(3, 4\)'),
        (
            lambda g, x, w, xg: (g, torch.zeros(4, 9, 256, dtype=x.dtype), torch.zeros(4, 9), xg),
            ValueError,
            r'mhc_mult must be in \[1, 8\], got 9',
        ),
        (
            lambda g, x, w, xg: (g, x, w, xg.transpose(0, 1).contiguous().transpose(0, 1)),
            ValueError,
            'x_grad must be contiguous',
        ),
        (
            lambda g, x, w, xg: (torch.zeros(4 * 256 + 1, dtype=g.dtype)[1:].view(4, 256), x, w, xg),
            ValueError,
            'o_grad must start at a 16-byte aligned address',
        ),
        (lambda g, x, w, xg: (g, x, w, x), ValueError, r'x_grad \(updated in place\) must not alias the input x'),
        (
            lambda g, x, w, xg: (xg.view(-1)[: g.numel()].view(g.shape), x, w, xg),
            ValueError,
            r'x_grad \(updated in place\) must not alias the input o_grad',
        ),
    ],
    ids=[
        'not-a-tensor',
        'o_grad-dtype',
        'mix-dtype',
        'x_grad-dtype',
        'x_grad-shape',
        'mix-tokens',
        'mhc-mult',
        'x_grad-strides',
        'misaligned',
        'alias-x',
        'alias-o_grad',
    ],
)
def test_mhc_pre_apply_mix_bwd_rejects(make, error, match):
    with pytest.raises(error, match=match):
        mhc_pre_apply_mix_bwd(*make(*_buffers()))


def test_mhc_pre_apply_mix_bwd_rejects_too_many_elements():
    o_grad = torch.empty(2**18, 1024, dtype=torch.bfloat16, device='meta')  # no memory behind meta tensors
    x = torch.empty(2**18, 8, 1024, dtype=torch.bfloat16, device='meta')  # 2**31 elements
    with pytest.raises(ValueError, match=r'tokens \* mhc_mult \* hidden must be at most 1073741824'):
        mhc_pre_apply_mix_bwd(o_grad, x, torch.empty(2**18, 8, device='meta'), torch.empty_like(x))


@pytest.mark.parametrize('num_tokens', [4, 0])
def test_mhc_pre_apply_mix_bwd_refuses_cpu_tensors(num_tokens):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_pre_apply_mix_bwd(*_buffers(num_tokens))


# CPU tier: the torch.library form, on fake tensors.


def test_mhc_pre_apply_mix_bwd_op_is_registered():
    assert OPERATORS['mhc_pre_apply_mix_bwd'] is mhc_pre_apply_mix_bwd.operator
    assert list(FORMS) == ['mhc_pre_apply_mix_bwd']
    assert getattr(torch.ops, NAMESPACE).mhc_pre_apply_mix_bwd.default is FORMS['mhc_pre_apply_mix_bwd']
    schema = FORMS['mhc_pre_apply_mix_bwd']._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ['x_grad']
    assert [r.alias_info for r in schema.returns] == [None]  # mix_grad: a new tensor


def test_mhc_pre_apply_mix_bwd_fake_calls():
    with FakeTensorMode():
        args = _buffers(device='cuda')
        for call in (mhc_pre_apply_mix_bwd, FORMS['mhc_pre_apply_mix_bwd']):
            mix_grad = call(*args)
            assert (mix_grad.shape, mix_grad.dtype, mix_grad.device) == ((4, 4), torch.float32, args[0].device)
            with pytest.raises(TypeError, match='mix must have dtype torch.float32'):
                call(args[0], args[1], args[2].double(), args[3])
            with pytest.raises(ValueError, match=r'x_grad must have shape \(4, 4, 256\)'):
                call(*args[:3], _buffers(3, device='cuda')[3])
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(*_buffers())


def test_mhc_pre_apply_mix_bwd_compiles_into_one_graph():
    record = GraphRecorder()

    def step(o_grad, x, mix_, x_grad):
        return mhc_pre_apply_mix_bwd(o_grad, x, mix_, x_grad) * 2

    with FakeTensorMode():
        args = _buffers(device='cuda')
        result = torch.compile(step, fullgraph=True, backend=record)(*args)
        assert (result.shape, result.dtype) == (args[2].shape, torch.float32)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_pre_apply_mix_bwd']) in targets, targets


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_pre_apply_mix_bwd_values(params, device):
    """x_grad (accumulated) and mix_grad within their rounding bounds of float64 autograd of the forward's
    reference; a second run from the same x_grad gives the same bits (no atomics)."""
    mhc, hidden = params['sizes']
    for num_tokens in NUM_TOKENS:
        o_grad, x, w, x_grad_before = _random(num_tokens, mhc, hidden, device)
        x_grad = x_grad_before.clone()
        mix_grad = mhc_pre_apply_mix_bwd(o_grad, x, w, x_grad)
        assert (mix_grad.shape, mix_grad.dtype, mix_grad.device) == ((num_tokens, mhc), torch.float32, x.device)
        cpu = [t.cpu() for t in (o_grad, x, w, x_grad_before)]
        expected_x_grad, expected_mix_grad = mhc_pre_apply_mix_bwd_ref(*cpu)
        assert_within(x_grad, expected_x_grad, x_grad_bound(cpu[0], cpu[2], cpu[3], expected_x_grad), 'x_grad')
        assert_within(mix_grad, expected_mix_grad, mix_grad_bound(cpu[0], cpu[1]), 'mix_grad')
        again = x_grad_before.clone()
        assert_equal(mhc_pre_apply_mix_bwd(o_grad, x, w, again), mix_grad)
        assert_equal(again, x_grad)


@pytest.mark.npu
def test_mhc_pre_apply_mix_bwd_empty(device):
    mix_grad = mhc_pre_apply_mix_bwd(*_buffers(0, device=device))
    assert (mix_grad.shape, mix_grad.dtype) == ((0, 4), torch.float32)


@pytest.mark.npu
def test_mhc_pre_apply_mix_bwd_config_and_source(device, monkeypatch, capsys):
    args = _buffers(device=device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    assert mhc_pre_apply_mix_bwd.operator.config(*args) == pre_apply_mix_config(backend, 'bwd', 4, 256, num_cores)
    monkeypatch.setenv(config.PRINT_KERNEL_SOURCE_ENV, '1')
    mhc_pre_apply_mix_bwd(*args)
    assert KERNEL_NAME in capsys.readouterr().out


@pytest.mark.npu
def test_mhc_pre_apply_mix_bwd_opcheck(device):
    torch.library.opcheck(FORMS['mhc_pre_apply_mix_bwd'], _buffers(device=device))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_pre_apply_mix_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    args = _random(params['num_tokens'], params['mhc'], params['hidden'], device)
    o_grad, x, w, x_grad = args
    before = x_grad.cpu()
    mix_grad = mhc_pre_apply_mix_bwd(*args)  # compile and warm up outside the timing
    cpu = [t.cpu() for t in (o_grad, x, w)]
    expected_x_grad, expected_mix_grad = mhc_pre_apply_mix_bwd_ref(*cpu, before)
    assert_within(x_grad, expected_x_grad, x_grad_bound(cpu[0], cpu[2], before, expected_x_grad), 'x_grad')
    assert_within(mix_grad, expected_mix_grad, mix_grad_bound(cpu[0], cpu[1]), 'mix_grad')
    time_us = benchmark_timer(lambda: mhc_pre_apply_mix_bwd(*args))  # x_grad keeps accumulating: same traffic
    benchmark_record(
        kernel=record_name('mhc', 'mhc_pre_apply_mix_bwd'),
        operation='bwd',
        params=params,
        time_us=time_us,
        # o_grad, x, mix and x_grad read, x_grad and mix_grad written
        bandwidth_gbs=count_bytes(o_grad, x, w, x_grad, x_grad, mix_grad) / time_us / 1e3,
        extras=config_extras(mhc_pre_apply_mix_bwd.operator.config(*args)),
    )
