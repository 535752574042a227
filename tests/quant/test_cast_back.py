"""cast_back and per_token_cast_back, the public operators: argument contract and torch.library forms (CPU tier),
values through the public calls against the reference, bit for bit, on what the domain's casts produce (device
tier: an accelerator, or the Ascend kernels on the emulator with --ascend-emulator). The kernels themselves:
test_cast_back_kernel.py."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.quant import cast_back, per_block_cast, per_channel_cast, per_token_cast, per_token_cast_back
from cann_ops_tilelang.quant._contract import sf_layout
from cann_ops_tilelang.quant._scale_rules import FORMAT_MAX
from tests.quant.cast_back_ref import cast_back_ref
from tests.quant.cast_ref import padded_hidden, per_token_cast_format_ref, scaled_rows, tma_col_major_sf
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal, count_bytes

LEVEL = get_test_level()
DATA = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
Q = (DATA, torch.ones(4, 2))
DATA64 = torch.zeros(64, 256, dtype=torch.float8_e4m3fn)  # two blocks of 32 tokens
FP4 = (torch.zeros(4, 256, dtype=torch.int8), torch.ones(4, 4))  # 512 e2m1 elements a row, 128-channel blocks


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, every NaN as one pattern (the NaN of inf * 0 is the platform's)."""
    t = t.cpu()
    bits = t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)
    return torch.where(torch.isnan(t), -1, bits)


def _expected(quantised, fmt: str, block) -> torch.Tensor:
    data, sf = (t.cpu() for t in quantised)
    sf = sf.view(torch.uint8) if sf.dtype == torch.int32 else sf
    return cast_back_ref(data, sf, torch.bfloat16 if fmt == 'bf16' else torch.float32, *block)


