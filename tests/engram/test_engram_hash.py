"""engram_hash: lowering (CPU tier), argument contract and reference (CPU tier), values and benchmark (device)."""

from __future__ import annotations

import inspect

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang import config as ops_config
from cann_ops_tilelang import operator as ops_operator
from cann_ops_tilelang.engram.engram_hash_kernel import choose_engram_hash_config, make_engram_hash_kernel
from tests.engram.engram_hash_ref import engram_hash_ref
from tests.engram.lowering_grids import gen_hash_configs
from tests.testing.bench import config_extras, make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import BENCHMARK_NUM_TOKENS, gen_num_tokens, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes

KERNEL_NAME = 'engram_hash_kernel'
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


LEVEL = get_test_level()
CONFIGS = gen_hash_configs(LEVEL)
VALUE_PARAMS = [
    {**cfg, 'num_tokens': t} for cfg in CONFIGS for t in gen_num_tokens(LEVEL) if cfg['num_layers'] <= 4 or t <= 1000
]
BENCHMARK_PARAMS = generate_samples(num_tokens=BENCHMARK_NUM_TOKENS, num_layers=[2], max_ngram=[3], num_tables=[8])
OP = cann_ops_tilelang.engram_hash.operator
engram_hash_config = OP.config  # the configuration a call launches (checked alike, no launch)


def _inputs(num_tokens: int, num_layers: int, max_ngram: int, num_tables: int, device, *, small_vocab: bool = False):
    """Token ids >= 0; multipliers over the whole int64 range (products wrap); vocab sizes > 0;
    offsets over the whole int32 range (the final int32 sum wraps too)."""
    ids = torch.randint(0, INT32_MAX, (num_tokens, max_ngram), dtype=torch.int32)
    mult = torch.randint(INT64_MIN, INT64_MAX, (num_layers, max_ngram), dtype=torch.int64)
    high = 1000 if small_vocab else INT32_MAX
    vocab = torch.randint(1, high, (num_layers, max_ngram - 1, num_tables), dtype=torch.int32)
    vocab.view(-1)[:2] = torch.tensor([1, INT32_MAX], dtype=torch.int32)[: vocab.numel()]  # extremes
    offsets = torch.randint(INT32_MIN, INT32_MAX, (num_layers, (max_ngram - 1) * num_tables), dtype=torch.int32)
    return tuple(t.to(device) for t in (ids, mult, vocab, offsets))


# ---------------------------------------------------------------- CPU tier: kernels lower, reference


