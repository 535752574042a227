"""Tests of moe_normalize_weight.

CPU tier: the Ascend 950 and CUDA kernels lower for every K of the level; the configuration's rules; the argument
contract on CPU tensors (each wrong argument its typed error); the torch.library forms on fake tensors. Device tier
(`npu`; the Ascend kernel on the emulator with --ascend-emulator): values against the float64 reference
(moe_normalize_weight_ref.py) and, where divisions are IEEE (the emulator, CUDA), bit for bit against the kernels'
fp32 order; two runs bit-identical; T = 0 and T = 1; zero, NaN and inf rows as documented; out= buffers; the
configuration query; opcheck; the benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.moe import moe_normalize_weight
from cann_ops_tilelang.moe.moe_normalize_weight_kernel import (
    MAX_TOPK,
    MoeNormalizeWeightConfig,
    choose_moe_normalize_weight_config,
    make_moe_normalize_weight_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_close, assert_equal, count_bytes
from tests.testing.timing import record_name

from .moe_normalize_weight_ref import moe_normalize_weight_fp32_ref, moe_normalize_weight_ref

LEVEL = get_test_level()
KERNEL_NAME = 'moe_normalize_weight_kernel'
# Level 0: the peer's top-k 6 and 8, each K one kernel; then the edges of the widened range.
TOPK = by_level(LEVEL, core=(6, 8), default=(1, 32, 64), full=(2, 13, 48))
NUM_TOKENS = by_level(LEVEL, core=(1, 130, 257), default=(4001,), full=(8001, 32768))
PARAMS = generate_samples(LEVEL, num_tokens=NUM_TOKENS, num_topk=TOPK)
BENCHMARK_PARAMS = generate_samples(num_tokens=(4001, 8001, 32768), num_topk=(6, 8))
# |error| <= rtol * |value| for positive weights: a tree of at most 6 levels of fp32 additions (6 * 2**-24 with
# the final + 1e-20) and one division (2**-24): below 5e-7.
RTOL = 5e-7
FORMS = moe_normalize_weight.operator.forms
OPS = {'moe_normalize_weight': (), 'moe_normalize_weight_out': ('out_denominator', 'out_normalized_weights')}


def make_config(backend: str, num_topk: int) -> MoeNormalizeWeightConfig:
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_moe_normalize_weight_config(backend=backend, num_cores=num_cores, num_topk=num_topk)


def random_weights(num_tokens: int, num_topk: int, device, seed: int = 0) -> torch.Tensor:
    """Positive weights spread over several binades (as sigmoid / sqrtsoftplus scores are)."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.rand(num_tokens, num_topk, generator=generator) * 4.0 ** torch.randint(-3, 3, (num_tokens, 1))
    return weights.to(device)


# ---------------------------------------------------------------- CPU tier: lowering and configuration