# ---------------------------------------------------------------- CPU tier: argument contract


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((DATA, 'bf16', (1, 128)), {}, TypeError, r'x must be a tuple \(data, sf\) of 2 tensors, got Tensor'),
        (((DATA.float(), Q[1]), 'bf16', (1, 128)), {}, TypeError, r'x\[0\] must have dtype torch.float8_e4m3fn'),
        (((DATA, Q[1].half()), 'bf16', (1, 128)), {}, TypeError, r'x\[1\] must have dtype torch.float32 or'),
        ((Q, 'e4m3', (1, 128)), {}, ValueError, "fmt must be 'bf16' or 'fp32'"),
        ((Q, 'bf16', (1, 128), 'ue8m0'), {}, ValueError, "x_special_fmt='ue8m0' is not supported yet"),
        ((Q, 'bf16', (32, 16)), {}, ValueError, r'x_block_size\[1\] \(channels per scale\) must be one of'),
        ((FP4, 'bf16', (32, 128)), {}, ValueError, r'FP4 \(int8\) data take per-token scales only'),
        (((DATA, torch.ones(1, 2, dtype=torch.float8_e4m3fn)), 'bf16', (32, 128)), {}, ValueError,
         r'float8_e4m3fn scales take per-token scales only'),
        (((DATA, torch.ones(4, 256, dtype=torch.float8_e4m3fn)), 'bf16', (32, 1)), {}, ValueError,
         r'float8_e4m3fn scales take per-token scales only'),
        (((torch.zeros(4, 80, dtype=torch.int8), torch.ones(4, 10)), 'bf16', (1, 16)), {}, ValueError,
         r'multiple of 64 for x_block_size \(1, 16\) and FP4 data \(H is twice its bytes\), got 160'),
        ((FP4, 'bf16', (1, 16)), {}, ValueError, r'x\[1\] must have shape \(4, 32\)'),
        (((FP4[0].view(torch.uint8), FP4[1]), 'bf16', (1, 128)), {}, TypeError, r'x\[0\] must have dtype'),
        ((FP4, 'bf16', (1, 128)), {'out': torch.empty(4, 256, dtype=torch.bfloat16)}, ValueError, 'out'),
        ((Q, 'bf16', (64, 128)), {}, ValueError, r'x_block_size\[0\] \(tokens per scale\) must be one of'),
        ((Q, 'bf16', (1, 1)), {}, ValueError, r'x_block_size\[0\] with per-channel scales must be one of'),
        ((Q, 'bf16', (1, 64)), {}, ValueError, r'x\[1\] must have shape \(4, 4\)'),
        (((DATA, torch.ones(1, 64, dtype=torch.int32)), 'bf16', (32, 1)), {}, ValueError,
         r'x\[1\] must have shape \(1, 256\)'),
        (((DATA, torch.ones(4, 4)[:, ::2]), 'bf16', (1, 128)), {}, ValueError,
         r'x\[1\] must be row-major \(contiguous\) or column-major \(strides \(1, S\) with S >= 4.*got strides '
         r'\(4, 2\)'),
        (((DATA, torch.ones(8, 2)[::2]), 'bf16', (1, 128)), {}, ValueError, r'got strides \(4, 1\)'),
        (((DATA, torch.ones(8).as_strided((4, 2), (1, 3))), 'bf16', (1, 128)), {}, ValueError,
         r'got strides \(1, 3\)'),  # columns overlapping
        (((DATA64, torch.ones(2, 1).t()), 'bf16', (32, 128)), {}, ValueError,
         r'x\[1\] must have shape \(2, 2\)'),  # column-major token blocks: the logical (R, K) shape
        (((DATA64, torch.ones(4, 2)[::2]), 'bf16', (32, 128)), {}, ValueError, r'got strides \(4, 1\)'),
        (((DATA64, torch.ones(3).as_strided((2, 2), (1, 1))), 'bf16', (32, 128)), {}, ValueError,
         r'got strides \(1, 1\)'),  # token blocks' columns overlapping: S < R
        (((DATA64, torch.ones(256, 2).t()), 'bf16', (32, 1)), {}, ValueError,
         r'column-major scales are not supported with per-channel scales'),
        ((Q, 'bf16', (1, 128)), {'out': torch.empty(4, 256)}, TypeError, 'out must have dtype torch.bfloat16'),
        ((Q, 'fp32', (1, 128)), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_cast_back_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        cast_back(*args, **kwargs)


def test_per_token_cast_back_rejects():
    with pytest.raises(ValueError, match=r'x\[1\] must have shape \(4, 4\)'):
        per_token_cast_back(Q, 'bf16', 64)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_token_cast_back(Q, 'bf16', 128)


def _col_major(sf: torch.Tensor, row_stride: int) -> torch.Tensor:
    """sf's values in a column-major view buf[:, :T].T of a (K, row_stride) buffer whose padding is poisoned
    (0xA5 bytes)."""
    rows, cols = sf.shape
    buffer = torch.full((cols, row_stride * sf.element_size()), 0xA5, dtype=torch.uint8, device=sf.device)
    view = buffer.view(sf.dtype)[:, :rows].T
    view.copy_(sf)
    return view


def test_cast_back_takes_col_major_scales(monkeypatch):
    """The layout read from the strides: column-major scales (strides (1, S), S >= T: per_token_cast's
    use_tma_aligned_col_major_sf, CUDA's padded S too) pass the contract and choose a kernel of their own
    (col_major_sf); a row-major buffer and one token of strides (1, 1) (both layouts at once) choose the row-major
    kernel, as does T = 0 (which launches nothing). Token blocks too (per_block_cast's: R = ceil(T / bt) rows, S >=
    R)."""
    module = importlib.import_module('cann_ops_tilelang.quant.cast_back')
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')

    def choice(data, sf, block, fmt='bf16'):
        op = module.PER_TOKEN if isinstance(block, int) else module.OP
        assert op.check((data, sf), fmt, block, None, None) == 'ascend'  # the whole contract
        return module.kernel_choice((data, sf), fmt, (1, block) if isinstance(block, int) else block)['col_major_sf']

    sf = torch.rand(5, 4)
    for layout, expected in (
        (sf, False),
        (_col_major(sf, 5), True),
        (_col_major(sf, 8), True),  # CUDA's padded stride
        (_col_major(sf[:1], 4), True),  # one token, strides (1, 4)
        (sf[:1].T.contiguous().T, False),  # one token, strides (1, 1)
    ):
        assert choice(torch.zeros(layout.shape[0], 512, dtype=torch.float8_e4m3fn), layout, 128) is expected
    words = _col_major(torch.randint(0, 2**31, (37, 3), dtype=torch.int32), 40)  # packed UE8M0, 9 blocks of 128
    assert choice(torch.zeros(37, 1152, dtype=torch.float8_e4m3fn), words, (1, 128), 'fp32') is True
    e4m3 = _col_major(torch.zeros(37, 64, dtype=torch.float8_e4m3fn), 48)  # E4M3 scales of FP4 data
    assert choice(torch.zeros(37, 512, dtype=torch.int8), e4m3, 16) is True
    none = tma_col_major_sf((0, 4), torch.float32, 'ascend')  # the peer's empty buffer: strides (1, 0)
    assert choice(torch.zeros(0, 512, dtype=torch.float8_e4m3fn), none, 128) is False  # no launch either way
    # Token blocks (per_block_cast's): R = ceil(T / bt) scale rows, strides (1, S), S >= R
    blocks = torch.rand(2, 4)  # 37 tokens in blocks of 32, 4 blocks of 128
    data = torch.zeros(37, 512, dtype=torch.float8_e4m3fn)
    for layout, expected in (
        (blocks, False),
        (_col_major(blocks, 2), True),  # Ascend's S = R
        (_col_major(blocks, 4), True),  # CUDA's padded S
        (_col_major(blocks, 9), True),
        (_col_major(blocks[:1], 4), True),  # one block, strides (1, 4)
    ):
        assert choice(data[: 32 * layout.shape[0]], layout, (32, 128)) is expected
    ue8m0 = _col_major(torch.randint(0, 2**31, (2, 3), dtype=torch.int32), 4)  # 9 blocks of 128 in 3 words
    assert choice(torch.zeros(200, 1152, dtype=torch.float8_e4m3fn), ue8m0, (128, 128), 'fp32') is True


SHORT = torch.zeros(4, 192, dtype=torch.float8_e4m3fn)  # H = 64 * 3: a block of 128 channels and a short one of 64


def test_cast_back_short_block_contract(monkeypatch):
    """H = 64 * odd: whole blocks of 64 channels as before; with 128-channel blocks a short last block, now taken,
    ceil(H / 128) scales a row (packed UE8M0 ceil(ceil(H / 128) / 4) words, sf_layout's shapes), row- or
    column-major, per token or per token block, by both calls (FP4 data too); floor(H / 128) scales are refused by
    shape, H not a multiple of 64 by its rule."""
    module = importlib.import_module('cann_ops_tilelang.quant.cast_back')
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    assert module.OP.check((SHORT, torch.ones(4, 3)), 'bf16', (1, 64), None, None) == 'ascend'
    for sf in (
        torch.ones(4, 2),
        torch.ones(4, 1, dtype=torch.int32),  # 2 UE8M0 bytes and 2 of padding
        torch.ones(4, 2, dtype=torch.float8_e4m3fn),
        _col_major(torch.ones(4, 2), 8),
    ):
        assert tuple(sf.shape) == sf_layout(4, 192, (1, 128), sf.dtype == torch.int32)[0]
        assert module.OP.check((SHORT, sf), 'bf16', (1, 128), None, None) == 'ascend'
        assert module.PER_TOKEN.check((SHORT, sf), 'fp32', 128, None, None) == 'ascend'
        choice = module.kernel_choice((SHORT, sf), 'bf16', (1, 128))
        assert (choice['hidden'], choice['block_channels']) == (192, 128)
    blocks = torch.zeros(40, 2880, dtype=torch.float8_e4m3fn)  # gpt-oss's H: 22 blocks of 128 and one of 64
    assert module.OP.check((blocks, torch.ones(2, 23)), 'fp32', (32, 128), None, None) == 'ascend'
    assert module.OP.check((blocks, torch.ones(40, 6, dtype=torch.int32)), 'fp32', (1, 128), None, None) == 'ascend'
    with pytest.raises(ValueError, match=r'x\[1\] must have shape \(4, 2\)'):
        cast_back((SHORT, torch.ones(4, 1)), 'bf16', (1, 128))  # the short block's scale missing
    with pytest.raises(ValueError, match=r'x\[1\] must have shape \(4, 2\)'):
        per_token_cast_back((SHORT, torch.ones(4, 1)), 'bf16', 128)
    with pytest.raises(ValueError, match=r'positive multiple of 64 for x_block_size \(1, 128\), got 160'):
        cast_back((torch.zeros(4, 160, dtype=torch.float8_e4m3fn), torch.ones(4, 2)), 'bf16', (1, 128))
    fp4 = torch.zeros(4, 96, dtype=torch.int8)  # 192 e2m1 elements
    for sf in (torch.ones(4, 2), torch.ones(4, 1, dtype=torch.int32), torch.ones(4, 2, dtype=torch.float8_e4m3fn)):
        assert module.OP.check((fp4, sf), 'bf16', (1, 128), None, None) == 'ascend'
        assert module.PER_TOKEN.check((fp4, sf), 'fp32', 128, None, None) == 'ascend'
        choice = module.kernel_choice((fp4, sf), 'bf16', (1, 128))
        assert (choice['hidden'], choice['fp4'], choice['block_channels']) == (192, True, 128)
    with pytest.raises(ValueError, match=r'x\[1\] must have shape \(4, 2\)'):
        per_token_cast_back((fp4, torch.ones(4, 1)), 'bf16', 128)
    with pytest.raises(ValueError, match=r'positive multiple of 64 for x_block_size \(1, 128\) and FP4 data .*got 160'):
        cast_back((torch.zeros(4, 80, dtype=torch.int8), torch.ones(4, 2)), 'bf16', (1, 128))
    with FakeTensorMode():
        out = per_token_cast_back((torch.empty(4, 192, dtype=SHORT.dtype), torch.empty(4, 2)), 'bf16', 128)
        assert (tuple(out.shape), out.dtype) == ((4, 192), torch.bfloat16)


def test_cast_back_fp4_half_load_contract(monkeypatch):
    """FP4 data at H = 64 * odd in whole blocks (gpt-oss's 2880 as per_token_cast writes it: MXFP4, 32-channel UE8M0
    blocks; 16-channel E4M3 ones) or in 128-channel blocks ending in a short one is taken by both calls; H not a
    multiple of 64 is still refused."""
    module = importlib.import_module('cann_ops_tilelang.quant.cast_back')
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    data = torch.zeros(4, 1440, dtype=torch.int8)  # 2880 e2m1 elements a row
    for block, sf in (
        (32, torch.ones(4, 23, dtype=torch.int32)),
        (16, torch.ones(4, 180, dtype=torch.float8_e4m3fn)),
        (128, torch.ones(4, 23)),  # 22 whole blocks and the short one
        (128, torch.ones(4, 6, dtype=torch.int32)),  # 23 UE8M0 bytes and one of padding
    ):
        assert tuple(sf.shape) == sf_layout(4, 2880, (1, block), sf.dtype == torch.int32)[0]
        assert module.OP.check((data, sf), 'bf16', (1, block), None, None) == 'ascend'
        assert module.PER_TOKEN.check((data, sf), 'fp32', block, None, None) == 'ascend'
        choice = module.kernel_choice((data, sf), 'bf16', (1, block))
        assert (choice['hidden'], choice['fp4'], choice['block_channels']) == (2880, True, block)
    with pytest.raises(ValueError, match=r'positive multiple of 64 for x_block_size \(1, 32\) and FP4 data .*got 2912'):
        per_token_cast_back((torch.zeros(4, 1456, dtype=torch.int8), torch.ones(4, 23, dtype=torch.int32)), 'bf16', 32)


def test_cast_back_fake_tensors(monkeypatch):
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    with FakeTensorMode():
        q = (torch.empty(161, 256, dtype=torch.float8_e4m3fn), torch.empty(161, 2, dtype=torch.int32))
        out = cast_back(q, 'bf16', (1, 32))
        assert (tuple(out.shape), out.dtype) == ((161, 256), torch.bfloat16)
        out = per_token_cast_back((q[0], torch.empty(161, 2)), 'fp32', 128)
        assert (tuple(out.shape), out.dtype) == ((161, 256), torch.float32)
        fp4 = (torch.empty(161, 128, dtype=torch.int8), torch.empty(161, 16, dtype=torch.float8_e4m3fn))
        out = per_token_cast_back(fp4, 'bf16', 16)  # FP4: two elements a byte
        assert (tuple(out.shape), out.dtype) == ((161, 256), torch.bfloat16)
        col_major = (q[0], torch.empty(2, 164, dtype=torch.int32)[:, :161].T)  # strides (1, 164)
        out = cast_back(col_major, 'fp32', (1, 32))
        assert (tuple(out.shape), out.dtype, out.stride()) == ((161, 256), torch.float32, (256, 1))
        blocks = (q[0], torch.empty(2, 8)[:, :6].T)  # per_block_cast's (128, 128): 6 token blocks, strides (1, 8)
        out = cast_back(blocks, 'bf16', (32, 128))
        assert (tuple(out.shape), out.dtype) == ((161, 256), torch.bfloat16)


# ---------------------------------------------------------------- device tier

# (producer, its block, scale format): what the domain's casts write, each read back. Level 0 keeps one kernel
# configuration per layout class (row blocks fp32 / UE8M0, channel blocks).
ROUND_TRIPS = by_level(
    LEVEL,
    core=[
        ('token', (1, 128), 'fp32', 'bf16'),
        ('block', (32, 64), 'ue8m0', 'fp32'),
        ('channel', (32, 1), 'fp32', 'bf16'),
    ],
    default=[
        (producer, block, sf, fmt)
        for producer, block in (('token', (1, 32)), ('token', (1, 128)), ('block', (128, 128)), ('block', (32, 64)),
                                ('channel', (32, 1)), ('channel', (128, 1)))
        for sf in ('fp32', 'ue8m0')
        for fmt in ('bf16', 'fp32')
    ],
)  # fmt: skip


def _quantise(x, producer: str, block, sf: str):
    packed = sf == 'ue8m0'
    if producer == 'token':
        return per_token_cast(x, 'e4m3', block[1], round_sf=packed, use_packed_ue8m0=packed)
    if producer == 'block':
        return per_block_cast(x, 'e4m3', block, round_sf=packed, use_packed_ue8m0=packed)
    return per_channel_cast(x, 'e4m3', block[0], packed, use_packed_ue8m0=packed)


@pytest.mark.npu
@pytest.mark.parametrize(('producer', 'block', 'sf', 'fmt'), ROUND_TRIPS, ids=lambda v: make_param_id({'v': v}))
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 161), default=(1, 300)))
def test_cast_back_values(producer, block, sf, fmt, num_tokens, device):
    x = scaled_rows(num_tokens, 1152, 'bfloat16', device)
    quantised = _quantise(x, producer, block, sf)
    result = cast_back(quantised, fmt, block)
    assert_equal(_bits(result), _bits(_expected(quantised, fmt, block)))
    buffer = torch.full_like(result, float('nan'))
    assert cast_back(quantised, fmt, block, out=buffer) is buffer
    assert_equal(_bits(buffer), _bits(result))
    if producer == 'token':
        assert_equal(_bits(per_token_cast_back(quantised, fmt, block[1])), _bits(result))
    # The round trip: within half an e4m3 step of x (2**-4 relative, and 2**-10 of the block's scale where the
    # value is subnormal in its block), plus bf16's rounding. Each element's scale is cast_back of data 1.0.
    scale = cast_back((torch.ones_like(quantised[0]), quantised[1]), 'fp32', block)
    error = (result.float() - x.float()).abs()
    assert bool((error <= x.float().abs() * (2**-4 + 2**-8) + scale * 2**-10).all())


