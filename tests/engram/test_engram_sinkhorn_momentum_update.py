"""engram_sinkhorn_momentum_update: lowering (CPU tier), argument contract (CPU tier), values and benchmark (device)."""

from __future__ import annotations

import inspect

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang.config import get_num_cores
from cann_ops_tilelang.engram.engram_sinkhorn_momentum_update_kernel import (
    choose_engram_sinkhorn_momentum_update_config,
    cuda_wide_block_max_numel,
    make_engram_sinkhorn_momentum_update_kernel,
)
from tests.engram.engram_sinkhorn_momentum_update_ref import (
    engram_sinkhorn_momentum_update_oracle,
    engram_sinkhorn_momentum_update_ref,
)
from tests.testing.bench import config_extras, make_param_id
from tests.testing.contract import assert_rejects_non_tensor_and_dtype
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes

KERNEL_NAME = 'engram_sinkhorn_momentum_update_kernel'
U32 = 2.0**-24  # unit roundoff of fp32
U16 = 2.0**-8  # unit roundoff of bf16
TINY = 2.0**-126  # smallest normal fp32: room for a flushed subnormal
DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}
PAIRINGS = [(g, m) for g in (torch.bfloat16, torch.float32) for m in (torch.bfloat16, torch.float32)]


def gen_numel(level: int) -> list[int]:
    """Element counts: empty, one, a tail of every tile (4173), whole tiles, multiples of 256 and not."""
    core = [0, 1, 4173, 65536]
    default = [255, 3 * 8192 + 1, 2**20]
    full = [2**24 + 1, 2**27]
    return list(dict.fromkeys(core + (default if level >= 1 else []) + (full if level >= 2 else [])))


def gen_pairings(level: int) -> list[tuple[torch.dtype, torch.dtype]]:
    """(grad dtype, momentum dtype); all four pairings at every level (they are distinct kernels)."""
    return PAIRINGS


LEVEL = get_test_level()
VALUE_PARAMS = generate_samples(LEVEL, numel=gen_numel, dtypes=gen_pairings, nesterov=[True, False])
# The kernels depend on the dtypes and nesterov (and on CUDA on the block shape that numel picks; numel itself
# is a runtime size): level 0 lowers the two extreme pairings, level 1 and up all eight variants.
LOWER_PARAMS = generate_samples(
    dtypes=PAIRINGS if LEVEL >= 1 else [PAIRINGS[0], PAIRINGS[3]],
    nesterov=[True, False] if LEVEL >= 1 else [True],
)
# The reference library's tests span numel 256K .. 512M; 2**18 (wide CUDA blocks), 2**20, 2**24 and 2**27
# cover it at sane memory.
BENCHMARK_PARAMS = generate_samples(numel=[2**18, 2**20, 2**24, 2**27], dtypes=PAIRINGS, nesterov=[True])


def _cfg(backend: str, params: dict, num_cores: int, numel: int = 1):
    g, m = params['dtypes']
    return choose_engram_sinkhorn_momentum_update_config(
        backend=backend,
        grad_dtype=DTYPE_NAMES[g],
        momentum_dtype=DTYPE_NAMES[m],
        nesterov=params['nesterov'],
        num_cores=num_cores,
        numel=numel,
    )


def _inputs(numel: int, dtypes, device) -> tuple[torch.Tensor, torch.Tensor]:
    g_dtype, m_dtype = dtypes
    grad = torch.randn(numel, device=device).to(g_dtype)
    momentum = (0.5 * torch.randn(numel, device=device)).to(m_dtype)
    return grad, momentum


def _poison_allocator(numel: int, device) -> None:
    """Hand a NaN-filled block of the result's size back to the caching allocator, so that the result the
    operator allocates next most likely starts as NaN: an element the kernel skips then fails the test
    instead of showing a stale value of an earlier call."""
    torch.full((numel,), float('nan'), dtype=torch.float32, device=device)


