"""Tests of moe_topk (the stable top-k of each row of fp32 scores).

CPU tier: the configuration chooser, the Ascend 950 and CUDA kernels lower for every (E, K) of the level, the
argument contract on CPU tensors, the torch.library forms on fake tensors. Device tier (`npu`; the Ascend kernel
on the emulator with --ascend-emulator): indices against the reference, exact (a selection has no rounding), for
random rows, ties, NaN / inf / signed zeros, T = 0 / 1, out= buffers, the configuration query and opcheck; the
benchmark with the peer's shapes.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.moe import moe_topk
from cann_ops_tilelang.moe.moe_topk_kernel import (
    MAX_EXPERTS,
    MoeTopkConfig,
    choose_moe_topk_config,
    make_moe_topk_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .moe_topk_ref import moe_topk_ref

KERNEL_NAME = 'moe_topk_kernel'
LEVEL = get_test_level()
# (E, K): each one kernel configuration per backend. Level 0: a ragged E with 16 rows per Ascend block... and the
# widest K; level 1: the peer's expert counts, E below one warp, K = E, E not a multiple of 4 (CUDA's scalar loads).
SIZES = by_level(
    LEVEL,
    core=[(72, 6), (384, 32)],
    default=[(64, 6), (128, 8), (256, 8), (512, 8), (5, 5), (33, 1), (258, 7)],
    full=[(512, 32), (1, 1)],
)
PARAMS = generate_samples(size=SIZES)
NUM_TOKENS = by_level(LEVEL, core=(1, 130), default=(7, 257), full=(4001,))
BENCHMARK_PARAMS = generate_samples(num_tokens=(4001, 8001, 32768), size=[(72, 6), (128, 8), (256, 8), (384, 6)])
SCORES = torch.zeros(4, 8)


def make_config(backend: str, num_experts: int, num_topk: int) -> MoeTopkConfig:
    """The config the operator would choose on an Ascend 950 (64 vector cores) or an H200 (132 SMs)."""
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_moe_topk_config(backend=backend, num_cores=num_cores, num_experts=num_experts, num_topk=num_topk)


# ---------------------------------------------------------------- CPU tier: configuration and lowering


@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_topk_kernel_lowers(params, backend):
    cfg = make_config(backend, *params['size'])
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lower(lambda: make_moe_topk_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_moe_topk_config_choice():
    cuda = make_config('cuda', 256, 8)
    assert (cuda.vector, cuda.slots, cuda.rows) == (4, 8, 4)  # two 16-byte loads per lane
    assert make_config('cuda', 258, 7).vector == 1  # rows of 258 fp32 are not 16-byte aligned
    misaligned = choose_moe_topk_config(backend='cuda', num_cores=H200_SMS, num_experts=256, num_topk=8, aligned=False)
    assert misaligned.vector == 1  # a view starting off a 16-byte boundary: scalar loads
    ascend = make_config('ascend', 512, 8)
    assert (ascend.vector, ascend.slots, ascend.rows, ascend.num_stages) == (1, 16, 16, 2)  # 32 KiB of UB
    assert make_config('ascend', 72, 6).rows == 32
    assert hash(ascend) == hash(make_config('ascend', 512, 8))


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(num_experts=MAX_EXPERTS + 1, num_topk=8), 'number of experts must be in 1..512'),
        (dict(num_experts=8, num_topk=9), r'num_topk must be in 1..min\(num_experts, 32\) = 1..8'),
        (dict(num_experts=64, num_topk=33), r'1..32, got 33'),
        (dict(num_experts=64, num_topk=0), 'got 0'),
    ],
)
def test_moe_topk_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        choose_moe_topk_config(backend='cuda', num_cores=H200_SMS, **kwargs)
    with pytest.raises(ValueError, match='backend must be'):
        choose_moe_topk_config(backend='cpu', num_cores=1, num_experts=8, num_topk=1)
    with pytest.raises(ValueError, match='vector must be 1 or 4'):
        MoeTopkConfig('cuda', 258, 7, H200_SMS, 4, 4, 1)


# ---------------------------------------------------------------- CPU tier: the argument contract


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        (([1.0], 1), {}, TypeError, 'scores must be a torch.Tensor, got list'),
        ((SCORES.double(), 1), {}, TypeError, 'scores must have dtype torch.float32, got torch.float64'),
        ((SCORES[0], 1), {}, ValueError, 'scores must have 2 dimensions'),
        ((torch.zeros(8, 4).t(), 1), {}, ValueError, 'scores must be contiguous'),
        ((SCORES, 1.0), {}, TypeError, 'num_topk'),
        ((SCORES, 0), {}, ValueError, r'num_topk must be in 1..min\(num_experts, 32\) = 1..8, got 0'),
        ((SCORES, 9), {}, ValueError, 'got 9'),
        ((torch.zeros(2, 40), 33), {}, ValueError, '= 1..32, got 33'),
        ((torch.zeros(2, 513), 8), {}, ValueError, 'the number of experts must be in 1..512, got 513'),
        ((torch.zeros(2, 0), 1), {}, ValueError, 'the number of experts must be in 1..512, got 0'),
        ((torch.empty(2**22, 512, device='meta'), 8), {}, ValueError, 'at most 2147483647 elements'),
        ((SCORES, 2), dict(out=torch.zeros(4, 2, dtype=torch.int32)), TypeError, 'out must have dtype torch.int64'),
        ((SCORES, 2), dict(out=torch.zeros(4, 3, dtype=torch.int64)), ValueError, r'out must have shape \(4, 2\)'),
        ((SCORES, 2), dict(out=torch.zeros(2, 4, dtype=torch.int64).t()), ValueError, 'out must be contiguous'),
        ((SCORES, 2), dict(out=torch.empty(4, 2, dtype=torch.int64, device='meta')), RuntimeError, 'out must be on'),
        ((SCORES, 2), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((torch.zeros(0, 8), 2), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=[
        'not-a-tensor', 'dtype', 'rank', 'non-contiguous', 'topk-type', 'topk-zero', 'topk-above-experts',
        'topk-above-32', 'too-many-experts', 'no-experts', 'too-many-elements', 'out-dtype', 'out-shape',
        'out-non-contiguous', 'out-device', 'cpu', 'cpu-empty',
    ],
)  # fmt: skip
def test_moe_topk_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_topk(*args, **kwargs)


def test_moe_topk_rejects_overlapping_out():
    scores = torch.zeros(4, 8)
    with pytest.raises(ValueError, match='out must not alias the input scores'):
        moe_topk(scores, 2, out=scores.view(torch.int64)[:2].view(4, 2))


# ---------------------------------------------------------------- CPU tier: torch.library forms on fake tensors

OPS = {'moe_topk': (), 'moe_topk_out': ('out',)}
FORMS = moe_topk.operator.forms


def test_moe_topk_is_declared():
    assert OPERATORS['moe_topk'] is moe_topk.operator
    assert list(FORMS) == list(OPS)
    for name, written in OPS.items():
        assert getattr(getattr(torch.ops, NAMESPACE), name).default is FORMS[name]
        schema = FORMS[name]._schema
        assert tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write) == written


def test_moe_topk_fake_calls():
    with FakeTensorMode():
        scores = torch.empty(130, 72, device='cuda')
        for result in (moe_topk(scores, 6), FORMS['moe_topk'](scores, 6)):
            assert (result.shape, result.dtype, result.device) == ((130, 6), torch.int64, scores.device)
        out = torch.empty(130, 6, dtype=torch.int64, device='cuda')
        assert moe_topk(scores, 6, out=out) is out
        for call in (moe_topk, FORMS['moe_topk']):
            with pytest.raises(ValueError, match='got 73'):
                call(scores, 73)
            with pytest.raises(TypeError, match='scores must have dtype torch.float32'):
                call(scores.half(), 6)


def test_moe_topk_compiles_into_one_graph():
    record = GraphRecorder()

    def both_forms(scores, out):
        return moe_topk(scores, 6) + 1, moe_topk(scores, 6, out=out)

    with FakeTensorMode():
        scores = torch.empty(130, 72, device='cuda')
        shifted, written = torch.compile(both_forms, fullgraph=True, backend=record)(
            scores, torch.empty(130, 6, dtype=torch.int64, device='cuda')
        )
        assert (shifted.shape, written.shape) == ((130, 6), (130, 6))
    targets = record.targets()
    assert {str(overload) for overload in FORMS.values()} <= targets


# ---------------------------------------------------------------- device tier


def _check(scores: torch.Tensor, num_topk: int) -> None:
    expected = moe_topk_ref(scores.cpu(), num_topk).to(scores.device)
    assert_equal(moe_topk(scores, num_topk), expected)
    out = torch.full_like(expected, -7)  # poisoned: a row the kernel skips keeps -7
    assert moe_topk(scores, num_topk, out=out) is out
    assert_equal(out, expected)


@pytest.mark.npu
@pytest.mark.parametrize('params', generate_samples(size=SIZES, num_tokens=NUM_TOKENS), ids=make_param_id)
def test_moe_topk_values(params, device):
    E, K = params['size']
    _check(torch.randn(params['num_tokens'], E, device=device), K)


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_topk_ties(params, device):
    """Few distinct values (many equal scores per row), and rows all equal: ties go to the lower index."""
    E, K = params['size']
    scores = torch.randint(0, 3, (33, E), device=device).float()
    scores[0] = 1.0
    scores[1] = -torch.inf
    _check(scores, K)


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_topk_special_values(params, device):
    """NaN below -inf (NaNs by index), +-inf in order, -0.0 equal to +0.0, subnormals ordered."""
    E, K = params['size']
    scores = torch.randn(9, E)
    scores[0, ::2] = torch.nan  # more NaNs than numbers where K > E / 2
    scores[1, :] = torch.nan
    scores[2, ::3] = torch.inf
    scores[2, 1::3] = -torch.inf
    scores[3, :] = torch.where(torch.arange(E) % 2 == 0, 0.0, -0.0)
    scores[4, :] = torch.tensor(1e-45) * torch.arange(E).flip(0)  # subnormals
    scores[5, :] = -torch.tensor(1e-45) * torch.arange(E)
    scores[6, :] = torch.where(torch.arange(E) % 3 == 0, torch.nan, -torch.inf)
    scores[7, -1] = torch.finfo(torch.float32).max
    scores[8, :] = -torch.finfo(torch.float32).max
    _check(scores.to(device), K)


@pytest.mark.npu
def test_moe_topk_misaligned_view(device):
    """A contiguous view starting 4 bytes into its storage (CUDA: the scalar-load kernel)."""
    scores = torch.randn(130 * 72 + 1, device=device)[1:].view(130, 72)
    assert moe_topk.operator.config(scores, 6).vector == 1 or config.backend_of(device) == 'ascend'
    _check(scores, 6)


@pytest.mark.npu
def test_moe_topk_empty(device):
    scores = torch.empty(0, 72, device=device)
    result = moe_topk(scores, 6)
    assert (result.shape, result.dtype, result.device) == ((0, 6), torch.int64, scores.device)
    out = torch.empty(0, 6, dtype=torch.int64, device=device)
    assert moe_topk(scores, 6, out=out) is out


@pytest.mark.npu
def test_moe_topk_config(device):
    scores = torch.randn(5, 72, device=device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_moe_topk_config(backend=backend, num_cores=num_cores, num_experts=72, num_topk=6)
    assert moe_topk.operator.config(scores, 6) == expected


@pytest.mark.npu
def test_moe_topk_opcheck(device):
    scores = torch.randn(130, 72, device=device)
    torch.library.opcheck(FORMS['moe_topk'], (scores, 6))
    torch.library.opcheck(FORMS['moe_topk_out'], (scores, 6, torch.empty(130, 6, dtype=torch.int64, device=device)))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_topk_benchmark(params, device, benchmark_timer, benchmark_record):
    E, K = params['size']
    scores = torch.randn(params['num_tokens'], E, device=device)
    out = torch.empty(params['num_tokens'], K, dtype=torch.int64, device=device)
    moe_topk(scores, K, out=out)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: moe_topk(scores, K, out=out))
    benchmark_record(
        kernel=record_name('moe', 'moe_topk'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(scores, out) / time_us / 1e3,
    )
