"""per_block_cast, per_block_cast_with_sf_only and per_block_cast_with_precomputed_sf, the public operators:
argument contract and torch.library forms (CPU tier), values through the public calls against the reference, bit
for bit, for e4m3 and FP4 (e2m1) data with fp32, power-of-two, UE8M0 and E4M3 scales (device tier: an
accelerator, or the Ascend kernels on the emulator with --ascend-emulator). The kernels themselves:
test_per_block_cast_kernel.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.config import backend_of
from cann_ops_tilelang.quant import (
    QuantTensor,
    per_block_cast,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)
from cann_ops_tilelang.quant.per_block_cast import _sf_result
from tests.quant.cast_ref import (
    assert_col_major_buffer_written,
    assert_peer_layout,
    logical_sf_bytes,
    scaled_rows,
    tma_col_major_sf,
)
from tests.quant.per_block_cast_ref import per_block_cast_precomputed_ref, per_block_cast_ref
from tests.testing import fast_path
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal, count_bytes

LEVEL = get_test_level()
# scale formats (round_sf, use_packed_ue8m0, use_e4m3_sf)
_FORMATS = {'fp32': (False, False, False), 'pow2': (True, False, False), 'ue8m0': (True, True, False),
            'e4m3': (False, False, True)}  # fmt: skip
VARIANTS = by_level(
    LEVEL,
    # level 0: two e4m3 and two FP4 configurations per mode, each compiled once per run (the FP4 'cast' of the
    # first and the 'precomputed' of the second are test_per_block_cast_kernel.py's level-0 kernels)
    core=[
        dict(dtype='bfloat16', block=(128, 128), sf='fp32', fmt='e4m3'),
        dict(dtype='float32', block=(32, 64), sf='ue8m0', fmt='e4m3'),
        dict(dtype='bfloat16', block=(32, 32), sf='ue8m0', fmt='e2m1'),
        dict(dtype='float32', block=(128, 128), sf='e4m3', fmt='e2m1'),
    ],
    default=generate_samples(
        dtype=['bfloat16', 'float32'], block=[(32, 32), (128, 128), (64, 128), (16, 16)], sf=list(_FORMATS),
        fmt=['e4m3', 'e2m1'],
    ),
)  # fmt: skip
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 161), default=(300,), full=(4001,))
HIDDEN = 1088  # 17 blocks of 64: a padded UE8M0 row; 128-channel blocks take 1152
X = torch.zeros(4, 256, dtype=torch.bfloat16)


def _hidden(block) -> int:
    return HIDDEN if block[1] <= 64 else 1152


def _flags(sf: str) -> dict:
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf)


def _cast(x, block=(128, 128), sf='fp32', fmt='e4m3', **kwargs):
    return per_block_cast(x, fmt, block, **_flags(sf), **kwargs)


def _assert_matches(result: QuantTensor, x: torch.Tensor, block, sf: str, fmt: str = 'e4m3') -> None:
    """Data and scale bytes equal the reference's (the inputs hold no inf or NaN: no NaN products)."""
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    data, scales = per_block_cast_ref(x.cpu(), *block, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
    assert_equal(result.data.cpu().view(torch.uint8), data.view(torch.uint8))
    assert_equal(result.sf.cpu().view(torch.uint8), scales.view(torch.uint8))


# ---------------------------------------------------------------- CPU tier: argument contract


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((X.half(), 'e4m3', (32, 32)), {}, TypeError, 'x must have dtype torch.bfloat16 or torch.float32'),
        ((X, 'e5m2', (32, 32)), {}, ValueError, r"fmt must be one of \('e4m3', 'e2m1'\), got 'e5m2'"),
        ((X, 'e2m1', (32, 32)), {'use_e4m3_sf': True, 'round_sf': True}, ValueError, 'use_e4m3_sf=True and round_sf'),
        ((X, 'e2m1', (32, 32)), {'use_e4m3_sf': 1}, TypeError, 'use_e4m3_sf must be a bool, got int'),
        ((X[:, :192].clone(), 'e2m1', (32, 128)), {}, ValueError, 'multiple of 128 for 128 channels per scale'),
        ((X, 'e4m3', 32), {}, TypeError, 'block_size must be a tuple of ints, got 32'),
        ((X, 'e4m3', (32,)), {}, ValueError, r'block_size must be \(tokens, channels\), got \(32,\)'),
        ((X, 'e4m3', (8, 32)), {}, ValueError,
         r'block_size\[0\] \(tokens per scale\) must be one of \(16, 32, 64, 128\), got 8'),
        ((X, 'e4m3', (32, 256)), {}, ValueError, r'block_size\[1\] \(channels per scale\) must be one of'),
        ((X, 'e4m3', (32, 32)), {'use_packed_ue8m0': True}, ValueError, 'use_packed_ue8m0=True needs round_sf=True'),
        ((X, 'e4m3', (32, 32)), {'use_tma_aligned_col_major_sf': 1}, TypeError, 'use_tma_aligned_col_major_sf must'),
        ((X, 'e4m3', (32, 32)), {'use_tma_aligned_col_major_sf': True}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X[:, :192].clone(), 'e4m3', (32, 128)), {}, ValueError, 'multiple of 128 for 128 channels per scale'),
        ((X, 'e4m3', (32, 32)), {}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, 'e2m1', (32, 32)), {'use_e4m3_sf': True}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_per_block_cast_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        per_block_cast(*args, **kwargs)