def _assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    err = (actual.double() - expected).abs()
    bad = ~(err <= bound)  # NaN fails too
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise AssertionError(
            f'{what}: {int(bad.sum())} of {actual.numel()} elements off; first at {i}: '
            f'{actual[i].item()!r} vs {expected[i].item()!r}, bound {bound[i].item():.3g}'
        )


def _check_result(grad, m_before, m_after, out, beta1, nesterov) -> None:
    """The kernels' error bounds against the fp64 oracle (module ref):

    m' = fl(beta1 * m + s) is one rounding of an exact value x: |m' - x| <= 2**-24 |x|. The bf16 buffer
    rounds m' once more: within 2**-8 |m'|. The lookahead fl(beta1 * m' + s) with m' off by at most
    2**-24 |x| is within 2**-24 (|beta1| |x| + |n|) of n = beta1 * x + s (fp64)."""
    oracle = engram_sinkhorn_momentum_update_oracle(grad, m_before, beta1)
    x, n = oracle.momentum, oracle.lookahead
    if m_after.dtype == torch.float32:
        _assert_within(m_after, x, U32 * x.abs() + TINY, 'momentum_buffer (fp32)')
    else:
        _assert_within(m_after, x, (U16 + 2 * U32) * x.abs() + TINY, 'momentum_buffer (bf16)')
    if nesterov:
        bound = U32 * (1 + 2.0**-20) * (abs(oracle.beta1) * x.abs() + n.abs()) + TINY
        _assert_within(out, n, bound, 'sinkhorn_input (nesterov)')
    else:
        _assert_within(out, x, U32 * x.abs() + TINY, 'sinkhorn_input (momentum)')
        # Without the lookahead the output is m' itself; the buffer holds it rounded to its dtype (RNE).
        assert_equal(m_after, out.to(m_after.dtype))


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', LOWER_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_momentum_update_ascend_lowers(params):
    cfg = _cfg('ascend', params, ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.nesterov, cfg.num_cores) == ('ascend', params['nesterov'], ASCEND_950_VECTOR_CORES)
    assert cfg.block % 64 == 0
    lowered = assert_ascend_kernel_lowers(
        lambda: make_engram_sinkhorn_momentum_update_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'numel' in lowered.source  # the element count stays a runtime argument


@pytest.mark.parametrize('params', LOWER_PARAMS, ids=make_param_id)
@pytest.mark.parametrize('blocks', ['wide', 'streaming'])
def test_engram_sinkhorn_momentum_update_cuda_lowers(params, blocks):
    wide_max = cuda_wide_block_max_numel(H200_SMS)
    cfg = _cfg('cuda', params, H200_SMS, numel=wide_max if blocks == 'wide' else wide_max + 1)
    assert (cfg.backend, cfg.nesterov) == ('cuda', params['nesterov'])
    lowered = assert_cuda_kernel_lowers(
        lambda: make_engram_sinkhorn_momentum_update_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'numel' in lowered.source
    # Full blocks move 4-element vectors (16-byte fp32, 8-byte bf16), one per thread and warp-contiguous;
    # the lookahead and the momentum are single-rounding FMAs.
    assert 'float4' in lowered.source
    assert '__fmaf_rn' in lowered.source
    if torch.bfloat16 in params['dtypes']:
        assert 'uint2' in lowered.source  # 4 bf16 elements per access
    assert 'uint4' not in lowered.source


def test_engram_sinkhorn_momentum_update_config_is_pure_and_hashable():
    params = {'dtypes': (torch.bfloat16, torch.float32), 'nesterov': True}
    a, b = _cfg('ascend', params, 64), _cfg('ascend', params, 64)
    assert a == b
    assert hash(a) == hash(b)
    assert a != _cfg('cuda', params, 132)
    with pytest.raises(ValueError, match='backend'):
        _cfg('cpu', params, 64)
    with pytest.raises(ValueError, match='dtypes'):
        choose_engram_sinkhorn_momentum_update_config(
            backend='cuda', grad_dtype='float16', momentum_dtype='float32', nesterov=True, num_cores=132, numel=1
        )


def test_engram_sinkhorn_momentum_update_block_shape_follows_numel():
    """CUDA: wide blocks up to two of them per SM, streaming blocks beyond; Ascend: one kernel for any numel."""
    params = {'dtypes': (torch.bfloat16, torch.float32), 'nesterov': True}
    for sms in (H200_SMS, 16):
        wide_max = cuda_wide_block_max_numel(sms)
        assert wide_max == 2 * sms * _cfg('cuda', params, sms, numel=1).block
        wide, streaming = _cfg('cuda', params, sms, numel=wide_max), _cfg('cuda', params, sms, numel=wide_max + 1)
        assert wide.block > streaming.block
        assert wide.threads > streaming.threads
        assert _cfg('cuda', params, sms, numel=0) == wide
        assert _cfg('cuda', params, sms, numel=2**31 - 2**20) == streaming
    ascend = _cfg('ascend', params, ASCEND_950_VECTOR_CORES, numel=1)
    assert _cfg('ascend', params, ASCEND_950_VECTOR_CORES, numel=2**30) == ascend


def test_engram_sinkhorn_momentum_update_signature_matches_tile_kernels():
    """Same parameter names, order and defaults as tile_kernels.engram (TileKernels 2.1.0)."""
    sig = inspect.signature(cann_ops_tilelang.engram_sinkhorn_momentum_update)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ('grad', inspect.Parameter.empty),
        ('momentum_buffer', inspect.Parameter.empty),
        ('beta1', inspect.Parameter.empty),
        ('nesterov', True),
    ]


# ---------------------------------------------------------------- CPU tier: argument contract


def _call(grad, momentum, beta1=0.9, nesterov=True):
    return cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, momentum, beta1, nesterov)


