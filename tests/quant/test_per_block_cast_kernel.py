"""per_block_cast, kernel level: configuration and lowering (CPU tier), the kernels called directly in their
argument order ((x, out, out_sf), (x, out_sf) or (x, sf, out) by mode) against the reference, bit-exact, for
e4m3 and FP4 (e2m1) data with fp32, power-of-two, UE8M0 and E4M3 scales (device tier: an accelerator, or the
Ascend kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant._scale_rules import UE8M0_PACK
from cann_ops_tilelang.quant.per_block_cast_kernel import (
    BLOCK_CHANNELS,
    BLOCK_TOKENS,
    MODES,
    PerBlockCastConfig,
    choose_per_block_cast_config,
    get_per_block_cast_kernel,
    make_per_block_cast_kernel,
)
from cann_ops_tilelang.quant.per_block_cast_kernel import (
    FORMATS as DATA_FORMATS,
)
from tests.quant.cast_ref import (
    e4m3_sf_ref,
    format_scale_and_inverse_ref,
    padded_hidden,
    per_token_cast_format_ref,
    per_token_cast_ref,
    scaled_rows,
)
from tests.quant.per_block_cast_ref import (
    block_amax_ref,
    expand_blocks,
    per_block_cast_precomputed_ref,
    per_block_cast_ref,
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

KERNEL_NAME = 'per_block_cast_kernel'
LEVEL = get_test_level()

# Scale formats (round_sf, packed_ue8m0, e4m3_sf): fp32 scales, fp32 powers of two (round_sf), UE8M0 bytes
# (round_sf + packed_ue8m0), E4M3 bytes (e4m3_sf).
FORMATS = {'fp32': (False, False, False), 'pow2': (True, False, False), 'ue8m0': (True, True, False),
           'e4m3': (False, False, True)}  # fmt: skip

# Level 0: every dtype, block size, scale format, output format and mode at least once, nine kernel
# configurations in all (each one compile, reused by every level-0 device test). The FP4 ones cover both shapes
# of the Ascend kernel's packing: an odd register column per task (bf16, 32 x 32 at hidden 1088: one 64-channel
# column) and pairs of them (fp32, 128 x 128 at hidden 1152: 128 channels). Level 1 the full product
# ('precomputed' reads fp32 or e4m3 scales).
_CORE_VARIANTS = [
    dict(in_dtype='bfloat16', block_tokens=32, block_channels=32, sf='ue8m0', mode='cast', fmt='e4m3'),
    dict(in_dtype='float32', block_tokens=128, block_channels=128, sf='fp32', mode='cast', fmt='e4m3'),
    dict(in_dtype='bfloat16', block_tokens=64, block_channels=64, sf='pow2', mode='sf_only', fmt='e4m3'),
    dict(in_dtype='float32', block_tokens=32, block_channels=64, sf='fp32', mode='precomputed', fmt='e4m3'),
    dict(in_dtype='bfloat16', block_tokens=32, block_channels=32, sf='ue8m0', mode='cast', fmt='e2m1'),
    dict(in_dtype='float32', block_tokens=128, block_channels=128, sf='e4m3', mode='precomputed', fmt='e2m1'),
    dict(in_dtype='bfloat16', block_tokens=64, block_channels=64, sf='e4m3', mode='cast', fmt='e4m3'),
    dict(in_dtype='float32', block_tokens=128, block_channels=128, sf='fp32', mode='cast', fmt='e2m1'),
    # NVFP4's 2-D weight blocks: 16 x 16, E4M3 scales (Ascend: one task of 17 register columns at hidden 1088)
    dict(in_dtype='bfloat16', block_tokens=16, block_channels=16, sf='e4m3', mode='cast', fmt='e2m1'),
]
# Level 1: e4m3 data on every block of 32, 64 and 128 and on 16 x 16; FP4 on NVFP4's 16 x 16, the peer's Ascend
# 32 x 32, DeepSeek-V3's 128 x 128 and a non-square block (the packing does not depend on the block).
_E4M3_BLOCKS = [(bt, bc) for bt in BLOCK_TOKENS for bc in BLOCK_CHANNELS if 16 not in (bt, bc)] + [(16, 16)]
_FP4_BLOCKS = [(16, 16), (32, 32), (128, 128), (32, 128)]
_ALL_VARIANTS = generate_samples(
    in_dtype=['bfloat16', 'float32'],
    block_tokens=list(BLOCK_TOKENS),
    block_channels=list(BLOCK_CHANNELS),
    sf=list(FORMATS),
    mode=list(MODES),
    fmt=list(DATA_FORMATS),
    where=lambda v: (
        (v['mode'] != 'precomputed' or v['sf'] in ('fp32', 'e4m3'))
        and (v['block_tokens'], v['block_channels']) in (_E4M3_BLOCKS if v['fmt'] == 'e4m3' else _FP4_BLOCKS)
    ),
)
VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS, default=_ALL_VARIANTS)
# Token counts: one token, partial last token blocks of every bt (67 = 2 * 32 + 3, 130 = 128 + 2), more tails.
NUM_TOKENS = by_level(LEVEL, core=(1, 67, 130), default=(3, 300), full=(4001,))
# Hidden sizes besides each variant's padded_hidden (a padded UE8M0 row, several column tiles): minimum, odd
# multiples of 64, production sizes. Lowered for the level-0 variants; the device tests take them from level 1.
HIDDEN = by_level(LEVEL, core=(256,), default=(128, 192, 7168), full=(4096, 5120, 16384))
# The largest tiles (the most UB / registers) at a production size: every dtype, bt and mode with bc = 32.
_WIDE_VARIANTS = by_level(
    LEVEL,
    core=(),
    default=generate_samples(
        in_dtype=['bfloat16', 'float32'], block_tokens=list(BLOCK_TOKENS), block_channels=[32], sf=['fp32'],
        mode=list(MODES), fmt=list(DATA_FORMATS),
    ),
)  # fmt: skip

ASC = dict(backend='ascend', num_cores=64)


def _config(backend: str, num_cores: int, variant: dict, hidden: int, col_major_sf: bool = False) -> PerBlockCastConfig:
    round_sf, packed, e4m3_sf = FORMATS[variant['sf']]
    return choose_per_block_cast_config(
        backend=backend,
        num_cores=num_cores,
        hidden=hidden,
        in_dtype=variant['in_dtype'],
        block_tokens=variant['block_tokens'],
        block_channels=variant['block_channels'],
        round_sf=round_sf,
        packed_ue8m0=packed,
        mode=variant['mode'],
        fmt=variant['fmt'],
        e4m3_sf=e4m3_sf,
        col_major_sf=col_major_sf,
    )


def _fits(variant: dict, hidden: int) -> bool:
    return hidden % max(64, variant['block_channels']) == 0


def _lowering_cases() -> list[dict]:
    cases = [dict(variant=v, hidden=padded_hidden(v['block_channels'])) for v in VARIANTS]
    cases += [dict(variant=v, hidden=h) for v in _CORE_VARIANTS for h in HIDDEN if _fits(v, h)]
    cases += [dict(variant=v, hidden=7168) for v in _WIDE_VARIANTS]
    return cases


# Device tests of more hidden sizes, from level 1 (each a kernel configuration of its own): the level-0 variants.
_HIDDEN_CASES = [
    dict(variant=v, hidden=h) for v in _CORE_VARIANTS for h in by_level(LEVEL, core=(), default=HIDDEN) if _fits(v, h)
]


def _case_id(case: dict) -> str:
    return make_param_id({**case['variant'], 'hidden': case['hidden']})


# ---------------------------------------------------------------- CPU tier: configuration


def test_per_block_cast_config_is_pure_and_hashable():
    a = choose_per_block_cast_config(**ASC, hidden=7168, in_dtype=torch.bfloat16)
    b = choose_per_block_cast_config(**ASC, hidden=7168, in_dtype='bfloat16')
    assert a == b
    assert hash(a) == hash(b)
    assert (a.block_tokens, a.block_channels, a.mode) == (32, 32, 'cast')  # the defaults: TileKernels' Ascend block
    assert (a.num_blocks, a.sf_cols, a.sf_padding, a.sf_dtype) == (224, 224, 0, 'float32')
    assert a.sf_shape(67) == (3, 224)
    assert a.sf_shape(64) == (2, 224)
    assert 7168 % a.block_k == 0
    assert a.block_k % 64 == 0
    assert a.block_tokens * a.block_k * 2 <= 64 * 1024  # the Ascend tile budget
    c = choose_per_block_cast_config(
        backend='cuda', num_cores=132, hidden=1088, in_dtype=torch.float32, block_tokens=64, block_channels=32,
        round_sf=True, packed_ue8m0=True,
    )  # fmt: skip
    assert (c.num_blocks, c.sf_pack, c.sf_cols, c.sf_padding, c.sf_dtype) == (34, 4, 36, 2, 'uint8')
    assert c.sf_shape(1) == (1, 36)
    d = dataclasses.replace(c, backend='ascend', threads=0, num_stages=2)
    assert (d.sf_cols, d.sf_padding) == (36, 2)  # the same bytes on both backends


@pytest.mark.parametrize('variant', _ALL_VARIANTS, ids=make_param_id)
def test_per_block_cast_cuda_config_tiles_the_block(variant):
    """CUDA: a thread holds 16 channels of rows_per_thread rows; the threads cover the thread block's tile once."""
    for hidden in (padded_hidden(variant['block_channels']), 4096, 7168):
        cfg = _config('cuda', H200_SMS, variant, hidden)
        assert cfg.threads_per_row * 16 == cfg.block_k
        assert cfg.threads * cfg.rows_per_thread * 16 == cfg.block_tokens * cfg.block_k
        assert cfg.rows_per_pass * cfg.rows_per_thread == cfg.block_tokens
        assert min(128, cfg.block_tokens * cfg.block_k // 16) <= cfg.threads <= 256
        assert hidden % cfg.block_k == 0
        assert cfg.block_k % cfg.block_channels == 0
        if hidden == 7168:  # 32 KiB of x per thread block at production sizes, or one channel block if wider
            size = 2 if variant['in_dtype'] == 'bfloat16' else 4
            unit = cfg.block_tokens * max(64, cfg.block_channels) * size
            widest = cfg.block_tokens * 32 * 16 * size  # a warp across a row (16-token blocks: 16 KiB of bf16)
            assert cfg.block_tokens * cfg.block_k * size == max(min(32 * 1024, widest), unit)


def test_per_block_cast_config_precomputed_drops_round_sf():
    """The peer's precomputed-scale path takes 1 / sf whatever round_sf says: one kernel for both."""
    kw = dict(**ASC, hidden=256, in_dtype='float32', mode='precomputed')
    assert choose_per_block_cast_config(**kw, round_sf=True) == choose_per_block_cast_config(**kw)
    cfg = choose_per_block_cast_config(**kw, round_sf=True)
    assert not cfg.round_sf
    assert (cfg.writes_data, cfg.computes_sf) == (True, False)
    with pytest.raises(ValueError, match='round_sf does not apply'):
        dataclasses.replace(cfg, round_sf=True)
    sf_only = choose_per_block_cast_config(**{**kw, 'mode': 'sf_only'}, round_sf=True)
    assert sf_only.round_sf
    assert (sf_only.writes_data, sf_only.computes_sf) == (False, True)


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(backend='cpu'), 'backend'),
        (dict(in_dtype=torch.float16), 'in_dtype'),
        (dict(block_tokens=8), 'block_tokens'),
        (dict(block_tokens=256), 'block_tokens'),
        (dict(block_channels=8), 'block_channels'),
        (dict(hidden=96), 'multiple of 64'),
        (dict(hidden=192, block_channels=128), 'multiple of 128'),
        (dict(hidden=0), 'positive multiple'),
        (dict(packed_ue8m0=True), 'needs round_sf'),
        (dict(mode='cast_only'), 'mode'),
        (dict(mode='precomputed', round_sf=True, packed_ue8m0=True), 'packed_ue8m0 is not supported'),
    ],
)
def test_per_block_cast_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, hidden=256, in_dtype=torch.bfloat16) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_per_block_cast_config(**args)


