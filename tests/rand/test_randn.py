"""Tests of randn, randn_like and set_seed.

CPU tier: the Ascend 950 and CUDA kernels lower (one per dtype); the CUDA source leaves nvcc nothing to contract
and stores 16 bytes at a time; the argument contract (typed errors, CPU tensors refused without the emulator);
the CPU replay's own exactness (fma and sqrt against exact rationals); the generator's statistics on the replay
(moments, Kolmogorov-Smirnov, neighbour and stream independence, the accuracy of the transform), which hold for
the devices because they equal the replay bit for bit. Device tier (`npu`; `--ascend-emulator` runs the Ascend
kernels on the CPU, the CUDA kernels need a GPU): bit identity with the replay, seeds and streams, empty draws,
randn_like, the moments of a device draw, CUDA graph replays (CUDA only); the benchmark (`benchmark`).
"""

import importlib
import math
import re
from fractions import Fraction

import pytest
import torch

from cann_ops_tilelang import config
from cann_ops_tilelang.rand._counter_normal import GROUP_ELEMENTS, pairs_drawn, seed_keys
from cann_ops_tilelang.rand.randn import randn, randn_like, set_seed
from cann_ops_tilelang.rand.randn_kernel import MAX_NUMEL, choose_randn_config, get_randn_kernel, make_randn_kernel
from tests.testing.bench import make_param_id
from tests.testing.fast_path import record_launchers
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal
from tests.testing.timing import record_name

from .randn_ref import fma_f32, mix32_ref, randn_pairs_ref, randn_ref, sqrt_f32

# The module (the package's `randn` attribute is the function of the same name).
randn_module = importlib.import_module('cann_ops_tilelang.rand.randn')

KERNEL_NAME = 'randn_kernel'
LEVEL = get_test_level()
# Level 0: one compile per backend and the two dtypes of the issue; fp16 from level 1.
DTYPES = by_level(LEVEL, [torch.float32, torch.bfloat16], [torch.float16])
# Element counts: one element, a partial group, a group and one, several Ascend tiles with a tail (8192 fp32 or
# 16384 bf16 elements per tile; 2048 fp32 / 4096 bf16 per CUDA thread block).
SIZES = by_level(LEVEL, [1, 127, 129, 20000], [128, 4096, 65537], [1 << 20, 3 * (1 << 20) + 5])
BENCHMARK_SHAPES = ((4001, 4096), (8001, 7168), (32768, 7168))
PARAMS = generate_samples(dtype=DTYPES, numel=SIZES)
BENCHMARK_PARAMS = generate_samples(dtype=(torch.bfloat16, torch.float32), shape=BENCHMARK_SHAPES)
SEED = 20261203
STATS_SAMPLES = 1 << 20  # replay draws for the statistics (about a second on one CPU core)


def make_config(backend, dtype):
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_randn_config(backend=backend, dtype=dtype, num_cores=num_cores)


def offset_of(device) -> int:
    """The device's pair offset now (its state tensor made if need be)."""
    return int(randn_module._state(device)[0][1])