@pytest.mark.parametrize('index', range(2), ids=['grad', 'momentum_buffer'])
def test_engram_sinkhorn_momentum_update_rejects_non_tensors_and_dtypes(index):
    args = list(_inputs(512, (torch.float32, torch.bfloat16), 'cpu'))
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=('grad', 'momentum_buffer')[index],
        dtype=torch.bfloat16,  # the message lists bf16 first: 'must have dtype torch.bfloat16 or torch.float32'
        non_tensors=(args[index].tolist(), None),
        wrong_dtype=torch.float16,
    )


def test_engram_sinkhorn_momentum_update_rejects_scalars():
    grad, momentum = _inputs(512, (torch.float32, torch.float32), 'cpu')
    for bad in ('0.9', None, True, torch.tensor(0.9)):
        with pytest.raises(TypeError, match='beta1 must be a float'):
            _call(grad, momentum, bad)
    for bad in (float('nan'), float('inf'), -float('inf')):
        with pytest.raises(ValueError, match='beta1 must be a finite number'):
            _call(grad, momentum, bad)
    for bad in (1, None, 'yes'):
        with pytest.raises(TypeError, match='nesterov must be a bool'):
            _call(grad, momentum, 0.9, bad)


def test_engram_sinkhorn_momentum_update_rejects_shapes():
    grad, momentum = _inputs(512, (torch.float32, torch.float32), 'cpu')
    with pytest.raises(ValueError, match=r'momentum_buffer must have shape \(512,\)'):
        _call(grad, momentum[:256])
    with pytest.raises(ValueError, match=r'momentum_buffer must have shape \(512,\)'):
        _call(grad, momentum.view(2, 256))
    # Any shape is accepted when both agree: the device check comes next.
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(grad.view(2, 256), momentum.view(2, 256))


@pytest.mark.parametrize('index', range(2), ids=['grad', 'momentum_buffer'])
def test_engram_sinkhorn_momentum_update_rejects_layouts(index):
    name = ('grad', 'momentum_buffer')[index]
    args = list(_inputs(512, (torch.bfloat16, torch.float32), 'cpu'))
    bad = list(args)
    bad[index] = torch.zeros(1024, dtype=args[index].dtype)[::2]  # every other element: not contiguous
    with pytest.raises(ValueError, match=f'{name} must be contiguous'):
        _call(*bad)
    bad[index] = torch.zeros(513, dtype=args[index].dtype)[1:]  # contiguous, one element off
    with pytest.raises(ValueError, match=f'{name} must start at a 16-byte aligned address'):
        _call(*bad)


