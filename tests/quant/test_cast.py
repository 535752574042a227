"""quant.cast, the public operator: argument contract and torch.library forms (CPU tier); values through the public
call against the reference bit for bit, stochastic rounding's unbiasedness and reproducibility, out=, empty and
scalar tensors, torch.compile (device tier: an accelerator, or the Ascend kernels on the emulator with
--ascend-emulator); benchmarks with the peer's shapes. The kernels themselves: test_cast_kernel.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.quant.cast import cast
from tests.quant import stochastic_rounding_ref as ref
from tests.quant.stochastic_rounding_ref import cast_inputs, nan_canonical, plain_cast_ref
from tests.testing import fast_path
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal, count_bytes

LEVEL = get_test_level()
F32, BF16, F16, E4M3, E5M2 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_SR_PAIRS = [(F32, BF16), (F32, E4M3), (BF16, E4M3)]
# The pairs of test_cast_kernel.py's level 0 (their kernels compile once per run); level 1 every pair.
_CORE_PLAIN = [(F32, BF16), (BF16, E4M3), (E4M3, F32), (F16, BF16), (BF16, F16), (F32, E5M2), (E5M2, BF16)]
_DTYPES = (F32, BF16, F16, E4M3, E5M2)
_ALL_PLAIN = [(a, b) for a in _DTYPES for b in _DTYPES if a != b]
PLAIN_PAIRS = by_level(LEVEL, core=_CORE_PLAIN, default=_ALL_PLAIN)
SHAPES = by_level(LEVEL, core=[(), (0, 5), (3, 5, 7), (129, 255)], default=[(1,), (4099,), (64, 1024)])
X = torch.zeros(4, 256)


def _pair_id(pair) -> str:
    return f'{str(pair[0])[6:]}-{str(pair[1])[6:]}'


def _sr_ref(x: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Integer bits of the reference's stochastic rounding of x (x's shape)."""
    return ref.stochastic_bf16_ref(x, seed) if dtype == BF16 else ref.stochastic_e4m3_ref(x, seed)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(_BITS[t.element_size()])


# ---------------------------------------------------------------- CPU tier: argument contract


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((X.double(), BF16), {}, TypeError, 'x must have dtype torch.float32 or .* or torch.float8_e5m2, got'),
        ((X.int(), BF16), {}, TypeError, 'x must have dtype'),
        (('x', BF16), {}, TypeError, 'x must be a'),
        ((X, 'bfloat16'), {}, TypeError, 'dtype must be a torch.dtype, got str'),
        ((X, torch.float64), {}, TypeError, 'dtype must be one of torch.float32 or .*, got torch.float64'),
        ((X, torch.float8_e4m3fnuz), {}, TypeError, 'dtype must be one of'),
        ((X.bfloat16(), F32, True), {}, ValueError, r'for a widening .*\(torch.bfloat16 -> torch.float32\)'),
        ((X, F32, True), {}, ValueError, 'not defined for a widening or same-width cast'),
        ((X.half(), BF16, True), {}, ValueError, 'not defined for a widening or same-width cast'),
        ((X, F16, True), {}, ValueError, r'not defined for this narrowing \(torch.float32 -> torch.float16\)'),
        ((X.half(), E4M3, True), {}, ValueError, 'not defined for this narrowing'),
        ((X, E5M2, True), {}, ValueError, 'not defined for this narrowing'),
        ((X, BF16, 1), {}, TypeError, 'stochastic_rounding must be a bool'),
        ((X, BF16, True), {'seed': -1}, ValueError, r'seed must be in \[0, 2\*\*32\), got -1'),
        ((X, BF16, True), {'seed': 2**32}, ValueError, r'seed must be in \[0, 2\*\*32\)'),
        ((X, BF16, True), {'seed': 1.0}, TypeError, 'seed must be an int'),
        ((X, BF16, True), {'seed': True}, TypeError, 'seed must be an int'),
        ((X, BF16), {'seed': 3}, ValueError, 'seed=3 is used only with stochastic_rounding=True'),
        ((X.t(), BF16), {}, ValueError, 'x must be contiguous'),
        ((X.view(-1)[1:], BF16), {}, ValueError, 'x .*16'),
        ((X, BF16), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, BF16, True), {'seed': 0}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, F32), {}, RuntimeError, "no kernels for 'cpu' tensors"),  # a copy, after the same checks
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_cast_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        cast(*args, **kwargs)


