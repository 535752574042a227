"""apply_rotary, the public operator: argument contract and torch.library form (CPU tier), values through the
public call against the float64 reference (device tier: an accelerator, or the Ascend kernel on the emulator with
--ascend-emulator): NeoX and GPT-J, the inverse, positions and offsets, 3-D and 4-D, GQA keys, partial rotary
views, empty and one-token inputs; the benchmark. The kernels themselves: test_apply_rotary_kernel.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from cann_ops_tilelang.transform import apply_rotary
from cann_ops_tilelang.transform.apply_rotary_kernel import choose_apply_rotary_config
from tests.testing import fast_path
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.timing import record_name

from .apply_rotary_ref import apply_rotary_ref, make_cos_sin_cache, rotation_tolerance

LEVEL = get_test_level()
SEQLEN_RO = 48
Q = torch.zeros(5, 4, 64, dtype=torch.bfloat16)
CACHE = torch.zeros(SEQLEN_RO, 64)
FORM = apply_rotary.operator.forms['apply_rotary']


def _call(query, cache=CACHE, key=None, positions=None, interleaved=False, conjugate=False, seqlen_offset=0):
    return apply_rotary(query, cache, key, positions, interleaved, conjugate, seqlen_offset)


# ---------------------------------------------------------------- CPU tier: argument contract


@pytest.mark.parametrize(
    ('kwargs', 'error', 'match'),
    [
        (dict(query=Q.tolist()), TypeError, 'query must be a torch.Tensor, got list'),
        (dict(query=Q.to(torch.float64)), TypeError, 'query must have dtype torch.bfloat16 or torch.float16 or'),
        (dict(query=Q, cache=CACHE.double()), TypeError, 'cos_sin_cache must have dtype torch.float32'),
        (dict(query=Q, key=Q.float()), TypeError, r'key must have the dtype of query \(torch.bfloat16\)'),
        (dict(query=Q, positions=torch.zeros(5)), TypeError, 'positions must have dtype torch.int32 or torch.int64'),
        (dict(query=Q, interleaved=1), TypeError, 'interleaved must be a bool, got int'),
        (dict(query=Q, conjugate=None), TypeError, 'conjugate must be a bool, got NoneType'),
        (dict(query=Q, seqlen_offset=1.0), TypeError, 'seqlen_offset must be an int, got float'),
        (dict(query=Q[0]), ValueError, r'query must be \(tokens, heads, rot_dim\) or \(batch, seqlen, heads'),
        (dict(query=Q[:, :0]), ValueError, r'with heads >= 1, got shape \(5, 0, 64\)'),
        (dict(query=Q, key=Q[:, :0].clone()), ValueError, r'key must be .* with heads >= 1'),
        (dict(query=Q, cache=CACHE[:, :48]), ValueError, r'rot_dim\) must be a multiple of 32 in \[32, 256\], got 48'),
        (dict(query=Q, cache=torch.zeros(4, 288)), ValueError, 'multiple of 32 in .*got 288'),
        (dict(query=Q, cache=CACHE[:0]), ValueError, 'cos_sin_cache must have at least one row'),
        (dict(query=Q, cache=torch.zeros(SEQLEN_RO, 128)), ValueError, 'last dimension of query must be rot_dim'),
        (dict(query=Q, cache=CACHE.t().contiguous().t()), ValueError, 'cos_sin_cache must have a contiguous last'),
        (dict(query=Q.transpose(1, 2).contiguous().transpose(1, 2)), ValueError, 'query must have a contiguous last'),
        (dict(query=Q, key=Q[:4]), ValueError, r'key must have the tokens of query, \(5,\)'),
        (dict(query=Q, key=Q[None]), ValueError, 'key must have the tokens of query'),
        (dict(query=Q, key=torch.zeros(5, 2, 32, dtype=torch.bfloat16)), ValueError, 'last dimension of key'),
        (dict(query=Q, positions=torch.zeros(1, 5, dtype=torch.int32)), ValueError, r'positions must have shape \(5'),
        (dict(query=Q, seqlen_offset=-1), ValueError, r'seqlen_offset must be in \[0, 43\] for seqlen 5'),
        (dict(query=Q, seqlen_offset=44), ValueError, r'seqlen_offset must be in \[0, 43\]'),
        (dict(query=Q, positions=torch.zeros(5, dtype=torch.int64), seqlen_offset=2**31), ValueError, 'fit int32'),
        (dict(query=Q, key=Q), ValueError, 'query and key must not overlap'),
        (dict(query=Q, key=Q[:, :2]), ValueError, 'query and key must not overlap'),
        (dict(query=Q), RuntimeError, "no kernels for 'cpu' tensors"),
        (dict(query=Q[:0]), RuntimeError, "no kernels for 'cpu' tensors"),  # empty: no CPU fallback either
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_apply_rotary_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        _call(**kwargs)


def test_apply_rotary_rejects_aliasing_the_inputs():
    fp32 = torch.zeros(SEQLEN_RO * 64)
    with pytest.raises(ValueError, match='query .updated in place. must not alias the input cos_sin_cache'):
        _call(fp32[: 5 * 2 * 64].view(5, 2, 64), fp32.view(SEQLEN_RO, 64))
    key = torch.zeros(5, 2, 64)
    with pytest.raises(ValueError, match='key .updated in place. must not alias the input positions'):
        _call(torch.zeros(5, 4, 64), CACHE, key, key.view(torch.int32).view(-1)[:5])


def _fused_qkv(tokens, q_heads, kv_heads, rot_dim, dtype, device=None):
    """(qkv, query, key): the query and key heads of one fused projection's rows, (tokens, heads, rot_dim) views."""
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * rot_dim, device=device).to(dtype)
    query, key, _ = qkv.split([q_heads * rot_dim, kv_heads * rot_dim, kv_heads * rot_dim], dim=-1)
    return qkv, query.view(tokens, q_heads, rot_dim), key.view(tokens, kv_heads, rot_dim)