def test_engram_sinkhorn_momentum_update_rejects_aliasing():
    grad, _ = _inputs(512, (torch.float32, torch.float32), 'cpu')
    with pytest.raises(ValueError, match='momentum_buffer .updated in place. must not alias the input grad'):
        _call(grad, grad)
    storage = torch.zeros(1024)
    with pytest.raises(ValueError, match='momentum_buffer .updated in place. must not alias the input grad'):
        _call(storage[:512], storage[256:768])
    both = storage.view(torch.bfloat16)  # 2048 bf16: a bf16 grad over the first half of the fp32 storage
    with pytest.raises(ValueError, match='must not alias'):
        _call(both[:512], storage[:512])
    # Adjacent halves of one buffer do not overlap: they pass to the device check.
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(storage[:512], storage[512:])


def test_engram_sinkhorn_momentum_update_rejects_devices_and_sizes():
    grad, momentum = _inputs(512, (torch.float32, torch.float32), 'cpu')
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(grad, momentum)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(grad[:0], momentum[:0])  # empty inputs are still validated first
    with pytest.raises(RuntimeError, match='one device'):
        _call(grad, momentum.to('meta'))
    huge = torch.empty(2**31, dtype=torch.bfloat16, device='meta')
    with pytest.raises(ValueError, match='numel must be at most'):
        _call(huge, huge.clone())


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_momentum_update_values(params, device):
    numel, nesterov = params['numel'], params['nesterov']
    grad, momentum = _inputs(numel, params['dtypes'], device)
    grad_before, m_before = grad.clone(), momentum.clone()
    beta1 = 0.9

    _poison_allocator(numel, device)
    out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, momentum, beta1, nesterov)

    assert out.dtype == torch.float32
    assert out.shape == (numel,)
    assert out.device == grad.device
    assert momentum.dtype == params['dtypes'][1]  # updated in place, in its own dtype
    assert torch.equal(grad, grad_before)
    _check_result(grad, m_before, momentum, out, beta1, nesterov)


@pytest.mark.npu
@pytest.mark.parametrize('dtypes', PAIRINGS, ids=lambda d: f'{d[0]}-{d[1]}')
def test_engram_sinkhorn_momentum_update_matches_torch_reference(dtypes, device):
    """Against the reference library's fp32 torch formula, which rounds every product and sum separately:
    with S = |beta1 m| + |(1 - beta1) g|, torch's m' is within 2u S of the exact value and ours within u S,
    torch's lookahead within (4 beta1 + 2) u S and ours within (2 beta1 + 1) u S (u = 2**-24)."""
    grad, momentum = _inputs(3 * 8192 + 5, dtypes, device)
    beta1 = 0.95
    for nesterov in (True, False):
        m = momentum.clone()
        ref_out, ref_m = engram_sinkhorn_momentum_update_ref(grad, m, beta1, nesterov)
        out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, m, beta1, nesterov)
        g64, m64 = grad.double(), momentum.double()
        scale = beta1 * m64.abs() + (1 - beta1) * g64.abs()
        bound = 8 * U32 * (1 + beta1) * scale + TINY
        _assert_within(out, ref_out.double(), bound, f'sinkhorn_input vs torch (nesterov={nesterov})')
        m_bound = (U16 if dtypes[1] == torch.bfloat16 else 0.0) * 2 * ref_m.double().abs() + 4 * U32 * scale + TINY
        _assert_within(m, ref_m.double(), m_bound, f'momentum_buffer vs torch (nesterov={nesterov})')