# CPU tier: lowering.


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_randn_ascend_kernel_lowers(dtype):
    cfg = make_config('ascend', dtype)
    assert_ascend_kernel_lowers(lambda: make_randn_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_randn_cuda_kernel_lowers(dtype):
    cfg = make_config('cuda', dtype)
    lowered = assert_cuda_kernel_lowers(lambda: make_randn_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    body = lowered.source[lowered.source.index('randn_kernel_kernel(') :]
    # Every float product, fma and root is an explicit round-to-nearest intrinsic, so nvcc fuses nothing: no
    # operator applies to a float literal, 19 fmas per pair (12 in the polynomials), one rounded root.
    assert re.search(r'[-+*/] \(?-?0x[0-9a-f.]+p[-+]?[0-9]+f', body) is None
    assert body.count('__fmaf_rn(') == 19
    assert body.count('__fsqrt_rn(') == 1
    assert 'sqrtf(' not in body
    vector = 'float4' if dtype == torch.float32 else 'uint4'
    assert body.count(f'*({vector}*)(out') == 2, 'one 16-byte store per half group'


# CPU tier: the contract (no emulator opt-in outside npu tests).


@pytest.mark.parametrize(
    ('size', 'error', 'match'),
    [
        ((2.0,), TypeError, 'size must be ints'),
        ((True,), TypeError, 'size must be ints'),
        (((3, 'a'),), TypeError, 'size must be ints'),
        ((3, -1), ValueError, 'must not be negative'),
        ((2**31,), ValueError, f'at most {MAX_NUMEL} elements'),
    ],
    ids=['float', 'bool', 'str-in-tuple', 'negative', 'too-large'],
)
def test_randn_rejects_size(size, error, match):
    with pytest.raises(error, match=match):
        randn(*size, device='cpu')


@pytest.mark.parametrize('dtype', [torch.float64, torch.int32, torch.float8_e4m3fn, 'float32'], ids=str)
def test_randn_rejects_dtype(dtype):
    with pytest.raises(TypeError, match='dtype must be'):
        randn(4, dtype=dtype, device='cpu')


def test_randn_rejects_device_type():
    with pytest.raises(TypeError, match='device must be a str or torch.device'):
        randn(4, device=0)


@pytest.mark.parametrize('size', [(4, 8), (0,)])
def test_randn_refuses_cpu_without_emulator(size):
    # No CPU fallback, not even for an empty draw.
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        randn(*size, device='cpu')
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        randn_like(torch.zeros(size))


def test_randn_makes_one_launcher_per_device_and_dtype(monkeypatch):
    """Through the one launcher cache (operator.Launchers): a launcher per (device, dtype), its configuration of the
    device's backend (require_accelerator, the device guard, when it is made) and core count."""
    made, launched = record_launchers(monkeypatch, randn_module._KERNEL)
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    monkeypatch.setattr(randn_module, 'require_accelerator', lambda *tensors: 'cuda')
    monkeypatch.setattr(randn_module, '_states', {})
    monkeypatch.setattr(randn_module, '_seed', SEED)
    for dtype in (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16):
        randn(128, dtype=dtype, device='cpu')
    cpu = torch.device('cpu')
    assert made == [(get_randn_kernel, make_config('cuda', dtype), cpu) for dtype in (torch.float32, torch.bfloat16)]
    assert len(launched) == 4


def test_randn_like_rejects_non_tensor():
    with pytest.raises(TypeError, match='input must be a torch.Tensor, got list'):
        randn_like([1.0])


@pytest.mark.parametrize(
    ('seed', 'error'),
    [(1.5, TypeError), (True, TypeError), ('1', TypeError), (2**64, ValueError), (-(2**63) - 1, ValueError)],
)
def test_set_seed_rejects(seed, error):
    with pytest.raises(error, match='seed must be'):
        set_seed(seed)


def test_set_seed_seeds_torch():
    set_seed(SEED)
    assert torch.initial_seed() == SEED


# CPU tier: the replay's exactness, then the generator's statistics on it.


def test_fma_and_sqrt_replays_are_correctly_rounded():
    """Against exact rationals: the fp32 neighbours of the result are no closer to the exact value."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(2000, generator=gen), torch.randn(2000, generator=gen)
    c = torch.randn(2000, generator=gen) * 1e-6
    c[::2] = -(a[::2].double() * b[::2].double()).float()  # cancellation: the error term decides
    fused, root = fma_f32(a, b, c), sqrt_f32(a.abs())
    for i in range(0, 2000, 5):
        cases = (
            (fused[i], Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))),
            (root[i], None),
        )
        for got, exact in cases:
            value = float(got)
            below = float(torch.nextafter(got, torch.tensor(-math.inf)))
            above = float(torch.nextafter(got, torch.tensor(math.inf)))
            if exact is None:  # sqrt: compare squares, exactly
                exact_sq = Fraction(float(a[i].abs()))
                dist = [abs(Fraction(v) ** 2 - exact_sq) for v in (below, value, above)]
                assert dist[1] <= min(dist[0], dist[2]) or Fraction(value) ** 2 == exact_sq, i
            else:
                dist = [abs(Fraction(v) - exact) for v in (below, value, above)]
                assert dist[1] <= min(dist[0], dist[2]), i


def test_mix_avalanche():
    """Each input bit of the 32-bit mix flips each output bit with probability 1/2 (5 sigma of 2**14 samples)."""
    x = torch.randint(0, 2**32, (1 << 14,), generator=torch.Generator().manual_seed(2), dtype=torch.int64)
    h = mix32_ref(x)
    shifts = torch.arange(32, dtype=torch.int64)
    bound = 5 * 0.5 / math.sqrt(x.numel())
    for bit in range(32):
        flipped = (h ^ mix32_ref(x ^ (1 << bit))).unsqueeze(1) >> shifts & 1
        assert (flipped.double().mean(0) - 0.5).abs().max() < bound, bit


@pytest.fixture(scope='module')
def replay_sample():
    k0, k1 = seed_keys(SEED)
    return randn_ref(STATS_SAMPLES, k0, k1).double()


def normal_cdf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.special.erfc(-x / math.sqrt(2.0))


def assert_standard_normal(x: torch.Tensor) -> None:
    """Mean, variance, skewness and excess kurtosis within 5 standard errors of a normal sample of this size;
    the Kolmogorov-Smirnov distance below its 0.1 % critical value (1.95 / sqrt(n))."""
    n = x.numel()
    mean, var = float(x.mean()), float(x.var())
    centred = x - mean
    skew = float((centred**3).mean()) / var**1.5
    kurt = float((centred**4).mean()) / var**2 - 3.0
    for name, value, std_err in (
        ('mean', mean, 1 / math.sqrt(n)),
        ('variance', var - 1.0, math.sqrt(2 / n)),
        ('skewness', skew, math.sqrt(6 / n)),
        ('excess kurtosis', kurt, math.sqrt(24 / n)),
    ):
        assert abs(value) < 5 * std_err, f'{name} {value} beyond 5 x {std_err}'
    ordered = x.sort().values
    cdf = normal_cdf(ordered)
    rank = torch.arange(1, n + 1, dtype=torch.float64)
    distance = max(float((rank / n - cdf).max()), float((cdf - (rank - 1) / n).max()))
    assert distance < 1.95 / math.sqrt(n), f'Kolmogorov-Smirnov distance {distance}'


def test_replay_is_standard_normal(replay_sample):
    assert_standard_normal(replay_sample)
    # The cosine and the sine halves separately (each its own sample).
    groups = replay_sample.view(-1, GROUP_ELEMENTS)
    assert_standard_normal(groups[:, : GROUP_ELEMENTS // 2].reshape(-1))
    assert_standard_normal(groups[:, GROUP_ELEMENTS // 2 :].reshape(-1))


def test_replay_tails(replay_sample):
    """Tail frequencies beyond 2, 3 and 4 sigma within 5 binomial standard errors."""
    n = replay_sample.numel()
    for k in (2.0, 3.0, 4.0):
        p = float(torch.special.erfc(torch.tensor(k / math.sqrt(2.0), dtype=torch.float64)))
        count = int((replay_sample.abs() > k).sum())
        assert abs(count - n * p) < 5 * math.sqrt(n * p * (1 - p)) + 1, (k, count, n * p)


@pytest.mark.parametrize('lag', [1, 2, 63, 64, 65, 127, 128])
def test_replay_neighbours_uncorrelated(replay_sample, lag):
    """Lag-k correlation within 5 / sqrt(n); lag 64 pairs r cos with r sin of the same pair (uncorrelated, but
    dependent through r: their squares are correlated, which Box-Muller's independence forbids)."""
    x = replay_sample
    n = x.numel() - lag
    bound = 5 / math.sqrt(n)
    assert abs(float((x[lag:] * x[:-lag]).mean())) < bound
    squares = x * x - 1.0
    assert abs(float((squares[lag:] * squares[:-lag]).mean())) / 2.0 < bound


def test_replay_streams_independent():
    """Successive calls (offsets), other seeds and the crossing of a 2**32-pair boundary give uncorrelated
    streams; the same (seed, offset) gives the same numbers."""
    k0, k1 = seed_keys(SEED)
    n = 1 << 18
    base = randn_ref(n, k0, k1, 0).double()
    others = [
        randn_ref(n, k0, k1, pairs_drawn(n)).double(),
        randn_ref(n, *seed_keys(SEED + 1), 0).double(),
        randn_ref(n, k0, k1, 2**32 - n // 4).double(),  # its pairs cross into the next high word
    ]
    bound = 5 / math.sqrt(n)
    for other in others:
        assert abs(float((base * other).mean())) < bound
        assert_standard_normal(other)
    assert_equal(randn_ref(n, k0, k1, 0), base.float())


def test_replay_transform_accuracy():
    """The polynomials' Box-Muller against float64 math on the same bits: |error| <= 4e-6 + 2e-6 |z| (a few
    fp32 ulps of the result)."""
    k0, k1 = seed_keys(SEED)
    cos, sin = randn_pairs_ref(k0, k1, 0, 1 << 16)
    counter = torch.arange(1 << 16, dtype=torch.int64)
    h1 = mix32_ref(counter ^ mix32_ref(torch.zeros_like(counter) ^ k0))
    h2 = mix32_ref(h1 ^ k1)
    u1 = ((h1 >> 8).double() + ((((h1 & 0xFF) << 8) | (h2 & 0xFF)).double() + 0.5) * 2.0**-16) * 2.0**-24
    angle = (((h2 >> 8) & 0x3FFFFF).double() - 2**21 + 0.5) * (float.fromhex('0x1.921fb6p-22'))
    theta = angle + (h2 >> 30).double() * (math.pi / 2)
    r = torch.sqrt(-2.0 * torch.log(u1))
    for got, exact in ((cos, r * torch.cos(theta)), (sin, r * torch.sin(theta))):
        error = (got.double() - exact).abs()
        assert bool((error <= 4e-6 + 2e-6 * exact.abs()).all()), float(error.max())


# Device tier.


def draw(numel, dtype, device):
    return randn(numel, dtype=dtype, device=device)


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_randn_equals_replay(params, device):
    """Bit identity with the CPU replay (the lead's H200 run checks the CUDA kernel with this test)."""
    numel, dtype = params['numel'], params['dtype']
    set_seed(SEED)
    k0, k1 = seed_keys(SEED)
    first = draw(numel, dtype, device)
    assert (first.shape, first.dtype, first.device, first.is_contiguous()) == ((numel,), dtype, device, True)
    assert_equal(first.cpu(), randn_ref(numel, k0, k1, 0, dtype))
    second = draw(numel, dtype, device)  # the next call continues the stream
    assert_equal(second.cpu(), randn_ref(numel, k0, k1, pairs_drawn(numel), dtype))
    assert offset_of(device) == 2 * pairs_drawn(numel)


@pytest.mark.npu
def test_randn_offset_crosses_high_word(device):
    """A draw whose pair counters cross 2**32 (the per-lane key select) equals the replay."""
    set_seed(SEED)
    k0, k1 = seed_keys(SEED)
    start = 2**32 - 3 * 64
    randn_module._state(device)[0][1].fill_(start)
    out = draw(1000, torch.float32, device)
    assert_equal(out.cpu(), randn_ref(1000, k0, k1, start))


@pytest.mark.npu
def test_randn_seeds_and_shapes(device):
    set_seed(SEED)
    a = randn(2, 3, 64, device=device, dtype=torch.float32)
    b = randn((2, 3, 64), device=device, dtype=torch.float32)
    set_seed(SEED)
    a_again = randn([2, 3, 64], device=device, dtype=torch.float32)
    assert a.shape == (2, 3, 64)
    assert_equal(a_again, a)
    assert not torch.equal(a, b)
    set_seed(SEED)
    whole = randn(384, device=device, dtype=torch.float32)  # whole groups concatenate
    assert_equal(torch.cat((a.view(-1), b.view(-1)))[:384], whole)
    set_seed(SEED + 1)
    assert not torch.equal(randn(384, device=device, dtype=torch.float32), whole)


@pytest.mark.npu
def test_randn_default_dtype_and_device(device):
    out = randn(5)
    assert (out.dtype, out.device) == (torch.get_default_dtype(), device)


@pytest.mark.npu
@pytest.mark.parametrize('shape', [(0,), (0, 7), (3, 0, 5)])
def test_randn_empty(shape, device):
    before = offset_of(device)
    out = randn(shape, dtype=torch.bfloat16, device=device)
    assert (out.shape, out.dtype, out.device) == (shape, torch.bfloat16, device)
    assert offset_of(device) == before  # nothing launched, nothing drawn


@pytest.mark.npu
def test_randn_like(device):
    template = torch.empty(3, 129, dtype=torch.bfloat16, device=device).t()  # a view: the result is contiguous
    set_seed(SEED)
    out = randn_like(template)
    assert (out.shape, out.dtype, out.device, out.is_contiguous()) == (template.shape, torch.bfloat16, device, True)
    set_seed(SEED)
    assert_equal(out, randn(template.shape, dtype=torch.bfloat16, device=device))


@pytest.mark.npu
def test_randn_device_draw_is_standard_normal(device):
    set_seed(SEED)
    assert_standard_normal(randn(1 << 16, dtype=torch.float32, device=device).cpu().double())


@pytest.mark.npu
@pytest.mark.cuda_only
def test_randn_cuda_graph_replays_draw_fresh_numbers(device):
    """Captured once, replayed twice: each replay continues the stream (the state is read on the device)."""
    if device.type != 'cuda':
        pytest.skip('CUDA graphs need a CUDA device')
    set_seed(SEED)
    k0, k1 = seed_keys(SEED)
    numel = 4096
    randn(numel, dtype=torch.float32, device=device)  # compiles, makes the state; offset now pairs_drawn(numel)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = randn(numel, dtype=torch.float32, device=device)
    draws = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        draws.append(out.cpu())
    step = pairs_drawn(numel)
    # Capture records without running: the replays draw at offsets 1 and 2 steps in.
    for i, values in enumerate(draws):
        assert_equal(values, randn_ref(numel, k0, k1, (i + 1) * step))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_randn_benchmark(params, device, benchmark_timer, benchmark_record):
    shape, dtype = params['shape'], params['dtype']
    randn(shape, dtype=dtype, device=device)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: randn(shape, dtype=dtype, device=device))
    written = math.prod(shape) * dtype.itemsize
    benchmark_record(
        kernel=record_name('rand', 'randn'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=written / time_us / 1e3,
    )
