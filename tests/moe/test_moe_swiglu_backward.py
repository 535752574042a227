"""moe_swiglu_backward, the public operator: lowering of both backends' kernels, the argument contract and the
torch.library form (CPU tier); values against the float64 reference, whose closed form is checked against autograd
of the float64 forward, the expert layout's padding, empty inputs, run-to-run reproducibility (device tier: an
accelerator, or the Ascend kernel on the emulator with --ascend-emulator); the benchmark. The configuration
chooser: test_moe_swiglu_backward_kernel.py; the fused cast: test_moe_swiglu_backward_and_per_token_cast.py.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.moe import moe_swiglu_backward
from cann_ops_tilelang.moe.moe_swiglu_backward_kernel import (
    choose_moe_swiglu_backward_config,
    make_moe_swiglu_backward_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing import fast_path
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

from .moe_swiglu_backward_ref import moe_swiglu_backward_ref, swiglu_forward_f64, token_mask_ref

LEVEL = get_test_level()
KERNEL_NAME = 'moe_swiglu_backward_kernel'
CLAMP = 1.5  # inputs are 2 * randn: about a third of the gate halves and half the value halves are clamped
SCALING = 2.5
_TORCH = {'bf16': torch.bfloat16, 'fp32': torch.float32}
# The options of a call: 'all' = expert layout (psum), top-k weights with routed scaling, clamp, act_out.
_OPTIONS = {'none': (False, False, False, False), 'all': (True, True, True, True)}
# Each variant is one kernel configuration per hidden size. Level 0: a plain bf16 one of one tile, and an fp32 one
# with every option over two Ascend tiles (the weight gradient carried across tiles), which
# test_moe_swiglu_backward_and_per_token_cast.py also compiles (its unfused composition).
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(x='bf16', grad='bf16', fmt='bf16', options='none', hidden=64),
        dict(x='fp32', grad='bf16', fmt='fp32', options='all', hidden=4096),
    ],
    default=generate_samples(
        x=['bf16', 'fp32'], grad=['bf16', 'fp32'], fmt=['bf16', 'fp32'], options=list(_OPTIONS), hidden=[192, 7168]
    ),
    full=generate_samples(x=['bf16'], grad=['bf16'], fmt=['bf16'], options=list(_OPTIONS), hidden=[128, 16384]),
)
NUM_TOKENS = by_level(LEVEL, core=(1, 300), default=(7, 1000), full=(4001,))
PARAMS = [dict(v, num_tokens=t) for v in VARIANTS for t in NUM_TOKENS]


def _options(params: dict) -> tuple[bool, bool, bool, bool]:
    return _OPTIONS[params['options']]


def make_config(backend: str, params: dict):
    """The configuration of `params` on an Ascend 950 (64 vector cores) or an H200 (132 SMs)."""
    layout, weights, clamp, recompute = _options(params)
    return choose_moe_swiglu_backward_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=params['hidden'], x_dtype=_TORCH[params['x']], grad_dtype=_TORCH[params['grad']],
        out_dtype=_TORCH[params['fmt']], num_experts=5 if layout else 0, with_weight=weights, use_clamp=clamp,
        do_recompute=recompute,
    )  # fmt: skip


def layout_psum(num_tokens: int, device) -> torch.Tensor:
    """Five experts' ends: tokens, an empty expert, padding up to the next aligned start, a last one short of T."""
    ends = [min(v, num_tokens) for v in (3, 3, 130, 200, max(num_tokens - 5, 0))]
    return torch.tensor(sorted(ends), dtype=torch.int32, device=device)