@pytest.mark.parametrize(
    ('backend', 'change', 'match'),
    [
        ('ascend', dict(block_k=192), 'block_k 192 must be a multiple of 64 dividing hidden 1024'),
        ('ascend', dict(block_k=0), 'block_k'),
        ('ascend', dict(block_tokens=128, block_k=512), 'exceeds 65536 bytes'),
        ('ascend', dict(num_cores=0), 'num_cores'),
        ('ascend', dict(num_stages=0), 'num_stages'),
        ('cuda', dict(block_k=1024), r'power of two <= 32'),
        ('cuda', dict(block_k=192, hidden=192 * 4), r'power of two'),
        ('cuda', dict(threads=48), 'multiple of 32'),
        ('cuda', dict(threads=2048), r'in \[32, 1024\]'),
        ('cuda', dict(threads=96), 'cover 3 rows per pass, which must divide block_tokens 32'),
    ],
)
def test_per_block_cast_config_validates_direct_construction(backend, change, match):
    base = choose_per_block_cast_config(backend=backend, num_cores=64, hidden=1024, in_dtype='bfloat16')
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(base, **change)


def test_reference_hand_values():
    """A block with maximum 448 has scale 1, 896 scale 2; the partial last token block's maximum is over its rows
    only; -0.0 keeps its sign; the UE8M0 byte is the scale's exponent + 127, the row zero-padded to 4 bytes."""
    x = torch.zeros(40, 64)
    x[:32, :32] = torch.linspace(-448, 448, 32 * 32).reshape(32, 32)
    x[:32, 32:] = 2 * x[:32, :32]
    x[32:, :32] = -0.0
    x[32:, 32:] = 1.0
    x[39, 63] = -1.0
    out, sf = per_block_cast_ref(x, 32, 32)
    assert sf.shape == (2, 2)
    assert sf[0].tolist() == [1.0, 2.0]
    assert torch.equal(out[:32, :32].float(), x[:32, :32].to(torch.float8_e4m3fn).float())
    assert torch.equal(out[:32, 32:].float(), out[:32, :32].float())
    assert sf[1, 0].item() == pytest.approx(1e-4 / 448, rel=1e-6)  # all-zero block: the amax floor
    assert out[32:, :32].view(torch.uint8).eq(0x80).all()  # -0.0 keeps its sign
    assert sf[1, 1].item() == pytest.approx(1 / 448, rel=1e-6)  # the 8 rows that exist, not 32
    assert out[32:39, 32:].float().eq(448.0).all()
    assert out[39, 63].float().item() == -448.0
    _, packed = per_block_cast_ref(x, 32, 32, round_sf=True, packed_ue8m0=True)
    assert packed.dtype == torch.uint8
    assert packed.shape == (2, 4)
    assert packed[0].tolist() == [127, 128, 0, 0]  # scales 1 and 2, zero padding
    assert packed[1, 1].item() == 127 - 8  # 1 / 448 rounds up to 2**-8
    # 64-token blocks: one partial block holding all 40 rows.
    _, sf64 = per_block_cast_ref(x, 64, 64)
    assert sf64.tolist() == [[2.0]]