# per_token_cast's FP4 data, 16-channel blocks and E4M3 scales read back (per-token scales only). Level 0: one per
# kernel configuration of test_cast_back_kernel's level 0 (e2m1 / E4M3 / 16, e2m1 / UE8M0 / 64, e4m3 / fp32 / 16).
FORMAT_ROUND_TRIPS = by_level(
    LEVEL,
    core=[('e2m1', 16, 'e4m3', 'bf16'), ('e2m1', 64, 'ue8m0', 'fp32'), ('e4m3', 16, 'fp32', 'fp32')],
    default=[
        (data, block, sf, fmt)
        for data in ('e2m1', 'e4m3')
        for block in (16, 32, 64, 128)
        for sf in ('fp32', 'ue8m0', 'e4m3')
        for fmt in ('bf16', 'fp32')
        if data == 'e2m1' or block == 16 or sf == 'e4m3'
    ],
)
# Half a step of the format, relative (e4m3 2**-4, e2m1 2**-2 between 2 and 6), and the smallest step of the block
# (the subnormal steps: e4m3 2**-9, e2m1 0.5, times the scale).
_ROUND_TRIP_ERROR = {'e4m3': (2**-4, 2**-10), 'e2m1': (2**-2, 2**-2)}


@pytest.mark.npu
@pytest.mark.parametrize(('data', 'block', 'sf', 'fmt'), FORMAT_ROUND_TRIPS, ids=lambda v: make_param_id({'v': v}))
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 37), default=(1, 161)))
def test_cast_back_formats_values(data, block, sf, fmt, num_tokens, device):
    _check_format_round_trip(data, block, sf, fmt, num_tokens, 1152, device)