@pytest.mark.npu
@pytest.mark.parametrize('dtypes', PAIRINGS, ids=lambda d: f'{d[0]}-{d[1]}')
def test_engram_sinkhorn_momentum_update_exact_cases(dtypes, device):
    """beta1 = 0: s = g exactly, so m' = g and the lookahead is g (bit-exact, rounded to each dtype);
    beta1 = 1: s = 0, so m' = m and the lookahead is m (bit-exact)."""
    grad, momentum = _inputs(8192 + 100, dtypes, device)
    for nesterov in (True, False):
        m = momentum.clone()
        out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, m, 0.0, nesterov)
        assert_equal(out, grad.float())
        assert_equal(m, grad.to(m.dtype))
        m = momentum.clone()
        out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, m, 1.0, nesterov)
        assert_equal(out, momentum.float())
        assert_equal(m, momentum)


@pytest.mark.npu
@pytest.mark.parametrize('numel', [1, 255, 4173, 8192 + 64 + 3, 'past_wide_blocks'], ids=lambda n: f'numel={n}')
def test_engram_sinkhorn_momentum_update_writes_only_its_elements(numel, device):
    """Views into larger buffers (tails of every size): the guard regions around them stay untouched, and
    repeated calls on the same inputs are bit-identical. 'past_wide_blocks': the smallest numel with a tail
    that takes the CUDA kernel's streaming blocks on this device (the others take its wide blocks)."""
    if numel == 'past_wide_blocks':
        numel = cuda_wide_block_max_numel(get_num_cores(device)) + 5
    pad = 4096
    g_big = torch.randn(numel + 2 * pad, device=device).to(torch.bfloat16)
    m_big = torch.randn(numel + 2 * pad, device=device)
    grad, momentum = g_big[pad : pad + numel], m_big[pad : pad + numel]
    g_before, m_big_before = g_big.clone(), m_big.clone()
    out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, momentum, 0.9, True)
    assert torch.equal(g_big, g_before)
    assert torch.equal(m_big[:pad], m_big_before[:pad])
    assert torch.equal(m_big[pad + numel :], m_big_before[pad + numel :])
    _check_result(grad, m_big_before[pad : pad + numel], momentum, out, 0.9, True)
    momentum.copy_(m_big_before[pad : pad + numel])
    again = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, momentum, 0.9, True)
    assert_equal(again, out)


@pytest.mark.npu
def test_engram_sinkhorn_momentum_update_any_shape(device):
    """A 2-D (rows, head_dim) call is the call on the flattened tensors (the update is elementwise), its result
    in the buffer's shape; numel 3 * 257 is no multiple of 256."""
    grad, momentum = _inputs(3 * 257, (torch.bfloat16, torch.float32), device)
    flat_momentum = momentum.clone()
    expected = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, flat_momentum, 0.9)
    out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad.view(3, 257), momentum.view(3, 257), 0.9)
    assert out.shape == (3, 257)
    assert_equal(out.view(-1), expected)
    assert_equal(momentum, flat_momentum)


@pytest.mark.npu
def test_engram_sinkhorn_momentum_update_empty(device):
    grad, momentum = _inputs(0, (torch.float32, torch.bfloat16), device)
    out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, momentum, 0.9)
    assert out.shape == (0,)
    assert out.dtype == torch.float32
    assert out.device == grad.device


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_engram_sinkhorn_momentum_update_benchmark(params, device, benchmark_timer, benchmark_record):
    grad, momentum = _inputs(params['numel'], params['dtypes'], device)
    beta1, nesterov = 0.9, params['nesterov']
    m_before = momentum.clone()
    out = cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, momentum, beta1, nesterov)
    _check_result(grad, m_before, momentum, out, beta1, nesterov)
    del m_before

    # Every call updates the buffer again; the traffic per call is the same.
    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_sinkhorn_momentum_update(grad, momentum, beta1))
    # Read grad and the buffer, write the buffer and sinkhorn_input.
    num_bytes = count_bytes(grad, momentum, momentum, out)
    benchmark_record(
        kernel='engram_sinkhorn_momentum_update',
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=num_bytes / time_us / 1e3,
        extras=config_extras(
            cann_ops_tilelang.engram_sinkhorn_momentum_update.operator.config(grad, momentum, beta1, nesterov)
        ),
    )