def make_inputs(params: dict, device) -> tuple[tuple, dict]:
    """(x, act_x_grad, fmt), keyword options; padding slots hold garbage (inf, NaN) that must not leak."""
    num_tokens, hidden = params['num_tokens'], params['hidden']
    layout, weights, clamp, recompute = _options(params)
    x = (2 * torch.randn(num_tokens, 2 * hidden)).to(_TORCH[params['x']])
    grad = torch.randn(num_tokens, hidden).to(_TORCH[params['grad']])
    kwargs = {'do_recompute': recompute}
    if layout:
        psum = layout_psum(num_tokens, 'cpu')
        padding = ~token_mask_ref(num_tokens, psum)
        x[padding] = float('nan')
        grad[padding] = float('inf')
        kwargs['psum_num_tokens_per_expert'] = psum.to(device)
    if weights:
        kwargs['topk_weights'] = torch.rand(num_tokens).to(device)
        kwargs['routed_scaling_factor'] = SCALING
    if clamp:
        kwargs['clamp_value'] = CLAMP
    return (x.to(device), grad.to(device), params['fmt']), kwargs


# ---------------------------------------------------------------- CPU tier: lowering


@pytest.mark.parametrize('params', VARIANTS, ids=make_param_id)
def test_moe_swiglu_backward_ascend_kernel_lowers(params):
    cfg = make_config('ascend', params)
    assert_ascend_kernel_lowers(lambda: make_moe_swiglu_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('params', VARIANTS, ids=make_param_id)
def test_moe_swiglu_backward_cuda_kernel_lowers(params):
    cfg = make_config('cuda', params)
    assert_cuda_kernel_lowers(lambda: make_moe_swiglu_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


# ---------------------------------------------------------------- CPU tier: the reference against autograd


@pytest.mark.parametrize('options', list(_OPTIONS))
def test_moe_swiglu_backward_ref_matches_autograd(options):
    """The closed form of the reference is the gradient of the float64 forward (autograd), slot by slot."""
    layout, weights, clamp, _ = _OPTIONS[options]
    num_tokens, hidden = 300, 64
    x = (2 * torch.randn(num_tokens, 2 * hidden, dtype=torch.float64)).requires_grad_()
    grad = torch.randn(num_tokens, hidden, dtype=torch.float64)
    topk = torch.rand(num_tokens, dtype=torch.float64).requires_grad_() if weights else None
    psum = layout_psum(num_tokens, 'cpu') if layout else None
    scaling, clamp_value = (SCALING if weights else None), (CLAMP if clamp else None)
    out = swiglu_forward_f64(x, topk, scaling, clamp_value)
    wanted = [x] + ([topk] if weights else [])
    grads = torch.autograd.grad(out, wanted, grad)
    x_grad, weight_grad, act_out = moe_swiglu_backward_ref(x, grad, psum, topk, scaling, clamp_value)
    kept = token_mask_ref(num_tokens, psum)
    torch.testing.assert_close(x_grad[kept], grads[0][kept], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(act_out[kept], out.detach()[kept], rtol=1e-12, atol=1e-12)
    assert not x_grad[~kept].any()
    assert not act_out[~kept].any()
    if weights:
        torch.testing.assert_close(weight_grad[kept], grads[1][kept], rtol=1e-12, atol=1e-12)
        assert not weight_grad[~kept].any()


# ---------------------------------------------------------------- CPU tier: the argument contract

X = torch.zeros(4, 128)
G = torch.zeros(4, 64)


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        (([1.0], G, 'fp32'), {}, TypeError, 'x must be a torch.Tensor, got list'),
        ((X.half(), G, 'fp32'), {}, TypeError, 'x must have dtype torch.bfloat16 or torch.float32'),
        ((X, G.double(), 'fp32'), {}, TypeError, 'act_x_grad must have dtype'),
        ((X[None], G, 'fp32'), {}, ValueError, 'x must have 2 dimensions'),
        ((torch.zeros(4, 96), G, 'fp32'), {}, ValueError, 'H a positive multiple of 64, got 96'),
        ((X, torch.zeros(4, 32), 'fp32'), {}, ValueError, r'act_x_grad must have shape \(4, 64\)'),
        ((X, torch.zeros(5, 64), 'fp32'), {}, ValueError, r'act_x_grad must have shape \(4, 64\)'),
        ((torch.zeros(128, 4).t(), G, 'fp32'), {}, ValueError, 'x must be contiguous'),
        ((X, G, 'e4m3'), {}, ValueError, r"fmt must be one of \('bf16', 'fp32'\)"),
        ((X, G, 1), {}, TypeError, 'fmt must be a str'),
        ((X, G, 'fp32'), {'psum_num_tokens_per_expert': torch.zeros(2)}, TypeError, 'must have dtype torch.int32'),
        ((X, G, 'fp32'), {'psum_num_tokens_per_expert': torch.zeros(0, dtype=torch.int32)}, ValueError,
         'at least one expert'),
        ((X, G, 'fp32'), {'psum_num_tokens_per_expert': torch.zeros(2, 2, dtype=torch.int32)}, ValueError,
         '1-D with at least one expert'),
        ((X, G, 'fp32'), {'topk_weights': torch.zeros(5)}, ValueError, r'topk_weights must have shape \(4,\)'),
        ((X, G, 'fp32'), {'topk_weights': torch.zeros(4, dtype=torch.bfloat16)}, TypeError,
         'topk_weights must have dtype torch.float32'),
        ((X, G, 'fp32'), {'routed_scaling_factor': 2.0}, ValueError, 'routed_scaling_factor needs topk_weights'),
        ((X, G, 'fp32'), {'topk_weights': torch.zeros(4), 'routed_scaling_factor': float('inf')}, ValueError,
         'routed_scaling_factor must be a finite number'),
        ((X, G, 'fp32'), {'clamp_value': 0.0}, ValueError, 'clamp_value must be a finite number > 0'),
        ((X, G, 'fp32'), {'clamp_value': 'big'}, TypeError, 'clamp_value must be a float'),
        ((X, G, 'fp32'), {'do_recompute': 1}, TypeError, 'do_recompute must be a bool'),
        ((X, G, 'fp32'), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X[:0], G[:0], 'fp32'), {}, RuntimeError, "no kernels for 'cpu' tensors"),  # no fallback, even empty
    ],
)  # fmt: skip
def test_moe_swiglu_backward_contract(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_swiglu_backward(*args, **kwargs)


def test_moe_swiglu_backward_rejects_too_many_elements():
    x = torch.empty(2**24, 128, dtype=torch.bfloat16, device='meta')  # no memory behind a meta tensor
    with pytest.raises(ValueError, match='at most 2\\*\\*31 - 1 elements'):
        moe_swiglu_backward(x, torch.empty(2**24, 64, dtype=torch.bfloat16, device='meta'), 'bf16')


# ---------------------------------------------------------------- CPU tier: the torch.library form

FORMS = moe_swiglu_backward.operator.forms


def test_moe_swiglu_backward_op_is_registered():
    assert OPERATORS['moe_swiglu_backward'] is moe_swiglu_backward.operator
    assert list(FORMS) == ['moe_swiglu_backward']
    overload = FORMS['moe_swiglu_backward']
    assert getattr(torch.ops, NAMESPACE).moe_swiglu_backward.default is overload
    schema = overload._schema
    assert [a.name for a in schema.arguments] == [
        'x', 'act_x_grad', 'fmt', 'psum_num_tokens_per_expert', 'topk_weights', 'routed_scaling_factor',
        'clamp_value', 'do_recompute',
    ]  # fmt: skip
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


@pytest.mark.parametrize('options', list(_OPTIONS))
def test_moe_swiglu_backward_fake_outputs(options):
    """Traced (fake CUDA tensors: no GPU, nothing compiled): the public call's tuple and the op's list."""
    layout, weights, clamp, recompute = _OPTIONS[options]
    with FakeTensorMode():
        args = (
            torch.empty(300, 256, dtype=torch.bfloat16, device='cuda'),
            torch.empty(300, 128, device='cuda'),
            'fp32',
        )
        kwargs = {'do_recompute': recompute}
        if layout:
            kwargs['psum_num_tokens_per_expert'] = torch.empty(5, dtype=torch.int32, device='cuda')
        if weights:
            kwargs.update(topk_weights=torch.empty(300, device='cuda'), routed_scaling_factor=SCALING)
        if clamp:
            kwargs['clamp_value'] = CLAMP
        result = moe_swiglu_backward(*args, **kwargs)
        expected = [((300, 256), torch.float32)]
        expected += [((300,), torch.float32)] if weights else []
        expected += [((300, 128), torch.float32)] if recompute else []
        assert isinstance(result, tuple)
        assert [(tuple(r.shape), r.dtype) for r in result] == expected
        assert all(r.device.type == 'cuda' for r in result)
        with pytest.raises(ValueError, match='routed_scaling_factor needs topk_weights'):
            moe_swiglu_backward(*args, routed_scaling_factor=1.0)


def test_moe_swiglu_backward_compiles_into_one_graph():
    """torch.compile(fullgraph=True) traces the call into one graph of the op (on fake tensors)."""
    record = GraphRecorder()

    def call(x, grad, weights):
        x_grad, weight_grad = moe_swiglu_backward(x, grad, 'bf16', topk_weights=weights)
        return x_grad * 2, weight_grad

    with FakeTensorMode():
        x = torch.empty(130, 128, dtype=torch.bfloat16, device='cuda')
        grad = torch.empty(130, 64, dtype=torch.bfloat16, device='cuda')
        doubled, weight_grad = torch.compile(call, fullgraph=True, backend=record)(
            x, grad, torch.empty(130, device='cuda')
        )
        assert (doubled.shape, weight_grad.shape) == ((130, 128), (130,))
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['moe_swiglu_backward']) in targets, targets


