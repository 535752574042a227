"""Tests of moe_topk_gate_backward.

CPU tier: the Ascend 950 and CUDA kernels lower for every configuration of the level; the configuration's rules;
the float64 reference against torch.autograd through the forward's math (every scoring function, with and without
the aux term, duplicate and masked slots); the argument contract on CPU tensors (each wrong argument its typed
error); the torch.library forms on fake tensors. Device tier (`npu`; the Ascend kernel on the emulator with
--ascend-emulator): values against the reference with stated tolerances, two runs bit-identical, T = 0 and T = 1,
duplicate, -1 and out-of-range slots, non-finite inputs confined to their row, out= buffers, the configuration
query, opcheck; the benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.moe import moe_topk_gate_backward
from cann_ops_tilelang.moe._scoring_grad import SERIES_COEFFS, SQRTSOFTPLUS_SERIES_LIMIT
from cann_ops_tilelang.moe.moe_topk_gate_backward_kernel import (
    MAX_EXPERTS,
    MAX_TOPK,
    MoeTopkGateBackwardConfig,
    choose_moe_topk_gate_backward_config,
    make_moe_topk_gate_backward_kernel,
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

from .moe_topk_gate_backward_ref import (
    forward_loss_ref,
    moe_topk_gate_backward_ref,
    routed_weights_ref,
    scoring_ref,
)

LEVEL = get_test_level()
KERNEL_NAME = 'moe_topk_gate_backward_kernel'
FUNCS = ('sqrtsoftplus', 'sigmoid', 'softmax')
SCALE = 2.5
# (num_experts, num_topk, scoring_func, aux): level 0 compiles three kernels, each covering a scoring function,
# an expert count that does or does not fill whole 64-lane registers, and the aux term on or off.
CONFIGS = by_level(
    LEVEL,
    core=[(256, 8, 'sqrtsoftplus', False), (72, 6, 'softmax', True), (128, 6, 'sigmoid', True)],
    default=[
        *[(e, k, f, aux) for e in (64, 256, 384) for k in (6, 8) for f in FUNCS for aux in (False, True)][::5],
        *[(128, 40, 'sqrtsoftplus', True), (72, 36, 'sigmoid', False)],  # K > 32: two slots a lane on CUDA
    ],
    full=[(e, k, f, aux) for e in (72, 128, 512) for k in (1, 8, 64) if k <= e for f in FUNCS for aux in (False, True)],
)
NUM_TOKENS = by_level(LEVEL, core=(1, 67), default=(4001,), full=(8001,))
PARAMS = [
    dict(num_tokens=t, num_experts=e, num_topk=k, scoring_func=f, aux=aux)
    for (e, k, f, aux) in CONFIGS
    for t in NUM_TOKENS
]
BENCHMARK_PARAMS = generate_samples(  # the forward's (experts, top-k) pairs: the peer's tests' shapes
    num_tokens=(4001, 8001, 32768), size=[(72, 6), (128, 8), (256, 8), (384, 6)], aux=(False, True)
)
# The kernels against the float64 reference, inputs of order 1: fp32 roundings of D, <g, w> and the slot
# quotients (a few ulp of the largest term), the aux sums over up to 512 experts and the softmax row dot product
# (tree sums: log2(512) roundings of the row's largest product), the derivative (a few ulp).
ATOL, RTOL = 2e-6, 1e-5
FORMS = moe_topk_gate_backward.operator.forms
OPS = {'moe_topk_gate_backward': (), 'moe_topk_gate_backward_out': ('out',)}


def make_config(backend, num_experts, num_topk, scoring_func, aux) -> MoeTopkGateBackwardConfig:
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_moe_topk_gate_backward_config(
        backend=backend, num_cores=num_cores, num_experts=num_experts, num_topk=num_topk,
        scoring_func=scoring_func, aux=aux,
    )  # fmt: skip


def num_seqs_of(num_tokens: int) -> int:
    return next(s for s in (4, 3, 2, 1) if num_tokens % s == 0)


def make_inputs(num_tokens, num_experts, num_topk, scoring_func, aux, device='cpu', seed=0):
    """The operator's arguments as a forward would leave them: u = scoring_func(logits), the top-k of u with a
    duplicate slot, a -1 slot and an out-of-range slot in some rows, the forward's weights, random gradients."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=generator) * 2.0
    scores = scoring_ref(logits, scoring_func).float()
    topk_idx = scores.topk(num_topk, dim=1).indices
    if num_topk >= 2:
        topk_idx[0::3, 1] = topk_idx[0::3, 0]  # a duplicate (fixed routing may repeat an expert)
        topk_idx[1::3, -1] = -1  # a masked slot
        topk_idx[2::5, 0] = num_experts  # out of range: treated as masked
    weights = routed_weights_ref(scores.double(), topk_idx, SCALE).float()
    grad_weights = torch.randn(num_tokens, num_topk, generator=generator)
    mask = grad_scores_sum = None
    if aux:
        mask = torch.rand(num_tokens, generator=generator) > 0.25
        grad_scores_sum = torch.randn(num_seqs_of(num_tokens), num_experts, generator=generator)
    tensors = [scores, topk_idx, weights, grad_weights, mask, grad_scores_sum]
    tensors = [None if t is None else t.to(device) for t in tensors]
    return (*tensors[:4], SCALE, scoring_func, *tensors[4:])


