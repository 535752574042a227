"""per_token_cast, kernel level (no public interface yet): configuration and lowering (CPU tier), the kernels
called directly in their argument order (x, out, out_sf) against the reference, bit-exact (device tier: an
accelerator, or the Ascend kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant._scale_rules import cuda_cast_scale_and_inverse
from cann_ops_tilelang.quant.cast_back_kernel import choose_cast_back_config
from cann_ops_tilelang.quant.per_token_cast_kernel import (
    FEW_TOKENS,
    RECAST,
    UE8M0_PACK,
    PerTokenRecastConfig,
    choose_per_token_cast_config,
    choose_per_token_recast_config,
    few_tokens,
    get_per_token_cast_kernel,
    make_per_token_cast_kernel,
)
from tests.quant.cast_ref import (
    FORMAT_MAX,
    format_scale_and_inverse_ref,
    padded_hidden,
    per_token_cast_format_ref,
    per_token_cast_precomputed_ref,
    per_token_cast_ref,
    round_up_pow2_bits,
    scaled_rows,
)
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal

KERNEL_NAME = 'per_token_cast_kernel'
LEVEL = get_test_level()

# Scale formats (round_sf, packed_ue8m0, e4m3_sf): fp32 scales, fp32 powers of two (round_sf), UE8M0 bytes
# (round_sf + packed_ue8m0), E4M3 bytes (use_e4m3_sf).
FORMATS = {'fp32': (False, False, False), 'pow2': (True, False, False), 'ue8m0': (True, True, False),
           'e4m3': (False, False, True)}  # fmt: skip

# Level 0 covers every dtype, block size, scale format and output format once (each one kernel to compile; the
# last is NVFP4's: 16-channel E4M3 scales of e2m1); level 1 the full product.
_CORE_VARIANTS = [
    dict(in_dtype='bfloat16', block_size=32, sf='fp32', fmt='e4m3'),
    dict(in_dtype='float32', block_size=64, sf='pow2', fmt='e2m1'),
    dict(in_dtype='bfloat16', block_size=128, sf='ue8m0', fmt='e4m3'),
    dict(in_dtype='float32', block_size=16, sf='e4m3', fmt='e2m1'),
]
_ALL_VARIANTS = generate_samples(
    in_dtype=['bfloat16', 'float32'], block_size=[16, 32, 64, 128], sf=list(FORMATS), fmt=['e4m3', 'e2m1']
)
VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS, default=_ALL_VARIANTS)
# Hidden sizes: minimum, a padded UE8M0 row (17 blocks of 64 / 34 of 32), several column tiles, production sizes.
HIDDEN = by_level(LEVEL, core=(256, 1088), default=(128, 192, 7168), full=(4096, 5120, 16384))
NUM_TOKENS = by_level(LEVEL, core=(1, 67), default=(3, 300), full=(4001,))


ASC = dict(backend='ascend', num_cores=64)


def _config(backend: str, num_cores: int, variant: dict, hidden: int, mode: str = 'cast', col_major_sf: bool = False):
    round_sf, packed, e4m3_sf = FORMATS[variant['sf']]
    return choose_per_token_cast_config(
        backend=backend,
        num_cores=num_cores,
        hidden=hidden,
        in_dtype=variant['in_dtype'],
        block_size=variant['block_size'],
        round_sf=round_sf,
        packed_ue8m0=packed,
        mode=mode,
        fmt=variant['fmt'],
        e4m3_sf=e4m3_sf,
        col_major_sf=col_major_sf,
    )


def _reference(x: torch.Tensor, variant: dict) -> tuple[torch.Tensor, torch.Tensor]:
    round_sf, packed, e4m3_sf = FORMATS[variant['sf']]
    return per_token_cast_format_ref(
        x.cpu(), variant['block_size'], variant['fmt'], round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf
    )


def _nan_products(x: torch.Tensor, variant: dict, inverse: torch.Tensor | None = None) -> torch.Tensor:
    """Where x * inverse is NaN (an inf times a zero inverse, or NaN input), as a mask of the data's bytes: the
    NaN's sign is the hardware's (x86, the reference's CPU and the emulator's, gives -NaN; a GPU +NaN), so there
    the data is compared without its sign (FP4: a byte holds two elements, both lose their sign bit)."""
    bs = variant['block_size']
    num_tokens, hidden = x.shape
    blocks = x.cpu().float().reshape(num_tokens, hidden // bs, bs)
    if inverse is None:
        round_sf, packed, e4m3_sf = FORMATS[variant['sf']]
        amax = blocks.abs().amax(dim=-1)
        _, inverse = format_scale_and_inverse_ref(
            amax, variant['fmt'], round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf
        )
    nan = torch.isnan(blocks * inverse.unsqueeze(-1)).reshape(x.shape)
    return nan.reshape(num_tokens, hidden // 2, 2).any(dim=-1) if variant['fmt'] == 'e2m1' else nan


def assert_data_equal(got: torch.Tensor, want: torch.Tensor, nan: torch.Tensor, fmt: str) -> None:
    """Data bytes equal, those of NaN products (`nan`) without their sign bits (e4m3 0x80, FP4 0x88)."""
    sign = 0x88 if fmt == 'e2m1' else 0x80
    got, want = got.cpu().view(torch.uint8), want.cpu().view(torch.uint8)
    assert_equal(torch.where(nan, got & (0xFF ^ sign), got), torch.where(nan, want & (0xFF ^ sign), want))


def _lowering_cases() -> list[dict]:
    cases = generate_samples(variant=VARIANTS, hidden=HIDDEN)
    return [c for c in cases if c['hidden'] % max(64, c['variant']['block_size']) == 0]


def _case_id(case: dict) -> str:
    return make_param_id({**case['variant'], 'hidden': case['hidden']})


# ---------------------------------------------------------------- CPU tier: configuration


def test_per_token_cast_config_is_pure_and_hashable():
    a = choose_per_token_cast_config(backend='ascend', num_cores=64, hidden=7168, in_dtype=torch.bfloat16)
    b = choose_per_token_cast_config(backend='ascend', num_cores=64, hidden=7168, in_dtype='bfloat16')
    assert a == b
    assert hash(a) == hash(b)
    assert a.block_size == 32  # the default block is TileKernels' Ascend one
    assert (a.num_blocks, a.sf_cols, a.sf_dtype) == (224, 224, 'float32')
    assert 7168 % a.block_k == 0
    assert a.block_k % 64 == 0
    c = choose_per_token_cast_config(
        backend='cuda',
        num_cores=132,
        hidden=192,
        in_dtype=torch.float32,
        block_size=64,
        round_sf=True,
        packed_ue8m0=True,
    )
    assert (c.num_blocks, c.sf_pack, c.sf_cols, c.sf_padding, c.sf_dtype) == (3, 4, 4, 1, 'uint8')
    d = choose_per_token_cast_config(
        backend='ascend',
        num_cores=64,
        hidden=192,
        in_dtype=torch.float32,
        block_size=64,
        round_sf=True,
        packed_ue8m0=True,
    )
    assert (d.sf_pack, d.sf_cols, d.sf_padding) == (4, 4, 1)  # the same bytes on both backends
    assert UE8M0_PACK == 4


def test_per_token_cast_config_padded_ue8m0_rows_stay_in_one_ascend_task():
    # 4160 = 65 * 64: the largest tile of at most 4096 would be 832 (13 blocks), leaving a padding byte mid-row.
    cfg = choose_per_token_cast_config(
        backend='ascend',
        num_cores=64,
        hidden=4160,
        in_dtype='bfloat16',
        block_size=64,
        round_sf=True,
        packed_ue8m0=True,
    )
    assert cfg.block_k == 4160
    assert cfg.num_col_tiles == 1
    plain = choose_per_token_cast_config(
        backend='ascend', num_cores=64, hidden=4160, in_dtype='bfloat16', block_size=64
    )
    assert plain.block_k == 832


def test_per_token_cast_config_padded_ue8m0_rows_past_one_ascend_task():
    """Past H = 8192 a padded UE8M0 row takes equal tasks (8320 = 65 blocks of 128: 5 tasks of 13), the last storing
    the row's padding; column-major words of such a row are refused (equal tasks cannot hold whole words), rows of
    whole words keep their tasks."""
    args = dict(backend='ascend', num_cores=64, in_dtype='bfloat16', round_sf=True, packed_ue8m0=True)
    cfg = choose_per_token_cast_config(hidden=8320, block_size=128, **args)
    assert (cfg.block_k, cfg.groups_per_tile, cfg.num_col_tiles, cfg.sf_padding) == (1664, 13, 5, 3)
    fp4 = choose_per_token_cast_config(hidden=8256, block_size=32, fmt='e2m1', **args)  # 258 blocks of 32
    assert (fp4.block_k, fp4.groups_per_tile, fp4.num_col_tiles, fp4.sf_padding) == (2752, 86, 3, 2)
    with pytest.raises(ValueError, match='column-major packed UE8M0 scales .* need hidden <= 8192, got 65 blocks'):
        choose_per_token_cast_config(hidden=8320, block_size=128, col_major_sf=True, **args)
    with pytest.raises(ValueError, match='need whole int32 words per task'):
        dataclasses.replace(cfg, col_major_sf=True)
    assert choose_per_token_cast_config(hidden=8192 + 512, block_size=128, **args).sf_padding == 0  # 68 blocks


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(backend='cpu'), 'backend'),
        (dict(in_dtype=torch.float16), 'in_dtype'),
        (dict(block_size=8), 'block_size'),
        (dict(fmt='e5m2'), 'fmt must be one of'),
        (dict(round_sf=True, e4m3_sf=True), 'e4m3_sf excludes round_sf'),
        (dict(hidden=96), 'multiple of 64'),
        (dict(hidden=8256, block_size=128), 'short last block .* hidden <= 8128'),  # Ascend: the row is one task
        (dict(hidden=0), 'positive multiple'),
        (dict(packed_ue8m0=True), 'needs round_sf'),
    ],
)
def test_per_token_cast_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, hidden=256, in_dtype=torch.bfloat16) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_per_token_cast_config(**args)


@pytest.mark.parametrize(('fmt', 'exponents'), [('e4m3', (-13, 0, 9, 100)), ('e2m1', (-124, -13, 0, 9, 126))])
def test_round_sf_reciprocal_product_rounds_like_the_division(fmt, exponents):
    """The kernels round c * fp32(1/m) up to a power of two (m = 448 or 6); TileKernels' reference rounds c / m.
    Both give the same power for every fp32 significand (the exponent only shifts both), from the amax floor
    (1e-4; FP4's 6 * 2**-126) up to large finite maxima, so the kernels match either."""
    significands = torch.arange(1 << 23, dtype=torch.int32) | (127 << 23)  # every fp32 in [1, 2)
    fmax = FORMAT_MAX[fmt]
    for exponent in exponents:
        c = significands.view(torch.float32) * 2.0**exponent
        by_product = round_up_pow2_bits(c * torch.tensor(1.0 / fmax, dtype=torch.float32))
        by_division = round_up_pow2_bits(c / torch.full_like(c, fmax))
        assert torch.equal(by_product, by_division), exponent


def test_reference_hand_values():
    """A block with maximum 448 has scale 1; 896 scale 2 (halves); the UE8M0 byte is the scale's exponent + 127."""
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-448, 448, 32)
    x[0, 32:] = 2 * torch.linspace(-448, 448, 32)
    x[1, :32] = -0.0
    x[1, 32:] = 1.0
    out, sf = per_token_cast_ref(x, 32)
    assert sf[0].tolist() == [1.0, 2.0]
    assert torch.equal(out[0, :32].float(), x[0, :32].to(torch.float8_e4m3fn).float())
    assert torch.equal(out[0, 32:].float(), out[0, :32].float())
    assert sf[1, 0].item() == pytest.approx(1e-4 / 448, rel=1e-6)  # all-zero block: the amax floor
    assert out[1, :32].view(torch.uint8).eq(0x80).all()  # -0.0 keeps its sign
    assert out[1, 32:].float().eq(448.0).all()
    _, packed = per_token_cast_ref(x, 32, round_sf=True, packed_ue8m0=True, ue8m0_pack=4)
    assert packed.dtype == torch.uint8
    assert packed.shape == (2, 4)
    assert packed[0].tolist() == [127, 128, 0, 0]  # scales 1 and 2, zero padding
    assert packed[1, 1].item() == 127 - 8  # 1 / 448 rounds up to 2**-8


