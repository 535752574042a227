"""Tests of moe_topk_gate (the MoE router's forward).

CPU tier: the Ascend 950 and CUDA kernels lower for every configuration of the level; every typed error of the
contract on CPU tensors; the torch.library forms on fake tensors. Device tier (`npu`; the Ascend kernel on the
emulator with --ascend-emulator): against the float64 reference (tests/moe/moe_topk_gate_ref.py), indices and
unmapped indices exact, weights and scores to fp32 rounding, for every feature and the combinations that matter,
ties, NaN / inf, T = 0 / 1, out= buffers, a strided unmapped_topk_idx; the benchmark with the peer's shapes.

The inputs keep most ranking keys apart by more than fp32 rounding (logits from a shuffled grid, biases from a
coarser one), so that the float64 reference's order is the kernels' order; the reference marks the few tokens
whose choice hangs on a near tie, which the comparison leaves out (at most 1% of the tokens).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.moe import moe_topk_gate
from cann_ops_tilelang.moe.moe_topk_gate_kernel import choose_moe_topk_gate_config, make_moe_topk_gate_kernel
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

from .moe_topk_gate_ref import moe_topk_gate_ref, random_experts_ref

KERNEL_NAME = 'moe_topk_gate_kernel'
LEVEL = get_test_level()
ALL_OPTIONS = ('mask', 'bias', 'image', 'fixed', 'unmapped', 'random', 'scores')


def _case(E, K, *, S=0, scoring='sqrtsoftplus', G=1, TG=1, R=0, options=()):
    return dict(E=E, K=K, S=S, scoring=scoring, G=G, TG=TG, R=R, options=tuple(options))


# Each case is one kernel configuration per backend. Level 0: the plain peer call; every option at once with
# sigmoid, shared experts, groups and a replica map; softmax on a ragged E with the backward's outputs.
CASES = by_level(
    LEVEL,
    core=[
        _case(72, 6),
        _case(64, 6, S=2, scoring='sigmoid', G=4, TG=2, R=4, options=ALL_OPTIONS),
        _case(40, 8, scoring='softmax', options=('bias', 'unmapped', 'scores')),
    ],
    default=[
        _case(256, 8, options=('bias',)),
        _case(256, 8, options=('image',)),
        _case(256, 8, options=('bias', 'image', 'mask')),
        _case(256, 8, options=('unmapped', 'fixed')),
        _case(256, 8, S=1, R=1, options=('random',)),
        _case(128, 8, S=2, R=2, options=('bias', 'unmapped', 'scores')),
        _case(384, 6, R=3, options=('mask', 'random')),
        _case(256, 8, scoring='sigmoid', G=8, TG=4, options=('bias', 'scores')),  # DeepSeek-V3's router
        _case(60, 4, scoring='softmax', G=2, TG=1),  # Qwen / Mixtral-like, groups of 30
        _case(512, 30, S=2, options=('bias',)),  # K + S = 32: every lane a slot
        _case(258, 7, scoring='sigmoid'),  # E % 4 != 0: CUDA's scalar loads
        _case(16, 2, G=16, TG=4),  # groups of one expert
    ],
    full=[_case(256, 8, S=1, R=4, options=ALL_OPTIONS)],
)
NUM_TOKENS = by_level(LEVEL, core=(1, 130), default=(257,), full=(4001,))
EP_RANKS = by_level(LEVEL, core=(255,), default=(0, 3))
BENCHMARK_PARAMS = generate_samples(
    num_tokens=(4001, 8001, 32768), size=[(72, 6), (128, 8), (256, 8), (384, 6)], shared=(0, 1)
)


def case_id(case: dict) -> str:
    """A compact test id: E, K, shared, scoring, groups, replicas and options."""
    parts = [f'E{case["E"]}', f'K{case["K"]}', f'S{case["S"]}', case['scoring']]
    if case['G'] > 1:
        parts.append(f'G{case["G"]}of{case["TG"]}')
    if case['R']:
        parts.append(f'R{case["R"]}')
    return '-'.join(parts + list(case['options']))


def param_id(value) -> str:
    if isinstance(value, dict) and 'E' in value:
        return case_id(value)
    return '-'.join(f'{k}={case_id(v) if isinstance(v, dict) else v}' for k, v in value.items())


def _sizes(case):
    return case['E'], case['K'], case['S']


def make_inputs(case, num_tokens, device, *, generator=None):
    """Positional and keyword arguments of a moe_topk_gate call for `case` (ep_rank 255, scale 2.5)."""
    E, K, S = _sizes(case)
    T, opts = num_tokens, case['options']
    g = torch.Generator().manual_seed(1234 + T + E) if generator is None else generator

    def grid(n, step):  # distinct multiples of step, shuffled
        return (torch.randperm(n, generator=g).float() - n / 2) * step

    # Logits on a grid of 8 / E in [-4, 4): neighbours' scores differ by far more than fp32 rounding.
    logits = torch.stack([grid(E, 8 / E) for _ in range(T)]) if T else torch.empty(0, E)
    kwargs = dict(scoring_func=case['scoring'], num_groups=case['G'], topk_groups=case['TG'])
    if 'mask' in opts:
        kwargs['mask'] = torch.rand(T, generator=g) > 0.25
    if 'bias' in opts:
        kwargs['bias'] = grid(E, 1 / 64)
    if 'image' in opts:
        kwargs['image_bias'] = grid(E, 1 / 32)
        kwargs['image_token_mask'] = torch.rand(T, generator=g) > 0.5
    if 'unmapped' in opts:
        given = [torch.randperm(E, generator=g)[:K] for _ in range(T)]
        kwargs['unmapped_topk_idx'] = torch.stack(given) if T else torch.empty(0, K, dtype=torch.int64)
    if 'fixed' in opts:
        kwargs['fix_routing_mask'] = torch.rand(T, generator=g) > 0.6
    if 'random' in opts:
        kwargs['force_random'] = torch.rand(T, generator=g) > 0.75
    if case['R']:
        kwargs['to_physical_map'] = torch.randint(0, 1024, (E + S, case['R']), generator=g, dtype=torch.int32)
        kwargs['logical_count'] = torch.randint(1, case['R'] + 1, (E + S,), generator=g, dtype=torch.int32)
    if 'scores' in opts:
        kwargs['scores'] = torch.full((T, E), torch.nan)  # poisoned: an element the kernel skips stays NaN
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return (logits.to(device), K, S > 0, S, 2.5, 255), kwargs


def check_call(args, kwargs, *, out=None):
    """Call moe_topk_gate(*args, **kwargs) and compare every output with the reference, on the tokens whose
    choice does not hang on a near tie of float64 keys (at most 1% of them; the reference marks them)."""
    unmapped_before = kwargs.get('unmapped_topk_idx')
    ref_kwargs = {k: v for k, v in kwargs.items() if k != 'scores'}
    if unmapped_before is not None:
        ref_kwargs['unmapped_topk_idx'] = unmapped_before.clone()
    idx, weights, unmapped, scores, ambiguous = moe_topk_gate_ref(*args, **ref_kwargs)
    result = moe_topk_gate(*args, **kwargs, out=out)
    if out is not None:
        assert result is out
    assert int(ambiguous.sum()) <= max(1, ambiguous.numel() // 100), 'too many near ties: change the inputs'
    device = args[0].device
    clear = (~ambiguous).to(device)
    assert (result[0].shape, result[1].shape) == (idx.shape, weights.shape)
    assert_equal(result[0][clear], idx.to(device)[clear])
    assert_close(result[1][clear], weights.float().to(device)[clear], atol=1e-6, rtol=1e-5)
    assert bool(result[1].isfinite().all())
    if unmapped_before is not None:
        assert_equal(kwargs['unmapped_topk_idx'][clear], unmapped.to(device)[clear])
    if 'scores' in kwargs:
        got, want = kwargs['scores'].cpu().double(), scores
        assert_equal(got.isnan(), want.isnan())
        assert_close(got.nan_to_num(0.0), want.nan_to_num(0.0), atol=1e-6, rtol=1e-5)
    return result


def make_config(backend, case, **flags):
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    names = {'mask': 'has_mask', 'bias': 'has_bias', 'image': 'has_image', 'fixed': 'has_fixed',
             'unmapped': 'has_unmapped', 'random': 'has_random', 'scores': 'has_scores'}  # fmt: skip
    return choose_moe_topk_gate_config(
        backend=backend, num_cores=num_cores, num_experts=case['E'], num_topk=case['K'],
        num_shared_experts=case['S'], scoring_func=case['scoring'], num_groups=case['G'], topk_groups=case['TG'],
        replicas=case['R'], **{names[o]: True for o in case['options']}, **flags,
    )  # fmt: skip


# ---------------------------------------------------------------- CPU tier: lowering


@pytest.mark.parametrize('case', CASES, ids=param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_topk_gate_kernel_lowers(case, backend):
    cfg = make_config(backend, case)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lower(lambda: make_moe_topk_gate_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_moe_topk_gate_config_choice():
    cuda = make_config('cuda', CASES[1])
    assert (cuda.vector, cuda.slots, cuda.rows, cuda.num_physical_topk, cuda.num_logical_experts) == (4, 4, 2, 8, 66)
    assert make_config('cuda', _case(258, 7)).vector == 1  # rows not 16-byte aligned: scalar loads
    assert make_config('cuda', CASES[0], aligned=False).vector == 1  # a view off a 16-byte boundary
    ascend = make_config('ascend', _case(512, 8))
    assert (ascend.vector, ascend.slots, ascend.rows, ascend.num_stages) == (1, 16, 8, 2)  # 16 KiB of logits
    assert make_config('ascend', CASES[0]).rows == 32
    assert hash(ascend) == hash(make_config('ascend', _case(512, 8)))


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(num_experts=64, num_topk=6, has_fixed=True), 'has_fixed needs has_unmapped'),
        (dict(num_experts=64, num_topk=6, scoring_func='relu'), 'scoring_func must be one of'),
        (dict(num_experts=64, num_topk=6, replicas=17), '1..16 columns, got 17'),
        (dict(num_experts=64, num_topk=31, num_shared_experts=2), r'num_topk must be in 1..30'),
        (dict(num_experts=64, num_topk=6, has_everything=True), 'unknown flags'),
        (dict(num_experts=64, num_topk=6, num_groups=64), 'num_groups must be in 1..32'),
    ],
)
def test_moe_topk_gate_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        choose_moe_topk_gate_config(backend='cuda', num_cores=H200_SMS, **kwargs)


# ---------------------------------------------------------------- CPU tier: the argument contract

T_, E_ = 4, 16
LOGITS = torch.zeros(T_, E_)
BASE = (LOGITS, 2, False, 0, 1.0, 0)
MAP = torch.zeros(E_, 2, dtype=torch.int32)
COUNT = torch.ones(E_, dtype=torch.int32)
UNMAPPED = torch.zeros(T_, 2, dtype=torch.int64)
MASK = torch.ones(T_, dtype=torch.bool)


def _with(**changes):
    """BASE's positional arguments with some replaced by name."""
    names = ('logits', 'num_topk', 'use_shared_as_routed', 'num_shared_experts', 'routed_scaling_factor', 'ep_rank')
    return tuple(changes.get(n, v) for n, v in zip(names, BASE, strict=True))


