"""per_channel_cast, kernel level (no public interface here): configuration and lowering (CPU tier), the kernels
called directly in their argument order (x[, x_sf], out, out_sf) against the reference, bit-exact (device tier:
an accelerator, or the Ascend kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.per_channel_cast_kernel import (
    BLOCK_TOKENS,
    CUDA_X_STAGINGS,
    IN_BLOCK_CHANNELS,
    PerChannelCastConfig,
    choose_per_channel_cast_config,
    get_per_channel_cast_kernel,
    make_per_channel_cast_kernel,
)
from tests.quant.cast_ref import pack_ue8m0_cols, per_token_cast_format_ref, scaled_rows
from tests.quant.per_channel_cast_ref import decode_prequantised, per_channel_cast_ref
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal

KERNEL_NAME = 'per_channel_cast_kernel'
LEVEL = get_test_level()

# Scale formats: fp32 scales, fp32 powers of two (round_sf), UE8M0 bytes (round_sf + packed_ue8m0).
FORMATS = {'fp32': (False, False), 'pow2': (True, False), 'ue8m0': (True, True)}
# Input scale formats of a pre-quantised x (in_packed_ue8m0, in_e4m3_sf): fp32, UE8M0 bytes in the row layout, or
# E4M3 bytes (per_token_cast's use_e4m3_sf).
IN_FORMATS = {'fp32': (False, False), 'ue8m0': (True, False), 'e4m3': (False, True)}

# Level 0: four kernel configurations, each compiled once (every level-0 device test uses them at VALUE_HIDDEN):
# bf16 / 128-token blocks / fp32 scales, fp32 / 32-token blocks / packed UE8M0 (token block counts not a
# multiple of 4), and pre-quantised e4m3 x: 32-channel UE8M0 input scales (two per register) to powers of two,
# and 32-channel E4M3 input scales to fp32 scales.
_CORE_VARIANTS = [
    dict(in_dtype='bfloat16', block_tokens=128, sf='fp32'),
    dict(in_dtype='float32', block_tokens=32, sf='ue8m0'),
    dict(in_dtype='float8_e4m3fn', block_tokens=128, sf='pow2', in_block_channels=32, in_sf='ue8m0'),
    dict(in_dtype='float8_e4m3fn', block_tokens=32, sf='fp32', in_block_channels=32, in_sf='e4m3'),
]
_ALL_VARIANTS = generate_samples(in_dtype=['bfloat16', 'float32'], block_tokens=list(BLOCK_TOKENS), sf=list(FORMATS))
_ALL_VARIANTS += generate_samples(
    in_dtype=['float8_e4m3fn'],
    block_tokens=list(BLOCK_TOKENS),
    sf=list(FORMATS),
    in_block_channels=list(IN_BLOCK_CHANNELS),
    in_sf=list(IN_FORMATS),
)
VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS, default=_ALL_VARIANTS)
# 1152 = 9 * 128: several column tiles of a size that is no power of two (Ascend), a multiple of 128 (32- and
# 128-channel input scales); the level-0 lowering shares its kernels with the level-0 device tests.
VALUE_HIDDEN = 1152
# Lowering adds the production size and 1088 = 17 * 64 (64-channel tiles only); the values add the minimum
# and the production size (level 0: the level-0 kernel again, with another token count).
LOWERING_HIDDEN = by_level(LEVEL, core=(VALUE_HIDDEN,), default=(7168, 1088))
VALUE_HIDDEN_SIZES = by_level(LEVEL, core=(VALUE_HIDDEN,), default=(64, 7168), full=(4096, 5120))
# Tokens: one (a single partial block), 300 (3 blocks of 128 / 10 of 32, the last partial: packed scale rows
# end in zero bytes); level 1 adds an exact multiple and 1000 (8 / 32 blocks, the last partial).
NUM_TOKENS = by_level(LEVEL, core=(1, 300), default=(128, 1000), full=(4001,))
# CUDA schedules a config can ask for beyond the chooser's (the tiling experiments of 128-token blocks): where x waits
# for its scales, 8-byte loads (block_k halved: the same threads per row), __launch_bounds__' minimum blocks. Each
# writes the same bytes; the device tier checks them from level 1, the lowering at every level.
SCHEDULES = [
    dict(x_staging='shared'),
    dict(x_staging='reread', min_blocks=4),
    dict(x_staging='shared', vector_bytes=8, min_blocks=4),
    dict(x_staging='registers', vector_bytes=8, min_blocks=2),
]


def _prequantised(variant: dict) -> bool:
    return variant.get('in_block_channels') is not None


def _config(backend: str, num_cores: int, variant: dict, hidden: int) -> PerChannelCastConfig:
    round_sf, packed = FORMATS[variant['sf']]
    return choose_per_channel_cast_config(
        backend=backend,
        num_cores=num_cores,
        hidden=hidden,
        in_dtype=variant['in_dtype'],
        block_tokens=variant['block_tokens'],
        round_sf=round_sf,
        packed_ue8m0=packed,
        in_block_channels=variant.get('in_block_channels'),
        in_packed_ue8m0=IN_FORMATS[variant['in_sf']][0] if _prequantised(variant) else False,
        in_e4m3_sf=IN_FORMATS[variant['in_sf']][1] if _prequantised(variant) else False,
    )


def _scheduled(cfg: PerChannelCastConfig, schedule: dict) -> PerChannelCastConfig:
    """cfg with a CUDA schedule's changes; another load width keeps the threads per row (block_k scaled)."""
    changes = dict(schedule)
    if changes.get('vector_bytes', cfg.vector_bytes) != cfg.vector_bytes:
        changes['block_k'] = cfg.block_k * changes['vector_bytes'] // cfg.vector_bytes
    return dataclasses.replace(cfg, **changes)