@pytest.mark.parametrize('num_topk', TOPK)
def test_moe_normalize_weight_ascend_kernel_lowers(num_topk):
    cfg = make_config('ascend', num_topk)
    assert (cfg.backend, cfg.num_topk, cfg.num_cores) == ('ascend', num_topk, ASCEND_950_VECTOR_CORES)
    assert_ascend_kernel_lowers(lambda: make_moe_normalize_weight_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('num_topk', TOPK)
def test_moe_normalize_weight_cuda_kernel_lowers(num_topk):
    cfg = make_config('cuda', num_topk)
    assert (cfg.backend, cfg.num_topk, cfg.block_rows % 32) == ('cuda', num_topk, 0)
    lowered = assert_cuda_kernel_lowers(lambda: make_moe_normalize_weight_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'atomic' not in lowered.source  # one thread per row: nothing is accumulated across threads


@pytest.mark.parametrize(
    ('fields', 'match'),
    [
        (dict(backend='tpu'), 'backend must be'),
        (dict(num_topk=0), r'num_topk must be in 1\.\.64'),
        (dict(num_topk=MAX_TOPK + 1), r'num_topk must be in 1\.\.64'),
        (dict(num_cores=0), 'num_cores must be >= 1'),
        (dict(block_rows=48), 'multiple of 32 on CUDA'),
    ],
    ids=['backend', 'topk-0', 'topk-65', 'cores', 'cuda-rows'],
)
def test_moe_normalize_weight_config_rejects(fields, match):
    values = dict(backend='cuda', num_topk=8, num_cores=H200_SMS, block_rows=64, num_stages=1) | fields
    with pytest.raises(ValueError, match=match):
        MoeNormalizeWeightConfig(**values)


# ---------------------------------------------------------------- CPU tier: the argument contract


def test_moe_normalize_weight_rejects_non_tensor():
    with pytest.raises(TypeError, match='topk_weights must be a torch.Tensor, got list'):
        moe_normalize_weight([[1.0, 2.0]])


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_moe_normalize_weight_rejects_dtype(dtype):
    with pytest.raises(TypeError, match='topk_weights must have dtype torch.float32'):
        moe_normalize_weight(torch.zeros(4, 8, dtype=dtype))


@pytest.mark.parametrize('shape', [(8,), (2, 4, 8)])
def test_moe_normalize_weight_rejects_rank(shape):
    with pytest.raises(ValueError, match='topk_weights must have 2 dimensions'):
        moe_normalize_weight(torch.zeros(shape))


@pytest.mark.parametrize('num_topk', [0, MAX_TOPK + 1])
def test_moe_normalize_weight_rejects_topk(num_topk):
    with pytest.raises(ValueError, match=r'topk_weights must have 1\.\.64 columns'):
        moe_normalize_weight(torch.zeros(4, num_topk))


def test_moe_normalize_weight_rejects_too_many_elements():
    x = torch.empty(2**26, 32, device='meta')  # 2**31 elements; no memory behind a meta tensor
    with pytest.raises(ValueError, match='at most 2147483647 elements'):
        moe_normalize_weight(x)


def test_moe_normalize_weight_rejects_non_contiguous():
    with pytest.raises(ValueError, match='topk_weights must be contiguous'):
        moe_normalize_weight(torch.zeros(8, 4).t())


def _buffers(x):
    return torch.zeros(x.shape[0]), torch.zeros(x.shape)


@pytest.mark.parametrize(
    ('make_out', 'error', 'match'),
    [
        (lambda x: torch.zeros(x.shape), TypeError, r'out must be a tuple \(denominator, normalized_weights\)'),
        (lambda x: _buffers(x)[:1], TypeError, 'out must be a tuple'),
        (lambda x: (torch.zeros(x.shape[0], dtype=torch.float64), _buffers(x)[1]), TypeError, r'out\[0\] must have'),
        (lambda x: (_buffers(x)[0], torch.zeros(4, 9)), ValueError, r'out\[1\] must have shape \(4, 8\)'),
        (lambda x: (torch.zeros(5), _buffers(x)[1]), ValueError, r'out\[0\] must have shape \(4,\)'),
        (lambda x: (_buffers(x)[0], torch.zeros(8, 4).t()), ValueError, r'out\[1\] must be contiguous'),
        (lambda x: (_buffers(x)[0], x), ValueError, r'out\[1\] must not alias the input topk_weights'),
        (lambda x: (x[:, 0].contiguous(), x[:, 0].contiguous()), ValueError, r'out\[1\] must have shape'),
        (lambda x: (_buffers(x)[0], torch.zeros(x.shape, device='meta')), RuntimeError, r'out\[1\] must be on cpu'),
    ],
    ids=['not-a-tuple', 'one-buffer', 'dtype', 'shape', 'denominator-shape', 'non-contiguous', 'alias', 'mixed',
         'device'],
)  # fmt: skip
def test_moe_normalize_weight_rejects_out(make_out, error, match):
    x = torch.zeros(4, 8)
    with pytest.raises(error, match=match):
        moe_normalize_weight(x, out=make_out(x))


def test_moe_normalize_weight_rejects_overlapping_buffers():
    x = torch.zeros(4, 8)
    storage = torch.zeros(40)
    with pytest.raises(ValueError, match='must not'):
        moe_normalize_weight(x, out=(storage[:4], storage[:32].view(4, 8)))


@pytest.mark.parametrize('num_tokens', [4, 0])
def test_moe_normalize_weight_refuses_cpu_tensors(num_tokens):
    # No CPU fallback, not even for empty inputs.
    x = torch.zeros(num_tokens, 8)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        moe_normalize_weight(x)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        moe_normalize_weight(x, out=_buffers(x))


# ---------------------------------------------------------------- CPU tier: the torch.library forms


def test_moe_normalize_weight_is_declared():
    assert OPERATORS['moe_normalize_weight'] is moe_normalize_weight.operator
    assert list(FORMS) == list(OPS)


@pytest.mark.parametrize('name', sorted(OPS))
def test_moe_normalize_weight_op_is_registered(name):
    assert getattr(getattr(torch.ops, NAMESPACE), name).default is FORMS[name]
    schema = FORMS[name]._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == OPS[name]
    assert all(r.alias_info is None for r in schema.returns)


@pytest.mark.parametrize('num_tokens', [0, 1, 130])
def test_moe_normalize_weight_fake_output(num_tokens):
    with FakeTensorMode():
        x = torch.empty(num_tokens, 8, device='cuda')
        for result in (moe_normalize_weight(x), FORMS['moe_normalize_weight'](x)):
            denominator, normalized = result
            assert (denominator.shape, denominator.dtype, denominator.device) == (
                (num_tokens,),
                torch.float32,
                x.device,
            )
            assert (normalized.shape, normalized.dtype, normalized.stride()) == (x.shape, torch.float32, (8, 1))
        buffers = (torch.empty(num_tokens, device='cuda'), torch.empty_like(x))
        result = moe_normalize_weight(x, out=buffers)
        assert result.denominator is buffers[0]
        assert result.normalized_weights is buffers[1]
        assert FORMS['moe_normalize_weight_out'](x, *buffers) is None


def test_moe_normalize_weight_fake_calls_raise_the_typed_errors():
    with FakeTensorMode():
        x = torch.empty(4, 8, device='cuda')
        for call in (moe_normalize_weight, FORMS['moe_normalize_weight']):
            with pytest.raises(TypeError, match='topk_weights must have dtype torch.float32'):
                call(x.half())
            with pytest.raises(ValueError, match='topk_weights must be contiguous'):
                call(x.t())
            with pytest.raises(ValueError, match='columns'):
                call(torch.empty(4, 65, device='cuda'))
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(torch.empty(4, 8))
        with pytest.raises(ValueError, match=r'out\[1\] must have shape'):
            FORMS['moe_normalize_weight_out'](x, torch.empty(4, device='cuda'), torch.empty(8, 4, device='cuda'))


def test_moe_normalize_weight_compiles_into_one_graph():
    record = GraphRecorder()

    def both_forms(x, denominator, normalized):
        first = moe_normalize_weight(x)
        moe_normalize_weight(x, out=(denominator, normalized))
        return first.normalized_weights * 2, first.denominator

    with FakeTensorMode():
        x = torch.empty(130, 8, device='cuda')
        doubled, denominator = torch.compile(both_forms, fullgraph=True, backend=record)(
            x, torch.empty(130, device='cuda'), torch.empty_like(x)
        )
        assert (doubled.shape, denominator.shape) == (x.shape, (130,))
    assert len(record.graphs) == 1
    targets = record.targets()
    assert {str(overload) for overload in FORMS.values()} <= targets, targets


# ---------------------------------------------------------------- device tier


def _ieee_division(device) -> bool:
    """The emulator (CPU tensors) and CUDA divide as IEEE fp32; an NPU's division is not documented to the bit."""
    return device.type in ('cpu', 'cuda')


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_normalize_weight_values(params, device):
    x = random_weights(params['num_tokens'], params['num_topk'], device)
    denominator, normalized = moe_normalize_weight(x)
    expected_denominator, expected_normalized = moe_normalize_weight_ref(x.cpu())
    assert_close(denominator.cpu().double(), expected_denominator, atol=0.0, rtol=RTOL)
    assert_close(normalized.cpu().double(), expected_normalized, atol=0.0, rtol=RTOL)
    if _ieee_division(device):
        exact_denominator, exact_normalized = moe_normalize_weight_fp32_ref(x)
        assert_equal(denominator.cpu(), exact_denominator)
        assert_equal(normalized.cpu(), exact_normalized)
    # out=: poisoned buffers (a row the kernel skipped would stay NaN); a second run gives the same bits.
    buffers = (torch.full_like(denominator, float('nan')), torch.full_like(normalized, float('nan')))
    result = moe_normalize_weight(x, out=buffers)
    assert result.denominator is buffers[0]
    assert result.normalized_weights is buffers[1]
    assert_equal(buffers[0], denominator)
    assert_equal(buffers[1], normalized)


@pytest.mark.npu
def test_moe_normalize_weight_empty(device):
    x = torch.empty(0, 8, device=device)
    denominator, normalized = moe_normalize_weight(x)
    assert (denominator.shape, normalized.shape, normalized.device) == ((0,), (0, 8), x.device)
    buffers = (torch.empty(0, device=device), torch.empty(0, 8, device=device))
    assert moe_normalize_weight(x, out=buffers).denominator is buffers[0]


@pytest.mark.npu
def test_moe_normalize_weight_special_rows(device):
    """As documented: zeros -> denominator 1e-20, weights 0; a NaN -> the row NaN; an inf -> denominator inf,
    finite weights 0, the inf NaN; a sum near zero -> large finite weights. Other rows are not affected."""
    inf, nan = float('inf'), float('nan')
    rows = [
        [0.0] * 8,
        [1.0, nan, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, inf, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, -1.0, 2.0**-20, 0.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, 2.0, 3.0, 2.0, 1.0, 0.5, 0.25, 0.25],
    ]
    x = torch.tensor(rows, device=device)
    denominator, normalized = moe_normalize_weight(x)
    denominator, normalized = denominator.cpu(), normalized.cpu()
    assert denominator[0].item() == torch.tensor(1e-20).item()
    assert normalized[0].eq(0).all()
    assert denominator[1].isnan()
    assert normalized[1].isnan().all()
    assert denominator[2].item() == inf
    assert normalized[2, 1].isnan()
    assert normalized[2, [0, *range(2, 8)]].eq(0).all()
    assert denominator[3].item() == 2.0**-20
    assert normalized[3, 0].item() == 2.0**20
    assert_equal(normalized[4], torch.tensor(rows[4]) / 10.0)


@pytest.mark.npu
def test_moe_normalize_weight_config(device):
    x = random_weights(5, 8, device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_moe_normalize_weight_config(backend=backend, num_cores=num_cores, num_topk=8)
    assert moe_normalize_weight.operator.config(x) == expected


@pytest.mark.npu
def test_moe_normalize_weight_prints_kernel_source(device, monkeypatch, capsys):
    monkeypatch.setenv(config.PRINT_KERNEL_SOURCE_ENV, '1')
    moe_normalize_weight(random_weights(5, 8, device))
    assert KERNEL_NAME in capsys.readouterr().out


@pytest.mark.npu
def test_moe_normalize_weight_opcheck(device):
    x = random_weights(130, 8, device)
    torch.library.opcheck(FORMS['moe_normalize_weight'], (x,))
    buffers = (torch.empty(130, device=device), torch.empty_like(x))
    torch.library.opcheck(FORMS['moe_normalize_weight_out'], (x, *buffers))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_normalize_weight_benchmark(params, device, benchmark_timer, benchmark_record):
    x = random_weights(params['num_tokens'], params['num_topk'], device)
    buffers = moe_normalize_weight(x)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: moe_normalize_weight(x, out=buffers))
    benchmark_record(
        kernel=record_name('moe', 'moe_normalize_weight'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *buffers) / time_us / 1e3,
        extras=config_extras(moe_normalize_weight.operator.config(x)),
    )