def test_apply_rotary_takes_fused_qkv_views():
    """Query and key heads of one fused qkv buffer interleave by token without sharing a byte: the contract takes
    them (on CPU tensors the device check is the one left to fail)."""
    _, query, key = _fused_qkv(5, 4, 2, 64, torch.bfloat16)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _call(query, CACHE, key)
    with pytest.raises(ValueError, match='query and key must not overlap'):
        _call(query, CACHE, query.view(5, 2, 128)[..., 32:96])


def test_apply_rotary_fast_path_flow(monkeypatch):
    """CPU tensors taken as CUDA ones: a second call of a configuration launches without the full check, query and
    key (partial-rotary views too) in one launch; calls whose spans meet (fused qkv views) or that the compiled
    entry could not refuse (an offset past the cache, no tokens) take the full check every time."""
    op = apply_rotary.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, op)
    plans = fast_path.count_plans(monkeypatch, op)
    q = torch.randn(5, 4, 96).to(torch.bfloat16)[..., 32:]
    k = torch.randn(5, 2, 64).to(torch.bfloat16)
    positions = torch.arange(5)
    for _ in range(3):
        _call(q, CACHE, k, positions, seqlen_offset=2)
    assert len(plans) == 1
    assert [len(args) for _, args in launches] == [6] * 3  # query, key, cache, positions, offset, sin's sign
    assert launches[-1][1][0].shape == (1, 5, 4, 64)
    assert launches[-1][1][3].shape == (1, 5)
    assert launches[-1][1][4:] == (2, 1.0)
    _call(q, CACHE, k, positions, conjugate=True)  # a runtime argument: the same launcher
    assert (len(plans), launches[-1][1][5]) == (1, -1.0)
    wide = torch.zeros(5, 4, 96, dtype=torch.bfloat16)
    for _ in range(2):
        _call(wide[..., :64], CACHE)  # another configuration (no key, no positions): planned once
    assert len(plans) == 2
    with pytest.raises(ValueError, match=r'seqlen_offset must be in \[0, 43\]'):
        _call(wide[..., :64], CACHE, seqlen_offset=44)
    _call(wide[:0, :, :64], CACHE)  # no tokens: the full check, no launch
    assert (len(plans), len(launches)) == (4, 6)
    _, fused_q, fused_k = _fused_qkv(5, 4, 2, 64, torch.bfloat16)
    for _ in range(2):
        _call(fused_q, CACHE, fused_k)
    assert (len(plans), len(launches)) == (6, 8)