def _check_format_round_trip(data, block, sf, fmt, num_tokens, hidden, device) -> None:
    """per_token_cast(x, data, block, ...) read back by cast_back: bit for bit against the reference, through
    per_token_cast_back and out= too, and within the round trip's error of x."""
    x = scaled_rows(num_tokens, hidden, 'bfloat16', device)
    packed, e4m3_sf = sf == 'ue8m0', sf == 'e4m3'
    quantised = per_token_cast(x, data, block, round_sf=packed, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf)
    result = cast_back(quantised, fmt, (1, block))
    assert tuple(result.shape) == (num_tokens, hidden)
    assert_equal(_bits(result), _bits(_expected(quantised, fmt, (1, block))))
    assert_equal(_bits(per_token_cast_back(quantised, fmt, block)), _bits(result))
    buffer = torch.full_like(result, float('nan'))
    assert cast_back(quantised, fmt, (1, block), out=buffer) is buffer
    assert_equal(_bits(buffer), _bits(result))
    # The round trip: within half a step of x (relative), or of the block's smallest step, plus bf16's rounding,
    # plus what saturation cuts off: an E4M3 scale rounded below c / m (coarsely where it is subnormal) leaves
    # x / sf past the format's largest value.
    relative, absolute = _ROUND_TRIP_ERROR[data]
    one = torch.full_like(quantised[0], 0x22) if data == 'e2m1' else torch.ones_like(quantised[0])  # 0x22: 1.0, 1.0
    scale = cast_back((one, quantised[1]), 'fp32', (1, block))
    error = (result.float() - x.float()).abs()
    saturated = (x.float().abs() - scale * FORMAT_MAX[data]).clamp(min=0)
    bound = x.float().abs() * (relative + 2**-8) + scale * absolute + saturated
    assert bool((error <= bound).all())


# FP4 data at H = 64 * odd (rows ending in half a 64-byte load), per_token_cast's 'e2m1' read back. Level 0: the
# configuration of test_cast_back_kernel.py's level 0 (H = 192, MXFP4: 32-channel UE8M0, bf16); level 1: H = 2880
# (gpt-oss's) with 16-channel E4M3 and 32-channel UE8M0 scales, bf16 and fp32 out.
_FP4_HALF_CORE = [(192, 32, 'ue8m0', 'bf16')]
FP4_HALF_LOAD_ROUND_TRIPS = by_level(
    LEVEL,
    core=_FP4_HALF_CORE,
    default=[
        *_FP4_HALF_CORE,
        *((2880, block, sf, fmt) for block, sf in ((16, 'e4m3'), (32, 'ue8m0')) for fmt in ('bf16', 'fp32')),
    ],
)


@pytest.mark.npu
@pytest.mark.parametrize(
    ('hidden', 'block', 'sf', 'fmt'), FP4_HALF_LOAD_ROUND_TRIPS, ids=lambda v: make_param_id({'v': v})
)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(37,), default=(1, 37)))
def test_cast_back_fp4_half_load_values(hidden, block, sf, fmt, num_tokens, device):
    _check_format_round_trip('e2m1', block, sf, fmt, num_tokens, hidden, device)


