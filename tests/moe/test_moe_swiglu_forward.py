"""Tests of moe_swiglu_forward.

CPU tier: the configuration chooser (pure, hashable, its rules); the Ascend 950 and CUDA kernels lower for every
configuration of the level; the argument contract on CPU tensors (each wrong argument its typed error); the
torch.library forms on fake tensors. Device tier (`npu`; the Ascend kernel on the emulator with --ascend-emulator):
values against the float64 reference (moe_swiglu_forward_ref.py) for T = 0, 1 and more rows, the expert layout with
empty experts and padding (zeros, x not needed there), clamp counts added to clamped_count exactly, out= buffers,
two runs bit-identical, the configuration query, opcheck; the benchmark (`benchmark`, the peer's shapes).
"""

import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.moe import moe_swiglu_forward, moe_swiglu_forward_and_per_token_cast
from cann_ops_tilelang.moe.moe_swiglu_forward_kernel import (
    MoeSwigluForwardConfig,
    choose_moe_swiglu_forward_config,
    make_moe_swiglu_forward_kernel,
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

from .moe_swiglu_forward_ref import expert_rows_ref, moe_swiglu_forward_ref

LEVEL = get_test_level()
KERNEL_NAME = 'moe_swiglu_forward_kernel'
# A variant is one kernel configuration: input dtype, output format, I, and its options ('+'-joined: the expert
# layout, weights, routed scaling, clamp, counts). Level 0: the plain kernel and the one with every option, each
# compiled once; the other tests reuse them.
EVERY = 'layout+weights+scaling+clamp+count'
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(dtype='bfloat16', fmt='bf16', hidden=320, options=''),
        dict(dtype='float32', fmt='fp32', hidden=1088, options=EVERY),
    ],
    default=[
        dict(dtype='float32', fmt='bf16', hidden=64, options=''),
        dict(dtype='bfloat16', fmt='fp32', hidden=4096, options='weights'),
        dict(dtype='bfloat16', fmt='bf16', hidden=7168, options='layout+weights+scaling+clamp'),
        dict(dtype='bfloat16', fmt='bf16', hidden=512, options='layout+clamp+count'),
    ],
    full=[dict(dtype='bfloat16', fmt='fp32', hidden=16384, options=EVERY)],
)
NUM_TOKENS = by_level(LEVEL, core=(1, 300), default=(161, 1000), full=(4001,))
PARAMS = [dict(variant, num_tokens=num_tokens) for variant in VARIANTS for num_tokens in NUM_TOKENS]
CLAMP = 3.0
SCALING = 2.5
X = torch.zeros(4, 256, dtype=torch.bfloat16)
# The peer's benchmark shapes: tokens, I (x has 2 I columns).
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8192], hidden=[2048, 4096, 7168], dtype=['bfloat16'])


def has(variant: dict, option: str) -> bool:
    return option in variant['options'].split('+')


def make_config(backend: str, variant: dict) -> MoeSwigluForwardConfig:
    """The configuration the operator chooses on an Ascend 950 (64 vector cores) or an H200 (132 SMs)."""
    return choose_moe_swiglu_forward_config(
        backend=backend,
        num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=variant['hidden'],
        in_dtype=variant['dtype'],
        fmt=variant['fmt'],
        with_layout=has(variant, 'layout'),
        with_weight=has(variant, 'weights'),
        clamp=has(variant, 'clamp'),
        count_clamp=has(variant, 'count'),
    )


