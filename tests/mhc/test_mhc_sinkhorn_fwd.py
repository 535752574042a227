"""Tests of mhc_sinkhorn_fwd.

CPU tier: the Ascend 950 and CUDA kernels lower for every configuration of the level; the argument contract on
CPU tensors; the torch.library form (schema, fake kernel, typed errors, torch.compile on fake tensors).
Device tier (`npu`; the Ascend kernels on the CPU with `--ascend-emulator`): values against the float64
reference for every mhc_mult of the level, no tokens, the configuration query, opcheck; the benchmark
(`benchmark`) at the peer's shapes.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_sinkhorn_fwd
from cann_ops_tilelang.mhc.mhc_sinkhorn_kernel import choose_mhc_sinkhorn_config, make_mhc_sinkhorn_kernel
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import assert_ascend_kernel_lowers, assert_cuda_kernel_lowers
from tests.testing.numeric import assert_close, count_bytes
from tests.testing.timing import record_name

from .mhc_sinkhorn_fwd_ref import mhc_sinkhorn_fwd_ref
from .sinkhorn_cases import ATOL, EPS, RTOL, distinct_configs, gen_cases, make_config, random_logits

KERNEL_NAME = 'mhc_sinkhorn_fwd_kernel'
CASES = gen_cases(get_test_level())
CONFIGS = distinct_configs(CASES)
# The peer's shapes: tokens 4001 / 8001, mhc_mult 4, Sinkhorn repeat 10 / 20.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], mhc_mult=[4], repeat=[10, 20])


# CPU tier: lowering (each configuration once; the token count is dynamic).


@pytest.mark.parametrize('params', CONFIGS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_mhc_sinkhorn_fwd_kernel_lowers(backend, params):
    cfg = make_config(backend, 'fwd', params['mhc_mult'], params['repeat'])
    assert (cfg.backend, cfg.direction, cfg.mhc_mult, cfg.repeat) == (backend, 'fwd', params['mhc_mult'],
                                                                      params['repeat'])  # fmt: skip
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowers(lambda: make_mhc_sinkhorn_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


# CPU tier: the argument contract (validation runs before the device guard).


def _call(shape=(4, 4, 4), out_shape=None, repeat=3, eps=EPS, **changes):
    x = changes.get('x', torch.zeros(shape))
    out = changes.get('out', torch.zeros(out_shape or shape))
    return mhc_sinkhorn_fwd(x, out, repeat, eps)


@pytest.mark.parametrize(
    ('changes', 'error', 'match'),
    [
        ({'x': [[1.0]]}, TypeError, 'comb_res_mix must be a torch.Tensor, got list'),
        ({'x': torch.zeros(4, 4, 4, dtype=torch.bfloat16)}, TypeError, 'comb_res_mix must have dtype torch.float32'),
        ({'out': torch.zeros(4, 4, 4, dtype=torch.float64)}, TypeError, 'comb_res_mix_out must have dtype'),
        ({'shape': (4, 4)}, ValueError, r'shape \(\.\.\., mhc_mult, mhc_mult\) with at least one leading'),
        ({'shape': (4, 4, 3)}, ValueError, r'mhc_mult in 1\.\.8, got \(4, 4, 3\)'),
        ({'shape': (4, 9, 9)}, ValueError, r'mhc_mult in 1\.\.8, got \(4, 9, 9\)'),
        ({'shape': (4, 0, 0)}, ValueError, r'mhc_mult in 1\.\.8'),
        ({'x': torch.zeros(4, 4, 4).transpose(0, 1)}, ValueError, 'comb_res_mix must be contiguous'),
        ({'out_shape': (5, 4, 4)}, ValueError, 'comb_res_mix_out must have shape'),
        ({'out': torch.zeros(4, 4, 4).transpose(0, 1)}, ValueError, 'comb_res_mix_out must be contiguous'),
        ({'repeat': 0}, ValueError, r'repeat must be in \[1, 2147483647\], got 0'),
        ({'repeat': 2.0}, TypeError, 'repeat must be an int, got float'),
        ({'repeat': True}, TypeError, 'repeat must be an int, got bool'),
        ({'eps': float('nan')}, ValueError, 'eps must be a finite number'),
        ({'eps': None}, TypeError, 'eps must be a float, got NoneType'),
    ],
    ids=lambda v: v if isinstance(v, str) and ' ' not in v else None,
)
def test_mhc_sinkhorn_fwd_rejects(changes, error, match):
    with pytest.raises(error, match=match):
        _call(**changes)


def test_mhc_sinkhorn_fwd_rejects_overlap():
    x = torch.zeros(6, 4, 4)
    with pytest.raises(ValueError, match=r'comb_res_mix_out \(written in place\) must not alias the input'):
        mhc_sinkhorn_fwd(x, x, 3, EPS)
    with pytest.raises(
        ValueError, match=r'comb_res_mix_out \(written in place\) must not alias the input comb_res_mix'
    ):
        mhc_sinkhorn_fwd(x[:4], x[2:], 3, EPS)


def test_mhc_sinkhorn_fwd_rejects_too_many_elements():
    x = torch.empty(2**26 + 1, 4, 4, device='meta')  # no memory behind a meta tensor
    with pytest.raises(ValueError, match='at most 1073741824 elements'):
        mhc_sinkhorn_fwd(x, torch.empty_like(x), 3, EPS)


@pytest.mark.parametrize('shape', [(4, 4, 4), (0, 4, 4)], ids=lambda s: f'shape={s}')
def test_mhc_sinkhorn_fwd_refuses_cpu_tensors(shape):
    # No CPU fallback, not even without tokens.
    x = torch.zeros(shape)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_sinkhorn_fwd(x, torch.zeros_like(x), 3, EPS)


# CPU tier: the torch.library form, on fake tensors (nothing allocated, compiled or launched; fake CUDA tensors
# need no GPU).

FORMS = mhc_sinkhorn_fwd.operator.forms


def test_mhc_sinkhorn_fwd_is_declared():
    assert OPERATORS['mhc_sinkhorn_fwd'] is mhc_sinkhorn_fwd.operator
    assert list(FORMS) == ['mhc_sinkhorn_fwd']  # the written buffer is an argument: no out= form


def test_mhc_sinkhorn_fwd_op_is_registered():
    schema = FORMS['mhc_sinkhorn_fwd']._schema
    assert getattr(torch.ops, NAMESPACE).mhc_sinkhorn_fwd.default is FORMS['mhc_sinkhorn_fwd']
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('comb_res_mix_out',)
    assert [a.name for a in schema.arguments] == ['comb_res_mix', 'comb_res_mix_out', 'repeat', 'eps']
    assert not schema.returns


def test_mhc_sinkhorn_fwd_fake_calls():
    """Traced, the public call returns the written buffer (as eager does); the contract's typed errors too."""
    with FakeTensorMode():
        x = torch.empty(6, 4, 4, device='cuda')
        out = torch.empty_like(x)
        assert mhc_sinkhorn_fwd(x, out, 10, EPS) is out
        assert FORMS['mhc_sinkhorn_fwd'](x, out, 10, EPS) is None
        with pytest.raises(TypeError, match='comb_res_mix must have dtype torch.float32'):
            mhc_sinkhorn_fwd(x.half(), out, 10, EPS)
        with pytest.raises(ValueError, match='comb_res_mix_out must have shape'):
            mhc_sinkhorn_fwd(x, torch.empty(3, 4, 4, device='cuda'), 10, EPS)
        with pytest.raises(ValueError, match='repeat must be in'):
            mhc_sinkhorn_fwd(x, out, 0, EPS)
        with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
            mhc_sinkhorn_fwd(torch.empty(6, 4, 4), torch.empty(6, 4, 4), 10, EPS)