def _lowering_cases() -> list[dict]:
    cases = generate_samples(variant=VARIANTS, hidden=LOWERING_HIDDEN)
    return [c for c in cases if c['hidden'] % max(64, c['variant'].get('in_block_channels') or 0) == 0]


def _case_id(case: dict) -> str:
    return make_param_id({**case['variant'], 'hidden': case['hidden']})


# ---------------------------------------------------------------- CPU tier: configuration


def test_per_channel_cast_config_is_pure_and_hashable():
    a = choose_per_channel_cast_config(
        backend='ascend', num_cores=64, hidden=7168, in_dtype=torch.bfloat16, block_tokens=128
    )
    b = choose_per_channel_cast_config(
        backend='ascend', num_cores=64, hidden=7168, in_dtype='bfloat16', block_tokens=128
    )
    assert a == b
    assert hash(a) == hash(b)
    assert (a.sf_dtype, a.sf_cols, a.sf_pack, a.in_block_channels) == ('float32', 7168, 1, None)
    assert a.sf_shape(1) == (1, 7168)
    assert a.sf_shape(300) == (3, 7168)
    assert (a.block_k, a.num_col_tiles, a.num_stages) == (256, 28, 2)  # 128 x 256: 64 KiB of bf16 + 32 KiB of e4m3
    assert 128 * a.block_k * (2 + 1) <= 96 * 1024  # x and out tiles of one buffer version
    c = choose_per_channel_cast_config(
        backend='cuda',
        num_cores=132,
        hidden=7168,
        in_dtype=torch.bfloat16,
        block_tokens=128,
        round_sf=True,
        packed_ue8m0=True,
    )
    # 32 threads x 8 bf16 per row, 8 rows at once, 16 rows per thread; scales col-packed four blocks a word.
    assert (c.block_k, c.threads, c.vector, c.lanes_per_row, c.row_groups, c.rows_per_thread) == (
        256, 256, 8, 32, 8, 16,
    )  # fmt: skip
    assert (c.sf_dtype, c.sf_pack, c.sf_cols) == ('uint8', 4, 4 * 7168)
    assert c.sf_shape(300) == (1, 4 * 7168)  # 3 token blocks: one word row, its last byte zero
    assert c.sf_shape(128 * 5) == (2, 4 * 7168)
    d = choose_per_channel_cast_config(
        backend='cuda', num_cores=132, hidden=1152, in_dtype='float8_e4m3fn', block_tokens=128, round_sf=True,
        in_block_channels=128, in_packed_ue8m0=True,
    )  # fmt: skip
    assert (d.vector, d.block_k, d.rows_per_thread * d.vector) == (16, 128, 64)
    assert (d.in_sf_cols, d.in_sf_dtype) == (12, 'uint8')  # 9 scale bytes per row, padded to 12
    e = dataclasses.replace(d, in_packed_ue8m0=False)
    assert (e.in_sf_cols, e.in_sf_dtype) == (9, 'float32')