def test_cast_rejects_out_buffers():
    with pytest.raises(ValueError, match=r'out must have shape \(4, 256\), got \(4, 255\)'):
        cast(X, BF16, out=torch.empty(4, 255, dtype=BF16))
    with pytest.raises(TypeError, match='out must have dtype torch.bfloat16'):
        cast(X, BF16, out=torch.empty(4, 256, dtype=F16))
    with pytest.raises(ValueError, match='out must be contiguous'):
        cast(X, BF16, out=torch.empty(256, 4, dtype=BF16).t())
    with pytest.raises(ValueError, match='out must not alias the input x'):
        cast(X, F32, out=X)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        cast(X, BF16, True, seed=1, out=torch.empty(4, 256, dtype=BF16))


def test_cast_rejects_too_many_elements():
    """The int32 index limit, checked on fake tensors (nothing is allocated)."""
    with FakeTensorMode():
        big = torch.empty(2**31 - 2**18, dtype=torch.float8_e4m3fn)
        with pytest.raises(ValueError, match=r'at most 2147221503 elements \(int32 indices\)'):
            cast(big, BF16)


def test_cast_forms_and_fake_tensors(monkeypatch):
    """The torch.library forms (functional and out=) with their schemas; while torch traces, the fake kernels give
    the eager call's output; the checks run there too."""
    functional = torch.ops.cann_ops_tilelang.cast.default
    into = torch.ops.cann_ops_tilelang.cast_out.default
    assert str(functional._schema) == (
        'cann_ops_tilelang::cast(Tensor x, ScalarType dtype, bool stochastic_rounding, int? seed) -> Tensor'
    )
    assert 'Tensor(a!) out) -> ()' in str(into._schema)
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    with FakeTensorMode():
        x = torch.empty(3, 5, 7, dtype=F32)
        y = cast(x, E4M3, True)
        assert (y.shape, y.dtype) == ((3, 5, 7), E4M3)
        buffer = torch.empty(3, 5, 7, dtype=BF16)
        assert cast(x, BF16, out=buffer) is buffer
        with pytest.raises(ValueError, match='not defined for a widening'):
            cast(x.bfloat16(), F32, True)


def test_cast_fast_path_flow(monkeypatch):
    """CPU tensors taken as CUDA ones: a second plain cast launches without the full check; a seed without
    stochastic rounding still gets the contract's error after plain casts warmed the key (it once launched)."""
    op = cast.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, op)
    plans = fast_path.count_plans(monkeypatch, op)
    x = torch.randn(4, 256)
    for _ in range(3):
        cast(x, BF16)
    assert (len(plans), len(launches)) == (1, 3)
    with pytest.raises(ValueError, match='seed=3 is used only with stochastic_rounding=True'):
        cast(x, BF16, seed=3)
    for seed in (5, 6):
        cast(x, BF16, True, seed=seed)
    assert (len(plans), len(launches)) == (3, 5)


# ---------------------------------------------------------------- device tier: values


@pytest.mark.npu
@pytest.mark.parametrize('pair', PLAIN_PAIRS, ids=_pair_id)
def test_cast_plain_values(pair, device):
    """Plain casts bit for bit (NaN's payload aside) over shapes of every rank, empty ones and a scalar; out=."""
    src, dst = pair
    for shape in SHAPES:
        x = cast_inputs(math.prod(shape), src, device).reshape(shape)
        y = cast(x, dst)
        assert (y.shape, y.dtype, y.device) == (x.shape, dst, x.device)
        expected = nan_canonical(_bits(plain_cast_ref(x.cpu(), dst)), dst)
        assert_equal(nan_canonical(_bits(y), dst), expected)
        buffer = torch.full(shape, float('nan'), device=device).to(dst)
        assert cast(x, dst, out=buffer) is buffer
        assert_equal(nan_canonical(_bits(buffer), dst), expected)