def test_mhc_sinkhorn_fwd_compiles_into_one_graph():
    """torch.compile(fullgraph=True) traces the call into one graph holding the op (a break would raise)."""
    record = GraphRecorder()

    def step(x, out):
        return mhc_sinkhorn_fwd(x, out, 20, EPS) * 2

    with FakeTensorMode():
        x = torch.empty(130, 4, 4, device='cuda')
        doubled = torch.compile(step, fullgraph=True, backend=record)(x, torch.empty_like(x))
        assert (doubled.shape, doubled.dtype) == (x.shape, x.dtype)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_sinkhorn_fwd']) in targets, targets


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', CASES, ids=make_param_id)
def test_mhc_sinkhorn_fwd_values(params, device):
    x = random_logits(params['shape'], device)
    out = torch.full_like(x, float('nan'))  # poisoned: an element the kernel skips stays NaN
    assert mhc_sinkhorn_fwd(x, out, params['repeat'], EPS) is out
    expected = mhc_sinkhorn_fwd_ref(x.cpu().double(), params['repeat'], EPS)
    assert_close(out.cpu().double(), expected, atol=ATOL, rtol=RTOL)
    assert torch.equal(mhc_sinkhorn_fwd(x, torch.empty_like(x), params['repeat'], EPS), out)  # run to run


@pytest.mark.npu
def test_mhc_sinkhorn_fwd_eps_is_an_argument(device):
    """eps reaches the kernel at run time (one compiled kernel serves every eps): a large eps changes the result
    as the reference says."""
    x = random_logits((130, 4, 4), device)
    for eps in (0.0, 0.25):
        out = mhc_sinkhorn_fwd(x, torch.empty_like(x), 3, eps)
        assert_close(out.cpu().double(), mhc_sinkhorn_fwd_ref(x.cpu().double(), 3, eps), atol=ATOL, rtol=RTOL)


@pytest.mark.npu
@pytest.mark.parametrize('shape', [(0, 4, 4), (2, 0, 3, 3)], ids=lambda s: f'shape={s}')
def test_mhc_sinkhorn_fwd_without_tokens(shape, device):
    x = torch.empty(shape, device=device)
    out = torch.empty_like(x)
    assert mhc_sinkhorn_fwd(x, out, 3, EPS) is out


@pytest.mark.npu
def test_mhc_sinkhorn_fwd_config(device):
    """The configuration a call launches (the query the benchmarks record) is the chooser's for the device."""
    x = random_logits((5, 4, 4), device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_mhc_sinkhorn_config(backend=backend, num_cores=num_cores, direction='fwd', mhc_mult=4,
                                          repeat=3)  # fmt: skip
    assert mhc_sinkhorn_fwd.operator.config(x, torch.empty_like(x), 3, EPS) == expected


@pytest.mark.npu
def test_mhc_sinkhorn_fwd_opcheck(device):
    """torch.library.opcheck on real tensors: the schema's mutation, the fake kernel against the real one."""
    x = random_logits((130, 4, 4), device)
    torch.library.opcheck(FORMS['mhc_sinkhorn_fwd'], (x, torch.empty_like(x), 3, EPS))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_sinkhorn_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    m = params['mhc_mult']
    x = random_logits((params['num_tokens'], m, m), device)
    out = torch.empty_like(x)
    mhc_sinkhorn_fwd(x, out, params['repeat'], EPS)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_sinkhorn_fwd(x, out, params['repeat'], EPS))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_sinkhorn_fwd'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, out) / time_us / 1e3,
        extras=config_extras(mhc_sinkhorn_fwd.operator.config(x, out, params['repeat'], EPS)),
    )