# ---------------------------------------------------------------- CPU tier: the fast path's flow


def test_moe_swiglu_backward_fast_path_flow(monkeypatch):
    """CPU tensors taken as CUDA ones: a second call of a key launches without the full check; routed scaling
    without weights, whose key no earlier call remembered, still gets the contract's error (it once found the key of
    the call without weights), and so does an empty expert table."""
    op = moe_swiglu_backward.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, op)
    plans = fast_path.count_plans(monkeypatch, op)
    x, grad = torch.randn(5, 256, dtype=torch.bfloat16), torch.randn(5, 128, dtype=torch.bfloat16)
    psum = torch.tensor([2, 5], dtype=torch.int32)
    for _ in range(3):
        moe_swiglu_backward(x, grad, 'bf16', psum, None, None, 4.0)
    assert (len(plans), len(launches)) == (1, 3)
    with pytest.raises(ValueError, match='routed_scaling_factor needs topk_weights'):
        moe_swiglu_backward(x, grad, 'bf16', psum, None, 2.0, 4.0)
    with pytest.raises(ValueError, match='at least one expert'):
        moe_swiglu_backward(x, grad, 'bf16', psum[:0], None, None, 4.0)
    with pytest.raises(ValueError, match='at least one expert'):
        moe_swiglu_backward(x, grad, 'bf16', psum[0], None, None, 4.0)  # 0-D: no IndexError on the fast path
    assert len(launches) == 3