def test_reference_hand_values_fp4_and_e4m3_scales():
    """FP4: a block with maximum 6 has scale 1 and its values round on the e2m1 grid (ties to even); E4M3 scales:
    c / m rounded to e4m3, the data scaled by its reciprocal; floors and saturation."""
    x = torch.zeros(3, 64)
    x[0, :16] = torch.tensor([6, -6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.0, 0.3, -2.9, 4.4, 1.0, 0.5, 0.1])
    x[0, 16:] = 12.0  # scale 2: every value 6
    x[1, :16] = 1e-45  # a subnormal block: FP4's floor gives scale 2**-126
    x[2, :16] = 3e30  # past 448 * 448 * 6: the E4M3 scale saturates
    data, sf = per_token_cast_format_ref(x, 16, 'e2m1')
    assert data.dtype == torch.int8
    assert data.shape == (3, 32)
    assert sf[0].tolist() == [1.0, 2.0, 2.0, 2.0]
    codes = data.view(torch.uint8)[0, :8]
    low, high = (codes & 0xF).tolist(), (codes >> 4).tolist()
    #  6 -> 7, -6 -> 15, .25 -> 0 (tie to even), .75 -> 2, 1.25 -> 2, 1.75 -> 4, 2.5 -> 4, 3.5 -> 6,
    #  5 -> 6, -0.0 -> 8, .3 -> 1, -2.9 -> 13, 4.4 -> 6, 1 -> 2, .5 -> 1, .1 -> 0
    assert list(zip(low, high, strict=True)) == [(7, 15), (0, 2), (2, 4), (4, 6), (6, 8), (1, 13), (6, 2), (1, 0)]
    assert data.view(torch.uint8)[0, 8:].eq(0x77).all()
    assert sf[1, 0].item() == 2.0**-126
    data, sf = per_token_cast_format_ref(x, 16, 'e2m1', e4m3_sf=True)
    assert sf.dtype == torch.float8_e4m3fn
    assert sf[0].float().tolist() == [1.0, 2.0, 2.0, 2.0]
    assert sf[1, 0].float().item() == 2.0**-9  # the floor: e4m3's smallest subnormal
    assert sf[2, 0].float().item() == 448.0  # saturated: the data saturates too
    assert data.view(torch.uint8)[2, :8].eq(0x77).all()
    _, sf = per_token_cast_format_ref(x, 16, 'e4m3', e4m3_sf=True)
    assert sf[0, 0].float().item() == 14 * 2.0**-10  # 6 / 448 = 13.71 * 2**-10 rounds to 14 steps of 2**-10