@pytest.mark.npu
@pytest.mark.parametrize('pair', _SR_PAIRS, ids=_pair_id)
def test_cast_stochastic_values(pair, device):
    """Stochastic rounding bit for bit against the reference for a given seed (special values included, indices in
    x's flattened order), into a new tensor and into out=."""
    src, dst = pair
    for i, shape in enumerate(SHAPES):
        x = cast_inputs(math.prod(shape), src, device).reshape(shape)
        seed = 1000003 * (i + 1)
        y = cast(x, dst, True, seed=seed)
        assert (y.shape, y.dtype) == (x.shape, dst)
        assert_equal(_bits(y), _sr_ref(x.cpu(), dst, seed))
        buffer = torch.zeros(shape, device=device).to(dst)
        assert cast(x, dst, True, seed=seed, out=buffer) is buffer
        assert_equal(_bits(buffer), _bits(y))


@pytest.mark.npu
@pytest.mark.parametrize('pair', _SR_PAIRS, ids=_pair_id)
def test_cast_stochastic_is_unbiased(pair, device):
    """Values between two neighbours at fractions 1/16 .. 15/16 of the spacing, 4096 copies each: the share that
    rounds up is the fraction, and the mean is the value, each within 5 standard deviations."""
    src, dst = pair
    lo, spacing = (1.0, 2.0**-7) if dst == BF16 else (1.25, 2.0**-3)  # bf16 near 1; e4m3 between 1.25 and 1.375
    fractions = torch.arange(1, 16, dtype=torch.float64) / 16
    if dst == BF16:
        values = lo + fractions * spacing  # exact in fp32
    else:
        values = -(lo + fractions * spacing) if src == F32 else lo + fractions * spacing  # bf16 holds these too
    copies = 4096
    x = values.to(src).repeat_interleave(copies).to(device)
    assert torch.equal(x.cpu().double().abs()[::copies], lo + fractions * spacing)  # the inputs are exact
    y = cast(x, dst, True, seed=11).cpu().float().abs().double().reshape(15, copies)
    up = (y > lo).double().mean(dim=1)
    assert ((y == lo) | (y == lo + spacing)).all()  # only the two neighbours
    sigma = (fractions * (1 - fractions) / copies).sqrt()
    assert ((up - fractions).abs() <= 5 * sigma).all(), (up, fractions)
    mean = y.mean(dim=1)
    assert ((mean - (lo + fractions * spacing)).abs() <= 5 * sigma * spacing).all()


@pytest.mark.npu
@pytest.mark.parametrize('pair', _SR_PAIRS, ids=_pair_id)
def test_cast_stochastic_is_reproducible(pair, device):
    """The same seed gives the same bits; another seed other bits on about half the elements that can round
    either way; seed=None draws from torch's default generator, so torch.manual_seed reproduces a call."""
    src, dst = pair
    x = (torch.randn(8191) * 0.9).to(src).to(device)
    a = _bits(cast(x, dst, True, seed=42))
    assert_equal(_bits(cast(x, dst, True, seed=42)), a)
    b = _bits(cast(x, dst, True, seed=43))
    changed = (a != b).double().mean().item()
    assert 0.1 < changed < 0.9, changed
    torch.manual_seed(5)
    c = _bits(cast(x, dst, True))
    d = _bits(cast(x, dst, True))
    torch.manual_seed(5)
    assert_equal(_bits(cast(x, dst, True)), c)
    assert not torch.equal(c, d)  # the generator moved on
    torch.manual_seed(5)
    assert_equal(c, _sr_ref(x.cpu(), dst, int(torch.randint(2**32, (), dtype=torch.int64))))