def test_apply_rotary_rejects_a_span_past_int32():
    # A view whose elements reach past 2**31 - 1 (meta: no memory behind it).
    wide = torch.empty(2, 4, 2**30, dtype=torch.bfloat16, device='meta')[:, :, :64]
    with pytest.raises(ValueError, match='query must span at most 2147483647 elements'):
        _call(wide.view(2, 4, 64), CACHE.to('meta'))


def test_apply_rotary_is_declared():
    assert OPERATORS['apply_rotary'] is apply_rotary.operator
    assert list(apply_rotary.operator.forms) == ['apply_rotary']
    assert getattr(torch.ops, NAMESPACE).apply_rotary.default is FORM
    schema = FORM._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('query', 'key')
    assert not schema.returns


def test_apply_rotary_fake_tensors(monkeypatch):
    """While torch traces (fake tensors): the memory-free check, then the op, which returns nothing; its errors are
    the contract's."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    with FakeTensorMode():
        q = torch.empty(7, 4, 64, dtype=torch.bfloat16)
        k = torch.empty(7, 2, 64, dtype=torch.bfloat16)
        cache = torch.empty(SEQLEN_RO, 64)
        assert _call(q, cache, k, torch.empty(7, dtype=torch.int32), True, True, 3) is None
        assert FORM(q, cache, k, None, False, False, 0) is None
        with pytest.raises(ValueError, match='query and key must not overlap'):
            _call(q, cache, q)
        with pytest.raises(ValueError, match='last dimension of key must be rot_dim'):
            _call(q, cache, torch.empty(7, 2, 32, dtype=torch.bfloat16))


def test_apply_rotary_compiles_into_one_graph(monkeypatch):
    """torch.compile(fullgraph=True) traces the in-place call into the op (a graph break would raise)."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    record = GraphRecorder()

    def rotate(q, cache, k):
        apply_rotary(q, cache, k, None, False, False, 1)
        return q * 2

    with FakeTensorMode():
        q, k = torch.empty(9, 4, 64, dtype=torch.bfloat16), torch.empty(9, 1, 64, dtype=torch.bfloat16)
        doubled = torch.compile(rotate, fullgraph=True, backend=record)(q, torch.empty(SEQLEN_RO, 64), k)
        assert (doubled.shape, doubled.dtype) == (q.shape, q.dtype)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORM) in targets, targets


# ---------------------------------------------------------------- device tier
# Level 0: four Ascend kernels (test_apply_rotary_kernel.py lowers the same): bf16 NeoX 64 wide with 4 query heads
# and 2 key heads, fp32 GPT-J 96 wide (a partial register chunk) with 3 heads, with int64 positions and without.

CASES = by_level(
    LEVEL,
    core=[
        # 3-D, offset, GQA key; T = 1 and 0; a partial rotary view q[..., :64] of 96-wide heads
        dict(dtype='bfloat16', rot_dim=64, layout=(5,), heads=(4, 2), interleaved=False, positions=None, offset=3),
        dict(dtype='bfloat16', rot_dim=64, layout=(1,), heads=(4, 2), interleaved=False, positions=None, offset=0),
        dict(dtype='bfloat16', rot_dim=64, layout=(0,), heads=(4, 2), interleaved=False, positions=None, offset=0),
        dict(dtype='bfloat16', rot_dim=64, layout=(9,), heads=(4, None), interleaved=False, positions=None, offset=1,
             head_dim=96, place='head'),
        # 4-D, positions (some out of the cache: clamped), key of the query's heads, DeepSeek-MLA tail views
        dict(dtype='float32', rot_dim=96, layout=(2, 7), heads=(3, 3), interleaved=True, positions='int64',
             offset=-2, head_dim=128, place='tail'),
        dict(dtype='float32', rot_dim=96, layout=(1, 1), heads=(3, 3), interleaved=True, positions='int64',
             offset=5),
    ],
    default=[
        dict(dtype='float16', rot_dim=128, layout=(33,), heads=(8, 1), interleaved=True, positions='int32',
             offset=0),
        dict(dtype='bfloat16', rot_dim=160, layout=(3, 11), heads=(5, 5), interleaved=False, positions='int32',
             offset=7, head_dim=192, place='tail'),
        dict(dtype='bfloat16', rot_dim=256, layout=(2, 40), heads=(2, 1), interleaved=True, positions=None,
             offset=8),
        dict(dtype='float32', rot_dim=32, layout=(67,), heads=(16, 4), interleaved=False, positions='int64',
             offset=0),
        dict(dtype='float32', rot_dim=224, layout=(130,), heads=(1, 1), interleaved=False, positions=None, offset=0),
        # 64 heads of 128 fp32: on Ascend two head groups per token
        dict(dtype='float32', rot_dim=128, layout=(2, 5), heads=(64, 8), interleaved=True, positions=None, offset=2),
    ],
    full=[
        dict(dtype='bfloat16', rot_dim=128, layout=(4001,), heads=(32, 8), interleaved=False, positions='int64',
             offset=0),
        dict(dtype='bfloat16', rot_dim=64, layout=(3, 1500), heads=(128, 1), interleaved=True, positions=None,
             offset=17, head_dim=192, place='tail'),
    ],
)  # fmt: skip
_DTYPES = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}
_POSITIONS = {None: None, 'int32': torch.int32, 'int64': torch.int64}