# ---------------------------------------------------------------- device tier


def _tolerance(dtype: torch.dtype) -> dict:
    """fp32: a few ulps of the fp32 math; bf16: one bf16 ulp (the fp32 value may round either way)."""
    return {'atol': 1e-5, 'rtol': 1e-5} if dtype == torch.float32 else {'atol': 1e-5, 'rtol': 2**-7}


def _assert_matches_ref(result: tuple, args: tuple, kwargs: dict) -> None:
    x, grad, fmt = args
    layout = kwargs.get('psum_num_tokens_per_expert')
    weights = kwargs.get('topk_weights')
    x_grad, weight_grad, act_out = moe_swiglu_backward_ref(
        x.float(), grad, layout, weights, kwargs.get('routed_scaling_factor'), kwargs.get('clamp_value')
    )
    dtype = _TORCH[fmt]
    assert_close(result[0].cpu(), x_grad.to(dtype), **_tolerance(dtype))
    index = 1
    if weights is not None:
        # A sum of H fp32 products: the bound follows the sum of their magnitudes.
        act = moe_swiglu_backward_ref(x.float(), grad, layout, None, None, kwargs.get('clamp_value'))[2]
        magnitude = (grad.cpu().double() * act).abs().nan_to_num(0.0).sum(dim=1) * SCALING
        error = (result[1].cpu().double() - weight_grad).abs()
        assert bool((error <= 1e-5 * magnitude + 1e-6).all()), float((error - 1e-5 * magnitude).max())
        assert result[1].dtype == torch.float32
        index = 2
    if kwargs.get('do_recompute'):
        assert_close(result[index].cpu(), act_out.to(dtype), **_tolerance(dtype))


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_swiglu_backward_values(params, device):
    """Values against the float64 reference (padding slots zero whatever they hold), the same bits run to run."""
    args, kwargs = make_inputs(params, device)
    result = moe_swiglu_backward(*args, **kwargs)
    assert all(r.device == args[0].device and r.is_contiguous() for r in result)
    _assert_matches_ref(result, args, kwargs)
    again = moe_swiglu_backward(*args, **kwargs)
    for first, second in zip(result, again, strict=True):
        assert_equal(first, second)