@pytest.mark.parametrize('in_dtype', ['bfloat16', 'float32', 'float8_e4m3fn'])
@pytest.mark.parametrize('block_tokens', BLOCK_TOKENS)
@pytest.mark.parametrize('hidden', [64, 192, 1088, 4160, 7168, 16384])
def test_per_channel_cast_config_tiles(in_dtype, block_tokens, hidden):
    """Every supported shape gets a valid tiling on both backends: a multiple of 64 dividing H, the Ascend task
    within its UB budget, the CUDA threads whole warps with one 16-byte load per thread and row."""
    prequant = dict(in_block_channels=32) if in_dtype == 'float8_e4m3fn' else {}
    common = dict(hidden=hidden, in_dtype=in_dtype, block_tokens=block_tokens, **prequant)
    asc = choose_per_channel_cast_config(backend='ascend', num_cores=64, **common)
    assert hidden % asc.block_k == 0
    assert asc.block_k % 64 == 0
    assert block_tokens * asc.block_k * (asc.in_bytes + 1) <= 96 * 1024
    cuda = choose_per_channel_cast_config(backend='cuda', num_cores=132, **common)
    assert hidden % cuda.block_k == 0
    assert cuda.vector * cuda.in_bytes == 16
    assert cuda.threads % 32 == 0
    assert cuda.threads <= 256
    assert cuda.row_groups * cuda.rows_per_thread == block_tokens
    assert cuda.rows_per_thread * cuda.vector <= 128  # registers: no spills at 256 threads


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(backend='cpu'), 'backend'),
        (dict(in_dtype=torch.float16), 'in_dtype'),
        (dict(block_tokens=64), 'block_tokens'),
        (dict(hidden=96), 'multiple of 64'),
        (dict(hidden=0), 'positive multiple'),
        (dict(hidden=-64), 'positive multiple'),
        (dict(packed_ue8m0=True), 'needs round_sf'),
        (dict(in_block_channels=64, in_dtype='float8_e4m3fn'), 'in_block_channels'),
        (dict(in_block_channels=128, in_dtype='float8_e4m3fn', hidden=192), 'multiple of 128'),
        (dict(in_block_channels=32), 'pre-quantised'),
        (dict(in_dtype='float8_e4m3fn'), 'in_dtype'),
        (dict(in_packed_ue8m0=True), 'in_block_channels'),
        (dict(in_e4m3_sf=True), 'in_block_channels'),
        (dict(in_block_channels=32, in_dtype='float8_e4m3fn', in_packed_ue8m0=True, in_e4m3_sf=True), 'exclude'),
    ],
)
def test_per_channel_cast_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, hidden=256, in_dtype=torch.bfloat16, block_tokens=32) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_per_channel_cast_config(**args)


@pytest.mark.parametrize(
    ('changes', 'match'),
    [
        (dict(block_k=96), 'block_k'),
        (dict(block_k=0), 'block_k'),
        (dict(block_k=512), 'dividing hidden'),
        (dict(block_k=384), 'UB budget'),  # 128 x 384 x (2 + 1) bytes = 144 KiB
        (dict(num_stages=3), 'num_stages'),
        (dict(num_cores=0), 'num_cores'),
        (dict(backend='cuda', block_k=384, threads=256), 'power of two'),
        (dict(backend='cuda', block_k=128, threads=96), 'row groups'),
        (dict(backend='cuda', block_k=128, threads=100), 'whole warps'),
        (dict(backend='cuda', block_k=128, threads=256, vector_bytes=4), 'vector_bytes'),
        (dict(backend='cuda', block_k=384, threads=256, vector_bytes=8), 'one 8-byte load'),
        (dict(backend='cuda', block_k=128, threads=2048), 'whole warps, at most 1024'),
        (dict(backend='cuda', block_k=128, threads=256, x_staging='smem'), 'x_staging'),
        (dict(backend='cuda', block_k=128, threads=256, min_blocks=-1), 'min_blocks'),
        (dict(backend='cuda', block_k=128, threads=256, min_blocks=9), 'min_blocks'),  # 9 x 256 > 2048 threads an SM
    ],
)
def test_per_channel_cast_config_validates_fields(changes, match):
    cfg = choose_per_channel_cast_config(
        backend='ascend', num_cores=64, hidden=1152, in_dtype='bfloat16', block_tokens=128
    )
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(cfg, **changes)