def _case_id(case: dict) -> str:
    return make_param_id({k: v for k, v in case.items() if k != 'heads'} | {'heads': '-'.join(map(str, case['heads']))})


def _rotated_view(case: dict, heads: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(the whole tensor, the rotated view of it): rot_dim wide heads, or views of head_dim wide ones."""
    rot_dim = case['rot_dim']
    head_dim = case.get('head_dim', rot_dim)
    whole = torch.randn(*case['layout'], heads, head_dim, device=device).to(_DTYPES[case['dtype']])
    if case.get('place') == 'tail':
        return whole, whole[..., head_dim - rot_dim :]
    return whole, whole[..., :rot_dim]


def _cache_rows(case: dict) -> int:
    """Rows of the case's cache: SEQLEN_RO, or as many as a sequence without positions reads."""
    return max(SEQLEN_RO, case['layout'][-1] + case['offset'])


def _positions(case: dict, device) -> torch.Tensor | None:
    dtype = _POSITIONS[case['positions']]
    if dtype is None:
        return None
    # mostly inside the cache, a few before and after it (clamped)
    return torch.randint(-4, _cache_rows(case) + 4, case['layout'], device=device).to(dtype)


def _assert_rotated(view, before, cache, case, positions, conjugate=False) -> None:
    expected = apply_rotary_ref(before, cache, positions, case['offset'], case['interleaved'], conjugate)
    error = (view.cpu().double() - expected).abs()
    tolerance = rotation_tolerance(before, view.dtype, case['interleaved'])
    assert bool((error <= tolerance).all()), f'max error {error.max().item()}, max allowed {tolerance.max().item()}'


@pytest.mark.npu
@pytest.mark.parametrize('case', CASES, ids=_case_id)
def test_apply_rotary_values(case, device):
    cache = make_cos_sin_cache(_cache_rows(case), case['rot_dim']).to(device)
    q_heads, k_heads = case['heads']
    q_whole, q = _rotated_view(case, q_heads, device)
    k = _rotated_view(case, k_heads, device)[1] if k_heads else None
    positions = _positions(case, device)
    q_before, q_rest = q.clone(), q_whole.clone()
    k_before = None if k is None else k.clone()
    args = (positions, case['interleaved'], False, case['offset'])
    assert apply_rotary(q, cache, k, *args) is None
    _assert_rotated(q, q_before, cache, case, positions)
    if k is not None:
        _assert_rotated(k, k_before, cache, case, positions)
    # the rest of a partial-rotary head is untouched
    head_dim = q_whole.shape[-1]
    rest = slice(0, head_dim - case['rot_dim']) if case.get('place') == 'tail' else slice(case['rot_dim'], head_dim)
    assert torch.equal(q_whole[..., rest].cpu(), q_rest[..., rest].cpu())
    # conjugate: the inverse rotation, also against the reference; applied after the rotation, x comes back
    rotated = q.clone()
    apply_rotary(q, cache, k, positions, case['interleaved'], True, case['offset'])
    _assert_rotated(q, rotated, cache, case, positions, conjugate=True)
    back = (q.cpu().double() - q_before.cpu().double()).abs()
    assert bool((back <= 2 * rotation_tolerance(q_before, q.dtype, case['interleaved'])).all())


@pytest.mark.npu
def test_apply_rotary_fused_qkv(device):
    """Query and key as views of one fused qkv buffer, rotated in one call (the first level-0 case's kernel); the
    value heads are untouched."""
    case = CASES[0]
    qkv, q, k = _fused_qkv(5, *case['heads'], case['rot_dim'], _DTYPES[case['dtype']], device)
    cache = make_cos_sin_cache(_cache_rows(case), case['rot_dim']).to(device)
    before = qkv.clone()
    q_before, k_before = q.clone(), k.clone()
    apply_rotary(q, cache, k, None, case['interleaved'], False, case['offset'])
    _assert_rotated(q, q_before, cache, case, None)
    _assert_rotated(k, k_before, cache, case, None)
    value = slice((case['heads'][0] + case['heads'][1]) * case['rot_dim'], None)
    assert torch.equal(qkv[:, value].cpu(), before[:, value].cpu())


@pytest.mark.npu
def test_apply_rotary_positions_equal_offsets(device):
    """positions = s, with an offset, read the rows the offset alone reads: the same bits (4-D, fp32 GPT-J)."""
    cache = make_cos_sin_cache(SEQLEN_RO, 96).to(device)
    q = torch.randn(2, 7, 3, 96, device=device)
    by_offset, by_positions = q.clone(), q.clone()
    apply_rotary(by_offset, cache, None, None, True, False, 4)
    positions = torch.arange(7, device=device).repeat(2, 1)
    apply_rotary(by_positions, cache, None, positions, True, False, 4)
    assert torch.equal(by_offset.cpu(), by_positions.cpu())


@pytest.mark.npu
def test_apply_rotary_config(device):
    """The configuration a call launches is the chooser's for the device."""
    q = torch.randn(5, 4, 64, device=device).to(torch.bfloat16)
    cache = make_cos_sin_cache(SEQLEN_RO, 64).to(device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    cfg = apply_rotary.operator.config(q, cache, seqlen_offset=2)
    expected = choose_apply_rotary_config(
        backend=backend, num_cores=num_cores, dtype=torch.bfloat16, rot_dim=64, heads=4,
        **({'vec': cfg.vec, 'cs_vec': cfg.cs_vec} if backend == 'cuda' else {}),
    )  # fmt: skip
    assert cfg == expected


@pytest.mark.npu
def test_apply_rotary_opcheck(device):
    """torch.library.opcheck on real tensors: the schema's mutations, the fake kernel against the real one."""
    q = torch.randn(5, 4, 64, device=device).to(torch.bfloat16)
    k = torch.randn(5, 2, 64, device=device).to(torch.bfloat16)
    cache = make_cos_sin_cache(SEQLEN_RO, 64).to(device)
    torch.library.opcheck(FORM, (q, cache, k, None, False, False, 3))


# ---------------------------------------------------------------- benchmark
# Llama-style 32 query / 8 key heads of 128 (hidden 4096), and DeepSeek-V3 MLA: 128 query heads with a 64-wide
# rotary tail of 192-wide heads and one shared 64-wide key head.
BENCHMARK_PARAMS = generate_samples(
    num_tokens=[4001, 8192, 32768],
    model=['llama', 'mla'],
    interleaved=[False, True],
)
_MODELS = {
    'llama': dict(heads=(32, 8), head_dim=128, rot_dim=128),
    'mla': dict(heads=(128, 1), head_dim=192, rot_dim=64),
}


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_apply_rotary_benchmark(params, device, benchmark_timer, benchmark_record):
    model = _MODELS[params['model']]
    tokens, rot_dim, head_dim = params['num_tokens'], model['rot_dim'], model['head_dim']
    q_heads, k_heads = model['heads']
    q = torch.randn(tokens, q_heads, head_dim, device=device).to(torch.bfloat16)[..., head_dim - rot_dim :]
    k = torch.randn(tokens, k_heads, rot_dim, device=device).to(torch.bfloat16)
    cache = make_cos_sin_cache(8192, rot_dim).to(device)
    positions = torch.randint(0, 8192, (tokens,), device=device)
    time_us = benchmark_timer(lambda: apply_rotary(q, cache, k, positions, params['interleaved']))
    # bytes moved: q and k read and written, one cache row and one position per token
    moved = 2 * (q.numel() + k.numel()) * 2 + tokens * (rot_dim * 4 + 8)
    cfg = apply_rotary.operator.config(q, cache, k, positions, params['interleaved'])
    benchmark_record(
        kernel=record_name('transform', 'apply_rotary'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=moved / time_us / 1e3,
        extras=config_extras(cfg),
    )