# FP4 data with a short last 128-channel block (H = 64 * odd), per_token_cast's 'e2m1' read back: level 1 only (the
# kernel's level-0 configuration is test_cast_back_kernel.py's), H = 192 and gpt-oss's 2880 in each scale format.
FP4_SHORT_BLOCK_ROUND_TRIPS = by_level(
    LEVEL,
    core=[],
    default=[(192, 'ue8m0', 'bf16'), (2880, 'fp32', 'bf16'), (2880, 'ue8m0', 'fp32'), (2880, 'e4m3', 'bf16')],
)


@pytest.mark.npu
@pytest.mark.parametrize(('hidden', 'sf', 'fmt'), FP4_SHORT_BLOCK_ROUND_TRIPS, ids=lambda v: make_param_id({'v': v}))
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(), default=(1, 37)))
def test_cast_back_fp4_short_block_values(hidden, sf, fmt, num_tokens, device):
    _check_format_round_trip('e2m1', 128, sf, fmt, num_tokens, hidden, device)


# Column-major scales (per_token_cast's use_tma_aligned_col_major_sf) read back: the kernel configurations of their
# own (col_major_sf) at H = padded_hidden(block) (UE8M0 rows that end in padding), FP4 data at 1152 (rows of whole
# 64-byte loads). Level 0: two, UE8M0 words of a padded row (e4m3 data) and E4M3 scales of FP4 data; level 1 adds
# fp32 scales, the other outputs, T = 300 and FP4 data with a short last block at H = 2880 (its own 'hidden').
_COL_MAJOR_CORE = [
    dict(dtype='bfloat16', block=64, sf='ue8m0', data='e4m3', out='bf16'),
    dict(dtype='float32', block=16, sf='e4m3', data='e2m1', out='fp32'),
]
COL_MAJOR_ROUND_TRIPS = by_level(
    LEVEL,
    core=_COL_MAJOR_CORE,
    default=[
        *_COL_MAJOR_CORE,
        dict(dtype='bfloat16', block=32, sf='fp32', data='e4m3', out='fp32'),
        dict(dtype='float32', block=128, sf='fp32', data='e2m1', out='bf16'),
        dict(dtype='float32', block=32, sf='ue8m0', data='e2m1', out='bf16'),
        dict(dtype='bfloat16', block=16, sf='e4m3', data='e4m3', out='bf16'),
        dict(dtype='bfloat16', block=128, sf='ue8m0', data='e2m1', out='fp32', hidden=2880),  # FP4's short block
    ],
)


def _tma_row_stride(num_tokens: int, dtype: torch.dtype) -> int:
    """CUDA's row stride of column-major scales (T rounded up to 16 bytes of the scale dtype)."""
    per = 16 // dtype.itemsize
    return -(-num_tokens // per) * per


@pytest.mark.npu
@pytest.mark.parametrize('variant', COL_MAJOR_ROUND_TRIPS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 1, 37), default=(0, 1, 37, 300)))
def test_cast_back_col_major_values(variant, num_tokens, device):
    """per_token_cast(..., use_tma_aligned_col_major_sf=True) -> cast_back gives the bits of the row-major round
    trip (the reference on the same scales row-major, which the row-major kernels match bit for bit); the same at
    CUDA's padded row stride with poisoned padding (the Ascend kernel meets S > T too), and through
    per_token_cast_back."""
    block, fmt, packed = variant['block'], variant['out'], variant['sf'] == 'ue8m0'
    hidden = variant.get('hidden', 1152 if variant['data'] == 'e2m1' else padded_hidden(block))
    x = scaled_rows(num_tokens, hidden, variant['dtype'], device)
    data, sf = per_token_cast(
        x, variant['data'], block, round_sf=packed, use_packed_ue8m0=packed, use_e4m3_sf=variant['sf'] == 'e4m3',
        use_tma_aligned_col_major_sf=True,
    )  # fmt: skip
    assert num_tokens <= 1 or sf.stride()[0] == 1 < sf.stride()[1]
    row_major = torch.empty(sf.shape, dtype=sf.dtype, device=sf.device).copy_(sf)  # the same values, row-major
    expected = _bits(_expected((data, row_major), fmt, (1, block)))
    result = cast_back((data, sf), fmt, (1, block))
    assert_equal(_bits(result), expected)
    padded = _col_major(sf, _tma_row_stride(num_tokens, sf.dtype) + 4)  # past CUDA's rounding, on every backend
    assert_equal(_bits(per_token_cast_back((data, padded), fmt, block)), expected)
    if LEVEL >= 1:  # the row-major kernel, called
        assert_equal(_bits(cast_back((data, row_major), fmt, (1, block))), expected)


