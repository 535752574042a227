"""moe_swiglu_backward_and_per_token_cast, the public operator: lowering, the argument contract and the
torch.library form (CPU tier); on the device, bit equality with the unfused composition (the FP8 input's values,
moe_swiglu_backward in fp32, per_token_cast of its x_grad), padding slots all zero, scales included, and the same
bits from run to run; the benchmark. The gradients' own reference tests: test_moe_swiglu_backward.py."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.moe import moe_swiglu_backward, moe_swiglu_backward_and_per_token_cast
from cann_ops_tilelang.moe.moe_swiglu_backward_kernel import (
    choose_moe_swiglu_backward_config,
    make_moe_swiglu_backward_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from cann_ops_tilelang.quant import QuantTensor, per_token_cast
from tests.quant.cast_ref import assert_peer_layout, logical_sf_bytes, per_token_cast_ref
from tests.testing import fast_path
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

# The modules (the package's names of the same spelling are the functions).
backward_module = importlib.import_module('cann_ops_tilelang.moe.moe_swiglu_backward')
fused_module = importlib.import_module('cann_ops_tilelang.moe.moe_swiglu_backward_and_per_token_cast')
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
# use_tma_aligned_col_major_sf: level 0's two configurations column-major (every option, the expert layout among
# them), T = 0, 1 and 37 (not a multiple of 4; rows 3..36 padding); level 1 adds two without any option.
COL_MAJOR_VARIANTS = by_level(
    LEVEL,
    core=VARIANTS[:2],
    default=[
        dict(block=64, sf='pow2', options='none', hidden=384),
        dict(block=32, sf='ue8m0', options='none', hidden=384),
    ],
)
COL_MAJOR_TOKENS = by_level(LEVEL, core=(0, 1, 37), default=(0, 1, 37, 300))


def make_config(backend: str, params: dict, **kwargs):
    layout, weights, clamp, recompute = _OPTIONS[params['options']]
    round_sf, packed = _SF[params['sf']]
    return choose_moe_swiglu_backward_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=params['hidden'], x_dtype=torch.float8_e4m3fn, grad_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
        num_experts=5 if layout else 0, with_weight=weights, use_clamp=clamp, do_recompute=recompute,
        block_size=params['block'], round_sf=round_sf, packed_ue8m0=packed, **kwargs,
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
        (((DATA[:, :128].contiguous(), torch.zeros(4, 1)), G[:, :64].contiguous(), 'e4m3', 128), {}, RuntimeError,
         "no kernels for 'cpu' tensors"),  # H 64: one 128-channel block across the halves
        (((DATA[:, :192].contiguous(), torch.zeros(4, 2)), G[:, :96].contiguous(), 'e4m3', 128), {}, ValueError,
         'H a positive multiple of 64'),
        (((DATA, SF), G, 'e4m3', 32), {'use_tma_aligned_col_major_sf': True}, RuntimeError,
         "no kernels for 'cpu' tensors"),
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


@pytest.mark.parametrize('num_tokens', [0, 1, 5, 37])
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_backward_and_per_token_cast_col_major_fake_strides(num_tokens, backend, monkeypatch):
    """While torch traces: x_grad_fp8's scales column-major with per_token_cast's strides on each backend (the
    peer's rule: CUDA T rounded up to 16 bytes, Ascend T), fp32 and UE8M0 words, with and without the expert
    layout; the other outputs row-major."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    device = 'cuda' if backend == 'cuda' else 'cpu'
    with FakeTensorMode():
        data = torch.empty(num_tokens, 512, dtype=torch.float8_e4m3fn, device=device)
        grad = torch.empty(num_tokens, 256, dtype=torch.bfloat16, device=device)
        psum = torch.empty(3, dtype=torch.int32, device=device)
        for sf_name, block, extra in (('fp32', 32, {}), ('ue8m0', 32, {'psum_num_tokens_per_expert': psum})):
            round_sf, packed = _SF[sf_name]
            scales = torch.empty(num_tokens, 512 // block, device=device)
            x_grad, quantised, *_ = moe_swiglu_backward_and_per_token_cast(
                (data, scales), grad, 'e4m3', block, use_tma_aligned_col_major_sf=True, round_sf=round_sf,
                use_packed_ue8m0=packed, **extra,
            )  # fmt: skip
            assert x_grad.is_contiguous()
            assert quantised.data.is_contiguous()
            assert_peer_layout(quantised.sf, num_tokens, sf_name, backend)


def test_moe_swiglu_backward_and_per_token_cast_col_major_config():
    """The layout is a configuration field of its own (in the choice: a kernel of its own), of the cast only; on
    Ascend column-major UE8M0 tiles hold whole words per half row (ValueError where a half row cannot)."""
    variant = VARIANTS[0]
    rows = make_config('ascend', variant)
    cols = make_config('ascend', variant, col_major_sf=True)
    assert (cols.col_major_sf, rows.col_major_sf, cols != rows, hash(cols) != hash(rows)) == (True, False, True, True)
    with pytest.raises(ValueError, match='col_major_sf is an option of the cast'):
        choose_moe_swiglu_backward_config(
            backend='cuda', num_cores=H200_SMS, hidden=256, x_dtype=torch.bfloat16, grad_dtype=torch.bfloat16,
            out_dtype=torch.bfloat16, col_major_sf=True,
        )  # fmt: skip
    with pytest.raises(TypeError, match='col_major_sf must be a bool'):
        make_config('cuda', variant, col_major_sf=1)
    words = dict(block=32, sf='ue8m0', options='none', hidden=2176)  # 68 blocks a half row: 17 words
    assert make_config('ascend', words).block_k == 1088  # 34 blocks: a word split
    assert make_config('ascend', words, col_major_sf=True).block_k == 128  # whole words
    with pytest.raises(ValueError, match='whole int32 words per half tile'):
        dataclasses.replace(make_config('ascend', words, col_major_sf=True), block_k=1088)
    halves = dict(block=64, sf='ue8m0', options='none', hidden=128)  # 2 blocks a half row: half a word
    with pytest.raises(ValueError, match='whole int32 words per half tile'):
        make_config('ascend', halves, col_major_sf=True)
    assert make_config('cuda', halves, col_major_sf=True).col_major_sf  # CUDA stores bytes: any row


_SF_DMA = re.compile(r'asc_copy_ub2gm_align\([^;]*x_grad_sf[^;]*, (\d+), (\d+), [^;]*, ([^;]*sf_stride[^;]*), (\d+)\);')


@pytest.mark.parametrize('params', COL_MAJOR_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_backward_and_per_token_cast_col_major_lowers(backend, params):
    """Both kernels write the column-major scales themselves, the row stride a launch argument: on CUDA one store
    per scale (UE8M0: per byte); on Ascend one DMA per half tile whose bursts are fp32 scales or UE8M0 words, a
    row stride apart."""
    cfg = make_config(backend, params, col_major_sf=True)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_moe_swiglu_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    assert 'sf_stride' in source
    if backend == 'ascend':
        dmas = _SF_DMA.findall(source)
        assert len(dmas) == 2  # the two halves
        bursts = cfg.groups_per_tile // (4 if cfg.packed_ue8m0 else 1)
        assert {(int(n), int(length), int(ub)) for n, length, _, ub in dmas} == {(bursts, 4, 4)}


def test_moe_swiglu_backward_and_per_token_cast_col_major_launch(monkeypatch):
    """CPU tensors taken as CUDA ones (the stub's fast_ok keeps the device test of a quantised x: every call here
    takes the full path): column-major scales are a kernel of their own; the kernel takes them transposed, (K, T)
    rows of the (1, T_pad) strided scales (UE8M0: their bytes)."""
    op = moe_swiglu_backward_and_per_token_cast.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, op)
    data, grad = torch.zeros(5, 256, dtype=torch.float8_e4m3fn), torch.randn(5, 128, dtype=torch.bfloat16)
    scales = torch.ones(5, 8)
    for col_major, packed in ((False, False), (True, False), (True, False), (True, True), (True, True)):
        _, (_, sf) = moe_swiglu_backward_and_per_token_cast(
            (data, scales), grad, 'e4m3', 32, use_tma_aligned_col_major_sf=col_major, round_sf=packed,
            use_packed_ue8m0=packed,
        )  # fmt: skip
        cfg, args = launches[-1]
        assert cfg.col_major_sf == col_major
        kernel_sf = args[9]
        if col_major:
            assert sf.stride() == (1, 5)
            assert (tuple(kernel_sf.shape), kernel_sf.stride()) == (((2, 20), (20, 1)) if packed else ((8, 5), (5, 1)))
    assert len(launches) == 5


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
    _assert_equals_unfused(params, device)


def _assert_equals_unfused(params: dict, device) -> None:
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


def _row_major(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype).copy_(t.cpu())


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', COL_MAJOR_TOKENS)
@pytest.mark.parametrize('params', COL_MAJOR_VARIANTS, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_col_major_values(params, num_tokens, device):
    """use_tma_aligned_col_major_sf=True: every output of the row-major call bit for bit (padding slots' zero
    scales included), the scales in per_token_cast's column-major layout of this backend, through the fast path's
    second call too."""
    _assert_col_major_values(params, num_tokens, device)


def _assert_col_major_values(params: dict, num_tokens: int, device) -> None:
    args, kwargs = make_inputs({**params, 'num_tokens': num_tokens}, device)
    rows = _flatten(moe_swiglu_backward_and_per_token_cast(*args, **kwargs))
    backend = 'cuda' if torch.device(device).type == 'cuda' else 'ascend'
    for _ in range(2):
        result = moe_swiglu_backward_and_per_token_cast(*args, **kwargs, use_tma_aligned_col_major_sf=True)
        flat = _flatten(result)
        assert len(flat) == len(rows)
        for index, (got, want) in enumerate(zip(flat, rows, strict=True)):
            if index == 2:
                assert_equal(logical_sf_bytes(got), logical_sf_bytes(want))
                assert_peer_layout(got, num_tokens, params['sf'], backend)
            else:
                assert_equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                             want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn else want)  # fmt: skip


@pytest.mark.npu
@pytest.mark.parametrize('params', COL_MAJOR_VARIANTS[:2], ids=make_param_id)
def test_moe_swiglu_backward_kernel_col_major_row_stride(params, device, monkeypatch):
    """The kernel writes the transposed scales at any row stride >= T: CUDA's padded rule on every backend (the
    layout rule patched, 37 rows padded to 40 fp32 / 40 words), into a poisoned buffer: each scale once (padding
    slots' zeros too), the padding columns untouched."""
    num_tokens, stride = 37, 40
    monkeypatch.setattr(fused_module.quant_contract, 'col_major_sf_strides', lambda t, dtype, dev: (1, stride))

    plain = backward_module.new_output

    def poisoned(like, layout):
        if len(layout) == 2:  # the row-major call's scales
            return plain(like, layout)
        shape, dtype, strides = layout
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        whole = like.new_full((extent * torch.empty(0, dtype=dtype).element_size(),), 0xA5, dtype=torch.uint8)
        poisoned.whole = whole
        return whole.view(dtype).as_strided(shape, strides)

    monkeypatch.setattr(backward_module, 'new_output', poisoned)
    args, kwargs = make_inputs({**params, 'num_tokens': num_tokens}, device)
    rows = moe_swiglu_backward_and_per_token_cast(*args, **kwargs)[1].sf.cpu()
    sf = moe_swiglu_backward_and_per_token_cast(*args, **kwargs, use_tma_aligned_col_major_sf=True)[1].sf
    assert sf.stride() == (1, stride)
    assert_equal(logical_sf_bytes(sf), logical_sf_bytes(rows))
    k, width = rows.shape[1], num_tokens * rows.element_size()
    whole = poisoned.whole.cpu()
    image = torch.full((k, stride * rows.element_size()), 0xA5, dtype=torch.uint8).flatten()
    image = image[: whole.numel()].clone()
    for row in range(k):
        start = row * stride * rows.element_size()
        image[start : start + width] = _row_major(rows.T[row]).view(torch.uint8)
    assert_equal(whole, image)


@pytest.mark.npu
@pytest.mark.parametrize('col_major', [False, True], ids=['row-major', 'col-major'])
def test_moe_swiglu_backward_and_per_token_cast_opcheck(col_major, device):
    """torch.library.opcheck on real tensors (level 0's first configuration): the fake kernel's layouts
    (column-major scales: their strides) against the real one's (its schema test cannot run: it multiplies the
    float8 inputs, which torch's CPU kernels do not)."""
    args, kwargs = make_inputs({**VARIANTS[0], 'num_tokens': 5}, device)
    (data, sf), grad, fmt, block = args
    op_args = (data, sf, grad, fmt, block, kwargs['psum_num_tokens_per_expert'], kwargs['topk_weights'],
               kwargs['routed_scaling_factor'], col_major, kwargs['round_sf'], kwargs['use_packed_ue8m0'],
               kwargs['clamp_value'], kwargs['do_recompute'])  # fmt: skip
    torch.library.opcheck(FORMS['moe_swiglu_backward_and_per_token_cast'], op_args, test_utils=('test_faketensor',))


@pytest.mark.npu
@pytest.mark.parametrize('params', VARIANTS[:1], ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_empty(params, device):
    args, kwargs = make_inputs({**params, 'num_tokens': 0}, device)
    result = _flatten(moe_swiglu_backward_and_per_token_cast(*args, **kwargs))
    assert all(r.numel() == 0 and r.device == args[1].device for r in result)


# ---------------------------------------------------------------- blocks across the halves (H = 64 * odd, 128 channels)

# 2 H is whole 128-channel blocks, but block H / 128 holds the gate's last 64 channels and the up's first 64, for x's
# scales and the cast's alike. Level 0: one case (H 192: 2 H = 3 blocks, the middle one across; packed UE8M0, one
# word ending in a zero byte; every option). Level 1: H 2880 (gpt-oss's: 45 blocks, block 22 across; CUDA nine tiles
# of 640 positions, tile 4 across the halves) with fp32, power-of-two and UE8M0 scales, with every option and without,
# row- and column-major; H 6720, Ascend's limit (the row in one task, 240 KiB of UB), with every option, also packed
# UE8M0 of 105 blocks (a row of 4 n + 1 blocks past 8192 channels, which per_token_cast on Ascend takes in equal tasks);
# the quant reference's bytes at 2880 and 6720.
STRADDLING_PARAMS = by_level(
    LEVEL,
    core=[dict(block=128, sf='ue8m0', options='all', hidden=192, num_tokens=300)],
    default=[
        *generate_samples(block=[128], sf=list(_SF), options=list(_OPTIONS), hidden=[2880], num_tokens=[7, 300]),
        dict(block=128, sf='pow2', options='all', hidden=6720, num_tokens=3),
        dict(block=128, sf='ue8m0', options='all', hidden=6720, num_tokens=3),
    ],
)
STRADDLING_REFERENCE = by_level(
    LEVEL,
    core=[],
    default=[
        dict(block=128, sf='fp32', options='all', hidden=2880, num_tokens=7),
        dict(block=128, sf='ue8m0', options='all', hidden=6720, num_tokens=3),
    ],
)
STRADDLING_COL_MAJOR = by_level(
    LEVEL,
    core=[],
    default=[dict(block=128, sf=sf, options='all', hidden=2880) for sf in ('fp32', 'ue8m0')],
)
_STRADDLING_LOWERED = [
    dict(block=128, sf='ue8m0', options='all', hidden=192),
    dict(block=128, sf='fp32', options='all', hidden=2880),
    dict(block=128, sf='ue8m0', options='none', hidden=2880, col_major=True),
]


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_backward_and_per_token_cast_straddling_contract(backend, monkeypatch):
    """H = 64 * odd takes 128-channel blocks, with per_token_cast's scale layouts of the (T, 2 H) x_grad (45 scales
    of 2880: fp32, or 12 packed UE8M0 words, row- and column-major)."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    device = 'cuda' if backend == 'cuda' else 'cpu'
    with FakeTensorMode():
        data = torch.empty(5, 2 * 2880, dtype=torch.float8_e4m3fn, device=device)
        scales = torch.empty(5, 45, device=device)
        grad = torch.empty(5, 2880, dtype=torch.bfloat16, device=device)
        for sf, shape, dtype in (('fp32', (5, 45), torch.float32), ('ue8m0', (5, 12), torch.int32)):
            round_sf, packed = _SF[sf]
            for col_major in (False, True):
                _, quantised, *_ = moe_swiglu_backward_and_per_token_cast(
                    (data, scales), grad, 'e4m3', 128, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
                    use_packed_ue8m0=packed,
                )  # fmt: skip
                want = per_token_cast(torch.empty(5, 2 * 2880, device=device), 'e4m3', 128, round_sf=round_sf,
                                      use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col_major).sf  # fmt: skip
                assert (tuple(quantised.sf.shape), quantised.sf.dtype) == (shape, dtype)
                assert quantised.sf.stride() == want.stride()


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_backward_and_per_token_cast_straddling_config(backend):
    """Blocks across the halves only with 128 channels and H = 64 * odd; their tiles (check_straddling_tiles):
    Ascend the row in one task (H <= 6720), CUDA whole blocks of the 2 H row; packed UE8M0 rows end in zero bytes."""
    v = dict(block=128, sf='fp32', options='all', hidden=2880)
    rows = {(128, 'fp32'): (True, 45, 45, 0), (128, 'ue8m0'): (True, 45, 48, 3), (64, 'fp32'): (False, 90, 90, 0)}
    for (block, sf), want in rows.items():
        cfg = make_config(backend, v | dict(block=block, sf=sf))
        assert (cfg.straddles, cfg.row_blocks, cfg.sf_cols, cfg.sf_padding) == want, (block, sf)
    assert not make_config(backend, v | dict(hidden=2816)).straddles
    assert make_config(backend, v | dict(sf='ue8m0'), col_major_sf=True).straddles  # whole words need no split
    cfg = make_config(backend, v)
    if backend == 'ascend':
        assert (cfg.block_k, cfg.num_col_tiles) == (2880, 1)
        with pytest.raises(ValueError, match='needs the row in one task: hidden <= 6720'):
            make_config(backend, v | dict(hidden=6848))
        with pytest.raises(ValueError, match='block_k 960: the row'):
            dataclasses.replace(cfg, block_k=960)
    else:
        assert (cfg.block_k, cfg.num_col_tiles, cfg.groups_per_tile, cfg.threads) == (640, 9, 5, 64)
        assert make_config(backend, v | dict(hidden=6848)).straddles
        with pytest.raises(ValueError, match='block_k 960: whole blocks of 128 dividing 2 \\* hidden 5760'):
            dataclasses.replace(cfg, block_k=960)


@pytest.mark.parametrize('params', _STRADDLING_LOWERED, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_backward_and_per_token_cast_straddling_lowers(backend, params):
    """Ascend: the row is one task, the cast one pass over the 2 H row (one block-maximum vcmax where the halves'
    passes have two), its data one DMA of 2 H bytes, its scales one of the whole row (packed: to the word); CUDA:
    the positions' guards, the packed row's zero byte after its 2 H / 128 scales."""
    cfg = make_config(backend, params, col_major_sf=params.get('col_major', False))
    assert cfg.straddles
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_moe_swiglu_backward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    hidden = params['hidden']
    if backend == 'ascend':
        assert source.count('simd_inst::vcmax(') == 1
        data = re.findall(r'asc_copy_ub2gm_align\(\(__gm__ uint8_t\*\)\(\(&\(x_grad_fp8\[[^;]*?, 1, (\d+), ', source)
        assert data == [str(2 * hidden)]
        if not cfg.col_major_sf:
            sf_bytes = cfg.sf_cols * (1 if cfg.packed_ue8m0 else 4)
            sf = re.findall(r'asc_copy_ub2gm_align\(\(__gm__ uint8_t\*\)\(\(&\(x_grad_sf\[[^;]*?, 1, (\d+), ', source)
            assert sf == [str(sf_bytes)]
    else:
        assert 'condval' in source
        if cfg.packed_ue8m0 and not cfg.col_major_sf:
            assert f'(int64_t){cfg.sf_cols}) + (int64_t){cfg.row_blocks})] = (uchar)0' in source


@pytest.mark.npu
@pytest.mark.parametrize('params', STRADDLING_PARAMS, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_straddling_values(params, device):
    """A block across the halves: bit for bit the unfused composition (per_token_cast of the (T, 2 H) x_grad),
    padding slots zero (the packed row's padding byte included), the same bits run to run."""
    _assert_equals_unfused(params, device)


@pytest.mark.npu
@pytest.mark.parametrize('params', STRADDLING_REFERENCE, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_straddling_reference(params, device):
    """A block across the halves: data and scale bytes of the token slots equal the quant reference's cast of the
    fp32 x_grad (per_token_cast_ref: no kernel macro shared)."""
    args, kwargs = make_inputs(params, device)
    (data, sf), grad, _, block = args
    _, quantised, *_ = moe_swiglu_backward_and_per_token_cast(*args, **kwargs)
    options = {k: v for k, v in kwargs.items() if k not in ('round_sf', 'use_packed_ue8m0')}
    x = dequantize_ref(data.cpu(), sf.cpu(), block).to(data.device)
    x_grad = moe_swiglu_backward(x, grad, 'fp32', **options)[0].cpu()
    round_sf, packed = _SF[params['sf']]
    want_data, want_sf = per_token_cast_ref(x_grad, block, round_sf=round_sf, packed_ue8m0=packed)
    kept = token_mask_ref(params['num_tokens'], kwargs.get('psum_num_tokens_per_expert'))
    assert kept.any()
    got_sf = quantised.sf.cpu().view(torch.uint8) if packed else quantised.sf.cpu()
    assert_equal(quantised.data.cpu().view(torch.uint8)[kept], want_data.view(torch.uint8)[kept])
    assert_equal(got_sf[kept], want_sf[kept])


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', [1, 37])
@pytest.mark.parametrize('params', STRADDLING_COL_MAJOR, ids=make_param_id)
def test_moe_swiglu_backward_and_per_token_cast_straddling_col_major(params, num_tokens, device):
    """Column-major scales with a block across the halves: the row-major call's values in per_token_cast's layout."""
    _assert_col_major_values(params, num_tokens, device)


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