# fmt: off
REJECTS = [
    ('logits-type', _with(logits=[0.0]), {}, TypeError, 'logits must be a torch.Tensor'),
    ('logits-dtype', _with(logits=LOGITS.half()), {}, TypeError, 'logits must have dtype torch.float32'),
    ('logits-rank', _with(logits=LOGITS[0]), {}, ValueError, 'logits must have 2 dimensions'),
    ('logits-strided', _with(logits=torch.zeros(E_, T_).t()), {}, ValueError, 'logits must be contiguous'),
    ('experts', _with(logits=torch.zeros(2, 513)), {}, ValueError, 'routed experts must be in 1..512, got 513'),
    ('elements', _with(logits=torch.empty(2**22, 512, device='meta')), {}, ValueError, 'at most 2147483647'),
    ('topk-type', _with(num_topk=2.0), {}, TypeError, 'num_topk'),
    ('topk-zero', _with(num_topk=0), {}, ValueError, 'num_topk must be in 1..16'),
    ('topk-above-experts', _with(num_topk=17), {}, ValueError, 'num_topk must be in 1..16'),
    ('topk-above-slots', _with(logits=torch.zeros(2, 64), num_topk=31, use_shared_as_routed=True,
                               num_shared_experts=2), {}, ValueError, 'num_topk must be in 1..30'),
    ('shared-flag-type', _with(use_shared_as_routed=1), {}, TypeError, 'use_shared_as_routed'),
    ('shared-none', _with(use_shared_as_routed=True), {}, ValueError, 'needs num_shared_experts 1 or 2'),
    ('shared-three', _with(use_shared_as_routed=True, num_shared_experts=3), {}, ValueError,
     'num_shared_experts must be in 0..2, got 3'),
    ('shared-negative', _with(num_shared_experts=-1), {}, ValueError, 'num_shared_experts must be >= 0'),
    ('scale-inf', _with(routed_scaling_factor=float('inf')), {}, ValueError, 'routed_scaling_factor'),
    ('scale-type', _with(routed_scaling_factor='1'), {}, TypeError, 'routed_scaling_factor'),
    ('rank-negative', _with(ep_rank=-1), {}, ValueError, 'ep_rank must be in 0..2147483647, got -1'),
    ('rank-type', _with(ep_rank=1.0), {}, TypeError, 'ep_rank'),
    ('scoring', BASE, dict(scoring_func='relu'), ValueError, "scoring_func must be one of .*got 'relu'"),
    ('scoring-type', BASE, dict(scoring_func=1), TypeError, 'scoring_func'),
    ('mask-dtype', BASE, dict(mask=MASK.int()), TypeError, 'mask must have dtype torch.bool'),
    ('mask-shape', BASE, dict(mask=MASK[:3]), ValueError, r'mask must have shape \(4,\)'),
    ('mask-strided', BASE, dict(mask=torch.ones(2 * T_, dtype=torch.bool)[::2]), ValueError, 'mask must be contiguous'),
    ('fixed-strided', BASE, dict(fix_routing_mask=torch.ones(2 * T_, dtype=torch.bool)[::2],
                                 unmapped_topk_idx=UNMAPPED), ValueError, 'fix_routing_mask must be contiguous'),
    ('bias-dtype', BASE, dict(bias=torch.zeros(E_).double()), TypeError, 'bias must have dtype torch.float32'),
    ('bias-shape', BASE, dict(bias=torch.zeros(E_ + 1)), ValueError, r'bias must have shape \(16,\)'),
    ('bias-strided', BASE, dict(bias=torch.zeros(2 * E_)[::2]), ValueError, 'bias must be contiguous'),
    ('image-bias-alone', BASE, dict(image_bias=torch.zeros(E_)), ValueError, 'must be given together'),
    ('image-mask-alone', BASE, dict(image_token_mask=MASK), ValueError, 'must be given together'),
    ('image-mask-dtype', BASE, dict(image_bias=torch.zeros(E_), image_token_mask=MASK.float()), TypeError,
     'image_token_mask must have dtype torch.bool'),
    ('map-alone', BASE, dict(to_physical_map=MAP), ValueError, 'to_physical_map and logical_count'),
    ('count-alone', BASE, dict(logical_count=COUNT), ValueError, 'to_physical_map and logical_count'),
    ('map-dtype', BASE, dict(to_physical_map=MAP.long(), logical_count=COUNT), TypeError,
     'to_physical_map must have dtype torch.int32'),
    ('map-rows', BASE, dict(to_physical_map=MAP[:15], logical_count=COUNT), ValueError,
     r'to_physical_map must have shape \(16, R\)'),
    ('map-replicas', BASE, dict(to_physical_map=torch.zeros(E_, 17, dtype=torch.int32), logical_count=COUNT),
     ValueError, 'to_physical_map must have 1..16 columns, got 17'),
    ('map-strided', BASE, dict(to_physical_map=torch.zeros(2, E_, dtype=torch.int32).t(), logical_count=COUNT),
     ValueError, 'to_physical_map must be contiguous'),
    ('count-shape', BASE, dict(to_physical_map=MAP, logical_count=COUNT[:3]), ValueError,
     r'logical_count must have shape \(16,\)'),
    ('count-dtype', BASE, dict(to_physical_map=MAP, logical_count=COUNT.long()), TypeError,
     'logical_count must have dtype torch.int32'),
    ('map-shared-rows', _with(use_shared_as_routed=True, num_shared_experts=1),
     dict(to_physical_map=MAP, logical_count=COUNT), ValueError, r'shape \(17, R\)'),
    ('fixed-alone', BASE, dict(fix_routing_mask=MASK), ValueError, 'fix_routing_mask needs unmapped_topk_idx'),
    ('unmapped-dtype', BASE, dict(unmapped_topk_idx=UNMAPPED.int()), TypeError, 'must have dtype torch.int64'),
    ('unmapped-shape', BASE, dict(unmapped_topk_idx=UNMAPPED[:, :1]), ValueError, r'shape \(4, 2\)'),
    ('unmapped-columns', BASE, dict(unmapped_topk_idx=torch.zeros(2, T_, dtype=torch.int64).t()), ValueError,
     'contiguous last dimension'),
    ('random-dtype', BASE, dict(force_random=MASK.byte()), TypeError, 'force_random must have dtype torch.bool'),
    ('scores-dtype', BASE, dict(scores=LOGITS.double()), TypeError, 'scores must have dtype torch.float32'),
    ('scores-shape', BASE, dict(scores=LOGITS[:3]), ValueError, r'scores must have shape \(4, 16\)'),
    ('scores-alias', BASE, dict(scores=LOGITS), ValueError, 'scores .* must not alias the input logits'),
    ('unmapped-alias', BASE, dict(unmapped_topk_idx=LOGITS.view(torch.int64)[:, :2], scores=torch.zeros(T_, E_)),
     ValueError, 'must not alias the input logits'),
    ('groups-divide', BASE, dict(num_groups=3), ValueError, 'num_groups must be in 1..32 and divide'),
    ('groups-type', BASE, dict(num_groups=2.0), TypeError, 'num_groups'),
    ('topk-groups', BASE, dict(num_groups=4, topk_groups=5), ValueError, r'topk_groups must be in 1..num_groups'),
    ('topk-in-groups', _with(num_topk=5), dict(num_groups=4, topk_groups=1), ValueError,
     'at most the 4 experts of the kept groups'),
    ('out-dtype', BASE, dict(out=(UNMAPPED.int(), torch.zeros(T_, 2))), TypeError, r'out\[0\] must have dtype'),
    ('out-shape', BASE, dict(out=(UNMAPPED, torch.zeros(T_, 3))), ValueError, r'out\[1\] must have shape \(4, 2\)'),
    ('out-type', BASE, dict(out=UNMAPPED), TypeError, 'out'),
    ('bias-device', BASE, dict(bias=torch.zeros(E_, device='meta')), RuntimeError, 'meta'),
    ('map-device', BASE, dict(to_physical_map=MAP.to('meta'), logical_count=COUNT), RuntimeError, 'meta'),
    ('cpu', BASE, {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ('cpu-empty', _with(logits=torch.zeros(0, E_)), {}, RuntimeError, "no kernels for 'cpu' tensors"),
]
# fmt: on


@pytest.mark.parametrize(('args', 'kwargs', 'error', 'match'), [r[1:] for r in REJECTS], ids=[r[0] for r in REJECTS])
def test_moe_topk_gate_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_topk_gate(*args, **kwargs)


def test_moe_topk_gate_keeps_the_peer_signature():
    import inspect

    names = list(inspect.signature(moe_topk_gate).parameters)
    assert names[:16] == [
        'logits', 'num_topk', 'use_shared_as_routed', 'num_shared_experts', 'routed_scaling_factor', 'ep_rank',
        'scoring_func', 'mask', 'bias', 'image_bias', 'image_token_mask', 'fix_routing_mask', 'to_physical_map',
        'logical_count', 'unmapped_topk_idx', 'force_random',
    ]  # fmt: skip
    keyword_only = [p.name for p in inspect.signature(moe_topk_gate).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert keyword_only == ['scores', 'num_groups', 'topk_groups', 'out']


# ---------------------------------------------------------------- CPU tier: torch.library forms on fake tensors

FORMS = moe_topk_gate.operator.forms
OPS = {'moe_topk_gate': ('unmapped_topk_idx', 'scores'),
       'moe_topk_gate_out': ('unmapped_topk_idx', 'scores', 'out_topk_idx', 'out_topk_weights')}  # fmt: skip


def test_moe_topk_gate_forms():
    assert OPERATORS['moe_topk_gate'] is moe_topk_gate.operator
    assert list(FORMS) == list(OPS)
    for name, written in OPS.items():
        assert getattr(getattr(torch.ops, NAMESPACE), name).default is FORMS[name]
        schema = FORMS[name]._schema
        assert tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write) == written


def test_moe_topk_gate_fake_calls():
    with FakeTensorMode():
        logits = torch.empty(130, 64, device='cuda')
        idx, weights = moe_topk_gate(logits, 6, True, 2, 2.5, 3, 'sigmoid', num_groups=4, topk_groups=2)
        assert (idx.shape, idx.dtype, weights.shape, weights.dtype) == ((130, 8), torch.int64, (130, 8), torch.float32)
        out = (torch.empty(130, 6, dtype=torch.int64, device='cuda'), torch.empty(130, 6, device='cuda'))
        unmapped = torch.empty(130, 6, dtype=torch.int64, device='cuda')
        assert moe_topk_gate(logits, 6, False, 0, 1, 0, unmapped_topk_idx=unmapped, out=out) is out
        fixed = torch.empty(130, dtype=torch.bool, device='cuda')
        with pytest.raises(ValueError, match='fix_routing_mask needs unmapped_topk_idx'):
            moe_topk_gate(logits, 6, False, 0, 1.0, 0, fix_routing_mask=fixed)


def test_moe_topk_gate_compiles_into_one_graph():
    record = GraphRecorder()

    def route(logits, bias, scores):
        idx, weights = moe_topk_gate(logits, 6, False, 0, 2.5, 1, 'sigmoid', bias=bias, scores=scores)
        return idx + 1, weights * 2

    with FakeTensorMode():
        logits = torch.empty(130, 64, device='cuda')
        idx, weights = torch.compile(route, fullgraph=True, backend=record)(
            logits, torch.empty(64, device='cuda'), torch.empty(130, 64, device='cuda')
        )
        assert (idx.shape, weights.shape) == ((130, 6), (130, 6))
    targets = record.targets()
    assert str(FORMS['moe_topk_gate']) in targets


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', generate_samples(case=CASES, num_tokens=NUM_TOKENS, ep_rank=EP_RANKS), ids=param_id)
def test_moe_topk_gate_values(params, device):
    args, kwargs = make_inputs(params['case'], params['num_tokens'], device)
    check_call((*args[:5], params['ep_rank']), kwargs)


@pytest.mark.npu
@pytest.mark.parametrize('case', CASES, ids=param_id)
def test_moe_topk_gate_out_buffers(case, device):
    args, kwargs = make_inputs(case, 33, device)
    P = case['K'] + case['S']
    out = (torch.full((33, P), -7, dtype=torch.int64, device=device), torch.full((33, P), torch.nan, device=device))
    check_call(args, kwargs, out=out)


@pytest.mark.npu
def test_moe_topk_gate_strided_unmapped(device):
    """unmapped_topk_idx may be a column slice (TileKernels takes any row stride): read and written in place."""
    case = CASES[1]
    args, kwargs = make_inputs(case, 20, device)
    wide = torch.full((20, case['K'] + 3), -5, dtype=torch.int64, device=device)
    wide[:, : case['K']] = kwargs['unmapped_topk_idx']
    kwargs['unmapped_topk_idx'] = wide[:, : case['K']]
    check_call(args, kwargs)
    assert bool((wide[:, case['K'] :] == -5).all())  # the columns beside it are untouched


@pytest.mark.npu
def test_moe_topk_gate_repeated_calls_keep_the_contract(device):
    """From the second call of a configuration on, CUDA takes the fast path: the same values, and the same typed
    errors (a scores buffer aliasing the logits, a bias or a map passed with another rank, a negative ep_rank)."""
    args, kwargs = make_inputs(CASES[1], 130, device)  # every option
    for _ in range(3):
        check_call(args, kwargs)
    rejected = [
        (dict(kwargs, scores=args[0]), 'scores'),
        (dict(kwargs, bias=kwargs['bias'].view(1, -1)), 'bias'),
        (dict(kwargs, to_physical_map=kwargs['to_physical_map'].unsqueeze(-1)), 'to_physical_map'),
    ]
    for bad, match in rejected:
        with pytest.raises(ValueError, match=match):
            moe_topk_gate(*args, **bad)
    with pytest.raises(ValueError, match='ep_rank'):
        moe_topk_gate(*args[:5], -1, **kwargs)


@pytest.mark.npu
def test_moe_topk_gate_misaligned_logits(device):
    """Logits as a contiguous view 4 bytes into its storage (CUDA: the scalar-load kernel)."""
    args, kwargs = make_inputs(CASES[0], 40, device)
    logits = torch.empty(40 * 72 + 1, device=device)[1:].view(40, 72).copy_(args[0])
    check_call((logits, *args[1:]), kwargs)


@pytest.mark.npu
@pytest.mark.parametrize('case', CASES[:2], ids=param_id)
def test_moe_topk_gate_ties(case, device):
    """Equal logits (and equal biases): the lower expert index wins, inside groups and between them."""
    args, kwargs = make_inputs(case, 9, device)
    logits = torch.zeros(9, case['E'], device=device)
    logits[1] = 1.0
    logits[2, ::2] = 0.5
    if 'bias' in kwargs:
        kwargs['bias'] = torch.zeros_like(kwargs['bias'])
    if 'image_bias' in kwargs:
        kwargs['image_bias'] = torch.zeros_like(kwargs['image_bias'])
    check_call((logits, *args[1:]), kwargs)


@pytest.mark.npu
@pytest.mark.parametrize('case', CASES, ids=param_id)
def test_moe_topk_gate_special_values(case, device):
    """NaN logits rank last, +-inf in order; weights stay finite (non-finite scores count 0)."""
    args, kwargs = make_inputs(case, 8, device)
    logits = args[0].clone()
    E = case['E']
    logits[0, ::3] = torch.nan
    logits[1, :] = torch.nan
    logits[2, 1] = torch.inf
    logits[3, ::2] = -torch.inf
    logits[4, :] = -torch.inf
    logits[5, 0] = torch.inf
    logits[5, E - 1] = torch.nan
    logits[6, :] = torch.where(torch.arange(E, device=device) % 2 == 0, torch.inf, -torch.inf)
    check_call((logits, *args[1:]), kwargs)


@pytest.mark.npu
@pytest.mark.parametrize('case', CASES[:2], ids=param_id)
def test_moe_topk_gate_empty(case, device):
    args, kwargs = make_inputs(case, 0, device)
    idx, weights = moe_topk_gate(*args, **kwargs)
    P = case['K'] + case['S']
    assert (idx.shape, idx.dtype, weights.shape, weights.dtype) == ((0, P), torch.int64, (0, P), torch.float32)


@pytest.mark.npu
@pytest.mark.parametrize('replicas', by_level(LEVEL, core=(4,), default=(1, 2, 3)))
def test_moe_topk_gate_physical_map(replicas, device):
    """Replicas 1..4: every token's experts come from its logical expert's row, the replica by the rule, for
    ep_rank 0 and 255."""
    case = dict(CASES[1], R=replicas) if replicas != CASES[1]['R'] else CASES[1]
    for ep_rank in (0, 255):
        args, kwargs = make_inputs(case, 45, device)
        check_call((*args[:5], ep_rank), kwargs)


@pytest.mark.npu
@pytest.mark.skipif(LEVEL < 2, reason='92100 tokens: level 2')
def test_moe_topk_gate_large_token_index(device):
    """Tokens past 92037, where t * 23333 passes 2**31: the replica rule in 64-bit arithmetic."""
    case = _case(16, 2, R=4, options=('unmapped',))
    args, kwargs = make_inputs(case, 92100, device)
    check_call(args, kwargs)


@pytest.mark.npu
def test_moe_topk_gate_force_random(device):
    """force_random: distinct experts in 0..N-1 (N the replica total), weights in [0, 1), the reference's draws."""
    case = CASES[1]
    args, kwargs = make_inputs(case, 64, device)
    kwargs['force_random'] = torch.ones(64, dtype=torch.bool, device=device)
    kwargs['mask'] = torch.ones(64, dtype=torch.bool, device=device)
    idx, weights = check_call(args, kwargs)
    num_physical = int(kwargs['logical_count'].cpu().clamp(1, case['R']).sum())
    assert all(len(set(row)) == idx.shape[1] for row in idx.cpu().tolist())
    assert bool(((idx >= 0) & (idx < num_physical)).all())
    assert bool(((weights >= 0) & (weights < 1)).all())
    experts, _ = random_experts_ref(5, 255, idx.shape[1], num_physical)
    assert idx[5].cpu().tolist() == experts


@pytest.mark.npu
def test_moe_topk_gate_config(device):
    args, kwargs = make_inputs(CASES[0], 5, device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_moe_topk_gate_config(backend=backend, num_cores=num_cores, num_experts=72, num_topk=6)
    assert moe_topk_gate.operator.config(*args, **kwargs) == expected


@pytest.mark.npu
def test_moe_topk_gate_opcheck(device):
    args, _ = make_inputs(CASES[0], 33, device)
    logits, K, shared, S, scale, rank = args
    values = (logits, K, shared, S, scale, rank, 'sqrtsoftplus', *[None] * 10, 1, 1)
    torch.library.opcheck(FORMS['moe_topk_gate'], values)
    out = (torch.empty(33, K, dtype=torch.int64, device=device), torch.empty(33, K, device=device))
    torch.library.opcheck(FORMS['moe_topk_gate_out'], (*values, *out))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_topk_gate_benchmark(params, device, benchmark_timer, benchmark_record):
    """The peer's production call: bias, shared experts as routed, a replica map and unmapped indices."""
    (E, K), S, T = params['size'], params['shared'], params['num_tokens']
    case = _case(E, K, S=S, R=2, options=('bias', 'unmapped'))
    args, kwargs = make_inputs(case, T, device)
    out = (torch.empty(T, K + S, dtype=torch.int64, device=device), torch.empty(T, K + S, device=device))
    moe_topk_gate(*args, **kwargs, out=out)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: moe_topk_gate(*args, **kwargs, out=out))
    benchmark_record(
        kernel=record_name('moe', 'moe_topk_gate'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(args[0], kwargs['unmapped_topk_idx'], *out) / time_us / 1e3,
        extras=config_extras(moe_topk_gate.operator.config(*args, **kwargs)),
    )