def test_per_channel_cast_config_takes_cuda_schedules():
    """The schedules beyond the chooser's: every x_staging, up to 1024 threads, min_blocks up to 2048 threads an
    SM; the chooser's own config holds x in registers without a minimum."""
    cfg = choose_per_channel_cast_config(
        backend='cuda', num_cores=132, hidden=1152, in_dtype='bfloat16', block_tokens=128
    )
    assert (cfg.x_staging, cfg.min_blocks, cfg.threads) == ('registers', 0, 256)
    for staging in CUDA_X_STAGINGS:
        assert dataclasses.replace(cfg, x_staging=staging).x_staging == staging
    wide = dataclasses.replace(cfg, threads=1024, min_blocks=2)
    assert (wide.row_groups, wide.rows_per_thread) == (64, 2)
    assert _scheduled(cfg, dict(vector_bytes=8)).block_k == cfg.block_k // 2


def test_per_channel_cast_config_ascend_budget_is_checked():
    cfg = choose_per_channel_cast_config(
        backend='ascend', num_cores=64, hidden=1024, in_dtype='float32', block_tokens=32
    )
    assert cfg.block_k == 512  # 32 x 512 x (4 + 1) bytes = 80 KiB
    with pytest.raises(ValueError, match='UB budget'):
        dataclasses.replace(cfg, block_k=1024)


# ---------------------------------------------------------------- CPU tier: the reference


def test_reference_hand_values():
    """Column maxima over the (partial) token block: 448 gives scale 1, 896 scale 2; an all -0.0 column the amax
    floor and -0.0 out; UE8M0 bytes are the scale's exponent + 127, column-packed with zero bytes."""
    x = torch.zeros(3, 64)
    x[:, 0] = torch.tensor([-448.0, 1.0, 2.0])
    x[:, 1] = torch.tensor([3.0, 896.0, -5.0])
    x[:, 2] = -0.0
    x[:, 3] = 1.0
    out, sf = per_channel_cast_ref(x, 32)
    assert sf.shape == (1, 64)
    assert sf[0, :2].tolist() == [1.0, 2.0]
    assert sf[0, 2].item() == pytest.approx(1e-4 / 448, rel=1e-6)
    assert out[:, 0].float().tolist() == [-448.0, 1.0, 2.0]
    assert out[:, 1].float().tolist() == [1.5, 448.0, -2.5]
    assert out[:, 2].view(torch.uint8).eq(0x80).all()
    assert out[:, 3].float().eq(448.0).all()
    _, packed = per_channel_cast_ref(x, 32, round_sf=True, packed_ue8m0=True)
    assert packed.dtype == torch.uint8
    assert packed.shape == (1, 4 * 64)
    assert packed[0, :8].tolist() == [127, 0, 0, 0, 128, 0, 0, 0]  # block 0 in byte 0 of each word
    assert packed[0, 12].item() == 127 - 8  # 1 / 448 rounds up to 2**-8


def test_reference_col_pack_layout():
    """Byte [r, 4 h + j] is token block 4 r + j of channel h; blocks past the last are zero bytes."""
    blocks = torch.arange(5 * 3, dtype=torch.uint8).view(5, 3) + 1  # 5 token blocks, 3 channels
    packed = pack_ue8m0_cols(blocks)
    assert packed.shape == (2, 12)
    assert packed[0].tolist() == [1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 12]
    assert packed[1].tolist() == [13, 0, 0, 0, 14, 0, 0, 0, 15, 0, 0, 0]
    assert torch.equal(packed.view(torch.int32)[1], torch.tensor([13, 14, 15], dtype=torch.int32))


def test_reference_blocks_are_independent():
    """A partial last token block has its own scales: the reference of the whole equals those of its blocks."""
    x = scaled_rows(70, 128, 'float32', 'cpu')
    out, sf = per_channel_cast_ref(x, 32)
    for b, rows in enumerate((slice(0, 32), slice(32, 64), slice(64, 70))):
        part_out, part_sf = per_channel_cast_ref(x[rows], 32)
        assert torch.equal(part_sf, sf[b : b + 1])
        assert torch.equal(part_out.view(torch.uint8), out[rows].view(torch.uint8))