def expert_layout(num_tokens: int) -> torch.Tensor:
    """psum (E,) over num_tokens rows: experts of a few rows, empty ones (first, middle, last), a full aligned block,
    rows left past the last expert, values past T clipped."""
    ends, begin = [], 0
    for count in (0, 5, 130, 0, 1, 0, 61, 200):
        start = -(-begin // 128) * 128
        begin = start + count if count else begin
        ends.append(min(begin, num_tokens))
    return torch.tensor(ends, dtype=torch.int32)


def make_inputs(variant: dict, num_tokens: int, device, seed: int = 0) -> dict:
    """x with entries past the clamp value on both sides and on it; the optional tensors of the variant."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, 2 * variant['hidden'], generator=generator) * 2.0
    x.view(-1)[::97] = CLAMP  # on the clamp bounds: clamped to themselves, never counted
    x.view(-1)[1::89] = -CLAMP
    inputs = {'x': x.to(getattr(torch, variant['dtype'])).to(device)}
    if has(variant, 'layout'):
        inputs['psum_num_tokens_per_expert'] = expert_layout(num_tokens).to(device)
    if has(variant, 'weights'):
        inputs['topk_weights'] = torch.rand(num_tokens, generator=generator).to(device)
        if has(variant, 'scaling'):
            inputs['routed_scaling_factor'] = SCALING
    if has(variant, 'clamp'):
        inputs['clamp_value'] = CLAMP
    return inputs


def assert_matches(y: torch.Tensor, inputs: dict, fmt: str) -> torch.Tensor:
    """y against the float64 reference: fp32 within a few ulps of the fp32 arithmetic (exp, division, two products:
    no cancellation), bf16 within half a bf16 step of that. Returns the reference's counts."""
    expected, counts = moe_swiglu_forward_ref(
        inputs['x'],
        inputs.get('psum_num_tokens_per_expert'),
        inputs.get('topk_weights'),
        inputs.get('routed_scaling_factor'),
        inputs.get('clamp_value'),
    )
    assert y.dtype == (torch.bfloat16 if fmt == 'bf16' else torch.float32)
    rtol = 2.0**-8 + 2e-6 if fmt == 'bf16' else 2e-6  # CUDA's expf: 2 ulps; IEEE division and products
    assert_close(y.cpu().double(), expected, atol=0.0, rtol=rtol)
    return counts


# ---------------------------------------------------------------- CPU tier: configurations and lowering


def test_moe_swiglu_forward_config_is_pure_and_hashable():
    variant = VARIANTS[0]
    for backend in ('ascend', 'cuda'):
        cfg = make_config(backend, variant)
        assert cfg == make_config(backend, variant)
        assert hash(cfg) == hash(make_config(backend, variant))
        assert cfg.hidden % cfg.block_k == 0


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        ({'hidden': 96}, 'hidden must be a positive multiple of 64'),
        ({'fmt': 'e5m2'}, 'fmt must be one of'),
        ({'in_dtype': torch.float16}, 'in_dtype must be torch.bfloat16 or torch.float32'),
        ({'fmt': 'e4m3', 'block_size': 48}, 'block_size must be one of'),
        ({'round_sf': True}, 'round_sf and packed_ue8m0 apply to fmt "e4m3" only'),
        ({'count_clamp': True}, 'count_clamp needs clamp'),
        ({'backend': 'cpu'}, 'backend must be'),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_moe_swiglu_forward_config_rejects(kwargs, match):
    arguments = {'backend': 'ascend', 'num_cores': 64, 'hidden': 256, 'in_dtype': torch.bfloat16, **kwargs}
    with pytest.raises(ValueError, match=match):
        choose_moe_swiglu_forward_config(**arguments)


def test_moe_swiglu_forward_config_tiles():
    """Ascend: one task per row up to 4096 channels, else the largest dividing tile; CUDA: tiles of up to 2048
    that 128 threads (else 64, else 32) split into runs of 8."""
    ascend = choose_moe_swiglu_forward_config(backend='ascend', num_cores=64, hidden=7168, in_dtype='bfloat16')
    assert (ascend.block_k, ascend.num_col_tiles, ascend.num_stages) == (3584, 2, 2)
    cuda = choose_moe_swiglu_forward_config(backend='cuda', num_cores=132, hidden=7168, in_dtype='bfloat16')
    assert (cuda.block_k, cuda.num_col_tiles, cuda.threads) == (1024, 7, 128)
    odd = choose_moe_swiglu_forward_config(backend='cuda', num_cores=132, hidden=1088, in_dtype='bfloat16')
    assert (odd.block_k, odd.threads) == (1088, 32)
    assert cuda.count_slots(10) == 10 * 7168 // 64
    assert ascend.count_slots(10) == 64 * 4 * 64


@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_moe_swiglu_forward_ascend_kernel_lowers(variant):
    cfg = make_config('ascend', variant)
    assert_ascend_kernel_lowers(lambda: make_moe_swiglu_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_moe_swiglu_forward_cuda_kernel_lowers(variant):
    cfg = make_config('cuda', variant)
    assert_cuda_kernel_lowers(lambda: make_moe_swiglu_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


# ---------------------------------------------------------------- CPU tier: argument contract

_PSUM = torch.tensor([4], dtype=torch.int32)
_COUNT = torch.zeros(4, dtype=torch.int64)


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        (([1.0], 'bf16'), {}, TypeError, 'x must be a torch.Tensor'),
        ((X.half(), 'bf16'), {}, TypeError, 'x must have dtype torch.bfloat16 or torch.float32'),
        ((X[0], 'bf16'), {}, ValueError, 'x must have 2 dimensions'),
        ((X.t(), 'bf16'), {}, ValueError, 'x must be contiguous'),
        ((X, 'e4m3'), {}, ValueError, r"fmt must be one of \('bf16', 'fp32'\)"),
        ((X, 'bf16'), {'topk_weights': torch.ones(4, dtype=torch.float64)}, TypeError,
         'topk_weights must have dtype torch.float32'),
        ((X, 'bf16'), {'topk_weights': torch.ones(3)}, ValueError, r'topk_weights must have shape \(4,\)'),
        ((X, 'bf16'), {'psum_num_tokens_per_expert': _PSUM.long()}, TypeError,
         'psum_num_tokens_per_expert must have dtype torch.int32'),
        ((X, 'bf16'), {'psum_num_tokens_per_expert': _PSUM.view(1, 1)}, ValueError,
         'psum_num_tokens_per_expert must be 1-D with at least one expert'),
        ((X, 'bf16'), {'psum_num_tokens_per_expert': _PSUM[:0]}, ValueError, 'at least one expert'),
        ((X, 'bf16'), {'routed_scaling_factor': 2.0}, ValueError, 'routed_scaling_factor needs topk_weights'),
        ((X, 'bf16'), {'topk_weights': torch.ones(4), 'routed_scaling_factor': float('nan')}, ValueError,
         'routed_scaling_factor'),
        ((X, 'bf16'), {'clamp_value': -1.0}, ValueError, 'clamp_value'),
        ((X, 'bf16'), {'clamped_count': _COUNT}, ValueError, 'clamped_count needs clamp_value'),
        ((X, 'bf16'), {'clamp_value': 1.0, 'clamped_count': _COUNT.int()}, TypeError,
         'clamped_count must have dtype torch.int64'),
        ((X, 'bf16'), {'clamp_value': 1.0, 'clamped_count': torch.zeros(3, dtype=torch.int64)}, ValueError,
         r'clamped_count must have shape \(4,\)'),
        ((X[:, :192].clone(), 'bf16'), {}, ValueError, 'x must have 2 I columns, I a positive multiple of 64'),
        ((X, 'bf16'), {'out': torch.empty(4, 128)}, TypeError, 'out must have dtype torch.bfloat16'),
        ((X, 'fp32'), {'out': torch.empty(4, 256)}, ValueError, r'out must have shape \(4, 128\)'),
        ((X, 'bf16'), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X[:0], 'bf16'), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
)  # fmt: skip
def test_moe_swiglu_forward_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_swiglu_forward(*args, **kwargs)


def test_moe_swiglu_forward_rejects_too_many_elements():
    x = torch.empty(2**20, 2**11, dtype=torch.bfloat16, device='meta')  # no memory behind a meta tensor
    with pytest.raises(ValueError, match='at most 2\\*\\*31 - 1 elements'):
        moe_swiglu_forward(x, 'bf16')


def test_moe_swiglu_forward_rejects_aliased_counts():
    x = torch.zeros(4, 256, dtype=torch.float32)
    with pytest.raises(ValueError, match='clamped_count'):
        moe_swiglu_forward(x, 'fp32', clamp_value=1.0, clamped_count=x.view(-1)[:8].view(torch.int64))


# ---------------------------------------------------------------- CPU tier: torch.library forms

FORMS = moe_swiglu_forward.operator.forms


def test_moe_swiglu_forward_is_declared():
    assert OPERATORS['moe_swiglu_forward'] is moe_swiglu_forward.operator
    assert list(FORMS) == ['moe_swiglu_forward', 'moe_swiglu_forward_out']
    for name, written in (
        ('moe_swiglu_forward', ('clamped_count',)),
        ('moe_swiglu_forward_out', ('clamped_count', 'out')),
    ):
        schema = getattr(getattr(torch.ops, NAMESPACE), name).default._schema
        assert tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write) == written


def test_moe_swiglu_forward_fake_tensors(monkeypatch):
    """While torch traces: the forms' fake kernels give the eager call's output; torch.compile makes one graph."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    with FakeTensorMode():
        x = torch.empty(161, 640, dtype=torch.bfloat16, device='cuda')
        y = moe_swiglu_forward(x, 'fp32', topk_weights=torch.empty(161, device='cuda'), routed_scaling_factor=2.0)
        assert (y.shape, y.dtype, y.device) == ((161, 320), torch.float32, x.device)
        count = torch.zeros(4, dtype=torch.int64, device='cuda')
        y = moe_swiglu_forward(x, 'bf16', clamp_value=1.0, clamped_count=count)
        assert (y.shape, y.dtype) == ((161, 320), torch.bfloat16)
        with pytest.raises(ValueError, match='clamped_count needs clamp_value'):
            FORMS['moe_swiglu_forward'](x, 'bf16', None, None, None, None, count)
    record = GraphRecorder()

    with FakeTensorMode():
        x = torch.empty(130, 128, dtype=torch.bfloat16, device='cuda')
        y = torch.compile(lambda x: moe_swiglu_forward(x, 'bf16') * 2, fullgraph=True, backend=record)(x)
        assert (y.shape, y.dtype) == ((130, 64), torch.bfloat16)
    assert len(record.graphs) == 1


# ---------------------------------------------------------------- CPU tier: the fast path's flow


@pytest.fixture
def stub_cuda_launches(monkeypatch):
    return fast_path.stub_cuda_launches(
        monkeypatch, moe_swiglu_forward.operator, moe_swiglu_forward_and_per_token_cast.operator
    )


def test_moe_swiglu_forward_fast_path_flow(stub_cuda_launches, monkeypatch):
    """A second call of a key launches the remembered launcher without the full check, with the arguments the
    full path gives it; out=, clamped_count, an empty expert table or no rows take the full path every time."""
    plans = fast_path.count_plans(monkeypatch, moe_swiglu_forward.operator)
    x = torch.randn(5, 128)
    weights, psum = torch.rand(5), torch.tensor([3, 5], dtype=torch.int32)
    for _ in range(3):
        y = moe_swiglu_forward(x, 'bf16', psum, weights, 2.0, 4.0)
        assert (y.shape, y.dtype) == ((5, 64), torch.bfloat16)
    assert len(plans) == 1
    first, *repeats = stub_cuda_launches
    assert all(cfg is first[0] for cfg, _ in repeats)
    for (_, args), (_, again) in itertools.pairwise(stub_cuda_launches):
        assert args[0] is again[0]
        assert args[1] is not again[1]  # a new output each call
        assert all(a is b for a, b in zip(args[2:6], again[2:6], strict=True))  # the inputs and placeholders
        assert args[6:] == again[6:] == (2.0, 4.0)
    moe_swiglu_forward(x, 'bf16', psum, None, None, 4.0)  # another key: full path once, then fast
    moe_swiglu_forward(x, 'bf16', psum, None, None, 4.0)
    assert len(plans) == 2
    for call in (
        lambda: moe_swiglu_forward(x, 'bf16', psum, weights, 2.0, 4.0, out=torch.empty(5, 64, dtype=torch.bfloat16)),
        lambda: moe_swiglu_forward(x, 'bf16', psum, weights, 2.0, 4.0, torch.zeros(4, dtype=torch.int64)),
        lambda: moe_swiglu_forward(x[:0], 'bf16', psum, weights[:0], 2.0, 4.0),
    ):
        call()
    assert len(plans) == 5
    with pytest.raises(ValueError, match='psum_num_tokens_per_expert must be 1-D with at least one expert'):
        moe_swiglu_forward(x, 'bf16', psum[:0], weights, 2.0, 4.0)
    with pytest.raises(ValueError, match='routed_scaling_factor needs topk_weights'):
        moe_swiglu_forward(x, 'bf16', psum, None, 2.0, 4.0)
    # topk_weights of another length: the kernels' entries take its size as their own (found on the H200: the fast
    # path launched a short one), so the key refuses it and the full check names it.
    launches = len(stub_cuda_launches)
    with pytest.raises(ValueError, match='topk_weights must have shape'):
        moe_swiglu_forward(x, 'bf16', psum, weights[:1].clone(), 2.0, 4.0)
    assert len(stub_cuda_launches) == launches


def test_moe_swiglu_forward_and_per_token_cast_fast_path_flow(stub_cuda_launches, monkeypatch):
    """The fused cast's key holds its cast options too: another block or scale format is planned once more."""
    plans = fast_path.count_plans(monkeypatch, moe_swiglu_forward_and_per_token_cast.operator)
    x = torch.randn(5, 256)
    for block, round_sf, packed in ((32, False, False), (32, False, False), (64, False, False), (32, True, True),
                                    (32, True, True)):  # fmt: skip
        data, sf = moe_swiglu_forward_and_per_token_cast(x, 'e4m3', block, round_sf=round_sf, use_packed_ue8m0=packed)
        assert data.shape == (5, 128)
        assert sf.dtype == (torch.int32 if packed else torch.float32)
    assert len(plans) == 3
    packed_sf = stub_cuda_launches[-1][1][2]
    assert packed_sf.dtype == torch.uint8  # UE8M0 words reach the kernel as bytes on the fast path too
    # Column-major scales: a key (and a kernel) of their own; the kernel takes them transposed, row-major (K, T)
    # views of the (1, T_pad) strided scales (UE8M0: their bytes), on the fast path too.
    for _ in range(2):
        data, sf = moe_swiglu_forward_and_per_token_cast(x, 'e4m3', 32, use_tma_aligned_col_major_sf=True)
        assert sf.stride() == (1, 5)
        assert stub_cuda_launches[-1][1][2].shape == (4, 5)
        assert stub_cuda_launches[-1][1][2].stride() == (5, 1)
        assert stub_cuda_launches[-1][0].col_major_sf
    for _ in range(2):
        data, sf = moe_swiglu_forward_and_per_token_cast(
            x, 'e4m3', 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True
        )
        assert (sf.shape, sf.stride()) == ((5, 1), (1, 5))
        assert stub_cuda_launches[-1][1][2].dtype == torch.uint8
        assert stub_cuda_launches[-1][1][2].shape == (1, 20)
    assert len(plans) == 5


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_swiglu_forward_values(params, device):
    variant, num_tokens = params, params['num_tokens']
    inputs = make_inputs(variant, num_tokens, device)
    clamped = torch.tensor([7, 0, 3, 11], dtype=torch.int64, device=device) if has(variant, 'count') else None
    y = moe_swiglu_forward(**inputs, fmt=variant['fmt'], clamped_count=clamped)
    counts = assert_matches(y, inputs, variant['fmt'])
    if clamped is not None:  # added to what the tensor held
        assert_equal(clamped.cpu(), counts + torch.tensor([7, 0, 3, 11]))
    # out=, poisoned: padding rows are written (zeros) too; a second run gives the same bits.
    out = torch.full_like(y, float('nan'))
    assert moe_swiglu_forward(**inputs, fmt=variant['fmt'], out=out) is out
    assert_equal(out, y)
    if clamped is None:  # twice more without out=: on CUDA the second takes the fast path
        for _ in range(2):
            assert_equal(moe_swiglu_forward(**inputs, fmt=variant['fmt']), y)


def _spoiled(inputs: dict):
    """(name, inputs) variants that the contract refuses, one argument spoiled in each."""
    x = inputs['x']
    yield 'x-dtype', inputs | {'x': x.to(torch.float16)}
    yield 'x-width', inputs | {'x': x[:, :-64].clone()}
    yield 'x-strided', inputs | {'x': torch.zeros((*x.shape, 2), dtype=x.dtype, device=x.device)[..., 0]}
    for name in ('psum_num_tokens_per_expert', 'topk_weights'):
        if name in inputs:
            value = inputs[name]
            yield (
                f'{name}-dtype',
                inputs | {name: value.to(torch.int64 if value.is_floating_point() else torch.float32)},
            )
            yield f'{name}-length', inputs | {name: value[:1].clone() if name == 'topk_weights' else value[:0]}


@pytest.mark.npu
@pytest.mark.cuda_only
@pytest.mark.parametrize('variant', VARIANTS[:2], ids=make_param_id)
def test_moe_swiglu_forward_fast_path_keeps_the_contract(variant, device):
    """After a launch has warmed the fast path (CUDA: it trusts a compiled entry that checks its arguments), a
    spoiled argument gets the full check's exception type and message."""
    inputs = make_inputs(variant, 33, device)
    inputs.pop('clamped_count', None)
    for _ in range(2):
        moe_swiglu_forward(**inputs, fmt=variant['fmt'])
    assert moe_swiglu_forward.operator.fast, 'no fast-path launcher after a full-path launch'
    for what, spoiled in _spoiled(inputs):
        args = (spoiled['x'], variant['fmt'], spoiled.get('psum_num_tokens_per_expert'), spoiled.get('topk_weights'),
                spoiled.get('routed_scaling_factor'), spoiled.get('clamp_value'), None, None)  # fmt: skip
        with pytest.raises(Exception) as full:
            moe_swiglu_forward.operator.check(*args)
        with pytest.raises(type(full.value)) as fast:
            moe_swiglu_forward(**spoiled, fmt=variant['fmt'])
        assert str(fast.value) == str(full.value), what


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS[:2], ids=make_param_id)
def test_moe_swiglu_forward_empty(variant, device):
    """T = 0: an empty result, nothing counted, no launch."""
    inputs = make_inputs(variant, 0, device)
    clamped = torch.zeros(4, dtype=torch.int64, device=device) if has(variant, 'count') else None
    y = moe_swiglu_forward(**inputs, fmt=variant['fmt'], clamped_count=clamped)
    assert y.shape == (0, variant['hidden'])
    if clamped is not None:
        assert_equal(clamped.cpu(), torch.zeros(4, dtype=torch.int64))