# Column-major scales of token blocks (per_block_cast's use_tma_aligned_col_major_sf) read back: level 0 two kernel
# configurations (32 x 32 UE8M0 words of a padded row, 128 x 128 fp32), level 1 adds 32 x 64 / 128 x 32 UE8M0, 32 x
# 128 fp32 and the other outputs. T = 37 and 300 are no multiple of the token block.
_BLOCK_COL_MAJOR_CORE = [
    dict(dtype='bfloat16', block=(32, 32), sf='ue8m0', out='bf16'),
    dict(dtype='float32', block=(128, 128), sf='fp32', out='fp32'),
]
BLOCK_COL_MAJOR_ROUND_TRIPS = by_level(
    LEVEL,
    core=_BLOCK_COL_MAJOR_CORE,
    default=[
        *_BLOCK_COL_MAJOR_CORE,
        dict(dtype='float32', block=(32, 64), sf='ue8m0', out='fp32'),
        dict(dtype='bfloat16', block=(128, 32), sf='ue8m0', out='bf16'),
        dict(dtype='bfloat16', block=(32, 128), sf='fp32', out='bf16'),
    ],
)


@pytest.mark.npu
@pytest.mark.parametrize('variant', BLOCK_COL_MAJOR_ROUND_TRIPS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 1, 37), default=(0, 1, 37, 300)))
def test_cast_back_block_col_major_values(variant, num_tokens, device):
    """per_block_cast(..., use_tma_aligned_col_major_sf=True) -> cast_back gives the bits of the row-major round
    trip (the reference on the same scales row-major); the same at CUDA's padded row stride and past it with
    poisoned padding (the Ascend kernel meets S > R too)."""
    block, fmt, packed = variant['block'], variant['out'], variant['sf'] == 'ue8m0'
    x = scaled_rows(num_tokens, padded_hidden(block[1]), variant['dtype'], device)
    data, sf = per_block_cast(
        x, 'e4m3', block, use_tma_aligned_col_major_sf=True, round_sf=packed, use_packed_ue8m0=packed
    )
    rows = -(-num_tokens // block[0])
    assert sf.shape[0] == rows
    assert rows <= 1 or sf.stride()[0] == 1 < sf.stride()[1]
    row_major = torch.empty(sf.shape, dtype=sf.dtype, device=sf.device).copy_(sf)  # the same values, row-major
    expected = _bits(_expected((data, row_major), fmt, block))
    assert_equal(_bits(cast_back((data, sf), fmt, block)), expected)
    for stride in (_tma_row_stride(rows, sf.dtype) or 4, _tma_row_stride(rows, sf.dtype) + 4):  # CUDA's, past it
        assert_equal(_bits(cast_back((data, _col_major(sf, stride)), fmt, block)), expected)
    if LEVEL >= 1:  # the row-major kernel, called
        assert_equal(_bits(cast_back((data, row_major), fmt, block)), expected)


# A short last block (H = 64 * odd, 128-channel blocks: gpt-oss's 2880; 192), e4m3 data, the layout per_token_cast
# writes for it (ceil(H / 128) scales a row), made by the reference here. Level 0: one kernel configuration, that of
# test_cast_back_kernel.py's level 0 (H = 192, fp32 scales, bf16 out); level 1 adds UE8M0 and E4M3 scales, fp32 out,
# H = 2880, column-major scales (their own configurations) and the same rows read as 32-token blocks.
_SHORT_CORE = [dict(hidden=192, sf='fp32', out='bf16')]
SHORT_BLOCK_ROUND_TRIPS = by_level(
    LEVEL,
    core=_SHORT_CORE,
    default=[
        dict(hidden=2880, sf='fp32', out='bf16'),
        dict(hidden=2880, sf='ue8m0', out='fp32'),
        dict(hidden=192, sf='e4m3', out='bf16'),
        dict(hidden=2880, sf='e4m3', out='fp32'),
    ],
)


def _short_block_quantised(x: torch.Tensor, sf: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x (T, H = 64 * odd) cast per token in 128-channel blocks by the reference: x padded with zero channels to
    whole blocks (a zero changes no block's maximum), per_token_cast_format_ref, the data cut back to H; packed
    UE8M0 as the interface's int32 words."""
    hidden = x.shape[1]
    padded = torch.nn.functional.pad(x.cpu().float(), (0, -hidden % 128))
    packed = sf == 'ue8m0'
    data, scales = per_token_cast_format_ref(padded, 128, round_sf=packed, packed_ue8m0=packed, e4m3_sf=sf == 'e4m3')
    data = data[:, :hidden].contiguous()
    return data.to(x.device), (scales.view(torch.int32) if packed else scales).to(x.device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', SHORT_BLOCK_ROUND_TRIPS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 37), default=(1, 161)))
def test_cast_back_short_block_values(variant, num_tokens, device):
    """Scales of a short last block (the last of ceil(H / 128) a row) read back: bit for bit against the reference,
    through per_token_cast_back and out= too, and within the round trip's error of x (each element's scale from
    the reference, no second kernel); level 1 also column-major (CUDA's padded row stride + 4, poisoned padding)
    and, for fp32 scales, every 32nd row as 32-token blocks."""
    hidden, fmt, block = variant['hidden'], variant['out'], (1, 128)
    x = scaled_rows(num_tokens, hidden, 'bfloat16', device)
    quantised = _short_block_quantised(x, variant['sf'])
    assert tuple(quantised[1].shape) == sf_layout(num_tokens, hidden, block, variant['sf'] == 'ue8m0')[0]
    expected = _bits(_expected(quantised, fmt, block))
    result = cast_back(quantised, fmt, block)
    assert_equal(_bits(result), expected)
    assert_equal(_bits(per_token_cast_back(quantised, fmt, 128)), expected)
    buffer = torch.full_like(result, float('nan'))
    assert cast_back(quantised, fmt, block, out=buffer) is buffer
    assert_equal(_bits(buffer), expected)
    scale = _expected((torch.ones_like(quantised[0]), quantised[1]), 'fp32', block)
    error = (result.float().cpu() - x.float().cpu()).abs()
    saturated = (x.float().cpu().abs() - scale * FORMAT_MAX['e4m3']).clamp(min=0)  # E4M3 scales rounded below
    assert bool((error <= x.float().cpu().abs() * (2**-4 + 2**-8) + scale * 2**-10 + saturated).all())
    if LEVEL >= 1:
        data, sf = quantised
        padded = _col_major(sf, _tma_row_stride(num_tokens, sf.dtype) + 4)
        assert_equal(_bits(cast_back((data, padded), fmt, block)), expected)
        if variant['sf'] == 'fp32':  # token blocks: the scale rows of tokens 0, 32, ... as 32-token blocks' rows
            blocks = (data, sf[::32].contiguous())
            assert_equal(_bits(cast_back(blocks, fmt, (32, 128))), _bits(_expected(blocks, fmt, (32, 128))))


# Per-token scales of the peer's shapes (tokens 4001 / 8001, hidden 4096 / 7168): 128-channel fp32 and 32-channel
# UE8M0, to bf16.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168], block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_cast_back_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = (1, params['block']), 'fp32' if params['block'] == 128 else 'ue8m0'
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    quantised = _quantise(x, 'token', block, sf)
    result = cast_back(quantised, 'bf16', block)
    assert_equal(_bits(result), _bits(_expected(quantised, 'bf16', block)))
    time_us = benchmark_timer(lambda: cast_back(quantised, 'bf16', block, out=result))
    benchmark_record(
        kernel='quant.cast_back',
        operation='cast_back',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*quantised, result) / time_us / 1e3,
        extras=config_extras(cast_back.operator.config(tuple(quantised), 'bf16', block)),
    )


# FP4 data of the same shapes: 16-channel E4M3 scales and 32-channel UE8M0 (per_token_cast's 'e2m1' outputs), to bf16.
FP4_BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168], block=[16, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', FP4_BENCHMARK_PARAMS, ids=make_param_id)
def test_cast_back_fp4_benchmark(params, device, benchmark_timer, benchmark_record):
    block = params['block']
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    packed = block == 32
    quantised = per_token_cast(x, 'e2m1', block, round_sf=packed, use_packed_ue8m0=packed, use_e4m3_sf=not packed)
    result = cast_back(quantised, 'bf16', (1, block))
    assert_equal(_bits(result), _bits(_expected(quantised, 'bf16', (1, block))))
    time_us = benchmark_timer(lambda: cast_back(quantised, 'bf16', (1, block), out=result))
    benchmark_record(
        kernel='quant.cast_back',
        operation='cast_back_fp4',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*quantised, result) / time_us / 1e3,
        extras=config_extras(cast_back.operator.config(tuple(quantised), 'bf16', (1, block))),
    )