def test_reference_prequantised_decode():
    """A pre-quantised x decodes as fp32(x) * scale: UE8M0 byte 128 is 2.0, 126 is 0.5, 0 is +0."""
    x = torch.tensor([[1.0] * 64, [-3.0] * 64], dtype=torch.float8_e4m3fn)
    x_sf = torch.tensor([[128, 126, 0, 0], [127, 0, 0, 0]], dtype=torch.uint8)  # 2 blocks of 32, padded to 4
    decoded = decode_prequantised(x, x_sf, 32, in_packed_ue8m0=True)
    assert decoded[0, :32].eq(2.0).all()
    assert decoded[0, 32:].eq(0.5).all()
    assert decoded[1, :32].eq(-3.0).all()
    assert decoded[1, 32:].eq(0.0).all()
    out, sf = per_channel_cast_ref(x, 32, x_sf=x_sf, in_block_channels=32, in_packed_ue8m0=True)
    ref_out, ref_sf = per_channel_cast_ref(decoded, 32)
    assert torch.equal(sf, ref_sf)
    assert torch.equal(out.view(torch.uint8), ref_out.view(torch.uint8))
    # E4M3 scales widen exactly: 0.875 (0x36), 2**-9 (the smallest subnormal, 0x01), 448 (0x7E).
    e4m3_sf = torch.tensor([[0x36, 0x01], [0x7E, 0x00]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    decoded = decode_prequantised(x, e4m3_sf, 32)
    assert decoded[0, :32].eq(0.875).all()
    assert decoded[0, 32:].eq(2.0**-9).all()
    assert decoded[1, :32].eq(-1344.0).all()
    assert decoded[1, 32:].eq(0.0).all()


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_channel_cast_kernel_signature(backend, variant):
    """The arguments, inputs then outputs, with the config's dtypes and shapes (T dynamic)."""
    cfg = _config(backend, 64, variant, VALUE_HIDDEN)
    prim_func = make_per_channel_cast_kernel(cfg)
    buffers = [prim_func.buffer_map[p] for p in prim_func.params]
    prequant = _prequantised(variant)
    assert [b.name for b in buffers] == ['x'] + (['x_sf'] if prequant else []) + ['out', 'out_sf']
    dtypes = [cfg.in_dtype] + ([cfg.in_sf_dtype] if prequant else []) + ['float8_e4m3fn', cfg.sf_dtype]
    assert [str(b.dtype) for b in buffers] == dtypes
    by_name = {b.name: b for b in buffers}
    num_tokens = buffers[0].shape[0]
    assert num_tokens.name == 'num_tokens'  # one dynamic size shared by x, out (and x_sf)
    assert all(b.shape[0].same_as(num_tokens) for b in buffers if b.name != 'out_sf')
    assert int(by_name['x'].shape[1]) == int(by_name['out'].shape[1]) == VALUE_HIDDEN
    assert int(by_name['out_sf'].shape[1]) == cfg.sf_cols
    if prequant:
        assert int(by_name['x_sf'].shape[1]) == cfg.in_sf_cols


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_channel_cast_ascend_lowers(case):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    assert cfg.backend == 'ascend'
    assert cfg.num_stages == 2
    lowered = assert_ascend_kernel_lowers(lambda: make_per_channel_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'asc_copy_gm2ub_align' in lowered.source


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_per_channel_cast_cuda_lowers(case):
    cfg = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    lowered = assert_cuda_kernel_lowers(lambda: make_per_channel_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert '__NV_SATFINITE' in lowered.source  # the fp8 conversion saturates at +-448, as the reference clamps
    vector_load = {'bfloat16': 'uint4', 'float32': 'float4', 'float8_e4m3fn': 'fp8_e4_16_t'}[cfg.in_dtype]
    assert f'*({vector_load}*)(x + ' in lowered.source  # one 16-byte load per thread and row


@pytest.mark.parametrize('schedule', SCHEDULES, ids=make_param_id)
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_channel_cast_cuda_schedules_lower(variant, schedule):
    """Each CUDA schedule lowers as it says: x read once (registers, shared) or twice (reread), staged through a
    shared tile only when 'shared', with its load width and __launch_bounds__' minimum."""
    cfg = _scheduled(_config('cuda', H200_SMS, variant, VALUE_HIDDEN), schedule)
    source = assert_cuda_kernel_lowers(
        lambda: make_per_channel_cast_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    ).source
    assert f'__launch_bounds__({cfg.threads}, {cfg.min_blocks or 1})' in source
    loads = {
        16: {'bfloat16': 'uint4', 'float32': 'float4', 'float8_e4m3fn': 'fp8_e4_16_t'},
        8: {'bfloat16': 'uint2', 'float32': 'float2', 'float8_e4m3fn': 'fp8_e4_8_t'},
    }[cfg.vector_bytes][cfg.in_dtype]
    assert source.count(f'*({loads}*)(x + ') == (2 if cfg.x_staging == 'reread' else 1)
    assert ('x_tile' in source) == (cfg.x_staging == 'shared')


# ---------------------------------------------------------------- device tier


def _inputs(num_tokens: int, hidden: int, variant: dict, device) -> tuple[torch.Tensor, ...]:
    """x (and x_sf for a pre-quantised variant), with columns and rows of very different magnitudes."""
    column_scale = torch.exp2(torch.randint(-12, 12, (1, hidden)).float())
    values = scaled_rows(num_tokens, hidden, 'float32', 'cpu') * column_scale
    if not _prequantised(variant):
        return (values.to(getattr(torch, variant['in_dtype'])).to(device),)
    packed, e4m3_sf = IN_FORMATS[variant['in_sf']]
    x, x_sf = per_token_cast_format_ref(
        values, variant['in_block_channels'], round_sf=packed, packed_ue8m0=packed, e4m3_sf=e4m3_sf
    )
    return x.to(device), x_sf.to(device)


def _run(
    inputs: tuple[torch.Tensor, ...], variant: dict, device, schedule: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    x = inputs[0]
    cfg = _config(backend_of(device), get_num_cores(device), variant, x.shape[1])
    if schedule:
        cfg = _scheduled(cfg, schedule)
    out = torch.full(x.shape, float('nan'), device=device).to(torch.float8_e4m3fn)  # poisoned: skipped stays NaN
    shape = cfg.sf_shape(x.shape[0])
    if cfg.sf_dtype == 'uint8':
        sf = torch.full(shape, 0xA5, dtype=torch.uint8, device=device)  # missing blocks' bytes must become 0
    else:
        sf = torch.full(shape, float('nan'), device=device)
    launch_kernel(get_per_channel_cast_kernel, cfg, device, *inputs, out, sf)
    return out, sf


def _reference(inputs: tuple[torch.Tensor, ...], variant: dict) -> tuple[torch.Tensor, torch.Tensor]:
    round_sf, packed = FORMATS[variant['sf']]
    prequant = {}
    if _prequantised(variant):
        prequant = dict(
            x_sf=inputs[1].cpu(),
            in_block_channels=variant['in_block_channels'],
            in_packed_ue8m0=IN_FORMATS[variant['in_sf']][0],
        )
    return per_channel_cast_ref(
        inputs[0].cpu(), variant['block_tokens'], round_sf=round_sf, packed_ue8m0=packed, **prequant
    )


def _check(inputs: tuple[torch.Tensor, ...], variant: dict, device, schedule: dict | None = None) -> None:
    out, sf = _run(inputs, variant, device, schedule)
    ref_out, ref_sf = _reference(inputs, variant)
    assert_equal(sf.cpu(), ref_sf)
    assert_equal(out.cpu().view(torch.uint8), ref_out.view(torch.uint8))


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_channel_cast_kernel_values(variant, num_tokens, device):
    _check(_inputs(num_tokens, VALUE_HIDDEN, variant, device), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_channel_cast_kernel_partial_blocks(variant, device):
    """A block count not a multiple of 4 whose last block has a single token: 4 blocks + 1 token of 32 tokens,
    or 2 blocks + 1 token of 128 (5 and 3 blocks: packed scale rows end in 3 or 1 zero byte)."""
    bt = variant['block_tokens']
    num_tokens = bt * (4 if bt == 32 else 2) + 1
    _check(_inputs(num_tokens, VALUE_HIDDEN, variant, device), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('schedule', by_level(LEVEL, core=(), default=SCHEDULES), ids=make_param_id)
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_per_channel_cast_kernel_cuda_schedules(variant, schedule, device):
    """The CUDA schedules a config can ask for write the reference's bytes: full token blocks and a last one of a
    single token (its rows past T neither read nor written)."""
    if device.type != 'cuda':
        pytest.skip('x_staging, vector_bytes and min_blocks are CUDA schedules')
    bt = variant['block_tokens']
    _check(_inputs(2 * bt + 1, VALUE_HIDDEN, variant, device), variant, device, schedule)


@pytest.mark.npu
@pytest.mark.parametrize('hidden', VALUE_HIDDEN_SIZES)
def test_per_channel_cast_kernel_hidden_sizes(hidden, device):
    variant = _CORE_VARIANTS[1]  # packed UE8M0 scales: the widest output rows
    _check(_inputs(37, hidden, variant, device), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS[:2], ids=make_param_id)
def test_per_channel_cast_kernel_special_values(variant, device):
    """Signed zeros, all-zero columns (the amax floor), bf16/fp32 subnormals, e4m3 ties, values at +-448 after
    scaling, and infinities: the block of an inf gets scale inf, its finite values +-0 and the inf NaN."""
    bt = variant['block_tokens']
    hidden = VALUE_HIDDEN
    num_tokens = bt + 5  # a full block and a partial one
    dtype = getattr(torch, variant['in_dtype'])
    tiny = torch.finfo(dtype).tiny
    pool = torch.tensor([0.0, -0.0, tiny, -tiny / 4, 1.0, -1.0625, 1.1875, 3.0, -448.0, 1e-30, 1e30])
    x = pool[torch.randint(len(pool), (num_tokens, hidden))].to(dtype)
    x[:, 0] = -0.0  # all -0.0 in both blocks
    x[:bt, 1] = 0.0
    x[:, 2] = tiny * torch.arange(num_tokens)  # subnormal-sized column, floored
    x[3, 5] = float('inf')
    x[bt + 4, 7] = -float('inf')  # the last row of the partial block
    out, sf = _run((x.to(device),), variant, device)
    ref_out, ref_sf = _reference((x,), variant)
    assert_equal(sf.cpu(), ref_sf)
    # NaN is NaN whatever its sign (inf * 0 gives the platform's default NaN); every other byte is exact.
    got, want = out.cpu().view(torch.uint8), ref_out.view(torch.uint8)
    nan = (want & 0x7F) == 0x7F
    assert torch.equal((got & 0x7F) == 0x7F, nan)
    assert torch.equal(got[~nan], want[~nan])
    assert int(nan.sum()) == 2  # the two infinities
    assert want[:, 0].eq(0x80).all()
    if FORMATS[variant['sf']][1]:  # UE8M0 0xff: block 0 of channel 5, block 1 of channel 7
        assert ref_sf[0, 4 * 5].item() == ref_sf[0, 4 * 7 + 1].item() == 0xFF
    else:
        assert ref_sf[0, 5].item() == ref_sf[1, 7].item() == float('inf')


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS[2:], ids=make_param_id)
def test_per_channel_cast_kernel_prequantised_special_values(variant, device):
    """A pre-quantised x with signed zeros, e4m3 subnormals and +-448, scales from 2**-60 to 2**60 and zero
    (UE8M0 byte 0), or every finite E4M3 scale: every decoded product is finite, every byte exact."""
    num_tokens, hidden, bc = 40, VALUE_HIDDEN, variant['in_block_channels']
    pool = torch.tensor([0.0, -0.0, 2.0**-9, -(2.0**-7), 1.0, -1.125, 448.0, -448.0, 240.0])
    x = pool[torch.randint(len(pool), (num_tokens, hidden))].to(torch.float8_e4m3fn)
    blocks = hidden // bc
    if IN_FORMATS[variant['in_sf']][1]:  # E4M3 scales: every e4m3 magnitude (subnormals, 448), zeros
        x_sf = (torch.randint(0, 0x7F, (num_tokens, blocks), dtype=torch.uint8)).view(torch.float8_e4m3fn)
        x_sf[0, :] = 0.0
        x_sf[1, 0] = 448.0
        x_sf[1, 1] = 2.0**-9
    else:
        x_sf = torch.randint(127 - 60, 127 + 60, (num_tokens, -(-blocks // 4) * 4), dtype=torch.uint8)
        x_sf[:, blocks:] = 0
        x_sf[0, :] = 0  # row 0 decodes to zeros
        x_sf[1, 0] = 0
    out, sf = _run((x.to(device), x_sf.to(device)), variant, device)
    ref_out, ref_sf = _reference((x, x_sf), variant)
    assert_equal(sf.cpu(), ref_sf)
    assert_equal(out.cpu().view(torch.uint8), ref_out.view(torch.uint8))