def test_reference_per_token_blocks_match_per_token_cast():
    """With one token per block the reference is per_token_cast's (an independent oracle of the same rule), for
    every output and scale format."""
    x = scaled_rows(37, 256, 'bfloat16', 'cpu')
    for fmt in DATA_FORMATS:
        for round_sf, packed, e4m3_sf in FORMATS.values():
            options = dict(round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
            out, sf = per_block_cast_ref(x, 1, 64, fmt, **options)
            ref_out, ref_sf = per_token_cast_format_ref(x, 64, fmt, **options)
            assert_equal(out.view(torch.uint8), ref_out.view(torch.uint8))
            assert_equal(sf.view(torch.uint8), ref_sf.view(torch.uint8))
    # The e4m3 path is also the first per-token oracle's.
    out, sf = per_block_cast_ref(x, 1, 64, round_sf=True, packed_ue8m0=True)
    ref_out, ref_sf = per_token_cast_ref(x, 64, round_sf=True, packed_ue8m0=True)
    assert_equal(out.view(torch.uint8), ref_out.view(torch.uint8))
    assert_equal(sf, ref_sf)
    # A 2-D block's maximum is the maximum of its rows' maxima.
    amax = block_amax_ref(x, 32, 64)
    rows = x.float().abs().reshape(37, 4, 64).amax(dim=-1)
    assert torch.equal(amax[0], rows[:32].amax(dim=0))
    assert torch.equal(amax[1], rows[32:].amax(dim=0))


def test_reference_precomputed_special_scales():
    """inverse = 1 / sf: a scale of 0 saturates finite values (zeros become NaN), inf zeroes them; others round."""
    x = torch.tensor([[1.0, -0.0, 3.0, 448.0] * 16])
    sf = torch.tensor([[0.0]])
    out = per_block_cast_precomputed_ref(x, sf, 32, 64).float()
    assert out[0, 0].item() == 448.0
    assert out[0, 1].isnan()
    sf = torch.tensor([[float('inf')]])
    assert per_block_cast_precomputed_ref(x, sf, 32, 64).view(torch.uint8)[0, :4].tolist() == [0, 0x80, 0, 0]
    sf = torch.tensor([[0.5]])
    assert per_block_cast_precomputed_ref(x, sf, 32, 64).float()[0, :4].tolist() == [2.0, -0.0, 6.0, 448.0]
    with pytest.raises(TypeError, match='float32'):
        per_block_cast_precomputed_ref(x, sf.double(), 32, 64)


def test_reference_hand_values_fp4_and_e4m3_scales():
    """FP4: a 2-D block with maximum 6 has scale 1, its values round on the e2m1 grid (ties to even) and pack two a
    byte, the low nibble first; the all-zero block gets FP4's floor 6 * 2**-126 / 6. E4M3 scales: c / m to nearest
    even e4m3, saturating at 448, and the data is x * (1 / fp32(sf))."""
    x = torch.zeros(40, 64)
    x[:32, :32] = 1.25  # a tie between 1 and 1.5: the even code (1.0)
    x[0, 0] = 6.0
    x[1, :4] = torch.tensor([-0.0, 0.25, 0.75, -5.0])  # -0, ties: to 0, to 1, to -4 (codes 0, 2, 6 even)
    x[32:, 32:] = 3.0  # the partial last token block: its 8 rows only
    data, sf = per_block_cast_ref(x, 32, 32, 'e2m1')
    assert (data.shape, data.dtype) == ((40, 32), torch.int8)
    assert sf.tolist()[0][0] == 1.0
    assert sf[0, 1].item() == 2.0**-126  # all-zero block: FP4's floor
    assert sf[1, 1].item() == 0.5
    codes = data.view(torch.uint8)
    assert codes[0, 0].item() == 0x27  # 6.0 (code 7) then 1.25 -> 1.0 (code 2)
    assert codes[1, :2].tolist() == [0x08, 0xE2]  # (-0, 0.25 -> 0), (0.75 -> 1.0, -5 -> -4)
    assert codes[2, :16].eq(0x22).all()
    assert codes[32:, 16:].eq(0x77).all()  # 3.0 at scale 0.5: 6
    given = torch.tensor([[0.25, 0.5], [1.0, 0.5]])  # x * 4 = 5 (a tie to 4) and 7 (past 6: saturates)
    codes = per_block_cast_precomputed_ref(x, given, 32, 32, 'e2m1').view(torch.uint8)
    assert codes[2, 0].item() == 0x66
    assert codes[0, 0].item() == 0x67  # 6 * 4 = 24 -> 6, then 5 -> 4
    data, sf = per_block_cast_ref(x, 32, 32, 'e2m1', e4m3_sf=True)
    assert sf.dtype == torch.float8_e4m3fn
    assert sf.float()[0].tolist() == [1.0, 2.0**-9]  # all-zero block: E4M3's smallest scale
    assert torch.equal(data[:2], per_block_cast_ref(x, 32, 32, 'e2m1')[0][:2])  # scale 1 either way
    y = torch.full((32, 64), 3e5)
    y[:, 32:] = 3.0
    _, sf = per_block_cast_ref(y, 32, 32, 'e4m3', e4m3_sf=True)
    rounded = e4m3_sf_ref(torch.tensor([3.0]) / torch.tensor([448.0])).float().item()
    assert sf.float()[0].tolist() == [448.0, rounded]  # the first saturated
    assert rounded != 3.0 / 448
    data = per_block_cast_precomputed_ref(y, sf, 32, 32)
    assert data.float()[0, 0].item() == 448.0  # 3e5 / 448 past e4m3's range: clamped


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_block_cast_ascend_lowers(case):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    assert cfg.backend == 'ascend'
    assert cfg.num_stages == 2
    lowered = assert_ascend_kernel_lowers(lambda: make_per_block_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert ('vcmax' in lowered.source) == cfg.computes_sf  # the block maxima: computed, or read
    # e4m3 data: one conversion per register; FP4: codes by compares, two registers deinterleaved per store.
    assert ('vsts_pack_quarter(simd_inst::vcvt<fp8_e4_t>' in lowered.source) == (cfg.writes_data and not cfg.fp4)
    assert ('vdintlv' in lowered.source) == (cfg.writes_data and cfg.fp4)


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_block_cast_cuda_lowers(case):
    cfg = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    lowered = assert_cuda_kernel_lowers(lambda: make_per_block_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    source = lowered.source
    vector = 'uint4' if cfg.in_dtype == 'bfloat16' else 'float4'
    assert f'*({vector}*)(x + ' in source  # x read in 16-byte vectors
    # The fp8 conversion saturates at +-448, as the reference clamps; each row's 16 fp8 bytes in one store. FP4:
    # codes by compares (no conversion on sm_90), each row's 8 bytes in one store.
    assert ('*(fp8_e4_16_t*)(out + ' in source) == (cfg.writes_data and not cfg.fp4)
    assert ('*(int2*)(out + ' in source) == (cfg.writes_data and cfg.fp4)
    assert ('__syncthreads' in source) == cfg.computes_sf  # one barrier, and none when the scales are read
    # The IEEE reciprocal of a read scale, or of a computed E4M3 scale.
    assert ('__frcp_rn' in source) == (not cfg.computes_sf or cfg.e4m3_sf)


# ---------------------------------------------------------------- device tier


def _poisoned_out(cfg: PerBlockCastConfig, num_tokens: int, device) -> torch.Tensor:
    """0x7F bytes: e4m3 NaN, FP4 codes (7, 7): a byte the kernel skipped shows."""
    data = torch.full((num_tokens, cfg.data_cols), 0x7F, dtype=torch.uint8, device=device)
    return data.view(getattr(torch, cfg.data_dtype))


def _poisoned_sf(cfg: PerBlockCastConfig, num_tokens: int, device) -> torch.Tensor:
    if cfg.sf_dtype == 'uint8':
        return torch.full(cfg.sf_shape(num_tokens), 0xA5, dtype=torch.uint8, device=device)  # padding must become 0
    if cfg.sf_dtype == 'float8_e4m3fn':
        return torch.full(cfg.sf_shape(num_tokens), 0x7F, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    return torch.full(cfg.sf_shape(num_tokens), float('nan'), device=device)


def _precomputed_scales(x: torch.Tensor, variant: dict) -> torch.Tensor:
    """Scales for mode 'precomputed': the computed ones times random factors in [1/4, 4), so that some blocks
    overflow the format (saturation) and others are not powers of two or c / m (the reciprocal's rounding); E4M3
    scales rounded to e4m3 again."""
    e4m3_sf = FORMATS[variant['sf']][2]
    _, sf = per_block_cast_ref(x, variant['block_tokens'], variant['block_channels'], variant['fmt'], e4m3_sf=e4m3_sf)
    scaled = sf.float() * torch.exp2(torch.rand(sf.shape) * 4 - 2)
    return e4m3_sf_ref(scaled) if e4m3_sf else scaled


def _run(x: torch.Tensor, variant: dict, device, sf: torch.Tensor | None = None):
    """(out or None, sf written or read, cfg) of the kernel of `variant` on x (on `device`)."""
    backend = backend_of(device)
    cfg = _config(backend, get_num_cores(device), variant, x.shape[1])
    num_tokens = x.shape[0]
    if cfg.mode == 'precomputed':
        out = _poisoned_out(cfg, num_tokens, device)
        given = sf.to(device, copy=True)  # a copy also on the CPU (the emulator), to see it left unchanged
        launch_kernel(get_per_block_cast_kernel, cfg, device, x, given, out)
        return out, given, cfg
    out_sf = _poisoned_sf(cfg, num_tokens, device)
    if cfg.mode == 'sf_only':
        launch_kernel(get_per_block_cast_kernel, cfg, device, x, out_sf)
        return None, out_sf, cfg
    out = _poisoned_out(cfg, num_tokens, device)
    launch_kernel(get_per_block_cast_kernel, cfg, device, x, out, out_sf)
    return out, out_sf, cfg


def _reference(x: torch.Tensor, variant: dict, cfg: PerBlockCastConfig, sf: torch.Tensor | None):
    bt, bc, fmt = variant['block_tokens'], variant['block_channels'], variant['fmt']
    if variant['mode'] == 'precomputed':
        return per_block_cast_precomputed_ref(x, sf, bt, bc, fmt), sf
    round_sf, packed, e4m3_sf = FORMATS[variant['sf']]
    return per_block_cast_ref(
        x, bt, bc, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf, ue8m0_pack=cfg.sf_pack
    )


def _check(x: torch.Tensor, variant: dict, device) -> None:
    sf_in = _precomputed_scales(x, variant) if variant['mode'] == 'precomputed' else None
    out, sf, cfg = _run(x.to(device), variant, device, sf_in)
    ref_out, ref_sf = _reference(x, variant, cfg, sf_in)
    assert_equal(sf.cpu().view(torch.uint8), ref_sf.view(torch.uint8))
    if cfg.writes_data:
        assert_equal(out.cpu().view(torch.uint8), ref_out.view(torch.uint8))


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_block_cast_kernel_values(variant, num_tokens, device):
    hidden = padded_hidden(variant['block_channels'])
    _check(scaled_rows(num_tokens, hidden, variant['in_dtype'], 'cpu'), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('case', _HIDDEN_CASES, ids=_case_id)
def test_per_block_cast_kernel_hidden_sizes(case, device):
    variant = case['variant']
    _check(scaled_rows(variant['block_tokens'] + 5, case['hidden'], variant['in_dtype'], 'cpu'), variant, device)


def _special_input(variant: dict, num_tokens: int, hidden: int) -> torch.Tensor:
    """Per channel block k: k = 0 all -0.0, 1 all +0.0, 2 subnormal-sized values, 3 one +inf in the last row
    (a partial token block for bt = 32), 4 one -inf in the first row; the rest from a pool of signed zeros,
    subnormals, e4m3 ties and values from 1e-30 to 1e30."""
    bc = variant['block_channels']
    dtype = getattr(torch, variant['in_dtype'])
    tiny = torch.finfo(dtype).tiny
    pool = torch.tensor([0.0, -0.0, tiny, -tiny / 4, 1.0, -1.0625, 1.1875, 3.0, -448.0, 1e-30, 1e30])
    x = pool[torch.randint(len(pool), (num_tokens, hidden))].to(dtype)
    x[:, :bc] = -0.0
    x[:, bc : 2 * bc] = 0.0
    x[:, 2 * bc : 3 * bc] = tiny * torch.arange(bc)
    x[-1, 3 * bc + 5] = float('inf')
    x[0, 4 * bc + 1] = -float('inf')
    return x


def _nan_products(x: torch.Tensor, variant: dict, sf: torch.Tensor | None) -> torch.Tensor:
    """Where x * inverse is NaN (an inf times a zero inverse, a zero times an inverse inf, or an inverse NaN), as a
    mask of the data's bytes (FP4: a byte holds two elements): the NaN's sign is the hardware's, unspecified by the
    contract, so there the data is compared without its sign bits."""
    bt, bc, fmt = variant['block_tokens'], variant['block_channels'], variant['fmt']
    if sf is None:
        round_sf, packed, e4m3_sf = FORMATS[variant['sf']]
        amax = block_amax_ref(x, bt, bc)
        _, inverse = format_scale_and_inverse_ref(amax, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
    else:
        inverse = torch.ones(sf.shape) / sf.float()
    nan = torch.isnan(x.float() * expand_blocks(inverse, x.shape[0], bt, bc))
    return nan.reshape(x.shape[0], -1, 2).any(dim=-1) if fmt == 'e2m1' else nan


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_block_cast_kernel_special_values(variant, device):
    """Signed zeros, all-zero blocks (the amax floor), bf16/fp32 subnormals, e4m3 / e2m1 ties, values past the
    format's range and infinities: the block of an inf gets scale inf (E4M3 scales: 448), its finite values +-0 and
    the inf NaN (FP4: +-6; E4M3 scales: the inf saturates). Mode 'precomputed' also gets scales of 0 (finite
    values saturate, zeros become NaN / FP4 +-6), inf (fp32; e4m3 has none: its largest) and tiny ones."""
    hidden = padded_hidden(variant['block_channels'])
    num_tokens = 37  # one full and one partial token block for bt = 32, one partial block otherwise
    x = _special_input(variant, num_tokens, hidden)
    fp4, e4m3_sf = variant['fmt'] == 'e2m1', FORMATS[variant['sf']][2]
    if fp4:
        x[1, -8:] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0]).to(x.dtype)  # e2m1 ties, past 6
    sf_in = None
    if variant['mode'] == 'precomputed':
        sf_in = _precomputed_scales(x, variant)
        sf_in[0, 5] = 0.0
        sf_in[0, 6] = 448.0 if e4m3_sf else float('inf')
        sf_in[-1, 7] = 2.0**-9 if e4m3_sf else 1e-30
    out, sf, cfg = _run(x.to(device), variant, device, sf_in)
    ref_out, ref_sf = _reference(x, variant, cfg, sf_in)
    assert_equal(sf.cpu().view(torch.uint8), ref_sf.view(torch.uint8))
    if variant['mode'] != 'precomputed':
        rows = cfg.sf_shape(num_tokens)[0]
        inf_scales = [ref_sf[rows - 1, 3], ref_sf[0, 4]]
        if cfg.packed_ue8m0:
            assert all(s.item() == 0xFF for s in inf_scales)
        else:
            assert all(s.float().item() == (448.0 if e4m3_sf else float('inf')) for s in inf_scales)
    if not cfg.writes_data:
        return
    # Every byte exact; those of NaN products without their sign bits (e4m3 0x80, FP4 0x88).
    got, want = out.cpu().view(torch.uint8), ref_out.view(torch.uint8)
    nan = _nan_products(x, variant, sf_in)
    sign = 0x88 if fp4 else 0x80
    assert_equal(torch.where(nan, got & (0xFF ^ sign), got), torch.where(nan, want & (0xFF ^ sign), want))
    if fp4:
        if e4m3_sf and variant['mode'] == 'cast':
            assert not nan.any()  # an inf's block has scale 448: no zero inverse
        six = ((want & 0x07) == 0x07) | ((want & 0x70) == 0x70)  # +-6 (code 7) in either nibble
        assert six.any()  # a block maximum, an inf, a NaN product
    elif variant['mode'] == 'precomputed':
        assert int(nan.sum()) > 2  # the infinities (scale inf: inverse 0), and zeros times inverse inf
        assert (want == 0x7E).any()  # +448: saturated
        assert (want == 0xFE).any()  # -448
    elif e4m3_sf:
        assert not nan.any()  # an inf's block has scale 448: the inf saturates
        assert (want == 0x7E).any()
        assert (want == 0xFE).any()
    else:
        assert int(nan.sum()) == 2  # the two infinities
    bc = variant['block_channels']
    zeros = slice(0, bc // 2 if fp4 else bc)  # -0.0 keeps its sign (FP4: code 8, twice a byte), but for a zero
    assert want[:, zeros][~nan[:, zeros]].eq(sign).all()  # given E4M3 scale (-0 * inf: NaN)


# ---------------------------------------------------------------- column-major scales (col_major_sf)

# The configurations of test_per_block_cast.py's level-0 column-major values (hidden padded_hidden(bc)): UE8M0
# bytes of a padded row cut into tasks of 2 blocks (bf16, 32 x 32: on Ascend 17 tasks of 64 channels, words shared
# between tasks: one DMA per byte) and E4M3 scales of FP4 data (fp32, NVFP4's 16 x 16). Level 1 lowers whole-word
# UE8M0 tasks, fp32 and power-of-two scales and the scales alone.
_COL_MAJOR_CORE = [
    dict(in_dtype='bfloat16', block_tokens=32, block_channels=32, sf='ue8m0', mode='cast', fmt='e4m3'),
    dict(in_dtype='float32', block_tokens=16, block_channels=16, sf='e4m3', mode='cast', fmt='e2m1'),
]
_COL_MAJOR_LOWERING = by_level(
    LEVEL,
    core=[(v, padded_hidden(v['block_channels'])) for v in _COL_MAJOR_CORE],
    default=[
        *[(v, padded_hidden(v['block_channels'])) for v in _COL_MAJOR_CORE],
        (dict(in_dtype='bfloat16', block_tokens=32, block_channels=32, sf='ue8m0', mode='cast', fmt='e4m3'), 7168),
        (dict(in_dtype='bfloat16', block_tokens=128, block_channels=128, sf='ue8m0', mode='cast', fmt='e4m3'), 7168),
        (dict(in_dtype='bfloat16', block_tokens=128, block_channels=128, sf='fp32', mode='cast', fmt='e4m3'), 1152),
        (dict(in_dtype='float32', block_tokens=64, block_channels=64, sf='pow2', mode='cast', fmt='e2m1'), 1088),
        (dict(in_dtype='float32', block_tokens=32, block_channels=64, sf='ue8m0', mode='sf_only', fmt='e2m1'), 1088),
        (dict(in_dtype='bfloat16', block_tokens=16, block_channels=16, sf='e4m3', mode='sf_only', fmt='e4m3'), 1088),
    ],
)


def _lowering_id(value) -> str | None:
    return make_param_id(value) if isinstance(value, dict) else None


def test_per_block_cast_config_col_major():
    """The layout is a configuration field of its own; on Ascend, a task of column-major UE8M0 scales holds whole
    int32 words where such a task fits the x buffer (else the kernel stores its bytes one by one); given scales are
    read row-major only."""
    args = dict(num_cores=64, in_dtype='bfloat16', round_sf=True, packed_ue8m0=True)
    rows = choose_per_block_cast_config(backend='ascend', hidden=768, block_tokens=64, block_channels=64, **args)
    cols = dataclasses.replace(rows, col_major_sf=True)
    assert cols.col_major_sf
    assert not rows.col_major_sf
    assert cols != rows
    assert hash(cols) != hash(rows)
    assert (rows.block_k, rows.groups_per_tile) == (384, 6)  # 64 x 384 bf16: the widest task, 1.5 words
    chosen = choose_per_block_cast_config(
        backend='ascend', hidden=768, block_tokens=64, block_channels=64, col_major_sf=True, **args
    )
    assert (chosen.block_k, chosen.groups_per_tile) == (256, 4)  # the widest whole-word task
    # 128 x 128 bf16: a word (512 channels) is past the 64 KiB x tile; tasks of 2 blocks, their bytes one by one
    deep = choose_per_block_cast_config(
        backend='ascend', hidden=7168, block_tokens=128, block_channels=128, col_major_sf=True, **args
    )
    assert (deep.block_k, deep.groups_per_tile) == (256, 2)
    # padded rows (34 blocks of 32): no whole-word task but the row, past the tile; the row-major choice
    padded = dict(backend='ascend', hidden=1088, block_tokens=32, block_channels=32, **args)
    assert choose_per_block_cast_config(**padded, col_major_sf=True).block_k == (
        choose_per_block_cast_config(**padded).block_k
    )
    cuda = dict(backend='cuda', num_cores=132, hidden=768, in_dtype='bfloat16', block_tokens=64, block_channels=64)
    assert choose_per_block_cast_config(**cuda, col_major_sf=True) == dataclasses.replace(
        choose_per_block_cast_config(**cuda), col_major_sf=True
    )  # CUDA stores the scales one by one either way: the same tiling
    with pytest.raises(ValueError, match='mode "precomputed" reads row-major scales'):
        choose_per_block_cast_config(**cuda, mode='precomputed', col_major_sf=True)


_SF_DMA = re.compile(
    r'asc_copy_ub2gm_align\(\(__gm__ uint8_t\*\)\(\(&\(out_sf\[[^;]*, (\d+), (\d+), '
    r'static_cast<asc_store_l2_cache_mode>\(\d+\), ([^,;]+), (\d+)\);'
)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(('variant', 'hidden'), _COL_MAJOR_LOWERING, ids=_lowering_id)
def test_per_block_cast_col_major_lowers(backend, variant, hidden):
    """Both kernels write the column-major scales themselves, the row stride a launch argument: on CUDA one store
    per scale (UE8M0: per byte) at k * stride + b; on Ascend one DMA per task whose bursts are single scales (fp32
    4 bytes, E4M3 1 byte) or UE8M0 words, stored a row stride apart, or (UE8M0 tasks of part words) one DMA per
    byte."""
    cfg = _config(backend, ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, variant, hidden, True)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_per_block_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    if backend == 'cuda':
        assert 'int sf_stride' in source
        return
    dmas = _SF_DMA.findall(source)
    sf_bytes = 1 if cfg.sf_dtype in ('uint8', 'float8_e4m3fn') else 4
    if cfg.packed_ue8m0 and cfg.groups_per_tile % UE8M0_PACK and cfg.num_col_tiles > 1:
        ((n_burst, len_burst, _, _),) = dmas  # in a loop over the task's bytes
        assert (int(n_burst), int(len_burst)) == (1, 1)
        return
    ((n_burst, len_burst, gm_stride, ub_stride),) = dmas
    burst = UE8M0_PACK if cfg.packed_ue8m0 else sf_bytes
    bursts = (cfg.groups_per_tile + cfg.sf_padding) * sf_bytes // burst  # a task's scales, or its words
    assert (int(n_burst), int(len_burst), int(ub_stride)) == (bursts, burst, burst)
    assert bursts == 1 or 'sf_stride' in gm_stride  # one scale a task (bc = 128): no stride to take


@pytest.mark.npu
@pytest.mark.parametrize('variant', _COL_MAJOR_CORE, ids=make_param_id)
@pytest.mark.parametrize(('num_tokens', 'stride'), [(1, 4), (37, 16)])
def test_per_block_cast_kernel_col_major_row_stride(variant, num_tokens, stride, device):
    """The kernel writes the transposed scales at any row stride >= ceil(T / bt): TileKernels' CUDA padding on
    every backend (1 or 3 token blocks in a row of 4 words / 16 bytes: on the emulator the Ascend kernel meets a
    padded stride too), each scale once, the padding columns untouched; the data as the row-major kernel writes
    it."""
    x = scaled_rows(num_tokens, padded_hidden(variant['block_channels']), variant['in_dtype'], 'cpu')
    cfg = _config(backend_of(device), get_num_cores(device), variant, x.shape[1], col_major_sf=True)
    ref_out, ref_sf = _reference(x, variant, cfg, None)  # (R, sf_cols), UE8M0 as bytes
    blocks = ref_sf.shape[0]
    ref_bytes = ref_sf.view(torch.uint8)
    # rows of the transposed scales, and the bytes of a block in a row: a UE8M0 word, or one scale
    rows, width = (cfg.sf_cols // UE8M0_PACK, UE8M0_PACK) if cfg.packed_ue8m0 else (cfg.sf_cols, ref_sf.element_size())
    image = ref_bytes.reshape(blocks, rows, width).permute(1, 0, 2).reshape(rows, width * blocks).contiguous()
    buffer = torch.full((rows, width * stride), 0xA5, dtype=torch.uint8, device=device)
    sf = buffer[:, : width * blocks]
    if not cfg.packed_ue8m0:
        sf = sf.view(getattr(torch, cfg.sf_dtype))
    out = _poisoned_out(cfg, num_tokens, device)
    launch_kernel(get_per_block_cast_kernel, cfg, device, x.to(device), out, sf)
    assert_equal(buffer[:, : width * blocks].cpu().contiguous(), image)
    assert buffer[:, width * blocks :].eq(0xA5).all()
    assert_equal(out.cpu().view(torch.uint8), ref_out.view(torch.uint8))