def test_per_block_cast_rejects_out_buffers():
    data, scales = torch.empty(4, 256, dtype=torch.float8_e4m3fn), torch.empty(1, 4)
    with pytest.raises(ValueError, match=r'out\[1\] must have shape \(1, 4\), got \(1, 2\)'):
        _cast(X, (32, 64), out=(data, scales[:, :2]))
    with pytest.raises(TypeError, match=r'out\[1\] must have dtype torch.int32'):
        _cast(X, (32, 64), 'ue8m0', out=(data, scales))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(X, (32, 64), out=(data, scales))
    fp4, e4m3_scales = torch.empty(4, 128, dtype=torch.int8), torch.empty(1, 4, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r'out\[0\] must have shape \(4, 128\), got \(4, 256\)'):
        _cast(X, (32, 64), 'e4m3', 'e2m1', out=(fp4.repeat(1, 2), e4m3_scales))
    with pytest.raises(TypeError, match=r'out\[1\] must have dtype torch.float8_e4m3fn'):
        _cast(X, (32, 64), 'e4m3', 'e2m1', out=(fp4, scales))
    with pytest.raises(TypeError, match=r'out\[0\] must have dtype torch.int8'):
        _cast(X, (32, 64), 'fp32', 'e2m1', out=(data, scales))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(X, (32, 64), 'e4m3', 'e2m1', out=(fp4, e4m3_scales))


def test_per_block_cast_halves_reject():
    with pytest.raises(ValueError, match=r'out_sf must have shape \(1, 2\), got \(1, 1\)'):
        per_block_cast_with_sf_only(X, 'e4m3', (128, 128), out_sf=torch.empty(1, 1))
    with pytest.raises(
        ValueError, match=r'sf must have shape \(1, 2\) \(one per block of \(128, 128\)\), got \(2, 2\)'
    ):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(2, 2))
    with pytest.raises(TypeError, match='sf must have dtype torch.float32'):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(1, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match='precomputed scales are fp32: use_packed_ue8m0=True is not supported'):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(1, 2), round_sf=True,
                                           use_packed_ue8m0=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_block_cast_with_precomputed_sf(X, 'e4m3', (128, 128), torch.ones(1, 2))
    e4m3_scales = torch.ones(1, 2).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match='sf must have dtype torch.float8_e4m3fn with use_e4m3_sf=True'):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), torch.ones(1, 2), use_e4m3_sf=True)
    with pytest.raises(TypeError, match='sf must have dtype torch.float32 with use_e4m3_sf=False'):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), e4m3_scales)
    with pytest.raises(ValueError, match='use_e4m3_sf=True and round_sf=True exclude each other'):
        per_block_cast_with_sf_only(X, 'e2m1', (128, 128), round_sf=True, use_e4m3_sf=True)
    with pytest.raises(TypeError, match=r'out must have dtype torch.int8'):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), torch.ones(1, 2),
                                           out=torch.empty(4, 128, dtype=torch.float8_e4m3fn))  # fmt: skip
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_block_cast_with_precomputed_sf(X, 'e2m1', (128, 128), e4m3_scales, use_e4m3_sf=True)


