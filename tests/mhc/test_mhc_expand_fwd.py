"""Tests of mhc_expand_fwd (TileKernels 2.1.0's expand_to_mhc_fwd).

CPU tier: the argument contract on CPU tensors (typed errors before the device guard); the torch.library form
(schema, fake kernel, typed errors and torch.compile on fake tensors). The kernels' lowering and configuration:
test_mhc_expand_kernel.py. Device tier (`npu`; on a CPU-only host the Ascend kernels on the emulator with
`--ascend-emulator`): values bit for bit against the reference, every mhc_mult of the level, empty inputs, the
configuration query, opcheck; the benchmark (`benchmark`, the peer's shapes).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_expand_fwd
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import config_extras, make_param_id
from tests.testing.graphs import GraphRecorder
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .expand_apply_cases import BENCHMARK_PARAMS, NUM_TOKENS, PARAMS, bf16, expand_config, poisoned
from .mhc_expand_fwd_ref import mhc_expand_fwd_ref

KERNEL_NAME = 'mhc_expand_fwd_kernel'
FORMS = mhc_expand_fwd.operator.forms


def _buffers(num_tokens=4, mhc=4, hidden=256, device='cpu'):
    """(x, o) of zeros (also on fake CUDA devices, where random numbers cannot be drawn)."""
    x = torch.zeros(num_tokens, hidden, dtype=torch.bfloat16, device=device)
    return x, torch.zeros(num_tokens, mhc, hidden, dtype=torch.bfloat16, device=device)


# CPU tier: the argument contract (validation runs before the device guard).


@pytest.mark.parametrize(
    ('make', 'error', 'match'),
    [
        (lambda x, o: ([1.0], o), TypeError, 'x must be a torch.Tensor, got list'),
        (lambda x, o: (x.float(), o), TypeError, 'x must have dtype torch.bfloat16, got torch.float32'),
        (lambda x, o: (x, o.half()), TypeError, 'o must have dtype torch.bfloat16, got torch.float16'),
        (lambda x, o: (x, o[:, 0]), ValueError, 'o must have 3 dimensions'),
        (lambda x, o: (x, o[:3]), ValueError, r'o must have shape \(4, 4, 256\), got \(3, 4, 256\)'),
        (lambda x, o: (x, torch.zeros(4, 9, 256, dtype=o.dtype)), ValueError, r'mhc_mult must be in \[1, 8\], got 9'),
        (lambda x, o: (x[:, :64], o[..., :64].contiguous()), ValueError, 'x must be contiguous'),
        (
            lambda x, o: (x[:, :96].contiguous(), o[..., :96].contiguous()),
            ValueError,
            'hidden must be a positive multiple of 64, got 96',
        ),
        (lambda x, o: (x, o.transpose(0, 1).contiguous().transpose(0, 1)), ValueError, 'o must be contiguous'),
        (
            lambda x, o: (torch.zeros(4 * 256 + 1, dtype=x.dtype)[1:].view(4, 256), o),
            ValueError,
            'x must start at a 16-byte aligned address',
        ),
        (
            lambda x, o: (o.view(-1)[: x.numel()].view(x.shape), o),
            ValueError,
            r'o \(written in place\) must not alias the input x',
        ),
    ],
    ids=[
        'not-a-tensor',
        'x-dtype',
        'o-dtype',
        'o-rank',
        'o-tokens',
        'mhc-mult',
        'strided',
        'hidden',
        'o-strides',
        'misaligned',
        'alias',
    ],
)
def test_mhc_expand_fwd_rejects(make, error, match):
    with pytest.raises(error, match=match):
        mhc_expand_fwd(*make(*_buffers()))


def test_mhc_expand_fwd_rejects_too_many_elements():
    # 2**20 tokens * 2 streams * 1024 = 2**31 elements, past the 2**30 bound; meta tensors have no memory behind them.
    x = torch.empty(2**20, 1024, dtype=torch.bfloat16, device='meta')
    o = torch.empty(2**20, 2, 1024, dtype=torch.bfloat16, device='meta')
    with pytest.raises(ValueError, match=r'tokens \* mhc_mult \* hidden must be at most 1073741824'):
        mhc_expand_fwd(x, o)


@pytest.mark.parametrize('num_tokens', [4, 0])
def test_mhc_expand_fwd_refuses_cpu_tensors(num_tokens):
    # No CPU fallback, not even for empty inputs.
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_expand_fwd(*_buffers(num_tokens))


# CPU tier: the torch.library form, on fake tensors (nothing is allocated, compiled or launched).


def test_mhc_expand_fwd_op_is_registered():
    assert OPERATORS['mhc_expand_fwd'] is mhc_expand_fwd.operator
    assert list(FORMS) == ['mhc_expand_fwd']
    assert getattr(torch.ops, NAMESPACE).mhc_expand_fwd.default is FORMS['mhc_expand_fwd']
    schema = FORMS['mhc_expand_fwd']._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert (written, len(schema.returns)) == (['o'], 0)


def test_mhc_expand_fwd_fake_calls():
    """Traced, the public call returns the written buffer and the op nothing; the contract's errors hold."""
    with FakeTensorMode():
        x, o = _buffers(device='cuda')
        assert mhc_expand_fwd(x, o) is o
        assert FORMS['mhc_expand_fwd'](x, o) is None
        for call in (mhc_expand_fwd, FORMS['mhc_expand_fwd']):
            with pytest.raises(TypeError, match='x must have dtype torch.bfloat16'):
                call(x.float(), o)
            with pytest.raises(ValueError, match=r'o must have shape \(4, 4, 256\)'):
                call(x, _buffers(3, device='cuda')[1])
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(*_buffers())