@pytest.mark.npu
@pytest.mark.cuda_only  # the fast path exists for CUDA launchers only (their entries check the tensors)
def test_cast_fast_path_keeps_results_and_errors(device):
    """After a first call its launcher is remembered; later calls take it and give the same bits, and arguments
    the contract refuses still raise its typed errors there."""
    x = cast_inputs(5000, F32, device)
    first = _bits(cast(x, BF16, True, seed=3))
    assert (F32, BF16, True, x.get_device()) in cast.operator.fast
    assert_equal(_bits(cast(x, BF16, True, seed=3)), first)
    with pytest.raises(ValueError, match='x must be contiguous'):
        cast(x.view(50, 100).t(), BF16, True, seed=3)
    with pytest.raises(ValueError, match=r'seed must be in \[0, 2\*\*32\)'):
        cast(x, BF16, True, seed=2**40)
    with pytest.raises(TypeError, match='dtype must be a torch.dtype'):
        cast(x, [BF16])


@pytest.mark.npu
def test_cast_same_dtype_copies(device):
    x = cast_inputs(300, BF16, device)
    y = cast(x, BF16)
    assert y is not x
    assert y.data_ptr() != x.data_ptr()
    assert_equal(y, x)


@pytest.mark.npu
@pytest.mark.parametrize(('dtype', 'sr', 'seed'), [(BF16, True, 5), (E4M3, False, None)])
def test_cast_opcheck(device, dtype, sr, seed):
    """torch.library.opcheck of the functional form: schema (no input written), autograd registration, the fake
    kernel against the real one, AOTAutograd with dynamic shapes against eager (a fixed seed: the same bits;
    finite inputs: its comparison takes NaN for a difference)."""
    x = torch.randn(3, 100, device=device)
    utils = ['test_schema', 'test_autograd_registration', 'test_faketensor', 'test_aot_dispatch_dynamic']
    torch.library.opcheck(torch.ops.cann_ops_tilelang.cast.default, (x, dtype, sr, seed), test_utils=utils)


@pytest.mark.npu
def test_cast_under_torch_compile(device):
    """torch.compile (aot_eager: fake tensors and functionalisation, the forms as opaque ops) gives the eager
    bits, the seed passed through or drawn when the compiled function runs."""
    x = cast_inputs(1000, F32, device)

    def f(t):
        return cast(t, BF16, True, seed=9), cast(t, E4M3)

    compiled = torch.compile(f, backend='aot_eager', fullgraph=True)
    got, want = compiled(x), f(x)
    for g, w in zip(got, want, strict=True):
        assert_equal(_bits(g), _bits(w))
    g = torch.compile(lambda t: cast(t, BF16, True), backend='aot_eager', fullgraph=True)
    torch.manual_seed(1)
    first = _bits(g(x))
    torch.manual_seed(1)
    assert_equal(_bits(g(x)), first)


# ---------------------------------------------------------------- benchmarks

# The peer ships no tests: DeepSeek-V3's hidden size 7168 at 4096 and 8192 tokens, its two stochastic pairs.
BENCHMARK_PARAMS = generate_samples(
    num_tokens=[4096, 8192], hidden=[7168], pair=['float32-bfloat16', 'bfloat16-float8_e4m3fn'], sr=[False, True]
)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    src, dst = (getattr(torch, name) for name in params['pair'].split('-'))
    x = torch.randn(params['num_tokens'], params['hidden']).to(src).to(device)
    sr = params['sr']
    result = cast(x, dst, sr, seed=7 if sr else None)
    head = x.view(-1)[: 1 << 20].cpu()  # the first 2**20 elements: their bits depend on their indices only
    expected = _sr_ref(head, dst, 7) if sr else _bits(plain_cast_ref(head, dst))
    assert_equal(_bits(result.view(-1)[: 1 << 20]), expected)
    time_us = benchmark_timer(lambda: cast(x, dst, sr, seed=7 if sr else None, out=result))
    benchmark_record(
        kernel='quant.cast',
        operation='stochastic' if sr else 'cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, result) / time_us / 1e3,
        extras=config_extras(cast.operator.config(x, dst, sr)),
    )