@pytest.mark.parametrize('params', CONFIGS, ids=make_param_id)
def test_engram_hash_ascend_lowers(params):
    cfg = choose_engram_hash_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.num_layers, cfg.max_ngram, cfg.num_tables, cfg.num_cores) == (*params.values(), 64)
    assert cfg.block_tokens * cfg.num_cols * 4 <= 32 * 1024 or cfg.block_tokens == 8
    assert_ascend_kernel_lowers(lambda: make_engram_hash_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('params', CONFIGS, ids=make_param_id)
def test_engram_hash_cuda_lowers(params):
    cfg = choose_engram_hash_config(backend='cuda', **params, num_cores=H200_SMS)
    assert (cfg.backend, cfg.num_layers, cfg.max_ngram, cfg.num_tables) == ('cuda', *params.values())
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_hash_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'num_tokens' in lowered.source  # T stays a runtime argument


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('params', CONFIGS[:2], ids=make_param_id)
def test_engram_hash_mask_variant_lowers(backend, params):
    """The image-token variant is its own kernel; mask=None takes no mask argument."""
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    cfg = choose_engram_hash_config(backend=backend, **params, num_cores=cores, has_mask=True)
    assert cfg.has_mask
    assert 'image_token_mask' in lower(lambda: make_engram_hash_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    plain = choose_engram_hash_config(backend=backend, **params, num_cores=cores)
    source = lower(lambda: make_engram_hash_kernel(plain), key=plain, kernel_name=KERNEL_NAME).source
    assert 'image_token_mask' not in source


def _python_hash(ids, mult, vocab, offsets) -> list:
    """Arbitrary-precision Python ints with explicit two's-complement wrapping: the oracle's oracle."""

    def wrap(x: int, bits: int) -> int:
        x &= (1 << bits) - 1
        return x - (1 << bits) if x >> (bits - 1) else x

    num_layers, max_ngram = len(mult), len(mult[0])
    num_tables = len(vocab[0][0])
    out = []
    for layer in range(num_layers):
        rows = []
        for token in ids:
            p = [wrap(int(token[i]) * int(mult[layer][i]), 64) for i in range(max_ngram)]
            row, h = [], p[0]
            for n in range(2, max_ngram + 1):
                h ^= p[n - 1]
                for e in range(num_tables):
                    k = (n - 2) * num_tables + e
                    row.append(wrap(h % int(vocab[layer][n - 2][e]) + int(offsets[layer][k]), 32))
            rows.append(row)
        out.append(rows)
    return out


@pytest.mark.parametrize('negative', [False, True], ids=['vocab>0', 'vocab<0'])
def test_engram_hash_reference_matches_python_ints(negative):
    ids, mult, vocab, offsets = _inputs(37, 2, 4, 3, 'cpu')
    ids[0] = torch.tensor([INT32_MAX, 0, 1, INT32_MAX - 1], dtype=torch.int32)
    ids[1] = -ids[1]  # negative ids: not token ids, but the arithmetic is defined
    mult[0, :] = torch.tensor([INT64_MAX, INT64_MIN, -1, 3], dtype=torch.int64)
    if negative:
        vocab = -vocab
    expected = torch.tensor(_python_hash(ids.tolist(), mult.tolist(), vocab.tolist(), offsets.tolist()))
    assert_equal(engram_hash_ref(ids, mult, vocab, offsets), expected.to(torch.int32))


def test_engram_hash_config_is_pure():
    a = choose_engram_hash_config(backend='ascend', num_layers=2, max_ngram=3, num_tables=8, num_cores=64)
    assert a == choose_engram_hash_config(backend='ascend', num_layers=2, max_ngram=3, num_tables=8, num_cores=64)
    assert a.num_cols == 16
    with pytest.raises(ValueError, match='max_ngram >= 2'):
        choose_engram_hash_config(backend='cuda', num_layers=2, max_ngram=1, num_tables=8, num_cores=132)


# ---------------------------------------------------------------- CPU tier: argument contract

_ARG_NAMES = ('ngram_token_ids', 'multipliers', 'vocab_sizes', 'offsets')
_ARG_DTYPES = (torch.int32, torch.int64, torch.int32, torch.int32)


def _cpu_args():
    return list(_inputs(5, 2, 3, 4, 'cpu'))


@pytest.mark.parametrize('index', range(4), ids=_ARG_NAMES)
def test_engram_hash_rejects_non_tensors_and_dtypes(index):
    args = _cpu_args()
    assert_rejects_non_tensor_and_dtype(
        cann_ops_tilelang.engram_hash,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=_ARG_DTYPES[index],
        non_tensors=(args[index].tolist(),),
        wrong_dtype=torch.int64 if _ARG_DTYPES[index] == torch.int32 else torch.int32,
    )
    with pytest.raises(TypeError, match='out must have dtype torch.int32'):
        cann_ops_tilelang.engram_hash(*args, out=torch.empty(2, 5, 8, dtype=torch.int64))


@pytest.mark.parametrize('index', range(4), ids=_ARG_NAMES)
def test_engram_hash_rejects_ndim(index):
    assert_rejects_extra_dimension(cann_ops_tilelang.engram_hash, _cpu_args(), index, name=_ARG_NAMES[index])


def test_engram_hash_rejects_sizes():
    ids, mult, vocab, offsets = _cpu_args()  # T=5, L=2, N=3, E=4
    with pytest.raises(ValueError, match=r'N in 2\.\.16'):
        cann_ops_tilelang.engram_hash(ids[:, :1].contiguous(), mult[:, :1].contiguous(), vocab[:, :0], offsets[:, :0])
    with pytest.raises(ValueError, match=r'N in 2\.\.16'):
        cann_ops_tilelang.engram_hash(torch.zeros(5, 17, dtype=torch.int32), mult, vocab, offsets)
    with pytest.raises(ValueError, match=r'L in 1\.\.32'):
        cann_ops_tilelang.engram_hash(ids, mult[:0], vocab[:0], offsets[:0])
    with pytest.raises(ValueError, match=r'L in 1\.\.32'):
        cann_ops_tilelang.engram_hash(ids, torch.zeros(33, 3, dtype=torch.int64), vocab, offsets)
    with pytest.raises(ValueError, match='E >= 1'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab[..., :0], offsets[:, :0])
    with pytest.raises(ValueError, match=r'\(N - 1\) \* E must be at most 256'):
        cann_ops_tilelang.engram_hash(ids, mult, torch.ones(2, 2, 129, dtype=torch.int32), offsets)


def test_engram_hash_rejects_shapes():
    ids, mult, vocab, offsets = _cpu_args()
    with pytest.raises(ValueError, match=r'multipliers must have shape \(2, 3\)'):
        cann_ops_tilelang.engram_hash(ids, mult[:, :2].contiguous(), vocab, offsets)
    with pytest.raises(ValueError, match=r'vocab_sizes must have shape \(2, 2, 4\)'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab[:1].contiguous(), offsets)
    with pytest.raises(ValueError, match=r'vocab_sizes must have shape \(2, 2, 4\)'):
        cann_ops_tilelang.engram_hash(ids, mult, torch.ones(2, 1, 4, dtype=torch.int32), offsets)
    with pytest.raises(ValueError, match=r'offsets must have shape \(2, 8\)'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets[:, :7].contiguous())
    with pytest.raises(ValueError, match=r'out must have shape \(2, 5, 8\)'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, out=torch.empty(2, 8, 5, dtype=torch.int32))


@pytest.mark.parametrize('index', range(4), ids=_ARG_NAMES)
def test_engram_hash_rejects_layouts(index):
    args = _cpu_args()
    t = args[index]
    dims = tuple(reversed(range(t.dim())))
    args[index] = torch.zeros(tuple(reversed(t.shape)), dtype=t.dtype).permute(*dims)  # same shape, transposed
    assert not args[index].is_contiguous()
    with pytest.raises(ValueError, match=f'{_ARG_NAMES[index]} must be contiguous'):
        cann_ops_tilelang.engram_hash(*args)


def test_engram_hash_rejects_out():
    ids, mult, vocab, offsets = _cpu_args()
    with pytest.raises(ValueError, match='out must be contiguous'):
        cann_ops_tilelang.engram_hash(
            ids, mult, vocab, offsets, out=torch.empty(8, 5, 2, dtype=torch.int32).permute(2, 1, 0)
        )
    big = torch.zeros(2 * 5 * 8 + 8, dtype=torch.int32)
    offsets_alias = big[:16].view(2, 8)
    with pytest.raises(ValueError, match='out must not alias the input offsets'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets_alias, out=big[8:].view(2, 5, 8))
    with pytest.raises(RuntimeError, match='out must be on cpu'):
        cann_ops_tilelang.engram_hash(
            ids, mult, vocab, offsets, out=torch.empty(2, 5, 8, dtype=torch.int32, device='meta')
        )


def test_engram_hash_signature():
    """TileKernels 2.1.0's parameter names, order and defaults, plus keyword-only out=."""
    params = inspect.signature(cann_ops_tilelang.engram_hash).parameters
    assert list(params) == [*_ARG_NAMES, 'image_token_mask', 'out']
    assert params['image_token_mask'].default is None
    assert params['image_token_mask'].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert params['out'].kind is inspect.Parameter.KEYWORD_ONLY


def test_engram_hash_rejects_mask():
    args = _cpu_args()  # T = 5
    with pytest.raises(TypeError, match='image_token_mask must be a torch.Tensor'):
        cann_ops_tilelang.engram_hash(*args, [True] * 5)
    for dtype in (torch.uint8, torch.int32):
        with pytest.raises(TypeError, match='image_token_mask must have dtype torch.bool'):
            cann_ops_tilelang.engram_hash(*args, torch.zeros(5, dtype=dtype))
    with pytest.raises(ValueError, match='image_token_mask must have 1 dimensions'):
        cann_ops_tilelang.engram_hash(*args, torch.zeros(5, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r'image_token_mask must have shape \(5,\)'):
        cann_ops_tilelang.engram_hash(*args, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match='image_token_mask must be contiguous'):
        cann_ops_tilelang.engram_hash(*args, torch.zeros(10, dtype=torch.bool)[::2])
    with pytest.raises(RuntimeError, match='one device'):
        cann_ops_tilelang.engram_hash(*args, torch.zeros(5, dtype=torch.bool, device='meta'))
    mask = torch.zeros(2 * 5 * 8 * 4, dtype=torch.bool)
    with pytest.raises(ValueError, match='out must not alias the input image_token_mask'):
        cann_ops_tilelang.engram_hash(*args, mask[:5], out=mask.view(torch.int32).view(2, 5, 8))
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        cann_ops_tilelang.engram_hash(*args, torch.zeros(5, dtype=torch.bool))


def test_engram_hash_config_follows_arguments(monkeypatch):
    """operator.config (what the benchmark records) is the config the operator launches (device faked: CPU
    tensors taken for CUDA ones, with an H200's SM count, and launchers of its own)."""
    monkeypatch.setattr(ops_config, 'backend_of', lambda device: 'cuda')
    monkeypatch.setattr(ops_operator, 'get_num_cores', lambda device: H200_SMS)
    monkeypatch.setattr(OP, '_launchers', {})
    args = _cpu_args()
    cfg = engram_hash_config(*args)
    assert cfg == choose_engram_hash_config(backend='cuda', num_layers=2, max_ngram=3, num_tables=4, num_cores=H200_SMS)
    assert not cfg.has_mask
    assert engram_hash_config(*args, torch.zeros(5, dtype=torch.bool)).has_mask


def test_engram_hash_rejects_zero_vocab_size(monkeypatch):
    """A zero vocabulary size (the divisor of a hash) is a ValueError where the sizes are in host memory, after
    every other check: CPU tensors without the emulator still get the device error."""
    ids, mult, vocab, offsets = _cpu_args()
    vocab[1, 0, 2] = 0
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets)
    monkeypatch.setattr(ops_config, 'backend_of', lambda device: 'cuda')  # taken for device tensors: checked
    monkeypatch.setattr(ops_operator, 'get_num_cores', lambda device: H200_SMS)
    monkeypatch.setattr(OP, '_launchers', {})
    monkeypatch.setattr(OP, 'fast', {})  # not what earlier calls of this process remembered
    for mask in (None, torch.zeros(5, dtype=torch.bool)):
        with pytest.raises(ValueError, match='engram_hash: vocab_sizes must be nonzero'):
            cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, mask)
        with pytest.raises(ValueError, match='vocab_sizes must be nonzero'):
            engram_hash_config(ids, mult, vocab, offsets, mask, out=torch.empty(2, 5, 8, dtype=torch.int32))
    assert not OP.fast  # nothing launched, nothing remembered


def test_engram_hash_rejects_devices():
    ids, mult, vocab, offsets = _cpu_args()
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        cann_ops_tilelang.engram_hash(ids[:0], mult, vocab, offsets)  # T = 0 still needs an accelerator
    with pytest.raises(RuntimeError, match='one device'):
        cann_ops_tilelang.engram_hash(ids, mult.to('meta'), vocab, offsets)


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_hash_values(params, device):
    num_tokens = params['num_tokens']
    sizes = {k: v for k, v in params.items() if k != 'num_tokens'}
    for small_vocab in (False, True):
        ids, mult, vocab, offsets = _inputs(num_tokens, **sizes, device=device, small_vocab=small_vocab)
        expected = engram_hash_ref(ids, mult, vocab, offsets)
        out = cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets)
        assert_equal(out, expected)  # exact integers

        buf = torch.randint(INT32_MIN, INT32_MAX, expected.shape, dtype=torch.int32, device=device)  # poison
        res = cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, out=buf)
        assert res is buf
        assert_equal(buf, expected)