@pytest.mark.npu
@pytest.mark.parametrize('params', [p for p in PARAMS if p['options'] == 'all'][:1], ids=make_param_id)
def test_moe_swiglu_backward_padding_only(params, device):
    """A layout whose only expert starts past T: every slot is padding, every output 0 (scales of weights too)."""
    args, kwargs = make_inputs(params, device)
    kwargs['psum_num_tokens_per_expert'] = torch.full((5,), 0, dtype=torch.int32, device=device)
    for r in moe_swiglu_backward(*args, **kwargs):
        assert not r.cpu().any()


@pytest.mark.npu
@pytest.mark.parametrize('params', VARIANTS, ids=make_param_id)
def test_moe_swiglu_backward_empty(params, device):
    """T = 0: empty results of the right shapes and dtypes, no launch."""
    args, kwargs = make_inputs({**params, 'num_tokens': 0}, device)
    result = moe_swiglu_backward(*args, **kwargs)
    assert result[0].shape == (0, 2 * params['hidden'])
    assert result[0].dtype == _TORCH[params['fmt']]
    assert all(r.numel() == 0 and r.device == args[0].device for r in result)


@pytest.mark.npu
@pytest.mark.parametrize('params', VARIANTS[:1], ids=make_param_id)
def test_moe_swiglu_backward_config(params, device):
    """The configuration a call launches is the chooser's for the device."""
    args, kwargs = make_inputs({**params, 'num_tokens': 5}, device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_moe_swiglu_backward_config(
        backend=backend, num_cores=num_cores, hidden=params['hidden'], x_dtype=args[0].dtype,
        grad_dtype=args[1].dtype, out_dtype=_TORCH[params['fmt']],
    )  # fmt: skip
    assert moe_swiglu_backward.operator.config(*args, **kwargs) == expected


@pytest.mark.npu
@pytest.mark.parametrize('params', VARIANTS[:1], ids=make_param_id)
def test_moe_swiglu_backward_opcheck(params, device):
    """torch.library.opcheck on real tensors: the schema, the fake kernel against the real one."""
    args, _kwargs = make_inputs({**params, 'num_tokens': 130}, device)
    torch.library.opcheck(FORMS['moe_swiglu_backward'], (*args, None, None, None, None, False))


# The peer's shapes (tokens 4001 / 8001, hidden 4096 / 7168): bf16 in and out, top-k weights, no layout.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_swiglu_backward_benchmark(params, device, benchmark_timer, benchmark_record):
    num_tokens, hidden = params['num_tokens'], params['hidden']
    x = torch.randn(num_tokens, 2 * hidden, device=device).bfloat16()
    grad = torch.randn(num_tokens, hidden, device=device).bfloat16()
    weights = torch.rand(num_tokens, device=device)
    result = moe_swiglu_backward(x, grad, 'bf16', topk_weights=weights)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: moe_swiglu_backward(x, grad, 'bf16', topk_weights=weights))
    benchmark_record(
        kernel=record_name('moe', 'moe_swiglu_backward'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, grad, weights, *result) / time_us / 1e3,
        extras=config_extras(moe_swiglu_backward.operator.config(x, grad, 'bf16', topk_weights=weights)),
    )