def test_mhc_expand_fwd_compiles_into_one_graph():
    """torch.compile(fullgraph=True) traces the in-place op into one graph (a graph break would raise)."""
    record = GraphRecorder()

    def step(x, o):
        return mhc_expand_fwd(x, o) * 2

    with FakeTensorMode():
        x, o = _buffers(device='cuda')
        doubled = torch.compile(step, fullgraph=True, backend=record)(x, o)
        assert (doubled.shape, doubled.dtype) == (o.shape, o.dtype)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_expand_fwd']) in targets, targets


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_expand_fwd_values(params, device):
    mhc, hidden = params['sizes']
    for num_tokens in NUM_TOKENS:
        x = bf16(num_tokens, hidden, device=device)
        o = poisoned(num_tokens, mhc, hidden, device=device)
        assert mhc_expand_fwd(x, o) is o
        assert_equal(o, mhc_expand_fwd_ref(x, mhc))  # a copy: bit for bit


@pytest.mark.npu
def test_mhc_expand_fwd_empty(device):
    x, o = _buffers(0, device=device)
    assert mhc_expand_fwd(x, o) is o


@pytest.mark.npu
def test_mhc_expand_fwd_config_and_source(device, monkeypatch, capsys):
    """The configuration a call launches is the chooser's for the device; the kernel-source switch prints it."""
    x, o = _buffers(device=device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    assert mhc_expand_fwd.operator.config(x, o) == expand_config(backend, 'fwd', 4, 256, num_cores)
    monkeypatch.setenv(config.PRINT_KERNEL_SOURCE_ENV, '1')
    mhc_expand_fwd(x, o)
    assert KERNEL_NAME in capsys.readouterr().out


@pytest.mark.npu
def test_mhc_expand_fwd_opcheck(device):
    """torch.library.opcheck on real tensors: the schema's mutation, the fake kernel against the real one."""
    torch.library.opcheck(FORMS['mhc_expand_fwd'], _buffers(device=device))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_expand_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    x = bf16(params['num_tokens'], params['hidden'], device=device)
    o = poisoned(params['num_tokens'], params['mhc'], params['hidden'], device=device)
    mhc_expand_fwd(x, o)  # compile and warm up outside the timing
    assert_equal(o, mhc_expand_fwd_ref(x, params['mhc']))
    time_us = benchmark_timer(lambda: mhc_expand_fwd(x, o))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_expand_fwd'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, o) / time_us / 1e3,
        extras=config_extras(mhc_expand_fwd.operator.config(x, o)),
    )