@pytest.mark.npu
def test_moe_swiglu_forward_layout_edges(device):
    """The every-option kernel: no expert row at all (every expert empty, or all rows past the last one) gives zeros
    and counts nothing; padding rows are never read (NaN there changes nothing); one expert of every row."""
    variant = VARIANTS[1]
    inputs = make_inputs(variant, 300, device)
    x = inputs['x']
    for psum in ([0, 0, 0], [0]):
        inputs['psum_num_tokens_per_expert'] = torch.tensor(psum, dtype=torch.int32, device=device)
        clamped = torch.zeros(4, dtype=torch.int64, device=device)
        y = moe_swiglu_forward(**inputs, fmt=variant['fmt'], clamped_count=clamped)
        assert_equal(y.cpu(), torch.zeros(300, variant['hidden']))
        assert_equal(clamped.cpu(), torch.zeros(4, dtype=torch.int64))
    psum = expert_layout(300)
    inputs['psum_num_tokens_per_expert'] = psum.to(device)
    clamped = torch.zeros(4, dtype=torch.int64, device=device)
    y = moe_swiglu_forward(**inputs, fmt=variant['fmt'], clamped_count=clamped)
    counts = assert_matches(y, inputs, variant['fmt'])
    assert_equal(clamped.cpu(), counts)
    padded = x.clone()
    padded[~expert_rows_ref(300, psum).to(device)] = float('nan')
    # (clamped_count given in every call here: the same kernel configuration, compiled once)
    again = torch.zeros(4, dtype=torch.int64, device=device)
    assert_equal(moe_swiglu_forward(**{**inputs, 'x': padded}, fmt=variant['fmt'], clamped_count=again), y)
    assert_equal(again.cpu(), counts)
    inputs['psum_num_tokens_per_expert'] = torch.tensor([300], dtype=torch.int32, device=device)
    assert_matches(moe_swiglu_forward(**inputs, fmt=variant['fmt'], clamped_count=again), inputs, variant['fmt'])


