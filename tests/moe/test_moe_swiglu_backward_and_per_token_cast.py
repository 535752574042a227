"""moe_swiglu_backward_and_per_token_cast, the public operator: lowering, the argument contract and the
torch.library form (CPU tier); on the device, bit equality with the unfused composition (the FP8 input's values,
moe_swiglu_backward in fp32, per_token_cast of its x_grad), padding slots all zero, scales included, and the same
bits from run to run; the benchmark. The gradients' own reference tests: test_moe_swiglu_backward.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang.moe import moe_swiglu_backward, moe_swiglu_backward_and_per_token_cast
from cann_ops_tilelang.moe.moe_swiglu_backward_kernel import (
    choose_moe_swiglu_backward_config,
    make_moe_swiglu_backward_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from cann_ops_tilelang.quant import QuantTensor, per_token_cast
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_close, assert_equal, count_bytes
from tests.testing.timing import record_name

from .moe_swiglu_backward_and_per_token_cast_ref import dequantize_ref, fp8_input_ref
from .moe_swiglu_backward_ref import token_mask_ref
from .test_moe_swiglu_backward import CLAMP, SCALING, layout_psum

LEVEL = get_test_level()
KERNEL_NAME = 'moe_swiglu_backward_kernel'
_SF = {'fp32': (False, False), 'pow2': (True, False), 'ue8m0': (True, True)}  # round_sf, use_packed_ue8m0
_OPTIONS = {'none': (False, False, False, False), 'all': (True, True, True, True)}  # as test_moe_swiglu_backward's
# Level 0: 32-channel fp32 scales and 128-channel UE8M0 scales, every option, two Ascend tiles (hidden 4096); their
# unfused composition takes the fp32 moe_swiglu_backward kernel of test_moe_swiglu_backward.py's level 0.
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(block=32, sf='fp32', options='all', hidden=4096),
        dict(block=128, sf='ue8m0', options='all', hidden=4096),
    ],
    default=generate_samples(
        block=[32, 64, 128], sf=list(_SF), options=list(_OPTIONS), hidden=[384, 7168],
        where=lambda p: p['sf'] != 'ue8m0' or (2 * p['hidden'] // p['block']) % 4 == 0,
    ),
)  # fmt: skip
NUM_TOKENS = by_level(LEVEL, core=(1, 300), default=(7, 1000), full=(4001,))
PARAMS = [dict(v, num_tokens=t) for v in VARIANTS for t in NUM_TOKENS]


def make_config(backend: str, params: dict):
    layout, weights, clamp, recompute = _OPTIONS[params['options']]
    round_sf, packed = _SF[params['sf']]
    return choose_moe_swiglu_backward_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=params['hidden'], x_dtype=torch.float8_e4m3fn, grad_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
        num_experts=5 if layout else 0, with_weight=weights, use_clamp=clamp, do_recompute=recompute,
        block_size=params['block'], round_sf=round_sf, packed_ue8m0=packed,
    )  # fmt: skip


def make_inputs(params: dict, device) -> tuple[tuple, dict]:
    """((data, sf), act_x_grad, 'e4m3', block), keyword options (scale format included)."""
    num_tokens, hidden, block = params['num_tokens'], params['hidden'], params['block']
    layout, weights, clamp, recompute = _OPTIONS[params['options']]
    round_sf, packed = _SF[params['sf']]
    data, sf = fp8_input_ref(2 * torch.randn(num_tokens, 2 * hidden), block)
    grad = torch.randn(num_tokens, hidden).bfloat16()
    kwargs = {'round_sf': round_sf, 'use_packed_ue8m0': packed, 'do_recompute': recompute}
    if layout:
        kwargs['psum_num_tokens_per_expert'] = layout_psum(num_tokens, device)
    if weights:
        kwargs.update(topk_weights=torch.rand(num_tokens).to(device), routed_scaling_factor=SCALING)
    if clamp:
        kwargs['clamp_value'] = CLAMP
    return ((data.to(device), sf.to(device)), grad.to(device), 'e4m3', block), kwargs


# ---------------------------------------------------------------- CPU tier: lowering


@pytest.mark.parametrize('params', VARIANTS, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_ascend_kernel_lowers(params):
    cfg = make_config('ascend', params)
    assert_ascend_kernel_lowers(lambda: make_moe_swiglu_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('params', VARIANTS, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_cuda_kernel_lowers(params):
    cfg = make_config('cuda', params)
    assert_cuda_kernel_lowers(lambda: make_moe_swiglu_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


# ---------------------------------------------------------------- CPU tier: the argument contract

DATA = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
SF = torch.zeros(4, 8)
G = torch.zeros(4, 128, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((DATA, G, 'e4m3', 32), {}, TypeError, r'x must be a tuple \(data, sf\) of 2 tensors'),
        (((DATA.float(), SF), G, 'e4m3', 32), {}, TypeError, r'x\[0\] must have dtype torch.float8_e4m3fn'),
        (((DATA, SF.double()), G, 'e4m3', 32), {}, TypeError, r'x\[1\] must have dtype torch.float32'),
        (((DATA, SF), G.half(), 'e4m3', 32), {}, TypeError, 'act_x_grad must have dtype'),
        (((DATA, torch.zeros(4, 16)), G, 'e4m3', 32), {}, ValueError, r'x\[1\] must have shape \(4, 8\)'),
        (((DATA, torch.zeros(4, 16)[:, :8]), G, 'e4m3', 32), {}, ValueError, r'x\[1\] must be contiguous'),
        (((DATA, SF), G, 'bf16', 32), {}, ValueError, r"fmt must be one of \('e4m3',\)"),
        (((DATA, SF), G, 'e4m3', 16), {}, ValueError, r'num_per_channels must be one of \(32, 64, 128\)'),
        (((DATA[:, :128].contiguous(), torch.zeros(4, 1)), G[:, :64].contiguous(), 'e4m3', 128), {}, ValueError,
         'hidden size must be a positive multiple of 128'),
        (((DATA, SF), G, 'e4m3', 32), {'use_tma_aligned_col_major_sf': True}, ValueError, 'not supported yet'),
        (((DATA, SF), G, 'e4m3', 32), {'use_packed_ue8m0': True}, ValueError, 'needs round_sf=True'),
        (((DATA[:, :128].contiguous(), torch.zeros(4, 2)), G[:, :64].contiguous(), 'e4m3', 64),
         {'round_sf': True, 'use_packed_ue8m0': True}, ValueError, 'whole int32 words of scales'),
        (((DATA, SF), G, 'e4m3', 32), {'routed_scaling_factor': 2.0}, ValueError, 'needs topk_weights'),
        (((DATA, SF), G, 'e4m3', 32), {'clamp_value': -1.0}, ValueError, 'clamp_value must be a finite number > 0'),
        (((DATA, SF), G, 'e4m3', 32), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
)  # fmt: skip
def test_moe_swiglu_backward_and_per_token_cast_contract(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_swiglu_backward_and_per_token_cast(*args, **kwargs)


# ---------------------------------------------------------------- CPU tier: the torch.library form

FORMS = moe_swiglu_backward_and_per_token_cast.operator.forms


def test_moe_swiglu_backward_and_per_token_cast_op_is_registered():
    assert OPERATORS['moe_swiglu_backward_and_per_token_cast'] is moe_swiglu_backward_and_per_token_cast.operator
    assert list(FORMS) == ['moe_swiglu_backward_and_per_token_cast']
    overload = FORMS['moe_swiglu_backward_and_per_token_cast']
    assert getattr(torch.ops, NAMESPACE).moe_swiglu_backward_and_per_token_cast.default is overload
    assert [a.name for a in overload._schema.arguments][:3] == ['x_data', 'x_sf', 'act_x_grad']


@pytest.mark.parametrize('sf', list(_SF))
def test_moe_swiglu_backward_and_per_token_cast_fake_outputs(sf):
    """Traced (fake CUDA tensors): x_grad, QuantTensor(data, sf), weight_grad, act_out with their layouts."""
    round_sf, packed = _SF[sf]
    with FakeTensorMode():
        data = torch.empty(300, 512, dtype=torch.float8_e4m3fn, device='cuda')
        scales = torch.empty(300, 16, device='cuda')
        grad = torch.empty(300, 256, dtype=torch.bfloat16, device='cuda')
        weights = torch.empty(300, device='cuda')
        result = moe_swiglu_backward_and_per_token_cast(
            (data, scales), grad, 'e4m3', 32, topk_weights=weights, round_sf=round_sf, use_packed_ue8m0=packed,
            do_recompute=True,
        )  # fmt: skip
        x_grad, quantised, weight_grad, act_out = result
        assert isinstance(quantised, QuantTensor)
        sf_layout = ((300, 4), torch.int32) if packed else ((300, 16), torch.float32)
        assert [(tuple(t.shape), t.dtype) for t in (x_grad, *quantised, weight_grad, act_out)] == [
            ((300, 512), torch.bfloat16), ((300, 512), torch.float8_e4m3fn), sf_layout, ((300,), torch.float32),
            ((300, 256), torch.bfloat16),
        ]  # fmt: skip


# ---------------------------------------------------------------- device tier


def _unfused(args: tuple, kwargs: dict) -> tuple:
    """The composition the fused operator equals: x's fp32 values, moe_swiglu_backward in fp32, x_grad cast by
    per_token_cast and rounded to bf16."""
    (data, sf), grad, _, block = args
    options = {k: v for k, v in kwargs.items() if k not in ('round_sf', 'use_packed_ue8m0')}
    x = dequantize_ref(data.cpu(), sf.cpu(), block).to(data.device)
    x_grad, *rest = moe_swiglu_backward(x, grad, 'fp32', **options)
    quantised = per_token_cast(
        x_grad, 'e4m3', block, round_sf=kwargs['round_sf'], use_packed_ue8m0=kwargs['use_packed_ue8m0']
    )
    return (x_grad.bfloat16(), quantised, *rest[:1], *(r.bfloat16() for r in rest[1:]))


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_equals_unfused(params, device):
    """Bit for bit the unfused composition on token slots, except weight_grad (see WEIGHT_GRAD_ORDER); zeros on
    padding slots (data, scales, everything); the same bits run to run."""
    args, kwargs = make_inputs(params, device)
    result = moe_swiglu_backward_and_per_token_cast(*args, **kwargs)
    expected = _unfused(args, kwargs)
    psum = kwargs.get('psum_num_tokens_per_expert')
    kept = token_mask_ref(params['num_tokens'], psum)
    flat, wanted = _flatten(result), _flatten(expected)
    assert len(flat) == len(wanted)
    for index, (got, want) in enumerate(zip(flat, wanted, strict=True)):
        got = got.cpu()
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        if kwargs.get('topk_weights') is not None and index == WEIGHT_GRAD_INDEX:
            assert_close(got[kept], want.cpu()[kept], **WEIGHT_GRAD_ORDER)
        else:
            assert_equal(got[kept], want.cpu()[kept])
        assert not got[~kept].view(torch.uint8).any()  # padding: 0 bytes (not the floor's scale)
    for first, second in zip(flat, _flatten(moe_swiglu_backward_and_per_token_cast(*args, **kwargs)), strict=True):
        assert_equal(first, second)


# weight_grad sums a token's products g * act in an order set by how the kernel spreads channels over threads: the
# fused kernel's (bf16 stores) and the fp32 kernel's of the composition differ on CUDA, so the sums agree to
# rounding, not bit for bit (each is the same run to run). Its place in _flatten's list: after x_grad, data, sf.
WEIGHT_GRAD_INDEX = 3
WEIGHT_GRAD_ORDER = dict(rtol=1e-5, atol=1e-4)


def _flatten(result: tuple) -> list[torch.Tensor]:
    return [result[0], *result[1], *result[2:]]


@pytest.mark.npu
@pytest.mark.parametrize('params', VARIANTS[:1], ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_empty(params, device):
    args, kwargs = make_inputs({**params, 'num_tokens': 0}, device)
    result = _flatten(moe_swiglu_backward_and_per_token_cast(*args, **kwargs))
    assert all(r.numel() == 0 and r.device == args[1].device for r in result)


# The peer's shapes (tokens 4001 / 8001, hidden 4096 / 7168): 128-channel fp32 scales, top-k weights.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    num_tokens, hidden = params['num_tokens'], params['hidden']
    data, sf = per_token_cast(torch.randn(num_tokens, 2 * hidden, device=device), 'e4m3', 128)
    grad = torch.randn(num_tokens, hidden, device=device).bfloat16()
    weights = torch.rand(num_tokens, device=device)

    def call():
        return moe_swiglu_backward_and_per_token_cast((data, sf), grad, 'e4m3', 128, topk_weights=weights)

    result = call()  # compile and warm up outside the timing
    time_us = benchmark_timer(call)
    cfg = moe_swiglu_backward_and_per_token_cast.operator.config((data, sf), grad, 'e4m3', 128, topk_weights=weights)
    benchmark_record(
        kernel=record_name('moe', 'moe_swiglu_backward_and_per_token_cast'),
        operation='bwd_cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(data, sf, grad, weights, *_flatten(result)) / time_us / 1e3,
        extras=config_extras(cfg),
    )