def test_per_block_cast_fake_tensors(monkeypatch):
    """While torch traces (fake tensors): the forms' fake kernels give the eager call's outputs."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    with FakeTensorMode():
        x = torch.empty(161, 1088, dtype=torch.float32)
        result = _cast(x, (64, 64), 'ue8m0')
        assert isinstance(result, QuantTensor)
        assert (result.data.shape, result.data.dtype) == ((161, 1088), torch.float8_e4m3fn)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((3, 5), torch.int32)
        sf = per_block_cast_with_sf_only(x, 'e4m3', (128, 64))
        assert (tuple(sf.shape), sf.dtype) == ((2, 17), torch.float32)
        data = per_block_cast_with_precomputed_sf(x, 'e4m3', (128, 64), sf)
        assert (tuple(data.shape), data.dtype) == ((161, 1088), torch.float8_e4m3fn)
        # FP4 (two codes a byte) with E4M3 scales, and with UE8M0 ones.
        result = _cast(x, (32, 32), 'e4m3', 'e2m1')
        assert (result.data.shape, result.data.dtype) == ((161, 544), torch.int8)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((6, 34), torch.float8_e4m3fn)
        result = _cast(x, (32, 32), 'ue8m0', 'e2m1')
        assert (tuple(result.sf.shape), result.sf.dtype) == ((6, 9), torch.int32)
        sf = per_block_cast_with_sf_only(x, 'e2m1', (128, 64), use_e4m3_sf=True)
        assert (tuple(sf.shape), sf.dtype) == ((2, 17), torch.float8_e4m3fn)
        data = per_block_cast_with_precomputed_sf(x, 'e2m1', (128, 64), sf, use_e4m3_sf=True)
        assert (tuple(data.shape), data.dtype) == ((161, 544), torch.int8)


def test_per_block_cast_torch_library_schemas():
    """The functional forms carry use_e4m3_sf after use_packed_ue8m0, as per_token_cast's."""
    for name in ('per_block_cast', 'per_block_cast_with_sf_only', 'per_block_cast_with_precomputed_sf'):
        schema = str(getattr(torch.ops.cann_ops_tilelang, name).default._schema)
        assert 'bool use_packed_ue8m0, bool use_e4m3_sf' in schema


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_block_cast_values(variant, num_tokens, device):
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    x = scaled_rows(num_tokens, _hidden(block), variant['dtype'], device)
    result = _cast(x, block, sf, fmt)
    _assert_matches(result, x, block, sf, fmt)
    poisoned = (
        torch.full_like(result.data.view(torch.uint8), 0x7F),
        torch.full_like(result.sf.view(torch.uint8), 0xA5),
    )
    buffers = tuple(t.view(r.dtype) for t, r in zip(poisoned, result, strict=True))
    again = _cast(x, block, sf, fmt, out=buffers)
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    _assert_matches(again, x, block, sf, fmt)
    # The halves: the scales alone are the full cast's; its data again from fp32 / e4m3 scales.
    scales = per_block_cast_with_sf_only(x, fmt, block, **_flags(sf))
    assert_equal(scales.cpu().view(torch.uint8), result.sf.cpu().view(torch.uint8))
    if sf != 'ue8m0':
        data = per_block_cast_with_precomputed_sf(x, fmt, block, scales, use_e4m3_sf=sf == 'e4m3')
        expected = per_block_cast_precomputed_ref(x.cpu(), scales.cpu(), *block, fmt)
        assert_equal(data.cpu().view(torch.uint8), expected.view(torch.uint8))


# ---------------------------------------------------------------- column-major scales (use_tma_aligned_col_major_sf)

