"""cast_back, kernel level (no public interface here): configuration and lowering (CPU tier), the kernels called
directly in their argument order (x, x_sf, out) against the reference, bit-exact (device tier: an accelerator,
or the Ascend kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.cast_back_kernel import (
    HIDDEN_UNIT,
    UE8M0_PACK,
    CastBackConfig,
    choose_cast_back_config,
    get_cast_back_kernel,
    make_cast_back_kernel,
)
from tests.quant.cast_back_ref import (
    block_scales,
    cast_back_ref,
    decode_e2m1,
    random_e2m1,
    random_e4m3,
    random_scales,
)
from tests.quant.cast_ref import pack_ue8m0_cols, pack_ue8m0_rows, ue8m0_to_fp32, unpack_ue8m0_cols
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal

KERNEL_NAME = 'cast_back_kernel'
LEVEL = get_test_level()
OUT_DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32}

# (block_tokens, block_channels): the row layout's blocks, then the per-channel ones (block_channels 1).
ROW_BLOCKS = [(bt, bc) for bt in (1, 32, 128) for bc in (32, 64, 128)]
CHANNEL_BLOCKS = [(32, 1), (128, 1)]

# Level 0: four kernel configurations (each compiled once, shared by the values, special-value and padding
# tests): per-token UE8M0 with two blocks per register, 32-token blocks of 64 channels with fp32 scales,
# 128 x 128 blocks (a task inside one token block), per-channel col-packed UE8M0. Level 1: the full product.
_CORE_VARIANTS = [
    dict(out_dtype='bfloat16', bt=1, bc=32, sf='ue8m0'),
    dict(out_dtype='float32', bt=32, bc=64, sf='fp32'),
    dict(out_dtype='bfloat16', bt=128, bc=128, sf='fp32'),
    dict(out_dtype='float32', bt=32, bc=1, sf='ue8m0'),
]
_ALL_VARIANTS = [
    dict(out_dtype=dtype, bt=bt, bc=bc, sf=sf)
    for (bt, bc) in ROW_BLOCKS + CHANNEL_BLOCKS
    for sf in ('fp32', 'ue8m0')
    for dtype in OUT_DTYPES
]
# per_token_cast's other formats (per-token scales only): FP4 data ('data': 'e2m1'), 16-channel blocks, E4M3
# scales ('sf': 'e4m3'). Level 0: three configurations (FP4 with 16-channel E4M3 scales, FP4 with UE8M0, e4m3
# data in 16-channel blocks); level 1: every block, scale format and output of both data formats.
_CORE_FORMAT_VARIANTS = [
    dict(out_dtype='bfloat16', bt=1, bc=16, sf='e4m3', data='e2m1'),
    dict(out_dtype='float32', bt=1, bc=64, sf='ue8m0', data='e2m1'),
    dict(out_dtype='float32', bt=1, bc=16, sf='fp32', data='e4m3'),
]
_ALL_FORMAT_VARIANTS = [
    dict(out_dtype=dtype, bt=1, bc=bc, sf=sf, data=data)
    for data in ('e4m3', 'e2m1')
    for bc in (16, 32, 64, 128)
    for sf in ('fp32', 'ue8m0', 'e4m3')
    for dtype in OUT_DTYPES
    if data == 'e2m1' or bc == 16 or sf == 'e4m3'  # the e4m3 rest: _ALL_VARIANTS
]
FORMAT_VARIANTS = by_level(LEVEL, core=_CORE_FORMAT_VARIANTS, default=_ALL_FORMAT_VARIANTS)
# A short last block: H = 64 * odd with 128-channel blocks (per_token_cast's rows of gpt-oss's H = 2880), e4m3
# data. Level 0: one configuration (H = 192, one whole block and the short one, fp32 scales, bf16 out), shared
# with test_cast_back.py's level 0; level 1: UE8M0 and E4M3 scales, fp32 out, token blocks, H = 2880.
_SHORT_CORE = [dict(variant=dict(out_dtype='bfloat16', bt=1, bc=128, sf='fp32', data='e4m3'), hidden=192)]
SHORT_BLOCK_CASES = by_level(
    LEVEL,
    core=_SHORT_CORE,
    default=[
        dict(variant=dict(out_dtype='float32', bt=1, bc=128, sf='ue8m0', data='e4m3'), hidden=192),
        dict(variant=dict(out_dtype='bfloat16', bt=1, bc=128, sf='e4m3', data='e4m3'), hidden=2880),
        dict(variant=dict(out_dtype='float32', bt=1, bc=128, sf='fp32', data='e4m3'), hidden=2880),
        dict(variant=dict(out_dtype='bfloat16', bt=1, bc=128, sf='ue8m0', data='e4m3'), hidden=2880),
        dict(variant=dict(out_dtype='bfloat16', bt=32, bc=128, sf='fp32', data='e4m3'), hidden=192),
        dict(variant=dict(out_dtype='float32', bt=128, bc=128, sf='ue8m0', data='e4m3'), hidden=2880),
    ],
)
# FP4 data at H = 64 * odd (gpt-oss's 2880 = 22.5 x 128, per_token_cast's rows of whole 16-, 32- or 64-channel
# blocks): a row ends in half a 64-byte load. Level 0: one configuration (H = 192, MXFP4: 32-channel UE8M0, bf16
# out); level 1: H = 2880 with 16-channel E4M3 and 32-channel UE8M0 scales, bf16 and fp32 out.
_FP4_HALF_CORE = [dict(variant=dict(out_dtype='bfloat16', bt=1, bc=32, sf='ue8m0', data='e2m1'), hidden=192)]
FP4_HALF_LOAD_CASES = by_level(
    LEVEL,
    core=_FP4_HALF_CORE,
    default=[
        *_FP4_HALF_CORE,
        *(
            dict(variant=dict(out_dtype=dtype, bt=1, bc=bc, sf=sf, data='e2m1'), hidden=2880)
            for bc, sf in ((16, 'e4m3'), (32, 'ue8m0'))
            for dtype in OUT_DTYPES
        ),
    ],
)
# FP4 data with a short last block (128-channel blocks at H = 64 * odd): the row's half load is the short block's,
# under the row's last scale. Level 0: one configuration (H = 192, a whole block and the short one, packed UE8M0:
# two bytes and two of padding, bf16 out); level 1: H = 2880 in each scale format, and the widest row an Ascend
# task holds (H = 16320, one row a task).
_FP4_SHORT_CORE = [dict(variant=dict(out_dtype='bfloat16', bt=1, bc=128, sf='ue8m0', data='e2m1'), hidden=192)]
FP4_SHORT_BLOCK_CASES = by_level(
    LEVEL,
    core=_FP4_SHORT_CORE,
    default=[
        *_FP4_SHORT_CORE,
        dict(variant=dict(out_dtype='bfloat16', bt=1, bc=128, sf='fp32', data='e2m1'), hidden=2880),
        dict(variant=dict(out_dtype='float32', bt=1, bc=128, sf='ue8m0', data='e2m1'), hidden=2880),
        dict(variant=dict(out_dtype='bfloat16', bt=1, bc=128, sf='e4m3', data='e2m1'), hidden=2880),
        dict(variant=dict(out_dtype='float32', bt=1, bc=128, sf='fp32', data='e2m1'), hidden=16320),
    ],
)
VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS, default=_ALL_VARIANTS)
# Tokens: one, partial token blocks (67 = 2 * 32 + 3; 129 = 128 + 1), several col-packed UE8M0 rows ending in
# padding (300: 10 blocks of 32), the benchmark size.
NUM_TOKENS = by_level(LEVEL, core=(1, 67, 300), default=(5, 129), full=(4001,))
# Hidden sizes beyond each variant's own (values_hidden), each one more kernel per variant: lowered for every
# variant (production size, several column tiles), run for the level-0 variants (also the minimum).
LOWERING_HIDDEN = by_level(LEVEL, core=(), default=(7168,), full=(64, 4096, 16384))
VALUES_HIDDEN = by_level(LEVEL, core=(), default=(64, 7168), full=(4096, 5120, 16384))


def values_hidden(bc: int, data: str = 'e4m3') -> int:
    """The hidden size of a variant's values tests: UE8M0 rows ending in padding (34 blocks of 32, 17 of 64, 9
    of 128), and for channel blocks 17 column tiles of 64 on Ascend. FP4: 1152, rows of whole 64-byte loads (18
    blocks of 64 and 9 of 128 end in padding; rows ending in half a load: FP4_HALF_LOAD_CASES and
    FP4_SHORT_BLOCK_CASES)."""
    return 1152 if bc == 128 or data == 'e2m1' else 1088


def _config(backend: str, num_cores: int, variant: dict, hidden: int) -> CastBackConfig:
    return choose_cast_back_config(
        backend=backend,
        num_cores=num_cores,
        hidden=hidden,
        out_dtype=variant['out_dtype'],
        block_tokens=variant['bt'],
        block_channels=variant['bc'],
        packed_ue8m0=variant['sf'] == 'ue8m0',
        **_format_kwargs(variant),
    )


def _format_kwargs(variant: dict) -> dict:
    """The format arguments of a FORMAT_VARIANTS entry (none for the e4m3 / fp32-or-UE8M0 variants: their calls,
    and so their configurations, stay as they were)."""
    if 'data' not in variant:
        return {}
    return dict(fp4=variant['data'] == 'e2m1', e4m3_sf=variant['sf'] == 'e4m3')


def _format_lowering_cases() -> list[dict]:
    return [dict(variant=v, hidden=values_hidden(v['bc'], v['data'])) for v in FORMAT_VARIANTS]


def _lowering_cases() -> list[dict]:
    cases = [dict(variant=v, hidden=values_hidden(v['bc'])) for v in VARIANTS]
    return cases + _sized_cases(VARIANTS, LOWERING_HIDDEN)


def _sized_cases(variants: list[dict], hidden_sizes) -> list[dict]:
    """variant x hidden, where the variant takes hidden (HIDDEN_UNIT: whole registers, whole blocks or a short last
    block of 128 channels)."""
    return generate_samples(variant=variants, hidden=hidden_sizes, where=lambda c: c['hidden'] % HIDDEN_UNIT == 0)


def _case_id(case: dict) -> str:
    return make_param_id({**case['variant'], 'hidden': case['hidden']})


# ---------------------------------------------------------------- CPU tier: configuration


def test_cast_back_config_is_pure_and_hashable():
    kwargs = dict(backend='ascend', num_cores=64, hidden=7168, block_tokens=1, block_channels=128, packed_ue8m0=False)
    a = choose_cast_back_config(out_dtype=torch.bfloat16, **kwargs)
    b = choose_cast_back_config(out_dtype='bfloat16', **kwargs)
    assert a == b
    assert hash(a) == hash(b)
    assert (a.num_blocks, a.sf_cols, a.sf_dtype, a.sf_shape(5)) == (56, 56, 'float32', (5, 56))
    assert (a.block_k, a.block_m, a.num_col_tiles, a.num_stages, a.threads) == (7168, 2, 1, 2, 0)
    assert a.ascend_ub_bytes <= 248 * 1024
    assert UE8M0_PACK == 4


@pytest.mark.parametrize(
    ('bt', 'bc', 'packed', 'num_tokens', 'shape', 'dtype'),
    [
        (1, 32, False, 5, (5, 34), 'float32'),
        (32, 64, True, 67, (3, 20), 'uint8'),  # 17 blocks padded to 20 bytes, ceil(67 / 32) rows
        (128, 128, True, 1, (1, 12), 'uint8'),  # 9 blocks padded to 12
        (32, 1, False, 67, (3, 1088), 'float32'),
        (32, 1, True, 300, (3, 4 * 1088), 'uint8'),  # 10 token blocks in 3 col-packed rows
        (128, 1, True, 129, (1, 4 * 1088), 'uint8'),
    ],
)
def test_cast_back_config_scale_layouts(bt, bc, packed, num_tokens, shape, dtype):
    hidden = 1152 if bc == 128 else 1088
    for backend in ('ascend', 'cuda'):
        cfg = choose_cast_back_config(
            backend=backend, num_cores=64, hidden=hidden, out_dtype='float32', block_tokens=bt,
            block_channels=bc, packed_ue8m0=packed,
        )  # fmt: skip
        assert cfg.sf_shape(num_tokens) == shape
        assert cfg.sf_dtype == dtype
        assert cfg.channel_blocks == (bc == 1)


_TILING_CASES = _sized_cases(_ALL_VARIANTS + _ALL_FORMAT_VARIANTS, [64, 1088, 1152, 7168, 16384, 64 * 67])


@pytest.mark.parametrize('case', _TILING_CASES, ids=_case_id)
def test_cast_back_config_tiles(case):
    """Every variant and size gets a valid tiling: Ascend tasks within UB and one token block (bt > 1), channel
    tasks of at least 32 rows; CUDA thread blocks of <= 256 threads, one row each for per-token scales, else 4 rows
    per thread inside a token block."""
    variant, hidden = case['variant'], case['hidden']
    asc = _config('ascend', 64, variant, hidden)
    assert hidden % asc.block_k == 0
    assert asc.block_m & (asc.block_m - 1) == 0
    if variant['bt'] > 1:
        assert asc.block_m <= variant['bt']
    if variant['bc'] == 1:
        assert asc.block_m >= 32  # a per-channel scale row serves at least 32 rows
        assert asc.block_k <= 512
    assert asc.ascend_ub_bytes <= 248 * 1024
    cuda = _config('cuda', 132, variant, hidden)
    assert hidden % cuda.block_k == 0
    assert cuda.threads <= 256
    assert cuda.rows_per_thread == (1 if variant['bt'] == 1 else 4)
    assert cuda.threads * 16 * cuda.rows_per_thread == cuda.block_m * cuda.block_k  # every element once


@pytest.mark.parametrize(
    ('kwargs', 'error', 'match'),
    [
        (dict(backend='cpu'), ValueError, 'backend'),
        (dict(out_dtype=torch.float16), ValueError, 'out_dtype'),
        (dict(out_dtype='fp8'), ValueError, 'out_dtype'),
        (dict(block_tokens=64), ValueError, 'block_tokens'),
        (dict(block_tokens=32, block_channels=16), ValueError, 'block_channels'),
        (dict(fp4=True, block_tokens=32), ValueError, 'per-token scales only'),
        (dict(e4m3_sf=True, block_tokens=1, block_channels=1), ValueError, 'block_tokens must be one of'),
        (dict(e4m3_sf=True, packed_ue8m0=True), ValueError, 'exclude each other'),
        (dict(fp4=1), TypeError, 'fp4 must be a bool'),
        (dict(fp4=True, hidden=160), ValueError, 'multiple of 64'),
        (dict(fp4=True, hidden=160, block_channels=128, backend='cuda'), ValueError, 'multiple of 64'),
        (dict(block_tokens=1, block_channels=1), ValueError, 'block_tokens must be one of'),
        (dict(block_tokens=True), TypeError, 'block_tokens'),
        (dict(block_channels=32.0), TypeError, 'block_channels'),
        (dict(hidden=96), ValueError, 'multiple of 64'),
        (dict(hidden=16448, block_channels=128), ValueError, 'whole row: hidden must be at most 16384'),
        (dict(hidden=16448, block_channels=128, fp4=True), ValueError, 'whole row: hidden must be at most 16384'),
        (dict(hidden=0), ValueError, 'positive multiple'),
        (dict(hidden=-64), ValueError, 'positive multiple'),
        (dict(packed_ue8m0=1), TypeError, 'packed_ue8m0'),
        (dict(num_cores=0), ValueError, 'num_cores'),
    ],
)
def test_cast_back_config_rejects(kwargs, error, match):
    args = dict(
        backend='ascend', num_cores=64, hidden=256, out_dtype=torch.bfloat16, block_tokens=1, block_channels=32,
        packed_ue8m0=False,
    ) | kwargs  # fmt: skip
    with pytest.raises(error, match=match):
        choose_cast_back_config(**args)


def test_cast_back_config_rejects_bad_tilings():
    base = choose_cast_back_config(
        backend='ascend', num_cores=64, hidden=1088, out_dtype='float32', block_tokens=32, block_channels=64,
        packed_ue8m0=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match='at most one token block'):
        dataclasses.replace(base, block_m=64, block_k=64)
    with pytest.raises(ValueError, match='power of two'):
        dataclasses.replace(base, block_m=24)
    with pytest.raises(ValueError, match='dividing hidden'):
        dataclasses.replace(base, block_k=128)
    with pytest.raises(ValueError, match='UB'):
        dataclasses.replace(base, block_tokens=128, block_m=128)  # 128 x 1088 x 5 bytes x 2
    cuda = choose_cast_back_config(
        backend='cuda', num_cores=132, hidden=1088, out_dtype='float32', block_tokens=32, block_channels=64,
        packed_ue8m0=False,
    )  # fmt: skip
    assert (cuda.threads, cuda.block_m, cuda.block_k) == (204, 12, 1088)
    with pytest.raises(ValueError, match='must divide block_tokens'):
        dataclasses.replace(cuda, block_m=3 * 3)  # 3 rows per thread
    with pytest.raises(ValueError, match='multiple of block_k'):
        dataclasses.replace(cuda, threads=200)
    with pytest.raises(ValueError, match='threads must be 0'):
        dataclasses.replace(base, threads=128)


def test_cast_back_config_col_major():
    """Column-major scales are a configuration field of their own (per-token scales only, as the contract); on
    Ascend a task of column-major UE8M0 scales holds whole int32 words (the row where it is one task); the UB estimate
    counts the transposed scale tile (rows of 32 bytes at least)."""
    args = dict(num_cores=64, out_dtype='bfloat16', block_tokens=1, block_channels=128, packed_ue8m0=True)
    rows = choose_cast_back_config(backend='ascend', hidden=7168, **args)
    cols = choose_cast_back_config(backend='ascend', hidden=7168, col_major_sf=True, **args)
    assert (cols.col_major_sf, rows.col_major_sf) == (True, False)
    assert cols != rows
    assert hash(cols) != hash(rows)
    assert (cols.block_k, cols.block_m) == (rows.block_k, rows.block_m) == (7168, 2)
    assert cols.ascend_col_major_tile == (14, 32)  # 14 words, 2 tokens of 4 bytes rounded up to 32 bytes
    # 18944 = 4 * 37 * 128: the row-major task of 9472 channels holds 74 blocks, 18.5 words; column-major: whole
    # words, the largest dividing the row
    assert choose_cast_back_config(backend='ascend', hidden=18944, **args).block_k == 9472
    wide = choose_cast_back_config(backend='ascend', hidden=18944, col_major_sf=True, **args)
    assert (wide.block_k, wide.task_blocks % UE8M0_PACK) == (512, 0)
    with pytest.raises(ValueError, match='hidden must be a multiple of 512'):
        choose_cast_back_config(backend='ascend', hidden=23680, col_major_sf=True, **args)
    with pytest.raises(ValueError, match='read in whole int32 words'):
        dataclasses.replace(wide, block_k=9472, block_m=1)
    fp32 = choose_cast_back_config(backend='ascend', hidden=7168, col_major_sf=True, **args | {'packed_ue8m0': False})
    assert fp32.ascend_col_major_tile == (56, 8)  # 56 scales, 2 tokens of fp32 rounded up to 32 bytes
    e4m3 = dict(args, packed_ue8m0=False, block_channels=16, e4m3_sf=True, fp4=True)
    assert choose_cast_back_config(backend='ascend', hidden=512, col_major_sf=True, **e4m3).ascend_col_major_tile == (
        32, 32,
    )  # fmt: skip
    cuda = choose_cast_back_config(backend='cuda', hidden=7168, col_major_sf=True, **args | {'num_cores': 132})
    assert cuda.col_major_sf
    assert (cuda.block_k, cuda.block_m) == (1792, 1)  # the row-major tiling
    with pytest.raises(ValueError, match='not supported with per-channel scales'):
        choose_cast_back_config(backend='cuda', hidden=256, col_major_sf=True, **args | {'block_channels': 1,
                                'block_tokens': 32})  # fmt: skip
    # Token blocks (per_block_cast's): a task reads its one token block's scales, a 32-byte UB row per scale / word
    blocks = choose_cast_back_config(backend='ascend', hidden=7168, col_major_sf=True, **args | {'block_tokens': 128})
    assert (blocks.block_k, blocks.scale_rows_per_task) == (7168, 1)
    assert blocks.ascend_col_major_tile == (14, 32)  # 14 words of one block row, 4 bytes rounded up to 32
    fp32_blocks = dataclasses.replace(blocks, packed_ue8m0=False)
    assert fp32_blocks.ascend_col_major_tile == (56, 8)  # 56 scales of one block row, fp32 rounded up to 32 bytes
    for backend in ('ascend', 'cuda'):
        cfg = choose_cast_back_config(backend=backend, hidden=1088, col_major_sf=True, **args | {'block_tokens': 32,
                                      'block_channels': 32})  # fmt: skip
        row = choose_cast_back_config(backend=backend, hidden=1088, **args | {'block_tokens': 32, 'block_channels': 32})
        assert cfg.col_major_sf
        assert (cfg.block_m, cfg.block_k) == (row.block_m, row.block_k)
    with pytest.raises(TypeError, match='col_major_sf must be a bool'):
        choose_cast_back_config(backend='ascend', hidden=256, col_major_sf=1, **args)


def test_cast_back_config_short_block():
    """H = 64 * odd with 128-channel blocks (gpt-oss's 2880): ceil(H / 128) scales a row, the last the short block's
    (packed UE8M0 bytes padded to whole words); on Ascend the row is one task (a ValueError past 16384 channels,
    and for a tiling that cuts the row), on CUDA tiles of whole registers (a thread's 16 columns lie in one block).
    64-channel blocks of the same H are whole (FP4 data's short block: test_cast_back_config_fp4_short_block)."""
    args = dict(out_dtype='bfloat16', block_tokens=1, block_channels=128, packed_ue8m0=False)
    asc = choose_cast_back_config(backend='ascend', num_cores=64, hidden=2880, **args)
    assert asc.short_block
    assert (asc.num_blocks, asc.task_blocks, asc.sf_cols, asc.sf_shape(5)) == (23, 23, 23, (5, 23))
    assert (asc.block_k, asc.block_m, asc.num_col_tiles) == (2880, 4, 1)
    packed = choose_cast_back_config(backend='ascend', num_cores=64, hidden=2880, **args | {'packed_ue8m0': True})
    assert (packed.sf_cols, packed.sf_shape(5)) == (24, (5, 24))  # 23 bytes and a zero byte: 6 int32 words
    with pytest.raises(ValueError, match='task of the whole row: block_k 960 must be hidden 2880'):
        dataclasses.replace(asc, block_k=960, block_m=16)
    largest = choose_cast_back_config(
        backend='ascend', num_cores=64, hidden=16320, **args | {'out_dtype': 'float32', 'packed_ue8m0': True}
    )
    assert (largest.block_k, largest.block_m) == (16320, 1)
    assert largest.ascend_ub_bytes <= 248 * 1024
    for bt in (1, 32, 128):
        cuda = choose_cast_back_config(backend='cuda', num_cores=132, hidden=2880, **args | {'block_tokens': bt})
        assert cuda.short_block
        assert (cuda.block_k, cuda.threads, cuda.num_blocks) == (2880, 180, 23)
        assert cuda.rows_per_thread == (1 if bt == 1 else 4)
    wide = choose_cast_back_config(backend='cuda', num_cores=132, hidden=5 * 1088, **args)  # 42.5 blocks
    assert (wide.block_k, wide.num_col_tiles, wide.num_blocks) == (1088, 5, 43)  # tiles of whole registers
    assert not choose_cast_back_config(
        backend='ascend', num_cores=64, hidden=2880, **args | {'block_channels': 64}
    ).short_block


def test_cast_back_config_fp4_half_load():
    """FP4 data at H = 64 * odd, whole 16-, 32- or 64-channel blocks (gpt-oss's 2880): on Ascend a task of the row
    (a multiple of 64 elements, its last load half: the UB data tile padded to whole 64-byte loads), on CUDA a
    thread block of the row, 16 columns a thread; rows of whole 64-byte loads keep their tiles and tile width."""
    args = dict(out_dtype='bfloat16', block_tokens=1, packed_ue8m0=False, fp4=True)
    for bc in (16, 32, 64):
        asc = choose_cast_back_config(backend='ascend', num_cores=64, hidden=2880, block_channels=bc, **args)
        assert not asc.short_block
        assert (asc.block_k, asc.block_m, asc.data_cols, asc.ascend_data_cols) == (2880, 4, 1440, 1472)
        assert asc.ascend_ub_bytes <= 248 * 1024
        cuda = choose_cast_back_config(backend='cuda', num_cores=132, hidden=2880, block_channels=bc, **args)
        assert (cuda.block_k, cuda.block_m, cuda.threads) == (2880, 1, 180)
    whole = choose_cast_back_config(backend='ascend', num_cores=64, hidden=1152, block_channels=32, **args)
    assert whole.ascend_data_cols == whole.data_cols == 576  # whole loads: no padding
    wide = choose_cast_back_config(backend='ascend', num_cores=64, hidden=64 * 257, block_channels=32, **args)
    assert (wide.block_k, wide.ascend_data_cols) == (64, 64)  # 257 tasks a row, each one half load
    for hidden in (96, 2880 + 32):
        with pytest.raises(ValueError, match='hidden must be a positive multiple of 64'):
            choose_cast_back_config(backend='cuda', num_cores=132, hidden=hidden, block_channels=32, **args)
    with pytest.raises(ValueError, match='block_k 576 must be a multiple of 128'):
        dataclasses.replace(whole, block_k=576)  # H of whole loads: tasks of whole loads


def test_cast_back_config_fp4_short_block():
    """FP4 data in 128-channel blocks at H = 64 * odd (gpt-oss's 2880): ceil(H / 128) scales a row, the last the
    short block's; on Ascend a task of the row ending in half a load (its UB data tile padded to whole loads), the
    widest 16320 (one row a task, within UB), past 16384 refused; on CUDA the FP4 kernel's tiles of whole registers."""
    args = dict(block_tokens=1, block_channels=128, fp4=True)
    for sf in ('fp32', 'ue8m0', 'e4m3'):
        formats = dict(packed_ue8m0=sf == 'ue8m0', e4m3_sf=sf == 'e4m3', **args)
        asc = choose_cast_back_config(backend='ascend', num_cores=64, hidden=2880, out_dtype='bfloat16', **formats)
        assert asc.short_block
        assert (asc.block_k, asc.block_m, asc.num_col_tiles, asc.task_blocks) == (2880, 4, 1, 23)
        assert (asc.data_cols, asc.ascend_data_cols) == (1440, 1472)
        assert asc.sf_shape(5) == (5, 24 if sf == 'ue8m0' else 23)  # 23 UE8M0 bytes and a zero byte: 6 words
        widest = choose_cast_back_config(backend='ascend', num_cores=64, hidden=16320, out_dtype='float32', **formats)
        assert (widest.block_k, widest.block_m, widest.ascend_data_cols) == (16320, 1, 8192)
        assert widest.ascend_ub_bytes <= 248 * 1024
        cuda = choose_cast_back_config(backend='cuda', num_cores=132, hidden=2880, out_dtype='float32', **formats)
        assert cuda.short_block
        assert (cuda.block_k, cuda.block_m, cuda.threads, cuda.num_blocks) == (2880, 1, 180, 23)
    wide = choose_cast_back_config(backend='cuda', num_cores=132, hidden=64 * 67, out_dtype='float32', **args | {
        'packed_ue8m0': False})  # fmt: skip
    assert (wide.block_k, wide.num_col_tiles, wide.num_blocks) == (64, 67, 34)  # tiles of whole registers
    with pytest.raises(ValueError, match='task of the whole row: block_k 960 must be hidden 2880'):
        dataclasses.replace(asc, block_k=960, block_m=16)


_CM_DMA = re.compile(
    r'asc_copy_gm2ub_align\(\(__ubuf__ uint8_t\*\)\([^;]*x_sf\[[^;]*, (\d+), ([^;]*?), 0, 0, 0, '
    r'static_cast<asc_load_l2_cache_mode>\(\d+\), ([^,;]+), (\d+)\);'
)
# The kernel configurations of test_cast_back.py's level-0 column-major values, and at level 1 fp32 scales, a
# 7168-channel row of two tokens a task and FP4 data with a short last block (H = 2880).
_COL_MAJOR_LOWERING = by_level(
    LEVEL,
    core=[(1088, 64, 'ue8m0', 'e4m3'), (1152, 16, 'e4m3', 'e2m1')],
    default=[
        (1088, 32, 'fp32', 'e4m3'),
        (1152, 128, 'fp32', 'e2m1'),
        (7168, 128, 'ue8m0', 'e4m3'),
        (2880, 128, 'ue8m0', 'e2m1'),
    ],
)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(('hidden', 'bc', 'sf', 'data'), _COL_MAJOR_LOWERING)
def test_cast_back_col_major_lowers(backend, hidden, bc, sf, data):
    """Both kernels read the column-major scales themselves, the row stride a launch argument: on CUDA one load
    per thread at k * stride + t (UE8M0: byte k % 4 of word k // 4); on Ascend one DMA per task, a burst per scale
    (UE8M0: per word) of the task's tokens, contiguous in GM, a row stride apart, into rows of the UB tile."""
    cfg = choose_cast_back_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, hidden=hidden,
        out_dtype='bfloat16', block_tokens=1, block_channels=bc, packed_ue8m0=sf == 'ue8m0', fp4=data == 'e2m1',
        e4m3_sf=sf == 'e4m3', col_major_sf=True,
    )  # fmt: skip
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowered = lower(lambda: make_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    if backend == 'cuda':
        assert 'int sf_stride' in lowered.source
        assert 'sf_stride)' in lowered.source  # the scale's address scales the row by it
        return
    assert lowered.ub_bytes == cfg.ascend_ub_bytes
    ((n_burst, len_burst, gm_stride, ub_stride),) = _CM_DMA.findall(lowered.source)
    rows, width = cfg.ascend_col_major_tile
    itemsize = 1 if cfg.widens_sf else 4
    assert (int(n_burst), int(ub_stride)) == (rows, width * itemsize)
    assert 'num_tokens' in len_burst  # the task's tokens, the last task's fewer
    assert 'sf_stride' in gm_stride


# Column-major scales of token blocks (per_block_cast's): test_cast_back.py's level-0 configurations, at level 1
# more blocks and a 7168-channel row.
_BLOCK_COL_MAJOR_LOWERING = by_level(
    LEVEL,
    core=[(1088, 32, 32, 'ue8m0'), (1152, 128, 128, 'fp32')],
    default=[(1088, 32, 64, 'ue8m0'), (1088, 128, 32, 'ue8m0'), (1152, 32, 128, 'fp32'), (7168, 128, 128, 'ue8m0')],
)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize(('hidden', 'bt', 'bc', 'sf'), _BLOCK_COL_MAJOR_LOWERING)
def test_cast_back_block_col_major_lowers(backend, hidden, bt, bc, sf):
    """Column-major scales of token blocks: on CUDA one load per thread at k * stride + t // bt (UE8M0: byte k % 4
    of word k // 4); on Ascend one DMA per task of the task's token block, a burst of one scale (UE8M0: one word,
    4 bytes) per scale / word, a row stride apart in GM, into 32-byte rows of the UB tile."""
    cfg = choose_cast_back_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, hidden=hidden,
        out_dtype='bfloat16', block_tokens=bt, block_channels=bc, packed_ue8m0=sf == 'ue8m0', col_major_sf=True,
    )  # fmt: skip
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowered = lower(lambda: make_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    if backend == 'cuda':
        assert 'int sf_stride' in lowered.source
        assert '* ((int64_t)sf_stride)' in lowered.source  # the scale's address scales the row by it
        return
    assert lowered.ub_bytes == cfg.ascend_ub_bytes
    ((n_burst, len_burst, gm_stride, ub_stride),) = _CM_DMA.findall(lowered.source)
    rows, width = cfg.ascend_col_major_tile
    assert (int(n_burst), int(len_burst), int(ub_stride)) == (rows, 4, 32)  # one scale / word per burst
    assert width * (1 if cfg.widens_sf else 4) == 32
    assert 'sf_stride' in gm_stride


# ---------------------------------------------------------------- CPU tier: the reference


def test_reference_hand_values():
    """One fp32 multiply, then the cast: 1.5 * 2 = 3; bf16 rounds to nearest even; UE8M0 byte b is 2 ** (b - 127),
    0 gives 0.0 and 255 inf; blocks of tokens and channels repeat the scale, a partial last token block too."""
    data = torch.tensor([[1.5, -0.5, 448.0, -0.0], [0.25, 1.0, -3.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    data = data.to(torch.float8_e4m3fn)
    sf = torch.tensor([[2.0, 0.5], [-1.0, 1.0 + 2.0**-8]])  # bt = 2, bc = 2: rows 0-1 and row 2
    out = cast_back_ref(data, sf, torch.float32, 2, 2)
    assert out.tolist() == [[3.0, -1.0, 224.0, -0.0], [0.5, 2.0, -1.5, 1.0], [-1.0, -1.0, 1.0 + 2.0**-8, 1.0 + 2.0**-8]]
    assert torch.signbit(out[0, 3])  # -0.0 keeps its sign
    bf16 = cast_back_ref(data, sf, torch.bfloat16, 2, 2)
    assert bf16[2, 2].item() == 1.0  # 1 + 2**-8 is a tie between 1 and 1 + 2**-7: to even
    sf_tie = torch.tensor([[1.0, 1.0], [3 * 2.0**-8 + 1.0, 1.0]])
    assert cast_back_ref(data, sf_tie, torch.bfloat16, 2, 2)[2, 0].item() == 1.0 + 2.0**-6  # 1 + 3 * 2**-8 up
    ue8m0 = torch.tensor([[127, 128, 0, 255]], dtype=torch.uint8)
    assert ue8m0_to_fp32(ue8m0).tolist() == [[1.0, 2.0, 0.0, float('inf')]]
    packed = pack_ue8m0_rows(ue8m0[:, :2], UE8M0_PACK)  # 2 blocks of 2 channels, padded to 4 bytes
    assert cast_back_ref(data[:1], packed, torch.float32, 1, 2).tolist() == [[1.5, -0.5, 896.0, -0.0]]


def test_reference_col_packed_layout():
    """Byte [r, 4h + j] of the col-packed layout is token block 4r + j of channel h; the padding is zero."""
    ue8m0 = torch.arange(6 * 3, dtype=torch.int32).to(torch.uint8).reshape(6, 3)  # 6 token blocks, 3 channels
    packed = pack_ue8m0_cols(ue8m0)
    assert packed.shape == (2, 12)
    for g in range(6):
        for h in range(3):
            assert packed[g // 4, 4 * h + g % 4] == ue8m0[g, h]
    assert packed[1, 4 * 0 + 2] == 0  # block 6 does not exist
    assert torch.equal(unpack_ue8m0_cols(packed, 6), ue8m0)
    scales = block_scales(packed, 6 * 32 - 5, 3, 32, 1)
    assert scales.shape == (187, 3)
    assert torch.equal(scales[::32], ue8m0_to_fp32(ue8m0))


def test_reference_random_inputs():
    data = random_e4m3(64, 256)
    bits = data.view(torch.uint8)
    assert not ((bits & 0x7F) == 0x7F).any()  # no NaN unless asked for
    assert torch.unique(bits).numel() == 254  # every other pattern occurs
    for packed in (False, True):
        for bt, bc in ((1, 32), (32, 1)):
            sf, scales = random_scales(70, 256, bt, bc, packed_ue8m0=packed)
            assert torch.equal(block_scales(sf, 70, 256, bt, bc)[::bt, ::bc], scales)


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_cast_back_ascend_lowers(case):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    assert cfg.backend == 'ascend'
    lowered = assert_ascend_kernel_lowers(lambda: make_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert lowered.ub_bytes == cfg.ascend_ub_bytes  # the config's UB estimate is the allocation
    assert 'vlds_unpack4' in lowered.source  # the fp8 bytes widen one per 32-bit lane
    if cfg.out_dtype == 'bfloat16':
        assert 'RS_DISABLE' in lowered.source  # non-saturating fp32 -> bf16: overflow to inf, as torch


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_cast_back_cuda_lowers(case):
    cfg = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    lowered = assert_cuda_kernel_lowers(lambda: make_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert lowered.ub_bytes == 0  # no shared memory: registers only
    assert '*(fp8_e4_16_t*)(xr' in lowered.source  # one 16-byte load of fp8 per row and thread
    store = '*(uint4*)(out' if cfg.out_dtype == 'bfloat16' else '*(float4*)(out'
    assert store in lowered.source  # 16-byte stores
    if cfg.out_dtype == 'bfloat16':
        assert '__float22bfloat162_rn' in lowered.source  # nearest even


@pytest.mark.parametrize('case', _format_lowering_cases(), ids=_case_id)
def test_cast_back_formats_lower(case):
    """FP4 data, E4M3 scales, 16-channel blocks: both backends lower; Ascend UB as the config says; FP4 read as
    bytes (CUDA: one 8-byte load a thread), E4M3 scales widened by conversion."""
    asc = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    lowered = assert_ascend_kernel_lowers(lambda: make_cast_back_kernel(asc), key=asc, kernel_name=KERNEL_NAME)
    assert lowered.ub_bytes == asc.ascend_ub_bytes
    assert 'vlds_unpack4' in lowered.source
    cuda = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    lowered = assert_cuda_kernel_lowers(lambda: make_cast_back_kernel(cuda), key=cuda, kernel_name=KERNEL_NAME)
    assert lowered.ub_bytes == 0
    if case['variant']['data'] == 'e2m1':
        assert '*(int2*)(xr' in lowered.source  # 8 bytes of FP4 (16 elements) per thread
    else:
        assert '*(fp8_e4_16_t*)(xr' in lowered.source
    if case['variant']['sf'] == 'e4m3':
        assert 'const fp8_e4_t* __restrict__ x_sf' in lowered.source


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('case', SHORT_BLOCK_CASES, ids=_case_id)
@pytest.mark.parametrize('col_major', by_level(LEVEL, core=(False,), default=(True,)))
def test_cast_back_short_block_lowers(backend, case, col_major):
    """A short last block lowers on both backends, row- and (level 1) column-major scales: Ascend a task of the
    whole row, its UB as the config says; CUDA the kernel of whole blocks, a thread's scale at col // 128 (the
    short block's for the last 64 columns)."""
    cfg = _config(
        backend, ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, case['variant'], case['hidden']
    )
    cfg = dataclasses.replace(cfg, col_major_sf=col_major)
    assert cfg.short_block
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowered = lower(lambda: make_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    if backend == 'ascend':
        assert cfg.block_k == cfg.hidden
        assert lowered.ub_bytes == cfg.ascend_ub_bytes
    else:
        assert lowered.ub_bytes == 0


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('case', FP4_HALF_LOAD_CASES, ids=_case_id)
def test_cast_back_fp4_half_load_lowers(backend, case):
    """FP4 data at H = 64 * odd lowers on both backends: Ascend a task ending in half a 64-byte load, its UB (data
    and codes padded to whole loads) as the config says; CUDA the FP4 kernel, one 8-byte load a thread."""
    cfg = _config(
        backend, ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, case['variant'], case['hidden']
    )
    assert cfg.hidden % 128 == 64
    assert not cfg.short_block
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowered = lower(lambda: make_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    if backend == 'ascend':
        assert cfg.ascend_data_cols == cfg.data_cols + 32
        assert lowered.ub_bytes == cfg.ascend_ub_bytes
    else:
        assert lowered.ub_bytes == 0
        assert '*(int2*)(xr' in lowered.source


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('case', FP4_SHORT_BLOCK_CASES, ids=_case_id)
def test_cast_back_fp4_short_block_lowers(backend, case):
    """FP4 data with a short last 128-channel block lowers on both backends: Ascend a task of the whole row ending
    in half a 64-byte load, its UB as the config says; CUDA the FP4 kernel, one 8-byte load a thread."""
    cfg = _config(
        backend, ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS, case['variant'], case['hidden']
    )
    assert cfg.short_block
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowered = lower(lambda: make_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    if backend == 'ascend':
        assert (cfg.block_k, cfg.ascend_data_cols) == (cfg.hidden, cfg.data_cols + 32)
        assert lowered.ub_bytes == cfg.ascend_ub_bytes
    else:
        assert lowered.ub_bytes == 0
        assert '*(int2*)(xr' in lowered.source


# ---------------------------------------------------------------- device tier


def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _run(x: torch.Tensor, sf: torch.Tensor, variant: dict, device) -> torch.Tensor:
    hidden = 2 * x.shape[1] if x.dtype == torch.int8 else x.shape[1]  # FP4: two elements a byte
    cfg = _config(backend_of(device), get_num_cores(device), variant, hidden)
    assert tuple(sf.shape) == cfg.sf_shape(x.shape[0])
    shape = (x.shape[0], cfg.hidden)
    out = torch.full(shape, float('nan'), device=device).to(OUT_DTYPES[variant['out_dtype']])  # poisoned
    launch_kernel(get_cast_back_kernel, cfg, device, x.to(device), sf.to(device), out)
    return out.cpu()


def _check(x: torch.Tensor, sf: torch.Tensor, variant: dict, device) -> None:
    out = _run(x, sf, variant, device)
    assert out.shape == (x.shape[0], 2 * x.shape[1] if x.dtype == torch.int8 else x.shape[1])
    ref = cast_back_ref(x, sf, OUT_DTYPES[variant['out_dtype']], variant['bt'], variant['bc'])
    assert_equal(_int_view(out), _int_view(ref))


def _inputs(num_tokens: int, hidden: int, variant: dict) -> tuple[torch.Tensor, torch.Tensor]:
    x = random_e2m1(num_tokens, hidden) if variant.get('data') == 'e2m1' else random_e4m3(num_tokens, hidden)
    sf, _ = random_scales(
        num_tokens, hidden, variant['bt'], variant['bc'], packed_ue8m0=variant['sf'] == 'ue8m0',
        e4m3_sf=variant['sf'] == 'e4m3',
    )  # fmt: skip
    return x, sf


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_cast_back_kernel_values(variant, num_tokens, device):
    _check(*_inputs(num_tokens, values_hidden(variant['bc']), variant), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('case', _sized_cases(_CORE_VARIANTS, VALUES_HIDDEN), ids=_case_id)
def test_cast_back_kernel_hidden_sizes(case, device):
    """The level-0 kernel classes at other sizes: minimum rows, several column tiles, production sizes."""
    _check(*_inputs(131, case['hidden'], case['variant']), case['variant'], device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_cast_back_kernel_ignores_padding(variant, device):
    """The UE8M0 padding (bytes past the last block of a row; token blocks past the last in col-packed rows)
    is never read: garbage there changes nothing. fp32 variants: a partial last token block of one token."""
    num_tokens = 2 * variant['bt'] * UE8M0_PACK + 1 if variant['bt'] > 1 else 3
    hidden = values_hidden(variant['bc'])
    x, sf = _inputs(num_tokens, hidden, variant)
    if variant['sf'] == 'ue8m0':
        blocks = -(-num_tokens // variant['bt'])
        if variant['bc'] == 1:
            valid = pack_ue8m0_cols(torch.ones(blocks, hidden, dtype=torch.uint8)).bool()
        else:
            valid = pack_ue8m0_rows(torch.ones(blocks, hidden // variant['bc'], dtype=torch.uint8)).bool()
        assert not valid.all()  # the layout ends in padding
        sf = torch.where(valid, sf, torch.full_like(sf, 0xA5))
    _check(x, sf, variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_cast_back_kernel_special_values(variant, device):
    """NaN data, +-0, subnormal e4m3, +-448 against scales 0, 2**-126 (subnormal products), 2**127 (fp32
    overflow to inf), inf (inf * 0 is NaN) and, for fp32 scales, -0.0, a subnormal scale and NaN: NaN wherever
    the reference has NaN, every other bit exact."""
    bt, bc = variant['bt'], variant['bc']
    num_tokens, hidden = 2 * max(bt, 8) + 3, values_hidden(bc)
    pool = torch.tensor([0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x07, 0x7E, 0xFE, 0x38, 0xB9, 0x53], dtype=torch.uint8)
    x = pool[torch.randint(len(pool), (num_tokens, hidden))].view(torch.float8_e4m3fn)
    blocks, per_row = -(-num_tokens // bt), hidden // bc
    if variant['sf'] == 'ue8m0':
        byte_pool = torch.tensor([0, 1, 2, 100, 127, 200, 254, 255], dtype=torch.uint8)
        ue8m0 = byte_pool[torch.randint(len(byte_pool), (blocks, per_row))]
        sf = pack_ue8m0_cols(ue8m0) if bc == 1 else pack_ue8m0_rows(ue8m0, UE8M0_PACK)
    else:
        scale_pool = torch.tensor(
            [0.0, -0.0, 2.0**-126, 2.0**-140, 2.0**127, -(2.0**120), float('inf'), float('nan'), 1.0, 1.0 + 2.0**-8]
        )
        sf = scale_pool[torch.randint(len(scale_pool), (blocks, per_row))]
    out = _run(x, sf, variant, device)
    ref = cast_back_ref(x, sf, OUT_DTYPES[variant['out_dtype']], bt, bc)
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(_int_view(out)[~nan], _int_view(ref)[~nan])
    assert nan.any()
    assert ref.isinf().any()
    assert (_int_view(ref) == _int_view(torch.tensor(-0.0).to(ref.dtype))).any()  # -0.0 kept


@pytest.mark.npu
@pytest.mark.parametrize('variant', FORMAT_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(1, 67), default=(5, 129)))
def test_cast_back_formats_values(variant, num_tokens, device):
    _check(*_inputs(num_tokens, values_hidden(variant['bc'], variant['data']), variant), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_FORMAT_VARIANTS, ids=make_param_id)
def test_cast_back_formats_special_values(variant, device):
    """Every e2m1 code (-0 included) or special e4m3 data against special scales: E4M3 0, -0, the smallest
    subnormal, 448 and NaN; UE8M0 0, 255 (inf); fp32 0, -0, subnormal, huge, inf, NaN. NaN where the reference has
    NaN, every other bit exact; UE8M0 padding bytes (garbage) are never read."""
    bc, fp4 = variant['bc'], variant['data'] == 'e2m1'
    num_tokens, hidden = 19, values_hidden(bc, variant['data'])
    if fp4:
        x = random_e2m1(num_tokens, hidden)
    else:
        pool = torch.tensor([0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x7E, 0xFE, 0x38], dtype=torch.uint8)
        x = pool[torch.randint(len(pool), (num_tokens, hidden))].view(torch.float8_e4m3fn)
    per_row = hidden // bc
    if variant['sf'] == 'e4m3':
        bytes_pool = torch.tensor([0x00, 0x80, 0x01, 0x7E, 0x7F, 0x38, 0xB8], dtype=torch.uint8)
        sf = bytes_pool[torch.randint(len(bytes_pool), (num_tokens, per_row))].view(torch.float8_e4m3fn)
    elif variant['sf'] == 'ue8m0':
        byte_pool = torch.tensor([0, 1, 100, 127, 254, 255], dtype=torch.uint8)
        ue8m0 = byte_pool[torch.randint(len(byte_pool), (num_tokens, per_row))]
        sf = pack_ue8m0_rows(ue8m0, UE8M0_PACK)
        valid = pack_ue8m0_rows(torch.ones_like(ue8m0), UE8M0_PACK).bool()
        sf = torch.where(valid, sf, torch.full_like(sf, 0xA5))
    else:
        scale_pool = torch.tensor([0.0, -0.0, 2.0**-140, 2.0**127, float('inf'), float('nan'), 1.0 + 2.0**-8])
        sf = scale_pool[torch.randint(len(scale_pool), (num_tokens, per_row))]
    out = _run(x, sf, variant, device)
    ref = cast_back_ref(x, sf, OUT_DTYPES[variant['out_dtype']], 1, bc)
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(_int_view(out)[~nan], _int_view(ref)[~nan])
    assert (_int_view(ref) == _int_view(torch.tensor(-0.0).to(ref.dtype))).any()  # -0.0 kept


@pytest.mark.npu
@pytest.mark.parametrize('case', SHORT_BLOCK_CASES, ids=_case_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(67,), default=(5, 129)))
def test_cast_back_kernel_short_block_values(case, num_tokens, device):
    """H = 64 * odd, 128-channel blocks: the last scale of a row multiplies its last 64 channels (the reference
    expands whole blocks and cuts them back to H), bit for bit; UE8M0 bytes past the short block's (garbage) are
    never read."""
    variant, hidden = case['variant'], case['hidden']
    x, sf = _inputs(num_tokens, hidden, variant)
    if variant['sf'] == 'ue8m0':
        blocks = -(-hidden // variant['bc'])
        valid = pack_ue8m0_rows(torch.ones(sf.shape[0], blocks, dtype=torch.uint8)).bool()
        assert not valid.all()  # 2 or 23 blocks: the rows end in padding
        sf = torch.where(valid, sf, torch.full_like(sf, 0xA5))
    _check(x, sf, variant, device)


def test_reference_short_block():
    """A short last block (H = 64 * odd, bc = 128) has its own scale: ceil(H / bc) a row, the last one on the row's
    last 64 channels only; fp32, UE8M0 (padded to a word) and E4M3 scales alike."""
    data = torch.ones(2, 192, dtype=torch.float8_e4m3fn)
    sf = torch.tensor([[2.0, -3.0], [0.5, 4.0]])
    out = cast_back_ref(data, sf, torch.float32, 1, 128)
    assert out.shape == (2, 192)
    assert torch.equal(out[:, :128], sf[:, :1].expand(2, 128))
    assert torch.equal(out[:, 128:], sf[:, 1:].expand(2, 64))
    assert torch.equal(block_scales(sf, 2, 192, 1, 128), out)
    ue8m0 = torch.tensor([[127, 130], [120, 140]], dtype=torch.uint8)
    packed = pack_ue8m0_rows(ue8m0, UE8M0_PACK)
    assert packed.shape == (2, 4)
    assert torch.equal(
        block_scales(packed, 2, 192, 1, 128)[:, ::64], ue8m0_to_fp32(ue8m0).repeat_interleave(2, 1)[:, :3]
    )
    sf, scales = random_scales(3, 2880, 1, 128, packed_ue8m0=False)
    assert sf.shape == (3, 23)
    assert torch.equal(block_scales(sf, 3, 2880, 1, 128)[:, 2816:], scales[:, 22:].expand(3, 64))
    with pytest.raises(ValueError, match=r'expected \(2, 2\)'):
        block_scales(sf[:2, :1], 2, 192, 1, 128)  # floor(H / bc) scales: the short block's missing


def test_reference_e2m1_decoding():
    """decode_e2m1: byte i holds elements 2 i (low nibble) and 2 i + 1; the 16 codes are fp4.E2M1_VALUES; it agrees
    with the domain's unpack_from_e2m1fn_x2."""
    from cann_ops_tilelang.quant.fp4 import unpack_from_e2m1fn_x2

    data = torch.tensor([[0x21, 0x9F], [0x70, 0x08]], dtype=torch.uint8).view(torch.int8)
    values = decode_e2m1(data)
    assert values.tolist() == [[0.5, 1.0, -6.0, -0.5], [0.0, 6.0, -0.0, 0.0]]
    assert torch.signbit(values[1, 2])
    x = random_e2m1(9, 256)
    assert torch.equal(decode_e2m1(x), unpack_from_e2m1fn_x2(x))
    sf = torch.tensor([[2.0, -0.25]]).repeat(9, 1)
    ref = cast_back_ref(x, sf, torch.float32, 1, 128)
    assert torch.equal(ref, decode_e2m1(x) * sf.repeat_interleave(128, dim=1))


@pytest.mark.npu
@pytest.mark.parametrize('case', FP4_HALF_LOAD_CASES, ids=_case_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(67,), default=(5, 33)))
def test_cast_back_kernel_fp4_half_load_values(case, num_tokens, device):
    """FP4 data at H = 64 * odd: each row's last 64 elements, half a 64-byte load, bit for bit against the
    reference (UB past them poisoned on the emulator)."""
    _check(*_inputs(num_tokens, case['hidden'], case['variant']), case['variant'], device)


@pytest.mark.npu
@pytest.mark.parametrize('case', FP4_SHORT_BLOCK_CASES, ids=_case_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(67,), default=(5,)))
def test_cast_back_kernel_fp4_short_block_values(case, num_tokens, device):
    """FP4 data with a short last 128-channel block: each row's last 64 elements, half a 64-byte load, times the
    short block's own scale, bit for bit against the reference."""
    _check(*_inputs(num_tokens, case['hidden'], case['variant']), case['variant'], device)