@pytest.mark.npu
def test_moe_swiglu_forward_config_query(device):
    variant = VARIANTS[0]
    x = make_inputs(variant, 5, device)['x']
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_moe_swiglu_forward_config(
        backend=backend, num_cores=num_cores, hidden=variant['hidden'], in_dtype=x.dtype, fmt=variant['fmt']
    )
    assert moe_swiglu_forward.operator.config(x, variant['fmt']) == expected


@pytest.mark.npu
def test_moe_swiglu_forward_opcheck(device):
    """torch.library.opcheck on real tensors: the schemas' mutations (clamped_count), the fake kernels against the
    real ones."""
    variant = VARIANTS[1]
    inputs = make_inputs(variant, 1, device)
    args = (inputs['x'], variant['fmt'], inputs['psum_num_tokens_per_expert'], inputs['topk_weights'], SCALING, CLAMP,
            torch.zeros(4, dtype=torch.int64, device=device))  # fmt: skip
    torch.library.opcheck(FORMS['moe_swiglu_forward'], args, test_utils=('test_schema', 'test_faketensor'))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_swiglu_forward_benchmark(params, device, benchmark_timer, benchmark_record):
    x = torch.randn(params['num_tokens'], 2 * params['hidden'], device=device).to(getattr(torch, params['dtype']))
    out = moe_swiglu_forward(x, 'bf16')
    time_us = benchmark_timer(lambda: moe_swiglu_forward(x, 'bf16', out=out))
    benchmark_record(
        kernel=record_name('moe', 'moe_swiglu_forward'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, out) / time_us / 1e3,
        extras=config_extras(moe_swiglu_forward.operator.config(x, 'bf16')),
    )
