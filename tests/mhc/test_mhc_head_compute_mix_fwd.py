"""Tests of mhc_head_compute_mix_fwd.

CPU tier: the argument contract on CPU tensors (typed errors before the device guard), the torch.library form
(schema, fake kernel, torch.compile on fake tensors). Device tier (`npu`; the Ascend kernel on the emulator
with `--ascend-emulator`): values against the float64 reference for every mhc_mult of the level, 0 tokens,
the configuration a call launches, opcheck; the benchmark. The kernels' lowering and configuration:
test_mhc_mixes_kernel.py.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_head_compute_mix_fwd
from cann_ops_tilelang.mhc._mixes_kernel import choose_mhc_mixes_config
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.numeric import assert_close, count_bytes
from tests.testing.timing import record_name

from .mhc_head_compute_mix_fwd_ref import mhc_head_compute_mix_fwd_ref
from .mixes_cases import BENCHMARK_MULT, BENCHMARK_TOKENS, gen_mhc_mult, gen_num_tokens, logits

EPS = 1e-2
PARAMS = generate_samples(get_test_level(), mhc_mult=gen_mhc_mult, num_tokens=gen_num_tokens)
BENCHMARK_PARAMS = generate_samples(mhc_mult=[BENCHMARK_MULT], num_tokens=BENCHMARK_TOKENS)
FORM = mhc_head_compute_mix_fwd.operator.forms['mhc_head_compute_mix_fwd']


def make_args(num_tokens: int, mhc_mult: int, device='cpu') -> list:
    x = logits(num_tokens, mhc_mult, device)
    scale = torch.rand(1, device=device) + 0.5
    base = torch.randn(mhc_mult, device=device)
    return [x, scale, base, torch.full_like(x, float('nan')), EPS]


# CPU tier: the argument contract.


@pytest.mark.parametrize(
    ('index', 'make', 'error', 'match'),
    [
        (0, lambda a: a.tolist(), TypeError, 'input_mix must be a torch.Tensor'),
        (0, lambda a: a.double(), TypeError, 'input_mix must have dtype torch.float32'),
        (1, lambda a: a.half(), TypeError, 'mhc_scale must have dtype torch.float32'),
        (0, lambda a: a.unsqueeze(0), ValueError, 'input_mix must have 2 dimensions'),
        (1, lambda a: torch.ones(2), ValueError, r'mhc_scale must have shape \(1,\)'),
        (2, lambda a: torch.ones(5), ValueError, r'mhc_base must have shape \(4,\)'),
        (3, lambda a: torch.empty(6, 4), ValueError, r'output_mix must have shape \(5, 4\)'),
        (3, lambda a: torch.empty(4, 5).t(), ValueError, 'output_mix must be contiguous'),
        (0, lambda a: torch.empty(4, 5).t(), ValueError, 'input_mix must be contiguous'),
        (4, lambda a: float('nan'), ValueError, 'mhc_pre_eps'),
    ],
    ids=['non-tensor', 'dtype', 'scale-dtype', 'rank', 'scale-shape', 'base-shape', 'out-shape', 'out-strides',
         'non-contiguous', 'eps-nan'],
)  # fmt: skip
def test_mhc_head_compute_mix_fwd_rejects(index, make, error, match):
    args = make_args(5, 4)
    args[index] = make(args[index])
    with pytest.raises(error, match=match):
        mhc_head_compute_mix_fwd(*args)


@pytest.mark.parametrize('mhc_mult', [0, 9])
def test_mhc_head_compute_mix_fwd_rejects_mhc_mult(mhc_mult):
    with pytest.raises(ValueError, match=rf'mhc_mult \(input_mix.shape\[1\]\) must be in \[1, 8\], got {mhc_mult}'):
        mhc_head_compute_mix_fwd(*make_args(3, mhc_mult))


@pytest.mark.parametrize('token_block_size', [3, 128, -1])
def test_mhc_head_compute_mix_fwd_rejects_token_block_size(token_block_size):
    with pytest.raises(ValueError, match='token_block_size must be 0 .chosen. or a power of two in'):
        mhc_head_compute_mix_fwd(*make_args(3, 4), token_block_size)


def test_mhc_head_compute_mix_fwd_rejects_aliasing_and_size():
    args = make_args(5, 4)
    args[3] = args[0]
    with pytest.raises(ValueError, match='output_mix'):
        mhc_head_compute_mix_fwd(*args)
    huge = torch.empty(2**28 + 1, 4, device='meta')  # no memory behind a meta tensor
    with pytest.raises(ValueError, match='input_mix must have at most 1073741824 elements'):
        mhc_head_compute_mix_fwd(huge, torch.ones(1), torch.ones(4), huge, EPS)


@pytest.mark.parametrize('num_tokens', [5, 0])
def test_mhc_head_compute_mix_fwd_refuses_cpu_tensors(num_tokens):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_head_compute_mix_fwd(*make_args(num_tokens, 4))


# CPU tier: the torch.library form, on fake tensors.


def test_mhc_head_compute_mix_fwd_op_is_registered():
    assert OPERATORS['mhc_head_compute_mix_fwd'] is mhc_head_compute_mix_fwd.operator
    assert list(mhc_head_compute_mix_fwd.operator.forms) == ['mhc_head_compute_mix_fwd']
    assert torch.ops.cann_ops_tilelang.mhc_head_compute_mix_fwd.default is FORM
    schema = FORM._schema
    assert schema.name == f'{NAMESPACE}::mhc_head_compute_mix_fwd'
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('output_mix',)
    assert not schema.returns


def test_mhc_head_compute_mix_fwd_traced():
    """Traced, the public call returns output_mix and the op nothing; the contract's errors come from both;
    torch.compile(fullgraph=True) traces it into one graph with the op."""
    with FakeTensorMode():
        x, scale, base, out, eps = make_args(40, 4, 'cuda')
        assert mhc_head_compute_mix_fwd(x, scale, base, out, eps) is out
        assert FORM(x, scale, base, out, eps, 0) is None
        for call in (mhc_head_compute_mix_fwd, lambda *a: FORM(*a, 0)):
            with pytest.raises(TypeError, match='input_mix must have dtype torch.float32'):
                call(x.half(), scale, base, out, eps)
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(
                    *make_args(40, 4),
                )
    record = GraphRecorder()

    def step(x, scale, base, out):
        return mhc_head_compute_mix_fwd(x, scale, base, out, EPS) * 2

    with FakeTensorMode():
        x, scale, base, out, _ = make_args(40, 4, 'cuda')
        assert torch.compile(step, fullgraph=True, backend=record)(x, scale, base, out).shape == x.shape
    assert len(record.graphs) == 1
    assert str(FORM) in record.targets()


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_head_compute_mix_fwd_values(params, device):
    args = make_args(params['num_tokens'], params['mhc_mult'], device)
    out = args[3]
    assert mhc_head_compute_mix_fwd(*args) is out  # poisoned with NaN: every element is written
    expected = mhc_head_compute_mix_fwd_ref(*args[:3], EPS)
    assert_close(out.double(), expected, atol=1e-6, rtol=1e-6)
    again = torch.full_like(out, float('nan'))
    mhc_head_compute_mix_fwd(args[0], args[1], args[2], again, EPS, 8)  # another tiling, the same numbers
    assert torch.equal(again, out)


@pytest.mark.npu
def test_mhc_head_compute_mix_fwd_empty_and_config(device):
    args = make_args(0, 3, device)
    assert mhc_head_compute_mix_fwd(*args) is args[3]
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    for token_block_size in (0, 16):
        expected = choose_mhc_mixes_config(
            backend=backend, num_cores=num_cores, kind='head_fwd', mhc_mult=3, token_block_size=token_block_size
        )
        assert mhc_head_compute_mix_fwd.operator.config(*args, token_block_size) == expected


@pytest.mark.npu
def test_mhc_head_compute_mix_fwd_opcheck(device):
    args = make_args(37, 4, device)
    torch.library.opcheck(FORM, (*args, 0))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_head_compute_mix_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    args = make_args(params['num_tokens'], params['mhc_mult'], device)
    mhc_head_compute_mix_fwd(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_head_compute_mix_fwd(*args))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_head_compute_mix_fwd'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(args[0], args[3]) / time_us / 1e3,
    )
