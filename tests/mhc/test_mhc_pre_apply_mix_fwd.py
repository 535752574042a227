"""Tests of mhc_pre_apply_mix_fwd (TileKernels 2.1.0's mhc_pre_apply_mix_fwd).

CPU tier: the argument contract on CPU tensors (typed errors before the device guard); the torch.library form
(schema, fake kernel, typed errors and torch.compile on fake tensors). The kernels' lowering and configuration:
test_mhc_pre_apply_mix_kernel.py. Device tier (`npu`; on a CPU-only host the Ascend kernels on the emulator with
`--ascend-emulator`): values within the rounding bound of the float64 reference, every mhc_mult of the level,
empty inputs, the configuration query, opcheck; the benchmark (`benchmark`, the peer's shapes).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_pre_apply_mix_fwd
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import config_extras, make_param_id
from tests.testing.graphs import GraphRecorder
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .expand_apply_cases import (
    BENCHMARK_PARAMS,
    NUM_TOKENS,
    PARAMS,
    assert_within,
    bf16,
    mix,
    poisoned,
    pre_apply_mix_config,
)
from .mhc_pre_apply_mix_fwd_ref import mhc_pre_apply_mix_fwd_ref, pre_apply_mix_fwd_bound

KERNEL_NAME = 'mhc_pre_apply_mix_fwd_kernel'
FORMS = mhc_pre_apply_mix_fwd.operator.forms


def _buffers(num_tokens=4, mhc=4, hidden=256, device='cpu'):
    """(x, mix, o) of zeros (also on fake CUDA devices, where random numbers cannot be drawn)."""
    return (
        torch.zeros(num_tokens, mhc, hidden, dtype=torch.bfloat16, device=device),
        torch.zeros(num_tokens, mhc, dtype=torch.float32, device=device),
        torch.zeros(num_tokens, hidden, dtype=torch.bfloat16, device=device),
    )


# CPU tier: the argument contract (validation runs before the device guard).


@pytest.mark.parametrize(
    ('make', 'error', 'match'),
    [
        (lambda x, w, o: (x, w.tolist(), o), TypeError, 'mix must be a torch.Tensor, got list'),
        (lambda x, w, o: (x.float(), w, o), TypeError, 'x must have dtype torch.bfloat16, got torch.float32'),
        (lambda x, w, o: (x, w.bfloat16(), o), TypeError, 'mix must have dtype torch.float32, got torch.bfloat16'),
        (lambda x, w, o: (x, w, o.float()), TypeError, 'o must have dtype torch.bfloat16, got torch.float32'),
        (lambda x, w, o: (x, w.unsqueeze(-1), o), ValueError, 'mix must have 2 dimensions'),
        (lambda x, w, o: (x, w[:, :3], o), ValueError, r'mix must have shape \(4, 4\), got \(4, 3\)'),
        (lambda x, w, o: (x, w, o[:3]), ValueError, r'o must have shape \(4, 256\), got \(3, 256\)'),
        (
            lambda x, w, o: (torch.zeros(4, 9, 256, dtype=x.dtype), torch.zeros(4, 9), o),
            ValueError,
            r'mhc_mult must be in \[1, 8\], got 9',
        ),
        (
            lambda x, w, o: (x[..., :80].contiguous(), w, o[:, :80].contiguous()),
            ValueError,
            'hidden must be a positive multiple of 64, got 80',
        ),
        (lambda x, w, o: (x, w.t().contiguous().t(), o), ValueError, 'mix must be contiguous'),
        (
            lambda x, w, o: (x, w, torch.zeros(4 * 256 + 1, dtype=o.dtype)[1:].view(4, 256)),
            ValueError,
            'o must start at a 16-byte aligned address',
        ),
        (
            lambda x, w, o: (x, w, x.view(-1)[: o.numel()].view(o.shape)),
            ValueError,
            r'o \(written in place\) must not alias the input x',
        ),
    ],
    ids=[
        'not-a-tensor',
        'x-dtype',
        'mix-dtype',
        'o-dtype',
        'mix-rank',
        'mix-shape',
        'o-tokens',
        'mhc-mult',
        'hidden',
        'mix-strides',
        'misaligned',
        'alias',
    ],
)
def test_mhc_pre_apply_mix_fwd_rejects(make, error, match):
    with pytest.raises(error, match=match):
        mhc_pre_apply_mix_fwd(*make(*_buffers()))


def test_mhc_pre_apply_mix_fwd_rejects_too_many_elements():
    x = torch.empty(2**18, 8, 1024, dtype=torch.bfloat16, device='meta')  # 2**31 elements: no memory behind
    mix_ = torch.empty(2**18, 8, device='meta')
    o = torch.empty(2**18, 1024, dtype=torch.bfloat16, device='meta')
    with pytest.raises(ValueError, match=r'tokens \* mhc_mult \* hidden must be at most 1073741824'):
        mhc_pre_apply_mix_fwd(x, mix_, o)


@pytest.mark.parametrize('num_tokens', [4, 0])
def test_mhc_pre_apply_mix_fwd_refuses_cpu_tensors(num_tokens):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_pre_apply_mix_fwd(*_buffers(num_tokens))


# CPU tier: the torch.library form, on fake tensors.


def test_mhc_pre_apply_mix_fwd_op_is_registered():
    assert OPERATORS['mhc_pre_apply_mix_fwd'] is mhc_pre_apply_mix_fwd.operator
    assert list(FORMS) == ['mhc_pre_apply_mix_fwd']
    assert getattr(torch.ops, NAMESPACE).mhc_pre_apply_mix_fwd.default is FORMS['mhc_pre_apply_mix_fwd']
    schema = FORMS['mhc_pre_apply_mix_fwd']._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert (written, len(schema.returns)) == (['o'], 0)


def test_mhc_pre_apply_mix_fwd_fake_calls():
    with FakeTensorMode():
        x, mix_, o = _buffers(device='cuda')
        assert mhc_pre_apply_mix_fwd(x, mix_, o) is o
        assert FORMS['mhc_pre_apply_mix_fwd'](x, mix_, o) is None
        for call in (mhc_pre_apply_mix_fwd, FORMS['mhc_pre_apply_mix_fwd']):
            with pytest.raises(TypeError, match='mix must have dtype torch.float32'):
                call(x, mix_.double(), o)
            with pytest.raises(ValueError, match=r'o must have shape \(4, 256\)'):
                call(x, mix_, _buffers(3, device='cuda')[2])
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(*_buffers())


def test_mhc_pre_apply_mix_fwd_compiles_into_one_graph():
    record = GraphRecorder()

    def step(x, mix_, o):
        return mhc_pre_apply_mix_fwd(x, mix_, o) * 2

    with FakeTensorMode():
        x, mix_, o = _buffers(device='cuda')
        result = torch.compile(step, fullgraph=True, backend=record)(x, mix_, o)
        assert (result.shape, result.dtype) == (o.shape, o.dtype)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_pre_apply_mix_fwd']) in targets, targets


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_pre_apply_mix_fwd_values(params, device):
    """Within the rounding bound of the float64 reference (fp32 fused multiply-adds, one bf16 rounding); the same
    bits on a second run."""
    mhc, hidden = params['sizes']
    for num_tokens in NUM_TOKENS:
        x = bf16(num_tokens, mhc, hidden, device=device)
        w = mix(num_tokens, mhc, device)
        o = poisoned(num_tokens, hidden, device=device)
        assert mhc_pre_apply_mix_fwd(x, w, o) is o
        expected = mhc_pre_apply_mix_fwd_ref(x.cpu(), w.cpu())
        assert_within(o, expected, pre_apply_mix_fwd_bound(x.cpu(), w.cpu(), expected), 'o')
        assert_equal(mhc_pre_apply_mix_fwd(x, w, poisoned(num_tokens, hidden, device=device)), o)


@pytest.mark.npu
def test_mhc_pre_apply_mix_fwd_empty(device):
    x, w, o = _buffers(0, device=device)
    assert mhc_pre_apply_mix_fwd(x, w, o) is o


@pytest.mark.npu
def test_mhc_pre_apply_mix_fwd_config_and_source(device, monkeypatch, capsys):
    args = _buffers(device=device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    assert mhc_pre_apply_mix_fwd.operator.config(*args) == pre_apply_mix_config(backend, 'fwd', 4, 256, num_cores)
    monkeypatch.setenv(config.PRINT_KERNEL_SOURCE_ENV, '1')
    mhc_pre_apply_mix_fwd(*args)
    assert KERNEL_NAME in capsys.readouterr().out


@pytest.mark.npu
def test_mhc_pre_apply_mix_fwd_opcheck(device):
    torch.library.opcheck(FORMS['mhc_pre_apply_mix_fwd'], _buffers(device=device))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_pre_apply_mix_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    num_tokens, mhc, hidden = params['num_tokens'], params['mhc'], params['hidden']
    x, w, o = (
        bf16(num_tokens, mhc, hidden, device=device),
        mix(num_tokens, mhc, device),
        poisoned(num_tokens, hidden, device=device),
    )
    mhc_pre_apply_mix_fwd(x, w, o)  # compile and warm up outside the timing
    expected = mhc_pre_apply_mix_fwd_ref(x.cpu(), w.cpu())
    assert_within(o, expected, pre_apply_mix_fwd_bound(x.cpu(), w.cpu(), expected), 'o')
    time_us = benchmark_timer(lambda: mhc_pre_apply_mix_fwd(x, w, o))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_pre_apply_mix_fwd'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, w, o) / time_us / 1e3,
        extras=config_extras(mhc_pre_apply_mix_fwd.operator.config(x, w, o)),
    )
