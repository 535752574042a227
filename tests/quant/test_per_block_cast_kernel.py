"""per_block_cast, kernel level (no public interface yet): configuration and lowering (CPU tier), the kernels
called directly in their argument order ((x, out, out_sf), (x, out_sf) or (x, sf, out) by mode) against the
reference, bit-exact (device tier: an accelerator, or the Ascend kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.per_block_cast_kernel import (
    BLOCK_CHANNELS,
    BLOCK_TOKENS,
    MODES,
    PerBlockCastConfig,
    choose_per_block_cast_config,
    get_per_block_cast_kernel,
    make_per_block_cast_kernel,
)
from tests.quant.cast_ref import padded_hidden, per_token_cast_ref, scaled_rows
from tests.quant.per_block_cast_ref import block_amax_ref, per_block_cast_precomputed_ref, per_block_cast_ref
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

# Scale formats: fp32 scales, fp32 powers of two (round_sf), UE8M0 bytes (round_sf + packed_ue8m0).
FORMATS = {'fp32': (False, False), 'pow2': (True, False), 'ue8m0': (True, True)}

# Level 0: every dtype, block size, format and mode at least once, four kernel configurations in all (each one
# compile, reused by every level-0 device test); level 1 the full product ('precomputed' reads fp32 scales only).
_CORE_VARIANTS = [
    dict(in_dtype='bfloat16', block_tokens=32, block_channels=32, sf='ue8m0', mode='cast'),
    dict(in_dtype='float32', block_tokens=128, block_channels=128, sf='fp32', mode='cast'),
    dict(in_dtype='bfloat16', block_tokens=64, block_channels=64, sf='pow2', mode='sf_only'),
    dict(in_dtype='float32', block_tokens=32, block_channels=64, sf='fp32', mode='precomputed'),
]
_ALL_VARIANTS = generate_samples(
    in_dtype=['bfloat16', 'float32'],
    block_tokens=list(BLOCK_TOKENS),
    block_channels=list(BLOCK_CHANNELS),
    sf=list(FORMATS),
    mode=list(MODES),
    where=lambda v: v['mode'] != 'precomputed' or v['sf'] == 'fp32',
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
        mode=list(MODES),
    ),
)  # fmt: skip

ASC = dict(backend='ascend', num_cores=64)


def _config(backend: str, num_cores: int, variant: dict, hidden: int) -> PerBlockCastConfig:
    round_sf, packed = FORMATS[variant['sf']]
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
        assert 128 <= cfg.threads <= 256
        assert hidden % cfg.block_k == 0
        assert cfg.block_k % cfg.block_channels == 0
        if hidden == 7168:  # 32 KiB of x per thread block at production sizes, or one channel block if wider
            size = 2 if variant['in_dtype'] == 'bfloat16' else 4
            unit = cfg.block_tokens * max(64, cfg.block_channels) * size
            assert cfg.block_tokens * cfg.block_k * size == max(32 * 1024, unit)


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
        (dict(block_tokens=16), 'block_tokens'),
        (dict(block_tokens=256), 'block_tokens'),
        (dict(block_channels=16), 'block_channels'),
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
    """With one token per block the reference is per_token_cast's (an independent oracle of the same rule)."""
    x = scaled_rows(37, 256, 'bfloat16', 'cpu')
    for round_sf, packed in FORMATS.values():
        out, sf = per_block_cast_ref(x, 1, 64, round_sf=round_sf, packed_ue8m0=packed)
        ref_out, ref_sf = per_token_cast_ref(x, 64, round_sf=round_sf, packed_ue8m0=packed)
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


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_block_cast_ascend_lowers(case):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    assert cfg.backend == 'ascend'
    assert cfg.num_stages == 2
    lowered = assert_ascend_kernel_lowers(lambda: make_per_block_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert ('vcmax' in lowered.source) == cfg.computes_sf  # the block maxima: computed, or read
    assert ('vsts_pack_quarter(simd_inst::vcvt<fp8_e4_t>' in lowered.source) == cfg.writes_data


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_block_cast_cuda_lowers(case):
    cfg = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    lowered = assert_cuda_kernel_lowers(lambda: make_per_block_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    source = lowered.source
    vector = 'uint4' if cfg.in_dtype == 'bfloat16' else 'float4'
    assert f'*({vector}*)(x + ' in source  # x read in 16-byte vectors
    # The fp8 conversion saturates at +-448, as the reference clamps; each row's 16 fp8 bytes in one store.
    assert ('__NV_SATFINITE' in source) == cfg.writes_data
    assert ('*(fp8_e4_16_t*)(out + ' in source) == cfg.writes_data
    assert ('__syncthreads' in source) == cfg.computes_sf  # one barrier, and none when the scales are read
    assert ('__frcp_rn' in source) == (not cfg.computes_sf)


# ---------------------------------------------------------------- device tier


def _poisoned_out(shape, device) -> torch.Tensor:
    return torch.full(shape, float('nan'), device=device).to(torch.float8_e4m3fn)  # skipped stays NaN


def _poisoned_sf(cfg: PerBlockCastConfig, num_tokens: int, device) -> torch.Tensor:
    if cfg.sf_dtype == 'uint8':
        return torch.full(cfg.sf_shape(num_tokens), 0xA5, dtype=torch.uint8, device=device)  # padding must become 0
    return torch.full(cfg.sf_shape(num_tokens), float('nan'), device=device)


def _precomputed_scales(x: torch.Tensor, variant: dict) -> torch.Tensor:
    """Scales for mode 'precomputed': the computed ones times random factors in [1/4, 4), so that some blocks
    overflow e4m3 (saturation) and others are not powers of two or c / 448 (the reciprocal's rounding)."""
    _, sf = per_block_cast_ref(x, variant['block_tokens'], variant['block_channels'])
    return sf * torch.exp2(torch.rand(sf.shape) * 4 - 2)


def _run(x: torch.Tensor, variant: dict, device, sf: torch.Tensor | None = None):
    """(out or None, sf written or read, cfg) of the kernel of `variant` on x (on `device`)."""
    backend = backend_of(device)
    cfg = _config(backend, get_num_cores(device), variant, x.shape[1])
    num_tokens = x.shape[0]
    if cfg.mode == 'precomputed':
        out = _poisoned_out(x.shape, device)
        given = sf.to(device, copy=True)  # a copy also on the CPU (the emulator), to see it left unchanged
        launch_kernel(get_per_block_cast_kernel, cfg, device, x, given, out)
        return out, given, cfg
    out_sf = _poisoned_sf(cfg, num_tokens, device)
    if cfg.mode == 'sf_only':
        launch_kernel(get_per_block_cast_kernel, cfg, device, x, out_sf)
        return None, out_sf, cfg
    out = _poisoned_out(x.shape, device)
    launch_kernel(get_per_block_cast_kernel, cfg, device, x, out, out_sf)
    return out, out_sf, cfg


def _reference(x: torch.Tensor, variant: dict, cfg: PerBlockCastConfig, sf: torch.Tensor | None):
    bt, bc = variant['block_tokens'], variant['block_channels']
    if variant['mode'] == 'precomputed':
        return per_block_cast_precomputed_ref(x, sf, bt, bc), sf
    round_sf, packed = FORMATS[variant['sf']]
    return per_block_cast_ref(x, bt, bc, round_sf=round_sf, packed_ue8m0=packed, ue8m0_pack=cfg.sf_pack)


def _check(x: torch.Tensor, variant: dict, device) -> None:
    sf_in = _precomputed_scales(x, variant) if variant['mode'] == 'precomputed' else None
    out, sf, cfg = _run(x.to(device), variant, device, sf_in)
    ref_out, ref_sf = _reference(x, variant, cfg, sf_in)
    assert_equal(sf.cpu(), ref_sf)
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


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_block_cast_kernel_special_values(variant, device):
    """Signed zeros, all-zero blocks (the amax floor), bf16/fp32 subnormals, e4m3 ties and infinities: the block
    of an inf gets scale inf, its finite values +-0 and the inf NaN. Mode 'precomputed' also gets scales of 0
    (finite values saturate, zeros become NaN), inf and tiny ones (saturation)."""
    hidden = padded_hidden(variant['block_channels'])
    num_tokens = 37  # one full and one partial token block for bt = 32, one partial block otherwise
    x = _special_input(variant, num_tokens, hidden)
    sf_in = None
    if variant['mode'] == 'precomputed':
        sf_in = _precomputed_scales(x, variant)
        sf_in[0, 5] = 0.0
        sf_in[0, 6] = float('inf')
        sf_in[-1, 7] = 1e-30
    out, sf, cfg = _run(x.to(device), variant, device, sf_in)
    ref_out, ref_sf = _reference(x, variant, cfg, sf_in)
    assert_equal(sf.cpu(), ref_sf)
    if variant['mode'] != 'precomputed':
        rows = cfg.sf_shape(num_tokens)[0]
        inf_blocks = [(rows - 1, 3), (0, 4)]
        if cfg.packed_ue8m0:
            assert all(ref_sf[b, k].item() == 0xFF for b, k in inf_blocks)
        else:
            assert all(ref_sf[b, k].item() == float('inf') for b, k in inf_blocks)
    if not cfg.writes_data:
        return
    # NaN is NaN whatever its sign (inf * 0 gives the platform's default NaN); every other byte is exact.
    got, want = out.cpu().view(torch.uint8), ref_out.view(torch.uint8)
    nan = (want & 0x7F) == 0x7F
    assert torch.equal((got & 0x7F) == 0x7F, nan)
    assert torch.equal(got[~nan], want[~nan])
    if variant['mode'] == 'precomputed':
        assert int(nan.sum()) > 2  # the infinities (scale inf: inverse 0), and zeros times inverse inf
        assert (want == 0x7E).any()  # +448: saturated
        assert (want == 0xFE).any()  # -448
    else:
        assert int(nan.sum()) == 2  # the two infinities
    assert want[:, : variant['block_channels']].eq(0x80).all()