# Kernel configurations of their own (col_major_sf). Level 0: two, UE8M0 bytes of a padded row (bf16 x, e4m3 data,
# 32 x 32 blocks: on Ascend tasks of 2 blocks, words shared between tasks) and E4M3 scales of FP4 data (fp32 x,
# NVFP4's 16 x 16); level 1 adds fp32 and power-of-two scales, DeepSeek-V3's 128 x 128 and other blocks.
_COL_MAJOR_CORE = [
    dict(dtype='bfloat16', block=(32, 32), sf='ue8m0', fmt='e4m3'),
    dict(dtype='float32', block=(16, 16), sf='e4m3', fmt='e2m1'),
]
COL_MAJOR_VARIANTS = by_level(
    LEVEL,
    core=_COL_MAJOR_CORE,
    default=[
        *_COL_MAJOR_CORE,
        dict(dtype='bfloat16', block=(128, 128), sf='fp32', fmt='e4m3'),
        dict(dtype='float32', block=(64, 128), sf='ue8m0', fmt='e2m1'),
        dict(dtype='bfloat16', block=(32, 64), sf='pow2', fmt='e2m1'),
        dict(dtype='bfloat16', block=(16, 16), sf='e4m3', fmt='e4m3'),
        dict(dtype='float32', block=(128, 32), sf='fp32', fmt='e2m1'),
    ],
)
# 0; 1; 37 tokens: 3 blocks of 16, 2 of 32 (the last partial), not a multiple of CUDA's padding (4 words, 16
# bytes); 300 from level 1 (19 blocks of 16, 10 of 32, 3 of 128).
COL_MAJOR_TOKENS = by_level(LEVEL, core=(0, 1, 37), default=(0, 1, 37, 300))