@pytest.mark.npu
@pytest.mark.parametrize('params', [*CONFIGS[:2], CONFIGS[-1]], ids=make_param_id)
@pytest.mark.parametrize('num_tokens', [1, 257, 4001])
def test_engram_hash_image_tokens(params, num_tokens, device):
    """Every row of an image token is -1; text tokens keep the rows of the call without a mask."""
    ids, mult, vocab, offsets = _inputs(num_tokens, **params, device=device)
    mask = torch.rand(num_tokens, device=device) < 0.3
    mask[0] = mask[-1] = True
    expected = engram_hash_ref(ids, mult, vocab, offsets, mask)
    assert bool((expected[:, mask] == -1).all())
    out = cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, mask)
    assert_equal(out, expected)
    assert_equal(out[:, ~mask], cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets)[:, ~mask])
    buf = torch.randint(INT32_MIN, INT32_MAX, expected.shape, dtype=torch.int32, device=device)  # poison
    assert cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, image_token_mask=mask, out=buf) is buf
    assert_equal(buf, expected)
    none = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    assert_equal(
        cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, none), engram_hash_ref(ids, mult, vocab, offsets)
    )


@pytest.mark.npu
def test_engram_hash_edge_values(device):
    """Extreme multipliers (every product wraps), id extremes, negative ids and negative vocab sizes."""
    ids, mult, vocab, offsets = _inputs(4001, 3, 4, 3, 'cpu')
    mult[0] = torch.tensor([INT64_MAX, INT64_MIN, -1, INT64_MIN + 1], dtype=torch.int64)
    ids[:4] = torch.tensor([INT32_MAX, 0, 1, INT32_MAX - 1], dtype=torch.int32)
    ids[4:8] = -ids[4:8]  # not token ids, but the arithmetic is defined
    vocab[2] = -vocab[2].clamp(min=2)  # negative sizes: the result takes the sign of the divisor
    vocab[1, 0] = torch.tensor([-1, INT32_MIN, 2], dtype=torch.int32)  # the divisors' extremes of both signs
    vocab[1, 1] = torch.tensor([INT32_MIN + 1, 3, -(2**30)], dtype=torch.int32)
    args = tuple(t.to(device) for t in (ids, mult, vocab, offsets))
    assert_equal(cann_ops_tilelang.engram_hash(*args), engram_hash_ref(*args))