# ---------------------------------------------------------------- CPU tier: lowering and configuration


@pytest.mark.parametrize('cfg_args', CONFIGS, ids=str)
def test_moe_topk_gate_backward_ascend_kernel_lowers(cfg_args):
    cfg = make_config('ascend', *cfg_args)
    assert (cfg.backend, cfg.num_cores, cfg.vector) == ('ascend', ASCEND_950_VECTOR_CORES, 1)
    assert_ascend_kernel_lowers(lambda: make_moe_topk_gate_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('cfg_args', CONFIGS, ids=str)
def test_moe_topk_gate_backward_cuda_kernel_lowers(cfg_args):
    cfg = make_config('cuda', *cfg_args)
    assert cfg.num_experts % cfg.vector == 0
    lowered = assert_cuda_kernel_lowers(
        lambda: make_moe_topk_gate_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'atomic' not in lowered.source  # deterministic: no atomics anywhere


def test_moe_topk_gate_backward_config_choice():
    # The largest Ascend row (512 experts, 64 slots, aux) still gets a tile; CUDA's vector width follows E.
    assert make_config('ascend', MAX_EXPERTS, MAX_TOPK, 'softmax', True).block_rows >= 4
    assert make_config('ascend', 64, 8, 'sigmoid', False).block_rows == 32
    assert [make_config('cuda', e, 1, 'sigmoid', False).vector for e in (256, 74, 73)] == [4, 2, 1]


@pytest.mark.parametrize(
    ('fields', 'match'),
    [
        (dict(backend='tpu'), 'backend must be'),
        (dict(num_experts=MAX_EXPERTS + 1), 'num_experts must be in'),
        (dict(num_topk=0), 'num_topk must be in'),
        (dict(num_experts=4, num_topk=5, vector=1), 'num_topk must be in'),
        (dict(scoring_func='relu'), 'scoring_func must be one of'),
        (dict(vector=3), 'vector must be'),
        (dict(backend='ascend', vector=1, block_rows=4096), 'UB budget'),
    ],
    ids=['backend', 'experts', 'topk-0', 'topk-over-experts', 'func', 'vector', 'ub'],
)
def test_moe_topk_gate_backward_config_rejects(fields, match):
    values = dict(backend='cuda', num_experts=256, num_topk=8, scoring_func='sigmoid', aux=False,
                  num_cores=H200_SMS, block_rows=4, num_stages=1, vector=4) | fields  # fmt: skip
    with pytest.raises(ValueError, match=match):
        MoeTopkGateBackwardConfig(**values)


# ---------------------------------------------------------------- CPU tier: the reference against autograd


@pytest.mark.parametrize('aux', [False, True])
@pytest.mark.parametrize('scoring_func', FUNCS)
def test_moe_topk_gate_backward_ref_matches_autograd(scoring_func, aux):
    """The formulas of the reference are the gradient of the forward's float64 math (duplicates, -1 and
    out-of-range slots included): torch.autograd through forward_loss_ref."""
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(12, 20, generator=generator, dtype=torch.float64) * 2.0).requires_grad_()
    scores = scoring_ref(logits, scoring_func)
    topk_idx = scores.detach().topk(4, dim=1).indices
    topk_idx[0::3, 1] = topk_idx[0::3, 0]
    topk_idx[1::3, 3] = -1
    topk_idx[2::5, 0] = 20
    grad_weights = torch.randn(12, 4, generator=generator, dtype=torch.float64)
    mask = torch.arange(12) % 4 != 1 if aux else None
    grad_scores_sum = torch.randn(3, 20, generator=generator, dtype=torch.float64) if aux else None
    loss = forward_loss_ref(logits, topk_idx, SCALE, scoring_func, grad_weights, mask, grad_scores_sum)
    (expected,) = torch.autograd.grad(loss, logits)
    weights = routed_weights_ref(scores.detach(), topk_idx, SCALE)
    actual = moe_topk_gate_backward_ref(
        scores.detach(), topk_idx, weights, grad_weights, SCALE, scoring_func, mask, grad_scores_sum
    )
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


def test_sqrtsoftplus_series_covers_its_range():
    """The series the kernels use below u^2 = SQRTSOFTPLUS_SERIES_LIMIT equals (1 - exp(-x)) / x there to far below
    fp32's precision (evaluated in float64: the truncation error alone)."""
    x = torch.linspace(0.0, SQRTSOFTPLUS_SERIES_LIMIT, 1001, dtype=torch.float64)
    series = torch.zeros_like(x)
    for c in SERIES_COEFFS:
        series = series * x + c
    exact = torch.where(x > 0, -torch.expm1(-x) / x, 1.0)
    assert ((series - exact).abs() / exact).max().item() < 1e-9


# ---------------------------------------------------------------- CPU tier: the argument contract


def _args(**changes):
    """Valid CPU arguments (T = 8, E = 16, K = 4, with the aux term) with `changes`, as keyword arguments."""
    args = dict(
        scores=torch.rand(8, 16),
        topk_idx=torch.zeros(8, 4, dtype=torch.int64),
        topk_weights=torch.zeros(8, 4),
        grad_topk_weights=torch.zeros(8, 4),
        routed_scaling_factor=1.0,
        scoring_func='sqrtsoftplus',
        mask=torch.ones(8, dtype=torch.bool),
        grad_scores_sum=torch.zeros(2, 16),
    )
    return args | changes


# Each wrong argument (a change to _args) and its typed error.
REJECTIONS = [
    (dict(scores=[[1.0]]), TypeError, 'scores must be a torch.Tensor'),
    (dict(scores=torch.rand(8, 16).double()), TypeError, 'scores must have dtype torch.float32'),
    (dict(scores=torch.rand(8, 16, 1)), ValueError, 'scores must have 2 dimensions'),
    (dict(topk_idx=torch.zeros(8, 4, dtype=torch.int32)), TypeError, 'topk_idx must have dtype torch.int64'),
    (dict(topk_idx=torch.zeros(7, 4, dtype=torch.int64)), ValueError, r'topk_idx must have shape \(8, 4\)'),
    (dict(topk_weights=torch.zeros(8, 4).half()), TypeError, 'topk_weights must have dtype torch.float32'),
    (dict(topk_weights=torch.zeros(8, 5)), ValueError, r'topk_weights must have shape \(8, 4\)'),
    (dict(grad_topk_weights=torch.zeros(8, 4, 1)), ValueError, 'grad_topk_weights must have 2 dimensions'),
    (dict(grad_topk_weights=torch.zeros(4, 8).t()), ValueError, 'grad_topk_weights must be contiguous'),
    (dict(scores=torch.rand(16, 8).t()), ValueError, 'scores must be contiguous'),
    (dict(topk_idx=torch.zeros(4, 8, dtype=torch.int64).t()), ValueError, 'topk_idx must be contiguous'),
    (dict(scores=torch.rand(8, 0)), ValueError, r'1\.\.512 columns'),
    (dict(scores=torch.rand(8, MAX_EXPERTS + 1)), ValueError, r'1\.\.512 columns'),
    (dict(scores=torch.rand(8, 3)), ValueError, r'topk_idx must have 1\.\.min\(num_experts, 64\) = 3 columns'),
    (dict(topk_idx=torch.zeros(8, 0, dtype=torch.int64)), ValueError, 'topk_idx must have 1..'),
    (dict(routed_scaling_factor='2'), TypeError, 'routed_scaling_factor'),
    (dict(routed_scaling_factor=float('inf')), ValueError, 'routed_scaling_factor'),
    (dict(scoring_func=1), TypeError, 'scoring_func must be a str'),
    (dict(scoring_func='relu'), ValueError, 'scoring_func must be one of'),
    (dict(mask=None), ValueError, 'mask and grad_scores_sum must be given together'),
    (dict(grad_scores_sum=None), ValueError, 'mask and grad_scores_sum must be given together'),
    (dict(mask=torch.ones(8, dtype=torch.uint8)), TypeError, 'mask must have dtype torch.bool'),
    (dict(mask=torch.ones(7, dtype=torch.bool)), ValueError, r'mask must have shape \(8,\)'),
    (dict(mask=torch.ones(16, dtype=torch.bool)[::2]), ValueError, 'mask must be contiguous'),
    (dict(grad_scores_sum=torch.zeros(2, 16).double()), TypeError, 'grad_scores_sum must have dtype'),
    (dict(grad_scores_sum=torch.zeros(2, 15)), ValueError, r'grad_scores_sum must have shape \(num_seqs, 16\)'),
    (dict(grad_scores_sum=torch.zeros(0, 16)), ValueError, 'num_seqs >= 1'),
    (dict(grad_scores_sum=torch.zeros(16)), ValueError, 'grad_scores_sum must have shape'),
    (dict(grad_scores_sum=torch.zeros(3, 16)), ValueError, 'must be a multiple of num_seqs = 3'),
    (dict(grad_scores_sum=torch.zeros(16, 4).t()), ValueError, 'grad_scores_sum must be contiguous'),
]


@pytest.mark.parametrize(
    ('changes', 'error', 'match'),
    REJECTIONS,
    ids=[f'{i}-{next(iter(changes))}' for i, (changes, _, _) in enumerate(REJECTIONS)],
)
def test_moe_topk_gate_backward_rejects(changes, error, match):
    with pytest.raises(error, match=match):
        moe_topk_gate_backward(**_args(**changes))


def test_moe_topk_gate_backward_rejects_too_many_elements():
    scores = torch.empty(2**22, 512, device='meta')  # 2**31 elements; no memory behind a meta tensor
    topk_idx = torch.empty(2**22, 8, dtype=torch.int64, device='meta')
    weights = torch.empty(2**22, 8, device='meta')
    with pytest.raises(ValueError, match='at most 2147483647 elements'):
        moe_topk_gate_backward(scores, topk_idx, weights, weights, 1.0)


def test_moe_topk_gate_backward_out_is_keyword_only():
    args = list(_args().values())
    with pytest.raises(TypeError, match='positional argument'):
        moe_topk_gate_backward(*args, torch.zeros(8, 16))


@pytest.mark.parametrize(
    ('make_out', 'error', 'match'),
    [
        (lambda a: a['scores'].tolist(), TypeError, 'out must be a torch.Tensor'),
        (lambda a: torch.zeros(8, 16).double(), TypeError, 'out must have dtype torch.float32'),
        (lambda a: torch.zeros(8, 17), ValueError, r'out must have shape \(8, 16\)'),
        (lambda a: torch.zeros(16, 8).t(), ValueError, 'out must be contiguous'),
        (lambda a: a['scores'], ValueError, 'out must not alias the input scores'),
        (lambda a: torch.zeros(8, 16, device='meta'), RuntimeError, 'out must be on cpu'),
    ],
    ids=['not-a-tensor', 'dtype', 'shape', 'non-contiguous', 'alias', 'device'],
)
def test_moe_topk_gate_backward_rejects_out(make_out, error, match):
    args = _args()
    with pytest.raises(error, match=match):
        moe_topk_gate_backward(**args, out=make_out(args))


@pytest.mark.parametrize('num_tokens', [8, 0])
def test_moe_topk_gate_backward_refuses_cpu_tensors(num_tokens):
    args = _args(
        scores=torch.rand(num_tokens, 16),
        topk_idx=torch.zeros(num_tokens, 4, dtype=torch.int64),
        topk_weights=torch.zeros(num_tokens, 4),
        grad_topk_weights=torch.zeros(num_tokens, 4),
        mask=torch.ones(num_tokens, dtype=torch.bool),
    )
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        moe_topk_gate_backward(**args)


# ---------------------------------------------------------------- CPU tier: the torch.library forms


def test_moe_topk_gate_backward_is_declared():
    assert OPERATORS['moe_topk_gate_backward'] is moe_topk_gate_backward.operator
    assert list(FORMS) == list(OPS)


@pytest.mark.parametrize('name', sorted(OPS))
def test_moe_topk_gate_backward_op_is_registered(name):
    assert getattr(getattr(torch.ops, NAMESPACE), name).default is FORMS[name]
    schema = FORMS[name]._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == OPS[name]
    assert all(r.alias_info is None for r in schema.returns)


def _on_fake_cuda(args, device='cuda'):
    """The arguments as fake tensors (CUDA by default) of the same shapes and dtypes (inside a FakeTensorMode)."""
    return [torch.empty(a.shape, dtype=a.dtype, device=device) if isinstance(a, torch.Tensor) else a for a in args]


@pytest.mark.parametrize('aux', [False, True])
@pytest.mark.parametrize('num_tokens', [0, 1, 12])
def test_moe_topk_gate_backward_fake_output(num_tokens, aux):
    real = make_inputs(num_tokens, 16, 4, 'sigmoid', aux)
    with FakeTensorMode():
        args = _on_fake_cuda(real)
        for result in (moe_topk_gate_backward(*args), FORMS['moe_topk_gate_backward'](*args)):
            assert (result.shape, result.dtype, result.stride()) == ((num_tokens, 16), torch.float32, (16, 1))
            assert result.device == args[0].device
        out = torch.empty_like(args[0])
        assert moe_topk_gate_backward(*args, out=out) is out
        assert FORMS['moe_topk_gate_backward_out'](*args, out) is None


def test_moe_topk_gate_backward_fake_calls_raise_the_typed_errors():
    real = make_inputs(12, 16, 4, 'sigmoid', True)
    with FakeTensorMode():
        args = _on_fake_cuda(real)
        for call in (moe_topk_gate_backward, FORMS['moe_topk_gate_backward']):
            with pytest.raises(TypeError, match='topk_idx must have dtype torch.int64'):
                call(args[0], args[1].int(), *args[2:])
            with pytest.raises(ValueError, match='scoring_func must be one of'):
                call(*args[:5], 'relu', *args[6:])
            with pytest.raises(ValueError, match='must be given together'):
                call(*args[:6], args[6], None)
            with pytest.raises(ValueError, match='multiple of num_seqs'):
                call(*args[:7], torch.empty(5, 16, device='cuda'))
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(*_on_fake_cuda(real, 'cpu'))


def test_moe_topk_gate_backward_compiles_into_one_graph():
    record = GraphRecorder()

    def both_forms(scores, topk_idx, weights, grad_weights, mask, grad_scores_sum, out):
        first = moe_topk_gate_backward(scores, topk_idx, weights, grad_weights, SCALE, 'softmax', mask, grad_scores_sum)
        moe_topk_gate_backward(scores, topk_idx, weights, grad_weights, SCALE, out=out)
        return first * 2

    real = make_inputs(12, 16, 4, 'softmax', True)
    with FakeTensorMode():
        args = [a for a in _on_fake_cuda(real) if isinstance(a, torch.Tensor)]
        doubled = torch.compile(both_forms, fullgraph=True, backend=record)(*args, torch.empty_like(args[0]))
        assert doubled.shape == (12, 16)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert {str(overload) for overload in FORMS.values()} <= targets, targets


# ---------------------------------------------------------------- device tier


def _expected(args):
    return moe_topk_gate_backward_ref(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_topk_gate_backward_values(params, device):
    args = make_inputs(*params.values(), device=device)
    result = moe_topk_gate_backward(*args)
    assert_close(result.cpu().double(), _expected(args), atol=ATOL, rtol=RTOL)
    # Deterministic: a second run, into a poisoned out= buffer, gives the same bits.
    out = torch.full_like(result, float('nan'))
    assert moe_topk_gate_backward(*args, out=out) is out
    assert_equal(out, result)


@pytest.mark.npu
@pytest.mark.parametrize('scoring_func', FUNCS)
def test_moe_topk_gate_backward_one_token_and_empty(scoring_func, device):
    cfg_args = next(c for c in CONFIGS if c[2] == scoring_func) if any(c[2] == scoring_func for c in CONFIGS) else None
    if cfg_args is None:
        pytest.skip('no configuration of this level uses this scoring function')
    num_experts, num_topk, _, aux = cfg_args
    for num_tokens in (1, 0):
        args = make_inputs(num_tokens, num_experts, num_topk, scoring_func, aux, device=device)
        result = moe_topk_gate_backward(*args)
        assert (result.shape, result.device) == ((num_tokens, num_experts), args[0].device)
        assert_close(result.cpu().double(), _expected(args), atol=ATOL, rtol=RTOL)


@pytest.mark.npu
def test_moe_topk_gate_backward_slots(device):
    """Duplicates add up, -1 and out-of-range indices (negative, >= E, beyond int32) contribute nothing, and a
    token whose slots are all masked gets only the aux term."""
    num_experts, num_topk, scoring_func, aux = CONFIGS[0]
    args = list(make_inputs(5, num_experts, num_topk, scoring_func, aux, device=device))
    topk_idx = args[1].cpu()
    topk_idx[0, :] = 3  # every slot the same expert
    topk_idx[1, :] = -1  # no routed expert
    topk_idx[2, 0], topk_idx[2, 1] = -7, 2**32 + 5  # a low word of 5 must not make it valid
    topk_idx[3, 1] = num_experts + 1
    topk_idx[4, 0] = 2**31 + 3  # a low word negative as int32
    args[1] = topk_idx.to(device)
    result = moe_topk_gate_backward(*args).cpu()
    assert_close(result.double(), _expected(args), atol=ATOL, rtol=RTOL)
    if not aux:
        assert result[1].eq(0).all()
        assert result[0, :3].eq(0).all()
        assert result[0, 4:].eq(0).all()


@pytest.mark.npu
def test_moe_topk_gate_backward_sqrtsoftplus_derivative_is_accurate(device):
    """du/dl = (1 - exp(-u^2)) / (2u) recovered from u, relative to float64, across the series / direct switch
    at u^2 = 0.5 and for tiny u (where the direct form would cancel): a few ulp. Row t routes to its probe u_t
    and to an expert with u = 1 (slot gradients 1 and 0), so grad_logits[t, probe] = s / (u_t + 1)^2 * du/dl."""
    num_experts, num_topk, scoring_func, aux = CONFIGS[0]
    if scoring_func != 'sqrtsoftplus' or aux:
        pytest.skip('needs the plain sqrtsoftplus configuration')
    probes = torch.tensor([0.0, 1e-30, 1e-10, 1e-4, 0.01, 0.3, 0.7, 0.7071067, 0.7071069, 0.72, 1.0, 2.0, 5.0, 1e3])
    num_tokens = probes.numel()
    scores = torch.ones(num_tokens, num_experts)
    scores[:, 0] = probes
    topk_idx = torch.full((num_tokens, num_topk), -1, dtype=torch.int64)
    topk_idx[:, 0], topk_idx[:, 1] = 0, 1
    weights = routed_weights_ref(scores.double(), topk_idx, SCALE).float()
    grad_weights = torch.zeros(num_tokens, num_topk)
    grad_weights[:, 0] = 1.0
    args = [t.to(device) for t in (scores, topk_idx, weights, grad_weights)]
    result = moe_topk_gate_backward(*args, SCALE, 'sqrtsoftplus').cpu()
    expected = moe_topk_gate_backward_ref(scores, topk_idx, weights, grad_weights, SCALE, 'sqrtsoftplus')
    assert result[0, 0].item() == 0.0  # u = 0: 0, not 0 / 0
    assert_close(result[:, 0].double(), expected[:, 0], atol=0.0, rtol=1e-6)


@pytest.mark.npu
def test_moe_topk_gate_backward_non_finite_stays_in_its_row(device):
    """No device assert, no host sync: a NaN score of a chosen expert, an inf score and an inf gradient change
    only their own token's row (row 0: the routed gradient NaN, the other experts' entries finite)."""
    num_experts, num_topk, scoring_func, aux = CONFIGS[0]
    args = list(make_inputs(6, num_experts, num_topk, scoring_func, aux, device=device))
    clean = moe_topk_gate_backward(*args).cpu()
    scores, topk_idx, grad_weights = args[0].cpu().clone(), args[1].cpu(), args[3].cpu().clone()
    scores[0, topk_idx[0, 0]] = float('nan')
    scores[2, topk_idx[2, 1]] = float('inf')
    grad_weights[4, 0] = float('inf')
    args[0], args[3] = scores.to(device), grad_weights.to(device)
    result = moe_topk_gate_backward(*args).cpu()
    for row in (1, 3, 5):
        assert_equal(result[row], clean[row])
    chosen = torch.zeros(num_experts, dtype=torch.bool)
    chosen[topk_idx[0].clamp(0, num_experts - 1)] = True
    assert result[0, topk_idx[0, 0]].isnan()
    if not aux:
        assert result[0, ~chosen].isfinite().all()
    assert not result[4].isfinite().all()


@pytest.mark.npu
def test_moe_topk_gate_backward_unnamed_experts_are_zero(device):
    """Without the aux term, for sqrtsoftplus and sigmoid, dL/du is zero at an expert no slot names, so dL/dl is
    exactly 0 there whatever its score (the CUDA kernel does not read it): a NaN or inf score of an unnamed expert
    leaves the row unchanged. With the aux term (or softmax) the row's sums take every score in."""
    for num_experts, num_topk, scoring_func, aux in CONFIGS:
        args = list(make_inputs(6, num_experts, num_topk, scoring_func, aux, device=device))
        clean = moe_topk_gate_backward(*args).cpu()
        scores, topk_idx = args[0].cpu().clone(), args[1].cpu()
        named = torch.zeros_like(scores, dtype=torch.bool)
        valid = (topk_idx >= 0) & (topk_idx < num_experts)
        named.scatter_(1, topk_idx.clamp(0, num_experts - 1), valid)
        poisoned = ~named & (torch.arange(num_experts) % 2 == 0)
        scores[poisoned] = float('nan')
        scores[~named & ~poisoned] = float('inf')
        args[0] = scores.to(device)
        result = moe_topk_gate_backward(*args).cpu()
        if aux or scoring_func == 'softmax':
            assert not result.isfinite().all()
        else:
            assert_equal(result, clean)
            assert (result[~named] == 0).all()


@pytest.mark.npu
def test_moe_topk_gate_backward_config(device):
    num_experts, num_topk, scoring_func, aux = CONFIGS[0]
    args = make_inputs(4, num_experts, num_topk, scoring_func, aux, device=device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_moe_topk_gate_backward_config(
        backend=backend, num_cores=num_cores, num_experts=num_experts, num_topk=num_topk,
        scoring_func=scoring_func, aux=aux,
    )  # fmt: skip
    assert moe_topk_gate_backward.operator.config(*args) == expected


@pytest.mark.npu
def test_moe_topk_gate_backward_prints_kernel_source(device, monkeypatch, capsys):
    monkeypatch.setenv(config.PRINT_KERNEL_SOURCE_ENV, '1')
    moe_topk_gate_backward(*make_inputs(3, *CONFIGS[0], device=device))
    assert KERNEL_NAME in capsys.readouterr().out


@pytest.mark.npu
def test_moe_topk_gate_backward_opcheck(device):
    num_experts, num_topk, scoring_func, aux = CONFIGS[1]
    args = make_inputs(12, num_experts, num_topk, scoring_func, aux, device=device)
    torch.library.opcheck(FORMS['moe_topk_gate_backward'], args)
    torch.library.opcheck(FORMS['moe_topk_gate_backward_out'], (*args, torch.empty_like(args[0])))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_topk_gate_backward_benchmark(params, device, benchmark_timer, benchmark_record):
    (num_experts, num_topk), num_tokens = params['size'], params['num_tokens']
    args = make_inputs(num_tokens, num_experts, num_topk, 'sqrtsoftplus', params['aux'], device=device)
    out = moe_topk_gate_backward(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: moe_topk_gate_backward(*args, out=out))
    benchmark_record(
        kernel=record_name('moe', 'moe_topk_gate_backward'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*[a for a in args if isinstance(a, torch.Tensor)], out) / time_us / 1e3,
        extras=config_extras(moe_topk_gate_backward.operator.config(*args)),
    )
