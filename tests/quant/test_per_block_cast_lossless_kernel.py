"""per_block_cast_lossless, kernel level (no public interface here): configuration, the reference against hand
values and the lossless bound, lowering (CPU tier); the kernels called directly in their argument order
(x, x_sf, out, out_sf) against the reference, bit for bit (device tier: an accelerator, or the Ascend kernel on
the emulator with --ascend-emulator)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.per_block_cast_lossless_kernel import (
    EXACT_SPREAD,
    IN_BLOCK_CHANNELS,
    IN_BLOCK_TOKENS,
    OUT_BLOCK_CHANNELS,
    OUT_BLOCK_TOKENS,
    PerBlockCastLosslessConfig,
    choose_per_block_cast_lossless_config,
    get_per_block_cast_lossless_kernel,
    make_per_block_cast_lossless_kernel,
)
from tests.quant.cast_ref import ue8m0_to_fp32
from tests.quant.per_block_cast_lossless_ref import (
    decode,
    per_block_cast_lossless_ref,
    random_exponents,
    random_fp4,
    scales_of,
)
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal

KERNEL_NAME = 'per_block_cast_lossless_kernel'
LEVEL = get_test_level()

# Level 0: four kernel configurations, each compiled once: the peer's Ascend case (per-token 32-channel UE8M0 in,
# 32 x 32 UE8M0 out), 16-channel per-token fp32 in to 128 x 128 fp32 out (eight input blocks per output block),
# 32 x 64 blocks of fp32 in to 64 x 128 UE8M0 out (two input rows per output row), 128 x 128 in = out.
_CORE_VARIANTS = [
    dict(bti=1, bci=32, bto=32, bco=32, in_sf='ue8m0', out_sf='ue8m0'),
    dict(bti=1, bci=16, bto=128, bco=128, in_sf='fp32', out_sf='fp32'),
    dict(bti=32, bci=64, bto=64, bco=128, in_sf='fp32', out_sf='ue8m0'),
    dict(bti=128, bci=128, bto=128, bco=128, in_sf='ue8m0', out_sf='fp32'),
]
_ALL_VARIANTS = [
    dict(bti=bti, bci=bci, bto=bto, bco=bco, in_sf=i, out_sf=o)
    for bti in IN_BLOCK_TOKENS
    for bci in IN_BLOCK_CHANNELS
    for bto in OUT_BLOCK_TOKENS
    for bco in OUT_BLOCK_CHANNELS
    for i, o in (('ue8m0', 'ue8m0'), ('fp32', 'fp32'))
    if bto % bti == 0 and bco % bci == 0
]
VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS, default=_ALL_VARIANTS)
# Tokens: one, a partial last token block, several blocks.
NUM_TOKENS = by_level(LEVEL, core=(1, 67, 300), default=(5, 129), full=(4001,))
LOWERING_HIDDEN = by_level(LEVEL, core=(), default=(7168,), full=(128, 4096))


def values_hidden(bco: int) -> int:
    """Packed UE8M0 output rows ending in padding (9 blocks of 128, 18 of 64, 36 of 32 ... : 1152 = 9 * 128),
    several column tiles on both backends for the narrow blocks."""
    return 1152


def _config(backend: str, num_cores: int, variant: dict, hidden: int) -> PerBlockCastLosslessConfig:
    return choose_per_block_cast_lossless_config(
        backend=backend,
        num_cores=num_cores,
        hidden=hidden,
        in_block_tokens=variant['bti'],
        in_block_channels=variant['bci'],
        out_block_tokens=variant['bto'],
        out_block_channels=variant['bco'],
        in_packed=variant['in_sf'] == 'ue8m0',
        out_packed=variant['out_sf'] == 'ue8m0',
    )


def _case_id(case: dict) -> str:
    return make_param_id({**case['variant'], 'hidden': case['hidden']})


def _lowering_cases() -> list[dict]:
    cases = [dict(variant=v, hidden=values_hidden(v['bco'])) for v in VARIANTS]
    return cases + [dict(variant=v, hidden=h) for v in VARIANTS for h in LOWERING_HIDDEN]


# ---------------------------------------------------------------- CPU tier: configuration


def test_config_is_pure_and_hashable():
    a = _config('ascend', 64, _CORE_VARIANTS[0], 4096)
    assert a == _config('ascend', 64, _CORE_VARIANTS[0], 4096)
    assert hash(a) == hash(_config('ascend', 64, _CORE_VARIANTS[0], 4096))
    assert {a: 1}[_config('ascend', 64, _CORE_VARIANTS[0], 4096)] == 1


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('variant', _ALL_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('hidden', [128, 1152, 4096, 7168])
def test_config_tiles(backend, variant, hidden):
    if hidden % max(128, variant['bco']):
        with pytest.raises(ValueError, match='hidden must be a positive multiple of'):
            _config(backend, 64, variant, hidden)
        return
    cfg = _config(backend, 64, variant, hidden)
    assert hidden % cfg.block_k == 0
    assert cfg.block_k % max(128, variant['bco']) == 0
    assert cfg.out_groups * cfg.in_per_out == cfg.in_groups
    if backend == 'ascend':
        assert cfg.out_block_tokens * cfg.block_k <= 32768 or cfg.block_k == max(128, variant['bco'])
    else:
        assert cfg.cuda_steps >= 1
        assert cfg.threads % 32 == 0


@pytest.mark.parametrize(
    ('num_tokens', 'variant', 'in_shape', 'out_shape'),
    [
        (67, dict(bti=1, bci=32, bto=32, bco=32, in_sf='ue8m0', out_sf='ue8m0'), (67, 36), (3, 36)),
        (67, dict(bti=32, bci=64, bto=64, bco=128, in_sf='fp32', out_sf='ue8m0'), (3, 18), (2, 12)),
        (1, dict(bti=1, bci=16, bto=128, bco=128, in_sf='fp32', out_sf='fp32'), (1, 72), (1, 9)),
    ],
)
def test_config_scale_layouts(num_tokens, variant, in_shape, out_shape):
    cfg = _config('ascend', 64, variant, 1152)
    assert cfg.in_sf_shape(num_tokens) == in_shape
    assert cfg.out_sf_shape(num_tokens) == out_shape


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(in_block_tokens=2), 'in_block_tokens must be one of'),
        (dict(in_block_channels=8), 'in_block_channels must be one of'),
        (dict(out_block_tokens=1), 'out_block_tokens must be one of'),
        (dict(out_block_channels=16), 'out_block_channels must be one of'),
        (dict(in_block_tokens=64, out_block_tokens=32), r'must be a multiple of the input block'),
        (dict(in_block_channels=64, out_block_channels=32), r'must be a multiple of the input block'),
        (dict(hidden=64), 'hidden must be a positive multiple of 128'),
        (dict(hidden=0), 'hidden must be a positive multiple of 128'),
        (dict(out_block_channels=128, hidden=192), 'hidden must be a positive multiple of 128'),
        (dict(backend='cpu'), 'backend must be'),
    ],
)
def test_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, hidden=1024) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_per_block_cast_lossless_config(**args)


def test_config_rejects_bad_tilings():
    cfg = _config('cuda', 132, _CORE_VARIANTS[0], 1024)
    with pytest.raises(ValueError, match='block_k'):
        dataclasses.replace(cfg, block_k=384)
    with pytest.raises(ValueError, match='threads'):
        dataclasses.replace(cfg, threads=96)
    with pytest.raises(ValueError, match='num_stages'):
        dataclasses.replace(cfg, num_stages=2)
    ascend = _config('ascend', 64, _CORE_VARIANTS[1], 16384)
    with pytest.raises(ValueError, match='UB'):
        dataclasses.replace(ascend, block_k=16384)


# ---------------------------------------------------------------- CPU tier: the reference and the bound


def _fp4(codes: list[int]) -> torch.Tensor:
    """One row of e2m1 codes, packed (low nibble first)."""
    c = torch.tensor(codes, dtype=torch.uint8).reshape(-1, 2)
    return (c[:, 0] | (c[:, 1] << 4)).view(torch.int8).reshape(1, -1)


def test_reference_hand_values():
    # One row of 128 channels: four 32-channel input blocks with exponents 130, 127, 120, 116 (max M = 130,
    # E = 124, d = 6, 3, -4, -8), one (1, 128) output block.
    codes = [7, 15, 1, 9, 3, 0, 8, 2] * 16
    exps = torch.tensor([[130, 127, 120, 116]])
    out, sf = per_block_cast_lossless_ref(_fp4(codes), exps.to(torch.uint8), (1, 32), (32, 128), out_packed=True)
    assert sf.tolist() == [[124, 0, 0, 0]]
    values = [6.0, -6.0, 0.5, -0.5, 1.5, 0.0, -0.0, 1.0]
    for block, d in enumerate((6, 3, -4, -8)):
        got = out[0, 32 * block : 32 * block + 8].float()
        assert torch.equal(got, torch.tensor(values) * 2.0**d)
    assert (out.view(torch.uint8)[0, 6::8] == 0x80).all()  # -0 keeps its sign
    # fp32 scales: only the exponent field counts, and E = 0 for M <= 6 (the scale 0.0, as the peer).
    sf32 = scales_of(torch.tensor([[5, 3, 6, 0]]), False, junk_bits=True)
    out, sf = per_block_cast_lossless_ref(_fp4(codes), sf32, (1, 32), (32, 128), out_packed=False)
    assert sf.tolist() == [[0.0]]
    assert torch.equal(out[0, :8].float(), torch.tensor(values) * 2.0**5)


def test_reference_rounds_past_the_bound():
    # d = -9: 0.5 * 2**-9 and 1.5 * 2**-9 are not e4m3 values (ties: to even, 0 and 2**-8); 1, 3, 6 are exact.
    codes = [1, 3, 2, 5, 7, 9, 11, 0] * 16
    exps = torch.tensor([[140, 140, 140, 125]])  # E = 134, d = -9 for the last block
    out, _ = per_block_cast_lossless_ref(_fp4(codes), exps.to(torch.uint8), (1, 32), (32, 128), out_packed=True)
    got = out[0, 96:104].float()
    tiny = 2.0**-9
    assert torch.equal(got, torch.tensor([0.0, 2 * tiny, tiny, 3 * tiny, 6 * tiny, -0.0, -2 * tiny, 0.0]))


@pytest.mark.parametrize('spread', [EXACT_SPREAD, EXACT_SPREAD + 1])
@pytest.mark.parametrize('packed', [False, True])
def test_lossless_bound(spread, packed):
    """Inside the bound (every exponent within EXACT_SPREAD of its output block's maximum, 7 <= M <= 254) the
    decoded output equals the decoded input bit for bit; one past it some elements round."""
    torch.manual_seed(spread)
    num_tokens, hidden, bti, bci, bto, bco = 70, 512, 1, 16, 32, 128
    rows, blocks = num_tokens, hidden // bci
    exps = random_exponents(rows, blocks, 200 - spread, 200)
    exps[::5, ::3] = 200 - spread  # the extremes present in every output block
    exps[::7, ::4] = 200
    x = random_fp4(num_tokens, hidden)
    sf = scales_of(exps, packed)
    out, out_sf = per_block_cast_lossless_ref(x, sf, (bti, bci), (bto, bco), out_packed=packed)
    out_fp32 = ue8m0_to_fp32(out_sf[:, : hidden // bco]) if packed else out_sf
    before = decode(x, ue8m0_to_fp32(exps.to(torch.uint8)), (bti, bci))
    after = decode(out, out_fp32, (bto, bco))
    if spread <= EXACT_SPREAD:
        assert_equal(after, before)
    else:
        assert not torch.equal(after, before)
        changed = after != before
        assert (before[changed].abs() <= 1.5 * 2.0 ** (200 - spread - 127)).all()  # only the 0.5 / 1.5 of the
        # smallest scale round


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_ascend_lowers(case):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    lowered = assert_ascend_kernel_lowers(
        lambda: make_per_block_cast_lossless_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert lowered.ub_bytes <= cfg.ascend_ub_bytes + 1024  # the config's estimate bounds the allocation
    assert 'vlds_unpack4' in lowered.source  # the FP4 bytes widen one per 32-bit lane


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_cuda_lowers(case):
    cfg = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    lowered = assert_cuda_kernel_lowers(
        lambda: make_per_block_cast_lossless_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert '*(uint4*)(xv' in lowered.source  # one 16-byte FP4 load per piece
    assert '*(fp8_e4_16_t*)(out' in lowered.source  # 16-byte e4m3 stores
    assert 'atomic' not in lowered.source


def _col_major(backend: str, bto: int, bco: int, out_packed: bool, hidden: int = 1152):
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_per_block_cast_lossless_config(
        backend=backend, num_cores=cores, hidden=hidden, in_block_tokens=1, in_block_channels=32,
        out_block_tokens=bto, out_block_channels=bco, in_packed=True, out_packed=out_packed, col_major_sf=True,
    )  # fmt: skip


def test_config_col_major_words():
    """Ascend tasks of column-major UE8M0 scales hold whole int32 words (one burst each): (32, 32) blocks at H 1152
    take 384 channels (12 blocks), (64, 64) blocks at H 4096 512 (8); where whole words need more than UB holds
    ((128, 128) blocks: 4 x 128 channels of 128 tokens; (64, 64) at H 1152: the row) the config refuses by name.
    CUDA stores bytes: any tiling."""
    assert _col_major('ascend', 32, 32, True).block_k == 384
    assert _col_major('ascend', 64, 64, True, hidden=4096).block_k == 512  # 8 blocks a task
    for bto_bco, hidden in (((128, 128), 4096), ((64, 64), 1152)):  # 18 blocks: only the row is whole words
        with pytest.raises(ValueError, match='of UB'):
            _col_major('ascend', *bto_bco, True, hidden=hidden)
    with pytest.raises(ValueError, match='whole int32 words per task'):
        dataclasses.replace(_col_major('ascend', 64, 64, True, hidden=4096), block_k=128)  # 2 blocks a task
    assert _col_major('cuda', 128, 128, True, hidden=4096).block_k == 128  # CUDA stores bytes: one block a tile


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(('bto', 'bco', 'out_packed'), [(32, 32, True), (128, 128, False)])
def test_col_major_lowers(backend, bto, bco, out_packed):
    """Column-major output scales: the scale stores go through the transposed view, whose row stride is the
    kernel's dynamic argument."""
    cfg = _col_major(backend, bto, bco, out_packed)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_per_block_cast_lossless_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    assert 'sf_stride' in source


# ---------------------------------------------------------------- device tier


def _inputs(num_tokens: int, hidden: int, variant: dict, low: int = 110, high: int = 140):
    rows = num_tokens if variant['bti'] == 1 else -(-num_tokens // variant['bti'])
    exps = random_exponents(rows, hidden // variant['bci'], low, high)
    return random_fp4(num_tokens, hidden), scales_of(exps, variant['in_sf'] == 'ue8m0')


def _run(x: torch.Tensor, sf: torch.Tensor, variant: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = 2 * x.shape[1]
    cfg = _config(backend_of(device), get_num_cores(device), variant, hidden)
    assert tuple(sf.shape) == cfg.in_sf_shape(x.shape[0])
    out = torch.full((x.shape[0], hidden), 0x7F, dtype=torch.uint8, device=device)  # poisoned (NaN)
    out_sf = torch.full(cfg.out_sf_shape(x.shape[0]), 0x7F, dtype=torch.uint8, device=device)
    out_sf = out_sf if cfg.out_packed else out_sf.float().fill_(float('nan'))
    launch_kernel(get_per_block_cast_lossless_kernel, cfg, device, x.view(torch.uint8).to(device), sf.to(device),
                  out.view(torch.float8_e4m3fn), out_sf)  # fmt: skip
    return out.cpu().view(torch.float8_e4m3fn), out_sf.cpu()


def _check(x: torch.Tensor, sf: torch.Tensor, variant: dict, device) -> None:
    out, out_sf = _run(x, sf, variant, device)
    ref, ref_sf = per_block_cast_lossless_ref(
        x,
        sf,
        (variant['bti'], variant['bci']),
        (variant['bto'], variant['bco']),
        out_packed=variant['out_sf'] == 'ue8m0',
    )
    assert_equal(out_sf, ref_sf)
    assert_equal(out.view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_kernel_values(variant, num_tokens, device):
    """Exponents 110..140: spreads up to 30, both sides of the bound, rounding to subnormals and to zero."""
    _check(*_inputs(num_tokens, values_hidden(variant['bco']), variant), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_kernel_extreme_exponents(variant, device):
    """Exponents over the whole UE8M0 range 0..255 (M <= 6: E = 0; spreads up to 255: d clamped), fp32 scales
    with junk mantissa and sign bits (ignored)."""
    num_tokens, hidden = 2 * variant['bto'] + 3, values_hidden(variant['bco'])
    rows = num_tokens if variant['bti'] == 1 else -(-num_tokens // variant['bti'])
    pool = torch.tensor([0, 1, 2, 5, 6, 7, 12, 13, 100, 126, 127, 128, 200, 250, 254, 255])
    exps = pool[torch.randint(len(pool), (rows, hidden // variant['bci']))]
    exps[: rows // 2] = exps[: rows // 2].clamp(max=6)  # whole output blocks with M <= 6
    sf = scales_of(exps, variant['in_sf'] == 'ue8m0', junk_bits=True)
    _check(random_fp4(num_tokens, hidden), sf, variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS[:1], ids=make_param_id)
def test_kernel_hidden_sizes(variant, device):
    for hidden in (128, 7168):
        _check(*_inputs(33, hidden, variant), variant, device)