@pytest.mark.npu
def test_engram_hash_zero_vocab_size(device):
    """On the emulator (sizes in host memory) a zero size is a ValueError before any launch, not a SIGFPE of the
    process; on a device it is not checked (reading the sizes would cost a sync per call): its rows are
    unspecified, as documented."""
    if device.type != 'cpu':
        pytest.skip('a zero vocabulary size is not checked on a device: its rows are unspecified')
    ids, mult, vocab, offsets = _inputs(37, 2, 3, 4, device)
    vocab[0, 1, 3] = 0
    with pytest.raises(ValueError, match='vocab_sizes must be nonzero'):
        cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets)
    vocab[0, 1, 3] = -7  # negative sizes are defined (the result takes the sign of the divisor)
    assert_equal(cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets), engram_hash_ref(ids, mult, vocab, offsets))


@pytest.mark.npu
def test_engram_hash_empty(device):
    ids, mult, vocab, offsets = _inputs(0, 2, 3, 8, device)
    out = cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets)
    assert out.shape == (2, 0, 16)
    assert out.dtype == torch.int32
    assert out.device == ids.device
    buf = torch.empty(2, 0, 16, dtype=torch.int32, device=device)
    assert cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, out=buf) is buf
    mask = torch.zeros(0, dtype=torch.bool, device=device)
    assert cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, mask).shape == (2, 0, 16)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_engram_hash_benchmark(params, device, benchmark_timer, benchmark_record):
    sizes = {k: v for k, v in params.items() if k != 'num_tokens'}
    ids, mult, vocab, offsets = _inputs(params['num_tokens'], **sizes, device=device)
    out = cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets)
    assert_equal(out, engram_hash_ref(ids, mult, vocab, offsets))

    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_hash(ids, mult, vocab, offsets, out=out))
    benchmark_record(
        kernel='engram_hash',
        operation='hash',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(ids, mult, vocab, offsets, out) / time_us / 1e3,
        extras=config_extras(engram_hash_config(ids, mult, vocab, offsets, out=out)),
    )