class _TorchPrimExprs:
    """The `tilelang.language` names _scale_rules.cuda_cast_scale_and_inverse uses, on CPU tensors (integers as
    int64 values; constants as 1-element tensors, so a division is tensor / tensor, IEEE), so the CUDA kernels'
    own scale function runs here."""

    def float32(value):
        return torch.tensor([value], dtype=torch.float32)

    def uint32(value):
        return torch.tensor([value], dtype=torch.int64)

    int32 = uint32
    uint8 = uint32
    float8_e4m3fn = 'float8_e4m3fn'
    max = torch.maximum
    min = torch.minimum

    def cast(value, dtype):
        if dtype is _TorchPrimExprs.float8_e4m3fn:
            return value.to(torch.float8_e4m3fn)
        if dtype is _TorchPrimExprs.float32:
            return value.float()
        return value.to(torch.uint8) if dtype is _TorchPrimExprs.uint8 else value

    def reinterpret(value, dtype):
        if dtype is _TorchPrimExprs.uint32:
            return value.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        return value.to(torch.int32).view(torch.float32)

    def call_extern(dtype, name, value):
        assert (dtype, name) == (_TorchPrimExprs.float32, '__frcp_rn')  # IEEE reciprocal
        return torch.ones_like(value) / value


@pytest.mark.parametrize('fmt', ['e4m3', 'e2m1'])
@pytest.mark.parametrize('sf', list(FORMATS))
def test_cuda_scale_rule_matches_the_reference(fmt, sf):
    """The CUDA kernels' scale function (run on CPU tensors) gives the reference's scales and inverses bit for bit
    (the Ascend kernels' are checked on the emulator): maxima across the binades, the floors, 0, inf."""
    round_sf, packed, e4m3_sf = FORMATS[sf]
    torch.manual_seed(0)
    specials = torch.tensor([0.0, 1e-45, 6.0, 448.0, 3e38, float('inf')])  # inf: scale inf, or E4M3's 448
    amax = torch.cat([torch.exp2(torch.rand(1 << 16) * 300 - 150), specials])
    stored, inverse = cuda_cast_scale_and_inverse(
        _TorchPrimExprs, amax, fmt=fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf
    )
    want_stored, want_inverse = format_scale_and_inverse_ref(
        amax, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf
    )
    assert_equal(stored.view(torch.uint8), want_stored.view(torch.uint8))
    assert_equal(inverse, want_inverse)


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_token_cast_ascend_lowers(case):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    assert cfg.backend == 'ascend'
    assert cfg.num_stages == 2
    assert_ascend_kernel_lowers(lambda: make_per_token_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_token_cast_cuda_lowers(case):
    cfg = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    lowered = assert_cuda_kernel_lowers(lambda: make_per_token_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    # The fp8 data conversion saturates at +-448, as the reference clamps (E4M3 scales are capped at 448 before
    # theirs); FP4 is rounded by compares (no conversion on sm_90); E4M3 scales have an IEEE reciprocal.
    assert ('__NV_SATFINITE' in lowered.source) == (cfg.fmt == 'e4m3')
    assert ('__frcp_rn' in lowered.source) == cfg.e4m3_sf


_LOADS = re.compile(r'\((\w+)\*\)\(x \+')  # the CUDA source's vector loads of x: their types


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_token_cast_strided_rows_lower(backend, variant):
    """Rows of a runtime stride (strided_rows): the row stride is a launch argument, and on CUDA x is read with the
    vector loads of the contiguous kernel (the stride's 16-byte alignment assumed: the interface checks it)."""
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    plain = _config(backend, cores, variant, 1088 if variant['block_size'] <= 64 else 1152)
    strided = dataclasses.replace(plain, strided_rows=True)
    sources = [lower(lambda c=c: make_per_token_cast_kernel(c), key=c, kernel_name=KERNEL_NAME).source
               for c in (plain, strided)]  # fmt: skip
    assert ['x_stride' in source for source in sources] == [False, True]
    if backend == 'cuda':
        loads = [sorted(set(_LOADS.findall(source))) for source in sources]
        assert loads[0], 'the contiguous kernel loads x in vectors'
        assert loads[1] == loads[0]


_SHORT_LOWERING = [v for v in _CORE_VARIANTS if v['block_size'] == 128] + [
    dict(in_dtype='float32', block_size=128, sf='e4m3', fmt='e2m1')
]


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('variant', _SHORT_LOWERING, ids=make_param_id)
def test_per_token_cast_short_block_lowers(backend, variant):
    """A short last block (H 2880 = 22.5 blocks of 128): Ascend's row-long task fits UB up to H 8128 (fp32 x
    included); CUDA's guarded tiles (2 of 1536 columns) load x in the vectors of the unguarded kernel of the same
    tiles (H 3072)."""
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    short = _config(backend, cores, variant, 2880)
    if backend == 'ascend':
        configs = [short, _config(backend, cores, variant, 8128)]
    else:
        configs = [short, dataclasses.replace(short, hidden=short.num_col_tiles * short.block_k)]
    assert [c.short_block for c in configs] == [True, backend == 'ascend']
    sources = [lower(lambda c=c: make_per_token_cast_kernel(c), key=c, kernel_name=KERNEL_NAME).source
               for c in configs]  # fmt: skip
    if backend == 'cuda':
        loads = [sorted(set(_LOADS.findall(source))) for source in sources]
        assert loads[1], 'the whole-block kernel loads x in vectors'
        assert loads[0] == loads[1]


# ---------------------------------------------------------------- device tier


def _run(x: torch.Tensor, variant: dict, device) -> tuple[torch.Tensor, torch.Tensor, object]:
    backend = backend_of(device)
    cfg = _config(backend, get_num_cores(device), variant, x.shape[1])
    # Poisoned: a byte the kernel skips stays 0xA5 (an FP4 pair of codes, an e4m3 value, padding that must be 0).
    out = torch.full((x.shape[0], cfg.data_cols), 0xA5, dtype=torch.uint8, device=device)
    out = out.view(getattr(torch, cfg.data_dtype))
    if cfg.sf_dtype == 'float32':
        sf = torch.full((x.shape[0], cfg.sf_cols), float('nan'), device=device)
    else:
        sf = torch.full((x.shape[0], cfg.sf_cols), 0xA5, dtype=torch.uint8, device=device)
        sf = sf.view(getattr(torch, cfg.sf_dtype))
    launch_kernel(get_per_token_cast_kernel, cfg, device, x, out, sf)
    return out, sf, cfg


def _check(x: torch.Tensor, variant: dict, device) -> None:
    out, sf, _ = _run(x, variant, device)
    ref_out, ref_sf = _reference(x, variant)
    assert_equal(sf.cpu().view(torch.uint8), ref_sf.view(torch.uint8))
    assert_data_equal(out, ref_out, _nan_products(x, variant), variant['fmt'])


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_token_cast_kernel_values(variant, num_tokens, device):
    _check(scaled_rows(num_tokens, padded_hidden(variant['block_size']), variant['in_dtype'], device), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('hidden', [h for h in HIDDEN if h != 1088])
def test_per_token_cast_kernel_hidden_sizes(hidden, device):
    variant = _CORE_VARIANTS[0]  # a level-0 kernel configuration class, new hidden sizes
    _check(scaled_rows(5, hidden, variant['in_dtype'], device), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_token_cast_kernel_special_values(variant, device):
    """Signed zeros, all-zero blocks (the amax floor), bf16/fp32 subnormals, e4m3 and e2m1 ties (0.25, 0.75, 2.5,
    5 after a scale of 1 in FP4), values past the format's maximum after scaling (saturated), and infinities:
    the block of an inf gets scale inf, its finite values +-0 and the inf NaN (FP4 +-6), with E4M3 scales 448."""
    bs = variant['block_size']
    hidden = padded_hidden(bs)
    dtype = getattr(torch, variant['in_dtype'])
    tiny = torch.finfo(dtype).tiny
    pool = torch.tensor([0.0, -0.0, tiny, -tiny / 4, 1.0, -1.0625, 1.1875, 3.0, -448.0, 1e-30, 1e30, 0.25, 2.5, 5.0])
    x = pool[torch.randint(len(pool), (7, hidden))].to(dtype)
    x[0, :bs] = -0.0
    x[1, bs : 2 * bs] = 0.0
    x[2, :bs] = tiny * torch.arange(bs)  # subnormal-sized block, floored
    x[3, 5] = float('inf')
    x[4, 2 * bs + 1] = -float('inf')
    x[5, :bs] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0] * (bs // 8))  # amax 6: FP4 scale 1
    x[6, :bs] = 3e38  # past 448 * 448: E4M3 scales saturate at 448
    out, sf, _ = _run(x.to(device), variant, device)
    ref_out, ref_sf = _reference(x, variant)
    assert_equal(sf.cpu().view(torch.uint8), ref_sf.view(torch.uint8))
    nan = _nan_products(x, variant)
    assert_data_equal(out, ref_out, nan, variant['fmt'])
    assert int(nan.sum()) == (0 if variant['sf'] == 'e4m3' else 2)  # the two infinities, times a zero inverse
    fp4 = variant['fmt'] == 'e2m1'
    negative_zeros = ref_out.view(torch.uint8)[0, : bs // 2 if fp4 else bs]  # a -0.0 block stays -0.0
    assert negative_zeros.eq(0x88 if fp4 else 0x80).all()


@pytest.mark.npu
@pytest.mark.parametrize('variant', [v for v in _CORE_VARIANTS if v['sf'] != 'ue8m0'], ids=make_param_id)
def test_per_token_cast_kernel_halves_values(variant, device):
    """Mode 'sf_only' writes per_token_cast's scales; mode 'precomputed' its data from given scales (fp32 or e4m3:
    packed UE8M0 is not taken there), including scales the kernel did not compute (zero: inverse inf, products
    saturate and zeros give NaN)."""
    x = scaled_rows(37, padded_hidden(variant['block_size']), variant['in_dtype'], device)
    _, ref_sf = _reference(x, variant)
    backend, cores = backend_of(device), get_num_cores(device)
    sf = torch.empty_like(ref_sf).to(device)
    launch_kernel(get_per_token_cast_kernel, _config(backend, cores, variant, x.shape[1], 'sf_only'), device, x, sf)
    assert_equal(sf.cpu().view(torch.uint8), ref_sf.view(torch.uint8))
    given = ref_sf.clone()
    given.view(torch.uint8)[0, 0] = 0  # a zero scale, fp32 or e4m3
    cfg = _config(backend, cores, variant, x.shape[1], 'precomputed')
    out = torch.full((37, cfg.data_cols), 0xA5, dtype=torch.uint8, device=device).view(getattr(torch, cfg.data_dtype))
    launch_kernel(get_per_token_cast_kernel, cfg, device, x, given.to(device), out)
    inverse = torch.ones(given.shape) / given.float()
    assert_data_equal(
        out, per_token_cast_precomputed_ref(x.cpu(), given, variant['block_size'], variant['fmt']),
        _nan_products(x, variant, inverse), variant['fmt'],
    )  # fmt: skip


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(
    ('mode', 'variant'),
    [('sf_only', _CORE_VARIANTS[2]), ('precomputed', _CORE_VARIANTS[0]), ('sf_only', _CORE_VARIANTS[3]),
     ('precomputed', _CORE_VARIANTS[3])],
    ids=lambda v: v if isinstance(v, str) else make_param_id(v),
)  # fmt: skip
def test_per_token_cast_halves_lower(backend, mode, variant):
    """per_token_cast_with_sf_only ('sf_only': no data stores) and _with_precomputed_sf ('precomputed': the scales
    read, their reciprocals, no reduction), e4m3 with fp32 / UE8M0 scales and FP4 with E4M3 scales."""
    cfg = _config(
        backend, ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, variant,
        padded_hidden(variant['block_size']), mode,
    )  # fmt: skip
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_per_token_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    if backend == 'cuda':
        assert ('__frcp_rn' in source) == (mode == 'precomputed' or (cfg.e4m3_sf and cfg.writes_data))
        data_param = 'signed char* __restrict__ out' if cfg.fp4 else 'fp8_e4_t* __restrict__ out'
        assert (data_param in source) == (mode == 'precomputed')


def test_per_token_cast_config_modes():
    cfg = choose_per_token_cast_config(
        backend='cuda',
        num_cores=132,
        hidden=256,
        in_dtype='bfloat16',
        block_size=128,
        round_sf=True,
        mode='precomputed',
    )
    assert (cfg.round_sf, cfg.writes_data, cfg.computes_sf) == (
        False,
        True,
        False,
    )  # round_sf dropped: 1 / sf either way
    with pytest.raises(ValueError, match='packed_ue8m0 is not supported there'):
        choose_per_token_cast_config(
            backend='cuda', num_cores=132, hidden=256, in_dtype='bfloat16', round_sf=True, packed_ue8m0=True,
            mode='precomputed',
        )  # fmt: skip
    with pytest.raises(ValueError, match='mode must be one of'):
        choose_per_token_cast_config(backend='cuda', num_cores=132, hidden=256, in_dtype='bfloat16', mode='both')


# ---------------------------------------------------------------- stochastic rounding of the data (stochastic)


def test_per_token_cast_config_stochastic():
    """Off by default (every existing configuration unchanged); mode 'cast' only; the data argument becomes the
    e4m3 bits (uint8), FP4's stays its int8 bytes."""
    common = dict(backend='cuda', num_cores=132, hidden=1088, in_dtype='bfloat16', block_size=32)
    plain = choose_per_token_cast_config(**common)
    assert not plain.stochastic
    assert plain == choose_per_token_cast_config(**common, stochastic=False)
    assert plain.data_storage == plain.data_dtype == 'float8_e4m3fn'
    cfg = choose_per_token_cast_config(**common, stochastic=True)
    assert cfg == dataclasses.replace(plain, stochastic=True)
    assert (cfg.data_storage, cfg.data_dtype) == ('uint8', 'float8_e4m3fn')
    fp4 = choose_per_token_cast_config(**common, stochastic=True, fmt='e2m1')
    assert fp4 == dataclasses.replace(choose_per_token_cast_config(**common, fmt='e2m1'), stochastic=True)
    assert fp4.data_storage == fp4.data_dtype == 'int8'
    for fmt in ('e4m3', 'e2m1'):
        for mode in ('sf_only', 'precomputed'):
            with pytest.raises(ValueError, match='stochastic: mode "cast" only'):
                choose_per_token_cast_config(**common, stochastic=True, mode=mode, fmt=fmt)


def test_per_token_cast_config_few_tokens():
    """Up to FEW_TOKENS rows CUDA takes 1024-column tiles of 64 threads for rows wider than one default tile (the
    narrower divisor and 32 threads where 1024 does not divide); rows of one tile, a short last block and Ascend
    keep their tiling; off by default."""
    common = dict(num_cores=132, in_dtype='bfloat16', block_size=128)
    for hidden, tile in ((7168, (1024, 64)), (4096, (1024, 64)), (2304, (768, 32))):
        cfg = choose_per_token_cast_config(backend='cuda', hidden=hidden, **common, few_tokens=True)
        assert (cfg.block_k, cfg.threads) == tile
        assert cfg == dataclasses.replace(choose_per_token_cast_config(backend='cuda', hidden=hidden, **common),
                                          block_k=tile[0], threads=tile[1])  # fmt: skip
    for backend, hidden in (('cuda', 2048), ('cuda', 1536), ('cuda', 2880), ('ascend', 7168), ('ascend', 2880)):
        assert choose_per_token_cast_config(backend=backend, hidden=hidden, **common, few_tokens=True) == (
            choose_per_token_cast_config(backend=backend, hidden=hidden, **common)
        )
    assert [few_tokens(t) for t in (0, 1, FEW_TOKENS, FEW_TOKENS + 1)] == [False, True, True, False]


# The row-major scale stores of the Ascend kernel: one burst of N bytes (asc_copy_ub2gm_align(gm, ub, 1, N, ...)).
_SF_ROW_DMA = re.compile(
    r'asc_copy_ub2gm_align\(\(__gm__ uint8_t\*\)\(\(&\(out_sf\[[^;]*\]\)\)\), [^;]*?\)\)\), 1, (\d+), '
)


@pytest.mark.parametrize(
    ('hidden', 'block', 'fmt', 'mode'), [(8320, 128, 'e4m3', 'cast'), (8256, 32, 'e2m1', 'sf_only')]
)
def test_per_token_cast_padded_wide_row_lowers(hidden, block, fmt, mode):
    """A padded UE8M0 row of several Ascend tasks: two scale stores, a task's scale bytes and the row's last task's
    with the padding (13 and 16 bytes at H 8320; 86 and 88 at 8256)."""
    variant = dict(in_dtype='bfloat16', block_size=block, sf='ue8m0', fmt=fmt)
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, variant, hidden, mode)
    assert cfg.num_col_tiles > 1
    assert cfg.sf_padding
    source = assert_ascend_kernel_lowers(lambda: make_per_token_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    lengths = sorted(int(n) for n in _SF_ROW_DMA.findall(source.source))
    assert lengths == [cfg.groups_per_tile, cfg.groups_per_tile + cfg.sf_padding]


# (variant, hidden, column-major scales): one column tile and several (7168: the element index's j * block_k).
_STOCHASTIC_LOWERING = [
    (_CORE_VARIANTS[0], 1088, False),
    (dict(in_dtype='float32', block_size=16, sf='e4m3', fmt='e4m3'), 7168, False),
    (_CORE_VARIANTS[2], 1152, True),
    # FP4: the level-0 NVFP4 configuration (fp32, 16-channel E4M3 scales, H 1088), MXFP4 (bf16, 32-channel UE8M0)
    # over several column tiles with column-major scales.
    (_CORE_VARIANTS[3], 1088, False),
    (dict(in_dtype='bfloat16', block_size=32, sf='ue8m0', fmt='e2m1'), 7168, True),
]


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(('variant', 'hidden', 'col_major'), _STOCHASTIC_LOWERING, ids=str)
def test_per_token_cast_stochastic_lowers(backend, variant, hidden, col_major):
    """The stochastic kernels lower on both backends (CUDA: not run in this project yet, no GPU): an int32 key
    argument after the scales, the data written as bits (uchar on CUDA), the hash's step and the exact fp32 adds of
    quant.cast's rounding, no saturating fp8 conversion of the data. (TileLang reports the CUDA element loop as not
    vectorized, the hash's branch; the stores stay vector stores of the bits.)"""
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    plain = _config(backend, cores, variant, hidden, col_major_sf=col_major)
    cfg = dataclasses.replace(plain, stochastic=True)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_per_token_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    plain_source = lower(lambda: make_per_token_cast_kernel(plain), key=plain, kernel_name=KERNEL_NAME).source
    assert 'key' in source
    assert 'key' not in plain_source
    if backend == 'cuda':
        assert 'int key' in source
        assert str(0x9E3779B1) in source  # the element hash's index step
        if cfg.fp4:  # the FP4 bytes as they are; the exact fp32 (a - lo) * (1 / spacing)
            assert 'signed char* __restrict__ out' in source
            assert '__fmul_rn(__fsub_rn(' in source
        else:
            assert 'uchar* __restrict__ out' in source
            assert '__fadd_rn' in source
        if not cfg.e4m3_sf:  # (the E4M3 scales' own conversion aside)
            assert '__NV_SATFINITE' not in source


# ---------------------------------------------------------------- column-major scales (col_major_sf)

# The configurations of test_per_token_cast.py's level-0 column-major values (hidden padded_hidden(block)): UE8M0
# bytes of a padded row, E4M3 scales of FP4 data. Level 1 lowers the other scale formats and the scales alone.
_COL_MAJOR_CORE = [
    dict(in_dtype='bfloat16', block_size=64, sf='ue8m0', fmt='e4m3'),
    dict(in_dtype='float32', block_size=16, sf='e4m3', fmt='e2m1'),
]
_COL_MAJOR_LOWERING = by_level(
    LEVEL,
    core=[(v, 'cast') for v in _COL_MAJOR_CORE],
    default=[
        *[(v, 'cast') for v in _COL_MAJOR_CORE],
        (dict(in_dtype='bfloat16', block_size=32, sf='fp32', fmt='e4m3'), 'cast'),
        (dict(in_dtype='float32', block_size=128, sf='pow2', fmt='e2m1'), 'cast'),
        (dict(in_dtype='float32', block_size=32, sf='ue8m0', fmt='e2m1'), 'sf_only'),
        (dict(in_dtype='bfloat16', block_size=32, sf='fp32', fmt='e4m3'), 'sf_only'),
        (dict(in_dtype='bfloat16', block_size=16, sf='e4m3', fmt='e4m3'), 'sf_only'),
    ],
)


def test_per_token_cast_config_col_major():
    """The layout is a configuration field of its own; on Ascend, a task of column-major UE8M0 scales holds whole
    int32 words (the row when it fits in one task); given scales are read row-major only."""
    args = dict(num_cores=64, in_dtype='bfloat16', block_size=32, round_sf=True, packed_ue8m0=True)
    rows = choose_per_token_cast_config(backend='ascend', hidden=7168, **args)
    cols = choose_per_token_cast_config(backend='ascend', hidden=7168, col_major_sf=True, **args)
    assert cols.col_major_sf
    assert not rows.col_major_sf
    assert cols != rows
    assert hash(cols) != hash(rows)
    assert cols.block_k == rows.block_k == 3584  # 112 blocks, 28 words a task
    # 4736 = 37 * 128: the row-major task of 2368 channels holds 74 blocks, 18.5 words
    assert choose_per_token_cast_config(backend='ascend', hidden=4736, **args).block_k == 2368
    assert choose_per_token_cast_config(backend='ascend', hidden=4736, col_major_sf=True, **args).block_k == 4736
    # past a one-task row (8192): the largest whole-word task that divides the row
    wide = choose_per_token_cast_config(backend='ascend', hidden=3 * 4736, col_major_sf=True, **args)
    assert (wide.block_k, wide.groups_per_tile % UE8M0_PACK) == (384, 0)
    cuda = choose_per_token_cast_config(backend='cuda', hidden=2176, col_major_sf=True, **args | {'num_cores': 132})
    # 34 blocks, 8.5 words a thread block: the CUDA kernel stores the bytes one by one, whole words or not
    assert (cuda.block_k, cuda.num_col_tiles) == (1088, 2)
    with pytest.raises(ValueError, match='need whole int32 words per task'):
        dataclasses.replace(cols, hidden=4736, block_k=2368)
    with pytest.raises(ValueError, match='mode "precomputed" reads row-major scales'):
        choose_per_token_cast_config(
            backend='cuda', num_cores=132, hidden=256, in_dtype='bfloat16', mode='precomputed', col_major_sf=True
        )


_SF_DMA = re.compile(
    r'asc_copy_ub2gm_align\(\(__gm__ uint8_t\*\)\(\(&\(out_sf\[[^;]*, (\d+), (\d+), '
    r'static_cast<asc_store_l2_cache_mode>\(\d+\), ([^,;]+), (\d+)\);'
)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(
    ('variant', 'mode'), _COL_MAJOR_LOWERING, ids=lambda v: v if isinstance(v, str) else make_param_id(v)
)
def test_per_token_cast_col_major_lowers(backend, variant, mode):
    """Both kernels write the column-major scales themselves, the row stride a launch argument: on CUDA one store
    per scale (UE8M0: per byte) at k * stride + t; on Ascend one DMA per task whose bursts are single scales (fp32
    4 bytes, E4M3 1 byte) or UE8M0 words, read back to back from UB and stored a row stride apart."""
    hidden = padded_hidden(variant['block_size'])
    cfg = _config(backend, ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, variant, hidden, mode, True)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_per_token_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    if backend == 'cuda':
        assert 'int sf_stride' in source
        return
    ((n_burst, len_burst, gm_stride, ub_stride),) = _SF_DMA.findall(source)
    sf_bytes = 1 if cfg.sf_dtype in ('uint8', 'float8_e4m3fn') else 4
    burst = UE8M0_PACK if cfg.packed_ue8m0 else sf_bytes
    bursts = (cfg.groups_per_tile + cfg.sf_padding) * sf_bytes // burst  # a task's scales, or its words
    assert (int(n_burst), int(len_burst), int(ub_stride)) == (bursts, burst, burst)
    assert 'sf_stride' in gm_stride


@pytest.mark.npu
@pytest.mark.parametrize('variant', _COL_MAJOR_CORE, ids=make_param_id)
def test_per_token_cast_kernel_col_major_row_stride(variant, device):
    """The kernel writes the transposed scales at any row stride >= T: TileKernels' CUDA padding on every backend
    (here 48 >= 37 tokens, so on the emulator the Ascend kernel meets a padded stride too), each scale once, the
    padding columns untouched; the data as the row-major kernel writes it."""
    num_tokens, stride = 37, 48
    x = scaled_rows(num_tokens, padded_hidden(variant['block_size']), variant['in_dtype'], device)
    cfg = _config(backend_of(device), get_num_cores(device), variant, x.shape[1], col_major_sf=True)
    ref_out, ref_sf = _reference(x, variant)  # (T, sf_cols), UE8M0 as bytes
    ref_bytes = ref_sf.view(torch.uint8)
    # rows of the transposed scales, and the bytes of a token in a row: a UE8M0 word, or one scale
    rows, width = (cfg.sf_cols // UE8M0_PACK, UE8M0_PACK) if cfg.packed_ue8m0 else (cfg.sf_cols, ref_sf.element_size())
    image = ref_bytes.reshape(num_tokens, rows, width).permute(1, 0, 2).reshape(rows, width * num_tokens).contiguous()
    buffer = torch.full((rows, width * stride), 0xA5, dtype=torch.uint8, device=device)
    sf = buffer[:, : width * num_tokens]
    if not cfg.packed_ue8m0:
        sf = sf.view(getattr(torch, cfg.sf_dtype))
    out = torch.empty((num_tokens, cfg.data_cols), dtype=getattr(torch, cfg.data_dtype), device=device)
    launch_kernel(get_per_token_cast_kernel, cfg, device, x, out, sf)
    assert_equal(buffer[:, : width * num_tokens].cpu().contiguous(), image)
    assert buffer[:, width * num_tokens :].eq(0xA5).all()
    assert_data_equal(out, ref_out, _nan_products(x, variant), variant['fmt'])


# ---------------------------------------------------------------- a quantised x: the fused CUDA kernel ('recast')

# x's layouts (cast_back's keyword arguments besides hidden and out_dtype): e4m3 data with per-token and block
# scales, fp32, UE8M0 (packed) or E4M3, row- or column-major.
_E4M3 = dict(fp4=False, e4m3_sf=False, col_major_sf=False)
_FUSED_SOURCES = [
    dict(block_tokens=128, block_channels=128, packed_ue8m0=False, **_E4M3),  # DeepSeek's weights / activations
    dict(block_tokens=1, block_channels=128, packed_ue8m0=False, **_E4M3),
    dict(block_tokens=1, block_channels=32, packed_ue8m0=True, **_E4M3),  # MXFP8
    dict(block_tokens=1, block_channels=16, packed_ue8m0=False, **_E4M3 | {'e4m3_sf': True}),
    dict(block_tokens=32, block_channels=64, packed_ue8m0=True, **_E4M3 | {'col_major_sf': True}),
    dict(block_tokens=1, block_channels=128, packed_ue8m0=False, **_E4M3 | {'col_major_sf': True}),
]
# Left to the composition: FP4 data, per-channel scales.
_COMPOSED_SOURCES = [
    dict(block_tokens=1, block_channels=32, packed_ue8m0=True, **_E4M3 | {'fp4': True}),
    dict(block_tokens=32, block_channels=1, packed_ue8m0=False, **_E4M3),
]


def _recast(backend: str, source: dict, hidden: int = 7168, **cast) -> PerTokenRecastConfig:
    cast = {'hidden': hidden, 'block_size': 128, **cast}
    return choose_per_token_recast_config(
        backend=backend, num_cores=H200_SMS, dequantise=tuple({'hidden': hidden, **source}.items()),
        cast=tuple(cast.items()),
    )  # fmt: skip


@pytest.mark.parametrize('source', _FUSED_SOURCES, ids=make_param_id)
def test_per_token_recast_config_fuses_on_cuda(source):
    """On CUDA an e4m3 x of row-block scales is one kernel: the fp32 cast's configuration in mode 'recast', reading
    x as cast_back's configuration of it reads it, its tile one whose threads hold 16 codes a load (7168: 1024
    columns, 32 a thread, where the fp32 cast's 1792 give 56); on Ascend the same x is the two stages."""
    cfg = _recast('cuda', source, round_sf=True, packed_ue8m0=True, col_major_sf=True)
    common = dict(backend='cuda', num_cores=H200_SMS, hidden=7168)
    dequantise = choose_cast_back_config(**common, out_dtype='float32', **source)
    cast = choose_per_token_cast_config(**common, in_dtype='float32', block_size=128, round_sf=True, packed_ue8m0=True,
                                        col_major_sf=True)  # fmt: skip
    assert cfg.fused
    assert cfg.dequantise is None
    assert (cfg.cast.mode, cfg.cast.quantised_x) == (RECAST, dequantise)
    assert (cast.block_k, cast.threads, cfg.cast.block_k, cfg.cast.threads) == (1792, 32, 1024, 32)
    assert cfg.cast == dataclasses.replace(cast, mode=RECAST, quantised_x=dequantise, block_k=1024)
    ascend = _recast('ascend', source, round_sf=True, packed_ue8m0=True, col_major_sf=True)
    assert not ascend.fused
    assert (ascend.dequantise.backend, ascend.cast.mode, ascend.cast.quantised_x) == ('ascend', 'cast', None)


@pytest.mark.parametrize('backend', ['cuda', 'ascend'])
@pytest.mark.parametrize(
    ('source', 'cast'),
    [*((s, {}) for s in _COMPOSED_SOURCES), (_FUSED_SOURCES[0], {'stochastic': True})],
    ids=lambda v: make_param_id(v) if v else 'plain',
)
def test_per_token_recast_config_composes_the_rest(backend, source, cast):
    """FP4 data, per-channel scales and stochastic rounding stay the composition on both backends: the stages
    their own operators choose."""
    cfg = _recast(backend, source, **cast)
    assert not cfg.fused
    common = dict(backend=backend, num_cores=H200_SMS, hidden=7168)
    assert cfg.dequantise == choose_cast_back_config(**common, out_dtype='float32', **source)
    assert cfg.cast == choose_per_token_cast_config(**common, in_dtype='float32', block_size=128, **cast)


def test_per_token_recast_config_rejects():
    """Mode 'recast' comes with x's layout and only on CUDA; a fused configuration has no dequantising stage and a
    composition no 'recast' stage."""
    fused = _recast('cuda', _FUSED_SOURCES[0])
    plain = choose_per_token_cast_config(backend='cuda', num_cores=H200_SMS, hidden=7168, in_dtype='float32',
                                         block_size=128)  # fmt: skip
    with pytest.raises(ValueError, match="goes with mode 'recast' only"):
        dataclasses.replace(fused.cast, quantised_x=None)
    with pytest.raises(ValueError, match="goes with mode 'recast' only"):
        dataclasses.replace(plain, quantised_x=fused.cast.quantised_x)
    with pytest.raises(ValueError, match='CUDA only'):
        dataclasses.replace(fused.cast, backend='ascend', threads=0, num_stages=2)
    per_channel = choose_cast_back_config(backend='cuda', num_cores=1, hidden=7168, out_dtype='float32',
                                          **_COMPOSED_SOURCES[1])  # fmt: skip
    with pytest.raises(ValueError, match='e4m3 data with scales in row blocks only'):
        dataclasses.replace(fused.cast, quantised_x=per_channel)
    with pytest.raises(ValueError, match='the plain rounding'):
        dataclasses.replace(fused.cast, in_dtype='bfloat16')
    with pytest.raises(ValueError, match="in mode 'recast' exactly where there is no dequantising stage"):
        PerTokenRecastConfig('cuda', None, plain)
    with pytest.raises(ValueError, match="in mode 'recast' exactly where there is no dequantising stage"):
        PerTokenRecastConfig('cuda', _recast('ascend', _FUSED_SOURCES[0]).dequantise, fused.cast)


# (x's layout, hidden, output block, output format, the 16-byte loads' x type): the DeepSeek case, MXFP8 in,
# NVFP4 out (E4M3 scales in and out), token blocks of column-major UE8M0, a short last block (H 2880).
_RECAST_LOWERING = [
    (_FUSED_SOURCES[0], 7168, 128, 'e4m3', 'fp8_e4_16_t'),
    (_FUSED_SOURCES[2], 7168, 32, 'e4m3', 'fp8_e4_16_t'),
    (_FUSED_SOURCES[3], 1152, 16, 'e2m1', 'fp8_e4_4_t'),
    (_FUSED_SOURCES[4], 4096, 32, 'e4m3', 'fp8_e4_16_t'),
    (_FUSED_SOURCES[5], 2880, 128, 'e4m3', 'fp8_e4_16_t'),
]


@pytest.mark.parametrize(('source', 'hidden', 'block', 'fmt', 'load'), _RECAST_LOWERING, ids=str)
def test_per_token_recast_cuda_lowers(source, hidden, block, fmt, load):
    """The fused kernel lowers for CUDA: arguments (x, x_sf, out, out_sf) with x the e4m3 data and x_sf of its
    scale format (column-major: a row stride of its own, apart from that of column-major output scales), x read by
    vector loads (16 bytes where a thread's run of a block has 16 codes), each code widened exactly and multiplied
    by its scale in fp32, as cast_back does."""
    e4m3_sf = fmt == 'e2m1'  # NVFP4: E4M3 scales out
    col_major = source['col_major_sf']  # column-major in and out: two row strides
    cfg = _recast('cuda', source, hidden, block_size=block, fmt=fmt, e4m3_sf=e4m3_sf, col_major_sf=col_major).cast
    source_text = assert_cuda_kernel_lowers(lambda: make_per_token_cast_kernel(cfg), key=cfg,
                                            kernel_name=KERNEL_NAME).source  # fmt: skip
    scales = cfg.quantised_x.sf_dtype
    x_sf = {'float32': 'float', 'uint8': 'uchar', 'float8_e4m3fn': 'fp8_e4_t'}[scales]
    out = 'signed char' if cfg.fp4 else 'fp8_e4_t'
    assert re.search(
        rf'{out}\* __restrict__ out, {"float" if not e4m3_sf else "fp8_e4_t"}\* __restrict__ out_sf, const '
        rf'fp8_e4_t\* __restrict__ x, const {x_sf}\* __restrict__ x_sf, int num_tokens',
        source_text,
    )
    assert ('int x_sf_stride' in source_text) == ('int sf_stride' in source_text) == col_major
    assert re.search(rf'\*\({load}\*\)\(x \+', source_text), f'no {load} load of x'
    # Pairs where the scale is a vector operand, else code by code (a UE8M0 scale's bits, a guarded short block).
    assert '__tl_cvt_fp8x2_to_float2' in source_text or '((float)x_local_cast[vec])' in source_text
    if source['packed_ue8m0']:
        assert '<< (uint)23' in source_text  # the UE8M0 byte as its fp32
    # A short last block: the tile's columns past H read no scale past x_sf's last (their products are discarded).
    assert (f'(int64_t){cfg.quantised_x.num_blocks - 1})' in source_text) == cfg.short_block