def _assert_peer_layout(sf: torch.Tensor, num_tokens: int, block, sf_name: str, backend: str) -> None:
    """The peer's layout of block scales: their rows the token blocks."""
    assert_peer_layout(sf, -(-num_tokens // block[0]), sf_name, backend)


@pytest.mark.parametrize('num_tokens', [0, 1, 16, 17, 37, 64, 65, 161, 300])
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_per_block_cast_col_major_fake_strides(num_tokens, backend, monkeypatch):
    """While torch traces: the fake kernels return the column-major scales with TileKernels' strides on each
    backend, the rows counted in token blocks (CUDA: ceil(T / bt) rounded up to 16 bytes, 4 fp32 / int32 words or
    16 E4M3 bytes; Ascend: ceil(T / bt)), every scale format, the cast and the scales alone; the data stays
    row-major."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    with FakeTensorMode():
        x = torch.empty(num_tokens, 1088, dtype=torch.bfloat16, device='cuda' if backend == 'cuda' else 'cpu')
        cases = (((32, 32), 'fp32', 'e4m3'), ((16, 64), 'ue8m0', 'e4m3'), ((16, 16), 'e4m3', 'e2m1'),
                 ((128, 64), 'pow2', 'e2m1'), ((64, 32), 'ue8m0', 'e2m1'))  # fmt: skip
        for block, sf, fmt in cases:
            result = _cast(x, block, sf, fmt, use_tma_aligned_col_major_sf=True)
            assert result.data.is_contiguous()
            _assert_peer_layout(result.sf, num_tokens, block, sf, backend)
            alone = per_block_cast_with_sf_only(x, fmt, block, True, **_flags(sf))
            _assert_peer_layout(alone, num_tokens, block, sf, backend)


def test_per_block_cast_col_major_strides_by_hand():
    """The rule on numbers: 161 tokens in blocks of 32 are 6 scale rows; CUDA pads them to 8 fp32 / int32 (16
    bytes), to 16 E4M3 bytes; Ascend keeps 6. T = 0: strides (1, 0)."""
    cpu = torch.empty(161, 1088)
    cuda_like = SimpleNamespace(shape=cpu.shape, device=torch.device('cuda'))  # what the rule reads of x
    assert _sf_result(cuda_like, (32, 32), True, False, False) == ((6, 34), torch.float32, (1, 8))
    assert _sf_result(cuda_like, (32, 32), True, True, False) == ((6, 9), torch.int32, (1, 8))
    assert _sf_result(cuda_like, (32, 32), True, False, True) == ((6, 34), torch.float8_e4m3fn, (1, 16))
    assert _sf_result(cpu, (32, 32), True, False, True) == ((6, 34), torch.float8_e4m3fn, (1, 6))
    assert _sf_result(cpu[:0], (32, 32), True, False, False) == ((0, 34), torch.float32, (1, 0))
    assert _sf_result(cpu, (32, 32), False, False, False) == ((6, 34), torch.float32)


def test_per_block_cast_col_major_out_buffers():
    """A given column-major sf buffer must have the strides the call would return (CPU tensors: the Ascend rule,
    R_pad = ceil(T / bt)); a row-major one is refused by name. Valid buffers reach the device check. (TileKernels
    refuses any given buffer with this option; these take the one of its own layout, as per_token_cast.)"""
    x = torch.zeros(40, 256, dtype=torch.bfloat16)  # 2 token blocks of 32, 8 channel blocks of 32
    data = torch.empty(40, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r'out\[1\] must have strides \(1, 2\) for shape \(2, 8\) .* got \(8, 1\)'):
        _cast(x, (32, 32), out=(data, torch.empty(2, 8)), use_tma_aligned_col_major_sf=True)
    with pytest.raises(ValueError, match=r'out\[1\] must be contiguous'):  # and the other way round
        _cast(x, (32, 32), out=(data, tma_col_major_sf((2, 8), torch.float32, 'ascend')))
    padded = torch.empty(8, 4).T[:2]  # CUDA's padding, not this backend's layout
    with pytest.raises(ValueError, match=r'must have strides \(1, 2\) for shape \(2, 8\) .* got \(1, 4\)'):
        _cast(x, (32, 32), out=(data, padded), use_tma_aligned_col_major_sf=True)
    given = tma_col_major_sf((2, 8), torch.float32, 'ascend')
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(x, (32, 32), out=(data, given), use_tma_aligned_col_major_sf=True)
    with pytest.raises(ValueError, match=r'out_sf must have strides \(1, 2\)'):
        per_block_cast_with_sf_only(x, 'e4m3', (32, 32), True, True, True, out_sf=torch.empty(2, 2, dtype=torch.int32))
    words = tma_col_major_sf((2, 2), torch.int32, 'ascend')
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_block_cast_with_sf_only(x, 'e4m3', (32, 32), True, True, True, out_sf=words)
    # One token block: a dimension of size 1 may have any stride (the same bytes either way).
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(x[:32], (32, 32), out=(data[:32], torch.empty(1, 8)), use_tma_aligned_col_major_sf=True)
    with pytest.raises(ValueError, match='the given scales are read row-major'):
        per_block_cast_with_precomputed_sf(x, 'e4m3', (32, 32), torch.ones(2, 8), use_tma_aligned_col_major_sf=True)


def test_per_block_cast_col_major_fast_path_flow(monkeypatch):
    """CPU tensors taken as CUDA ones: after warm row-major calls, the column-major call is planned anew (the
    layout is part of the fast path's key) and launches the column-major kernel with the transposed scales (UE8M0:
    their bytes) of its own strides; warm, each layout takes the fast path with its own kernel."""
    op = per_block_cast.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, op)
    plans = fast_path.count_plans(monkeypatch, op)
    x = torch.zeros(70, 256)  # 3 token blocks of 32, 8 channel blocks: 2 words
    for _ in range(2):
        rows = _cast(x, (32, 32), 'ue8m0')
    assert (len(plans), len(launches)) == (1, 2)
    for _ in range(2):
        cols = _cast(x, (32, 32), 'ue8m0', use_tma_aligned_col_major_sf=True)
    assert (len(plans), len(launches)) == (2, 4)
    _cast(x, (32, 32), 'ue8m0')
    assert (len(plans), len(launches)) == (2, 5)
    assert rows.sf.is_contiguous()
    assert (tuple(cols.sf.shape), cols.sf.stride()) == ((3, 2), (1, 3))
    for cfg, args in launches:  # row-major (R, 4 K) bytes, or the transposed (K words, 4 R bytes)
        assert args[2].shape == ((2, 12) if cfg.col_major_sf else (3, 8))
    assert [cfg.col_major_sf for cfg, _ in launches] == [False, False, True, True, False]
    (cfg, (_, _, sf_arg)) = launches[3]
    assert (sf_arg.dtype, sf_arg.stride()) == (torch.uint8, (12, 1))
    assert sf_arg.data_ptr() == cols.sf.data_ptr()


@pytest.mark.npu
@pytest.mark.parametrize('variant', COL_MAJOR_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', COL_MAJOR_TOKENS)
def test_per_block_cast_col_major_values(variant, num_tokens, device):
    """The column-major call writes the row-major call's data and scale values (bit for bit) in TileKernels'
    layout of this backend, into a new buffer or a given one (poisoned: every scale overwritten, the CUDA padding
    columns untouched)."""
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    x = scaled_rows(num_tokens, _hidden(block), variant['dtype'], device)
    rows = _cast(x, block, sf, fmt)
    result = _cast(x, block, sf, fmt, use_tma_aligned_col_major_sf=True)
    assert_equal(result.data.cpu().view(torch.uint8), rows.data.cpu().view(torch.uint8))
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(rows.sf))
    _assert_peer_layout(result.sf, num_tokens, block, sf, backend_of(device))
    assert_col_major_buffer_written(
        lambda buffer: _cast(x, block, sf, fmt, use_tma_aligned_col_major_sf=True,
                             out=(torch.empty_like(rows.data), buffer)).sf,
        rows.sf, backend_of(device), device,
    )  # fmt: skip
    alone = per_block_cast_with_sf_only(x, fmt, block, True, **_flags(sf))  # the scales alone: the same
    assert_equal(logical_sf_bytes(alone), logical_sf_bytes(rows.sf))
    _assert_peer_layout(alone, num_tokens, block, sf, backend_of(device))


@pytest.mark.npu
@pytest.mark.parametrize(
    ('block', 'sf'),
    by_level(LEVEL, core=[], default=[((128, 128), 'ue8m0'), ((32, 32), 'ue8m0'), ((64, 64), 'fp32')]),
)
def test_per_block_cast_col_major_column_tiles(block, sf, device):
    """Rows cut into several tasks / thread blocks at hidden 7168: 128 x 128 UE8M0 (on Ascend tasks of 2 blocks,
    their bytes one DMA each), 32 x 32 UE8M0 (whole-word tasks), 64 x 64 fp32."""
    x = scaled_rows(161, 7168, 'bfloat16', device)
    rows = _cast(x, block, sf)
    result = _cast(x, block, sf, use_tma_aligned_col_major_sf=True)
    assert_equal(result.data.cpu().view(torch.uint8), rows.data.cpu().view(torch.uint8))
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(rows.sf))
    _assert_peer_layout(result.sf, 161, block, sf, backend_of(device))


# The peer's shapes (tokens multiples of 128, hidden 4096 / 7168), DeepSeek-V3's 128 x 128 fp32 and 32 x 32 UE8M0.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4096, 8192], hidden=[4096, 7168], block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_per_block_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = (params['block'],) * 2, 'fp32' if params['block'] == 128 else 'ue8m0'
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    result = _cast(x, block, sf)
    _assert_matches(result, x, block, sf)
    time_us = benchmark_timer(lambda: _cast(x, block, sf, out=result))
    cfg = per_block_cast.operator.config(x, 'e4m3', block, **_flags(sf))
    benchmark_record(
        kernel='quant.per_block_cast',
        operation='cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )


# FP4 at the same shapes: 32 x 32 blocks with UE8M0 scales (the peer's Ascend block) and 128 x 128 with fp32 ones.
FP4_BENCHMARK_PARAMS = generate_samples(num_tokens=[4096, 8192], hidden=[4096, 7168], block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', FP4_BENCHMARK_PARAMS, ids=make_param_id)
def test_per_block_cast_fp4_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = (params['block'],) * 2, 'fp32' if params['block'] == 128 else 'ue8m0'
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    result = _cast(x, block, sf, 'e2m1')
    _assert_matches(result, x, block, sf, 'e2m1')
    time_us = benchmark_timer(lambda: _cast(x, block, sf, 'e2m1', out=result))
    cfg = per_block_cast.operator.config(x, 'e2m1', block, **_flags(sf))
    benchmark_record(
        kernel='quant.per_block_cast',
        operation='cast_fp4',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )
