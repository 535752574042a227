"""per_token_cast, kernel level (no public interface yet): configuration and lowering (CPU tier), the kernels
called directly in their argument order (x, out, out_sf) against the reference, bit-exact (device tier: an
accelerator, or the Ascend kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.per_token_cast_kernel import (
    UE8M0_PACK,
    choose_per_token_cast_config,
    get_per_token_cast_kernel,
    make_per_token_cast_kernel,
)
from tests.quant.cast_ref import (
    INV_FP8_MAX,
    padded_hidden,
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

# Scale formats: fp32 scales, fp32 powers of two (round_sf), UE8M0 bytes (round_sf + packed_ue8m0).
FORMATS = {'fp32': (False, False), 'pow2': (True, False), 'ue8m0': (True, True)}

# Level 0 covers every dtype, block size and format once (each one kernel to compile); level 1 the full product.
_CORE_VARIANTS = [
    dict(in_dtype='bfloat16', block_size=32, sf='fp32'),
    dict(in_dtype='float32', block_size=64, sf='pow2'),
    dict(in_dtype='bfloat16', block_size=128, sf='ue8m0'),
    dict(in_dtype='float32', block_size=32, sf='ue8m0'),
]
_ALL_VARIANTS = generate_samples(in_dtype=['bfloat16', 'float32'], block_size=[32, 64, 128], sf=list(FORMATS))
VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS, default=_ALL_VARIANTS)
# Hidden sizes: minimum, a padded UE8M0 row (17 blocks of 64 / 34 of 32), several column tiles, production sizes.
HIDDEN = by_level(LEVEL, core=(256, 1088), default=(128, 192, 7168), full=(4096, 5120, 16384))
NUM_TOKENS = by_level(LEVEL, core=(1, 67), default=(3, 300), full=(4001,))


ASC = dict(backend='ascend', num_cores=64)


def _config(backend: str, num_cores: int, variant: dict, hidden: int):
    round_sf, packed = FORMATS[variant['sf']]
    return choose_per_token_cast_config(
        backend=backend,
        num_cores=num_cores,
        hidden=hidden,
        in_dtype=variant['in_dtype'],
        block_size=variant['block_size'],
        round_sf=round_sf,
        packed_ue8m0=packed,
    )


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
    with pytest.raises(ValueError, match='not a multiple of 4 need hidden <= 8192'):
        choose_per_token_cast_config(
            backend='ascend', num_cores=64, hidden=8192 + 128, in_dtype='bfloat16', block_size=128, round_sf=True,
            packed_ue8m0=True,
        )  # fmt: skip


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(backend='cpu'), 'backend'),
        (dict(in_dtype=torch.float16), 'in_dtype'),
        (dict(block_size=16), 'block_size'),
        (dict(hidden=96), 'multiple of 64'),
        (dict(hidden=192, block_size=128), 'multiple of 128'),
        (dict(hidden=0), 'positive multiple'),
        (dict(packed_ue8m0=True), 'needs round_sf'),
    ],
)
def test_per_token_cast_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, hidden=256, in_dtype=torch.bfloat16) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_per_token_cast_config(**args)


def test_round_sf_reciprocal_product_rounds_like_the_division():
    """The kernels round c * fp32(1/448) up to a power of two; TileKernels' reference rounds c / 448. Both give
    the same power for every fp32 significand (the exponent only shifts both), so the kernels match either."""
    significands = torch.arange(1 << 23, dtype=torch.int32) | (127 << 23)  # every fp32 in [1, 2)
    for exponent in (-13, 0, 9, 100):  # 1e-4 (the floor) up to large finite maxima
        c = significands.view(torch.float32) * 2.0**exponent
        by_product = round_up_pow2_bits(c * INV_FP8_MAX)
        by_division = round_up_pow2_bits(c / torch.full_like(c, 448.0))
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
    assert '__NV_SATFINITE' in lowered.source  # the fp8 conversion saturates at +-448, as the reference clamps


# ---------------------------------------------------------------- device tier


def _run(x: torch.Tensor, variant: dict, device) -> tuple[torch.Tensor, torch.Tensor, object]:
    backend = backend_of(device)
    cfg = _config(backend, get_num_cores(device), variant, x.shape[1])
    out = torch.full(x.shape, float('nan'), device=device).to(torch.float8_e4m3fn)  # poisoned: skipped stays NaN
    if cfg.sf_dtype == 'uint8':
        sf = torch.full((x.shape[0], cfg.sf_cols), 0xA5, dtype=torch.uint8, device=device)  # padding must become 0
    else:
        sf = torch.full((x.shape[0], cfg.sf_cols), float('nan'), device=device)
    launch_kernel(get_per_token_cast_kernel, cfg, device, x, out, sf)
    return out, sf, cfg


def _check(x: torch.Tensor, variant: dict, device) -> None:
    out, sf, cfg = _run(x, variant, device)
    round_sf, packed = FORMATS[variant['sf']]
    ref_out, ref_sf = per_token_cast_ref(
        x.cpu(), variant['block_size'], round_sf=round_sf, packed_ue8m0=packed, ue8m0_pack=cfg.sf_pack
    )
    assert_equal(sf.cpu(), ref_sf)
    assert_equal(out.cpu().view(torch.uint8), ref_out.view(torch.uint8))


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
    """Signed zeros, all-zero blocks (the amax floor), bf16/fp32 subnormals, e4m3 ties, values at +-448 after
    scaling, and infinities: the block of an inf gets scale inf, its finite values +-0 and the inf NaN."""
    bs = variant['block_size']
    hidden = padded_hidden(bs)
    dtype = getattr(torch, variant['in_dtype'])
    tiny = torch.finfo(dtype).tiny
    pool = torch.tensor([0.0, -0.0, tiny, -tiny / 4, 1.0, -1.0625, 1.1875, 3.0, -448.0, 1e-30, 1e30])
    x = pool[torch.randint(len(pool), (6, hidden))].to(dtype)
    x[0, :bs] = -0.0
    x[1, bs : 2 * bs] = 0.0
    x[2, :bs] = tiny * torch.arange(bs)  # subnormal-sized block, floored
    x[3, 5] = float('inf')
    x[4, 2 * bs + 1] = -float('inf')
    out, sf, cfg = _run(x.to(device), variant, device)
    round_sf, packed = FORMATS[variant['sf']]
    ref_out, ref_sf = per_token_cast_ref(x, bs, round_sf=round_sf, packed_ue8m0=packed, ue8m0_pack=cfg.sf_pack)
    out = out.cpu()
    assert_equal(sf.cpu(), ref_sf)
    # NaN is NaN whatever its sign (inf * 0 gives the platform's default NaN); every other byte is exact.
    got, want = out.view(torch.uint8), ref_out.view(torch.uint8)
    nan = (want & 0x7F) == 0x7F
    assert torch.equal((got & 0x7F) == 0x7F, nan)
    assert torch.equal(got[~nan], want[~nan])
    assert int(nan.sum()) == 2  # the two infinities
    assert want[0, :bs].eq(0x80).all()


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(('mode', 'variant'), [('sf_only', _CORE_VARIANTS[2]), ('precomputed', _CORE_VARIANTS[0])])
def test_per_token_cast_halves_lower(backend, mode, variant):
    """per_token_cast_with_sf_only ('sf_only': no fp8 stores) and _with_precomputed_sf ('precomputed': the scales
    read, their reciprocals, no reduction)."""
    round_sf, packed = FORMATS[variant['sf']]
    cfg = choose_per_token_cast_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=padded_hidden(variant['block_size']),
        in_dtype=variant['in_dtype'], block_size=variant['block_size'], round_sf=round_sf, packed_ue8m0=packed,
        mode=mode,
    )  # fmt: skip
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_per_token_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    if backend == 'cuda':
        assert ('__frcp_rn' in source) == (mode == 'precomputed')
        assert ('fp8_e4_t* __restrict__ out' in source) == (mode == 'precomputed')


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
