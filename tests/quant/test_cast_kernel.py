"""quant.cast, kernel level: configuration, the reference's two derivations of stochastic rounding and the seed's
key (CPU tier), lowering of both backends, and the kernels called directly, (x, out) or (x, out bits, key),
against the reference bit for bit over tails of every vector width and the special values (device tier: an
accelerator, or the Ascend kernels on the emulator with --ascend-emulator)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.cast_kernel import (
    DTYPE_BYTES,
    MAX_NUMEL,
    RECIPE,
    STOCHASTIC_PAIRS,
    CastConfig,
    choose_cast_config,
    get_cast_kernel,
    key_argument,
    make_cast_kernel,
    seed_key,
)
from tests.quant import stochastic_rounding_ref as ref
from tests.quant.stochastic_rounding_ref import cast_inputs, nan_canonical, plain_cast_ref
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal

KERNEL_NAME = 'cast_kernel'
LEVEL = get_test_level()
_NAMES = list(DTYPE_BYTES)
_TORCH = {name: getattr(torch, name) for name in _NAMES}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}

_ALL_PLAIN = [dict(src=a, dst=b, sr=False) for a in _NAMES for b in _NAMES if a != b]
_ALL_SR = [dict(src=a, dst=b, sr=True) for a, b in STOCHASTIC_PAIRS]
# Level 0: the three stochastic roundings and plain casts that take every dtype as source and as target once
# (ten kernel configurations, each compiled once); level 1 every pair.
_CORE = [
    *_ALL_SR,
    dict(src='float32', dst='bfloat16', sr=False),
    dict(src='bfloat16', dst='float8_e4m3fn', sr=False),
    dict(src='float8_e4m3fn', dst='float32', sr=False),
    dict(src='float16', dst='bfloat16', sr=False),
    dict(src='bfloat16', dst='float16', sr=False),
    dict(src='float32', dst='float8_e5m2', sr=False),
    dict(src='float8_e5m2', dst='bfloat16', sr=False),
]
VARIANTS = by_level(LEVEL, core=_CORE, default=_ALL_PLAIN)


def _config(backend: str, num_cores: int, variant: dict) -> CastConfig:
    return choose_cast_config(
        backend=backend,
        num_cores=num_cores,
        in_dtype=variant['src'],
        out_dtype=variant['dst'],
        stochastic_rounding=variant['sr'],
    )


def _numels(cfg: CastConfig) -> tuple[int, ...]:
    """One element; tails of every vector width (not a multiple of 2, 4 (the peer's limit), 8, 16 or 64); the
    tile plus a tail and two full tiles (several tasks / thread blocks)."""
    return by_level(LEVEL, core=(1, 4103, 2 * cfg.tile + 77), default=(7, 100, 2 * cfg.tile), full=(3 * cfg.tile + 1,))


# ---------------------------------------------------------------- CPU tier: configuration and reference


def test_cast_config_is_pure_and_hashable():
    a = choose_cast_config(backend='ascend', num_cores=64, in_dtype=torch.float32, out_dtype=torch.bfloat16)
    b = choose_cast_config(backend='ascend', num_cores=64, in_dtype='float32', out_dtype='bfloat16')
    assert a == b
    assert hash(a) == hash(b)
    assert (a.tile, a.num_stages, a.out_storage) == (16384, 2, 'bfloat16')
    assert a.tile * (4 + 2) * a.num_stages <= 192 * 1024  # two buffer versions of x and out within the UB budget
    c = choose_cast_config(
        backend='cuda', num_cores=132, in_dtype='bfloat16', out_dtype='float8_e4m3fn', stochastic_rounding=True
    )
    assert (c.vector, c.steps, c.threads, c.tile, c.out_storage) == (16, 2, 256, 8192, 'uint8')
    assert c.vector * 1 == 16  # one 16-byte store of e4m3 per run, two 16-byte loads of bf16


@pytest.mark.parametrize('variant', _ALL_PLAIN + _ALL_SR, ids=make_param_id)
def test_cast_config_tiles(variant):
    """Ascend: whole registers and a stage within 96 KiB; CUDA: 16 bytes of the narrower side per access."""
    asc = _config('ascend', ASCEND_950_VECTOR_CORES, variant)
    assert asc.tile % 64 == 0
    assert asc.tile * (asc.in_bytes + asc.out_bytes) <= 96 * 1024
    assert asc.tile * (asc.in_bytes + asc.out_bytes) * 2 > 96 * 1024  # the largest power of two that fits
    cuda = _config('cuda', H200_SMS, variant)
    assert cuda.vector * min(cuda.in_bytes, cuda.out_bytes) == 16
    assert cuda.tile == cuda.threads * cuda.vector * cuda.steps
    assert cuda.out_storage == ({'bfloat16': 'uint16', 'float8_e4m3fn': 'uint8'}[variant['dst']] if variant['sr']
                                else variant['dst'])  # fmt: skip
    assert asc.out_storage == ('uint8' if variant['dst'] == 'float8_e5m2' else cuda.out_storage)


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(backend='cpu'), 'backend'),
        (dict(in_dtype=torch.float64), 'in_dtype must be one of'),
        (dict(out_dtype='int8'), 'out_dtype must be one of'),
        (dict(out_dtype='float32'), 'nothing to cast'),
        (dict(in_dtype='bfloat16', out_dtype='float32', stochastic_rounding=True), 'stochastic rounding casts'),
        (dict(out_dtype='float16', stochastic_rounding=True), 'stochastic rounding casts'),
        (dict(out_dtype='float8_e5m2', stochastic_rounding=True), 'stochastic rounding casts'),
    ],
)
def test_cast_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, in_dtype='float32', out_dtype='bfloat16') | kwargs
    with pytest.raises(ValueError, match=match):
        choose_cast_config(**args)


@pytest.mark.parametrize(
    ('backend', 'change', 'match'),
    [
        ('ascend', dict(tile=100), 'multiple of 64'),
        ('ascend', dict(tile=32768), 'exceeds 98304 bytes'),
        ('ascend', dict(tile=2**19), r'tile must be in \[1, 262144\]'),
        ('ascend', dict(num_cores=0), 'num_cores'),
        ('ascend', dict(num_stages=0), 'num_stages'),
        ('cuda', dict(threads=48), 'multiple of 32'),
        ('cuda', dict(tile=1000), 'multiple of threads x 8'),
    ],
)
def test_cast_config_validates_direct_construction(backend, change, match):
    base = choose_cast_config(backend=backend, num_cores=64, in_dtype='float32', out_dtype='bfloat16')
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(base, **change)


def test_seed_key_matches_the_reference():
    """The package's key of a seed is the reference's (written apart), a bijection on a sample, 32 bits."""
    seeds = [0, 1, 2, 7, 12345, 2**31 - 1, 2**31, 2**32 - 1]
    keys = [seed_key(s) for s in seeds]
    assert keys == [ref.seed_key(s) for s in seeds]
    assert len(set(keys)) == len(keys)
    assert all(0 <= k < 2**32 for k in keys)
    assert [key_argument(k) % 2**32 for k in keys] == keys
    assert all(-(2**31) <= key_argument(k) < 2**31 for k in keys)
    # The recipe's constants are the reference's (the reference writes them out again).
    assert (RECIPE.index_step, RECIPE.mul1, RECIPE.mul2) == (ref._INDEX_STEP, ref._MUL1, ref._MUL2)


def test_random_bits_hand_values():
    """h for index 0 and key 0 is 0 (every step keeps 0); index 1 and key 0 by hand; bits are 32-bit."""
    bits = ref.random_bits(2, 0)
    assert bits[0].item() == 0
    h = 0x9E3779B1
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    assert bits[1].item() == (h * 0xC2B2AE35) & 0xFFFFFFFF
    many = ref.random_bits(1 << 16, ref.seed_key(3))
    assert int(many.min()) >= 0
    assert int(many.max()) < 2**32
    # Roughly uniform top bits (each of 16 buckets within 10 % of its share) and no repeats in 2**16 indices.
    counts = torch.bincount(many >> 28, minlength=16)
    assert (counts - 4096).abs().max().item() < 410
    assert many.unique().numel() == many.numel()


@pytest.mark.parametrize('seed', [0, 1, 99991, 2**32 - 1])
def test_reference_derivations_agree(seed):
    """The integer reference (the kernels' operations) equals the value-level one (neighbours and fractions in
    float64) on magnitudes over every binade of both formats and the finite special values."""
    x = cast_inputs(1 << 16, torch.float32, 'cpu')
    x = x[x.isfinite()]
    assert_equal(ref.stochastic_e4m3_ref(x, seed), ref.stochastic_e4m3_by_value(x, seed))
    assert_equal(ref.stochastic_bf16_ref(x, seed), ref.stochastic_bf16_by_value(x, seed))
    xb = x.bfloat16()
    assert_equal(ref.stochastic_e4m3_ref(xb, seed), ref.stochastic_e4m3_by_value(xb.float(), seed))


def test_reference_special_values():
    """The contract's special values, by hand."""
    x = torch.tensor([0.0, -0.0, float('inf'), float('-inf'), float('nan'), 1e30, -500.0, 448.0, 1e-45, 2.0**-9])
    e4m3 = ref.stochastic_e4m3_ref(x, 5).tolist()
    assert e4m3[:8] == [0x00, 0x80, 0x7E, 0xFE, 0x7F, 0x7E, 0xFE, 0x7E]
    assert e4m3[8] == 0x00  # an fp32 subnormal: its fraction of 2**-9 rounds to 0 on the 2**-29 grid
    assert e4m3[9] == 0x01  # exactly representable: no rounding
    y = torch.tensor([0.0, -0.0, float('inf'), float('-inf'), float('nan'), 3.4e38, -3.4e38, 1.0, 1e-40])
    bf16 = (ref.stochastic_bf16_ref(y, 5).to(torch.int32) & 0xFFFF).tolist()
    assert bf16[:7] == [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F7F, 0xFF7F]
    assert bf16[7] == 0x3F80
    assert bf16[8] in ((y[8:].view(torch.int32).item() >> 16), (y[8:].view(torch.int32).item() >> 16) + 1)


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_cast_ascend_lowers(variant):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, variant)
    source = assert_ascend_kernel_lowers(lambda: make_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    assert ('vmul' in source) == cfg.stochastic_rounding  # the hash's multiplies, in stochastic rounding only
    if cfg.out_bytes < 4:  # one narrow result per 32-bit lane, stored packed
        assert 'vsts_pack' in source


@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_cast_cuda_lowers(variant):
    cfg = _config('cuda', H200_SMS, variant)
    source = assert_cuda_kernel_lowers(lambda: make_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    # 16-byte accesses on both sides (several for the wider one), guarded scalar ones for the tail
    assert source.count('*(uint4*)') + source.count('*(float4*)') + source.count('*(fp8_e4_16_t*)') >= 2
    assert '< numel' in source
    assert ('2246822507' in source) == cfg.stochastic_rounding  # MUL1: the hash, in stochastic rounding only
    if cfg.stochastic_rounding and cfg.out_dtype == 'float8_e4m3fn':
        assert '__fadd_rn' in source  # exact fp32 steps, never contracted into an FMA
        assert '__fmul_rn' in source


# ---------------------------------------------------------------- device tier


def _run(x: torch.Tensor, variant: dict, device, seed: int = 0) -> torch.Tensor:
    """The kernel of `variant` on x (flat, on `device`); returns the result as `dst` (a view of its bits)."""
    cfg = _config(backend_of(device), get_num_cores(device), variant)
    dst = _TORCH[variant['dst']]
    out = torch.full((x.numel() * DTYPE_BYTES[variant['dst']],), 0x5A, dtype=torch.uint8, device=device).view(dst)
    written = out.view(getattr(torch, cfg.out_storage))
    if cfg.stochastic_rounding:
        launch_kernel(get_cast_kernel, cfg, device, x, written, key_argument(seed_key(seed)))
    else:
        launch_kernel(get_cast_kernel, cfg, device, x, written)
    return out


def _expected(x: torch.Tensor, variant: dict, seed: int) -> torch.Tensor:
    """Integer bits of the reference's result."""
    dst = _TORCH[variant['dst']]
    if not variant['sr']:
        return nan_canonical(plain_cast_ref(x, dst).view(_BITS[DTYPE_BYTES[variant['dst']]]), dst)
    if variant['dst'] == 'bfloat16':
        return ref.stochastic_bf16_ref(x, seed)
    return ref.stochastic_e4m3_ref(x, seed)


def _bits_of(out: torch.Tensor, variant: dict) -> torch.Tensor:
    dst = _TORCH[variant['dst']]
    bits = out.cpu().view(_BITS[DTYPE_BYTES[variant['dst']]])
    return bits if variant['sr'] else nan_canonical(bits, dst)


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_cast_kernel_values(variant, device):
    """Bit for bit against the reference (stochastic rounding: the exact bits, NaN included; plain casts: NaN's
    payload aside), for one element, tails and several tiles, with the special values at the front."""
    cfg = _config(backend_of(device), get_num_cores(device), variant)
    for numel in _numels(cfg):
        x = cast_inputs(numel, _TORCH[variant['src']], device)
        seed = numel * 7919 % 2**32
        out = _run(x, variant, device, seed)
        assert_equal(_bits_of(out, variant), _expected(x.cpu(), variant, seed))


def test_max_numel_leaves_the_last_cuda_tile_in_int32():
    """Element indices and the end of the last CUDA tile stay below 2**31 (the kernels' int32 arithmetic)."""
    for variant in _ALL_PLAIN + _ALL_SR:
        cfg = _config('cuda', H200_SMS, variant)
        assert MAX_NUMEL + cfg.tile < 2**31
