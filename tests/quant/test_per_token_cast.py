"""per_token_cast, the public operator: argument contract and torch.library forms (CPU tier), values through the
public call against the reference, bit-exact (device tier: an accelerator, or the Ascend kernel on the emulator
with --ascend-emulator). The kernels themselves: test_per_token_cast_kernel.py."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config, operator
from cann_ops_tilelang.config import backend_of
from cann_ops_tilelang.quant import (
    QuantTensor,
    cast_back,
    per_block_cast,
    per_token_cast,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
    unpack_from_e2m1fn_x2,
)
from cann_ops_tilelang.quant.cast_kernel import key_argument, seed_key
from cann_ops_tilelang.quant.per_token_cast import QUANTISED
from cann_ops_tilelang.quant.per_token_cast_kernel import FEW_TOKENS, choose_per_token_cast_config
from tests.quant.cast_back_ref import cast_back_ref
from tests.quant.cast_ref import (
    assert_col_major_buffer_written,
    assert_peer_layout,
    format_scale_and_inverse_ref,
    from_blocks,
    logical_sf_bytes,
    pack_e2m1_ref,
    padded_hidden,
    per_token_cast_format_ref,
    per_token_cast_precomputed_ref,
    row_blocks,
    scaled_rows,
    tma_col_major_sf,
)
from tests.quant.stochastic_rounding_ref import stochastic_e2m1_ref, stochastic_e4m3_ref
from tests.testing import fast_path
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.numeric import assert_equal, count_bytes

LEVEL = get_test_level()
# The interface module (its name is also the function the package exports): FUSE_ON_CUDA lives there.
_INTERFACE = importlib.import_module('cann_ops_tilelang.quant.per_token_cast')
# scale formats (round_sf, use_packed_ue8m0, use_e4m3_sf): each a kernel of its own per dtype, block, output format
# and hidden size.
_FORMATS = {'fp32': (False, False, False), 'pow2': (True, False, False), 'ue8m0': (True, True, False),
            'e4m3': (False, False, True)}  # fmt: skip
# level 0: configurations test_per_token_cast_kernel.py compiles anyway (each compiles once per run)
_CORE_VARIANTS = [
    dict(dtype='bfloat16', block=32, sf='fp32', fmt='e4m3'),
    dict(dtype='float32', block=64, sf='pow2', fmt='e2m1'),
    dict(dtype='float32', block=16, sf='e4m3', fmt='e2m1'),
]
VARIANTS = by_level(
    LEVEL,
    core=_CORE_VARIANTS,
    default=generate_samples(
        dtype=['bfloat16', 'float32'], block=[16, 32, 64, 128], sf=list(_FORMATS), fmt=['e4m3', 'e2m1']
    ),
)
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 37), default=(300,), full=(4001,))


def _cast(x, block=128, sf='fp32', fmt='e4m3', **kwargs):
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    return per_token_cast(x, fmt, block, round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf, **kwargs)


def _without_nan_signs(
    data: torch.Tensor, x: torch.Tensor, inverse: torch.Tensor, block: int, fmt: str
) -> torch.Tensor:
    """Data bytes (uint8) with the sign bits of NaN products x * inverse cleared (`inverse` one per token and block
    of `block` channels): that NaN's sign is the hardware's (x86, the reference's CPU and the emulator's, gives -NaN;
    a GPU +NaN), unspecified by the contract (e4m3: the byte's sign; FP4: both codes' signs of a byte holding one)."""
    num_tokens, hidden = x.shape
    nan = from_blocks(torch.isnan(row_blocks(x.cpu(), block) * inverse.unsqueeze(-1)), hidden)
    if fmt == 'e2m1':
        return torch.where(nan.reshape(num_tokens, hidden // 2, 2).any(dim=-1), data & 0x77, data)
    return torch.where(nan, data & 0x7F, data)


def _assert_matches(result: QuantTensor, x: torch.Tensor, block: int, sf: str, fmt: str = 'e4m3') -> None:
    """Data and scale bytes equal the reference's, bit for bit (NaN products whatever their sign)."""
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    data, scales = per_token_cast_format_ref(
        x.cpu(), block, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf
    )
    amax = row_blocks(x.cpu(), block).abs().amax(dim=-1)
    _, inverse = format_scale_and_inverse_ref(amax, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
    got = result.data.cpu().view(torch.uint8)
    assert_equal(
        _without_nan_signs(got, x, inverse, block, fmt),
        _without_nan_signs(data.view(torch.uint8), x, inverse, block, fmt),
    )
    assert_equal(result.sf.cpu().view(torch.uint8), scales.view(torch.uint8))


# ---------------------------------------------------------------- CPU tier: argument contract


X = torch.zeros(4, 256, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((X.tolist(), 'e4m3', 128), {}, TypeError, 'x must be a torch.Tensor, got list'),
        (
            (X.half(), 'e4m3', 128),
            {},
            TypeError,
            'x must have dtype torch.bfloat16 or torch.float32, got torch.float16',
        ),
        ((X[None], 'e4m3', 128), {}, ValueError, 'x must have 2 dimensions'),
        ((torch.zeros(256, 4).t(), 'e4m3', 128), {}, ValueError, 'x must have a contiguous last dimension'),
        ((X, 4, 128), {}, TypeError, 'fmt must be a str, got int'),
        ((X, 'e5m2', 128), {}, ValueError, r"fmt must be one of \('e4m3', 'e2m1'\), got 'e5m2'"),
        ((X, 'e4m3', 128.0), {}, TypeError, 'num_per_channels must be an int, got float'),
        ((X, 'e4m3', True), {}, TypeError, 'num_per_channels must be an int, got bool'),
        ((X, 'e4m3', 8), {}, ValueError, r'num_per_channels must be one of \(16, 32, 64, 128\), got 8'),
        ((X, 'e4m3', 128), {'round_sf': 1}, TypeError, 'round_sf must be a bool, got int'),
        ((X, 'e4m3', 128), {'use_packed_ue8m0': True}, ValueError, 'use_packed_ue8m0=True needs round_sf=True'),
        ((X, 'e4m3', 128), {'x_block_size': (1, 128)}, ValueError, r'x is a tensor, got x_block_size=\(1, 128\)'),
        ((X, 'e2m1', 128), {'use_e4m3_sf': True, 'round_sf': True}, ValueError, 'use_e4m3_sf=True and round_sf'),
        ((X, 'e2m1', 128), {'stochastic_cast': True}, RuntimeError, "no kernels for 'cpu' tensors"),  # FP4: supported
        ((X, 'e2m1', 128), {'stochastic_cast': True, 'seed': 2**32}, ValueError, r'seed must be in \[0, 2\*\*32\)'),
        ((X, 'e4m3', 128), {'seed': 3}, ValueError, 'seed=3 is used only with stochastic_cast=True'),
        ((X, 'e4m3', 128), {'stochastic_cast': True, 'seed': -1}, ValueError, r'seed must be in \[0, 2\*\*32\), got -'),
        ((X, 'e4m3', 128), {'stochastic_cast': True, 'seed': 2**32}, ValueError, r'seed must be in \[0, 2\*\*32\)'),
        ((X, 'e4m3', 128), {'stochastic_cast': True, 'seed': 1.0}, TypeError, 'seed must be an int, got float'),
        ((X, 'e4m3', 128), {'stochastic_cast': True, 'seed': True}, TypeError, 'seed must be an int, got bool'),
        ((X, 'e4m3', 128), {'stochastic_cast': True}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, 'e4m3', 128), {'stochastic_cast': True, 'seed': 2**32 - 1}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, 'e4m3', 128), {'use_tma_aligned_col_major_sf': 1}, TypeError, 'use_tma_aligned_col_major_sf must be a'),
        ((X, 'e4m3', 128), {'use_tma_aligned_col_major_sf': True}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X[:, :192].clone(), 'e4m3', 128), {}, RuntimeError, "no kernels for 'cpu' tensors"),  # a short last block
        ((X[:, :96].contiguous(), 'e4m3', 32), {}, ValueError, 'positive multiple of 64 for whole 64-lane registers'),
        ((X[:, :96].contiguous(), 'e2m1', 128), {}, ValueError, 'positive multiple of 64 for whole 64-lane'),
        ((X[:, :0], 'e4m3', 32), {}, ValueError, 'positive multiple of 64'),
        ((torch.empty(2**17, 2**14 + 64, device='meta'), 'e4m3', 64), {}, ValueError, 'at most 2\\*\\*31 - 1'),
        ((X, 'e4m3', 128), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_per_token_cast_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        per_token_cast(*args, **kwargs)


def test_per_token_cast_rejects_out_buffers():
    data, scales = torch.empty(4, 256, dtype=torch.float8_e4m3fn), torch.empty(4, 2)
    with pytest.raises(TypeError, match=r'out must be a tuple \(data, sf\) of 2 tensors, got Tensor'):
        _cast(X, out=data)
    with pytest.raises(TypeError, match=r'out\[0\] must have dtype torch.float8_e4m3fn'):
        _cast(X, out=(data.view(torch.uint8), scales))
    with pytest.raises(ValueError, match=r'out\[1\] must have shape \(4, 2\), got \(4, 1\)'):
        _cast(X, out=(data, scales[:, :1]))
    with pytest.raises(TypeError, match=r'out\[1\] must have dtype torch.int32'):  # packed: four bytes per int32
        _cast(X, 32, 'ue8m0', out=(data, torch.empty(4, 2)))
    shared = torch.empty(4 * 256 + 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r'out\[1\] must not alias the input out\[0\]'):
        _cast(
            X,
            out=(
                shared[: 4 * 256].view(torch.float8_e4m3fn).view(4, 256),
                shared[-32:].view(torch.float32)[:8].view(4, 2),
            ),
        )
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(X, out=(data, scales))  # valid buffers: the device decides
    fp4, e4m3_scales = torch.empty(4, 128, dtype=torch.int8), torch.empty(4, 16, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r'out\[0\] must have shape \(4, 128\), got \(4, 256\)'):
        _cast(X, 16, 'e4m3', 'e2m1', out=(fp4.view(torch.uint8).repeat(1, 2).view(torch.int8), e4m3_scales))
    with pytest.raises(TypeError, match=r'out\[1\] must have dtype torch.float8_e4m3fn'):
        _cast(X, 16, 'e4m3', 'e2m1', out=(fp4, torch.empty(4, 16)))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(X, 16, 'e4m3', 'e2m1', out=(fp4, e4m3_scales))


def test_per_token_cast_fake_tensors(monkeypatch):
    """While torch traces (fake tensors, torch.compile): the forms' fake kernels give the eager call's outputs."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    with FakeTensorMode():
        x = torch.empty(37, 1088, dtype=torch.float32)
        for block, sf, sf_shape, sf_dtype in (
            (64, 'fp32', (37, 17), torch.float32),
            (32, 'ue8m0', (37, 9), torch.int32),
        ):
            result = _cast(x, block, sf)
            assert isinstance(result, QuantTensor)
            assert (result.data.shape, result.data.dtype) == ((37, 1088), torch.float8_e4m3fn)
            assert (tuple(result.sf.shape), result.sf.dtype) == (sf_shape, sf_dtype)
        out = (torch.empty(37, 1088, dtype=torch.float8_e4m3fn), torch.empty(37, 17))
        assert _cast(x, 64, out=out) == out
        for block, sf, sf_shape, sf_dtype in (
            (16, 'e4m3', (37, 68), torch.float8_e4m3fn),  # NVFP4's layout
            (32, 'ue8m0', (37, 9), torch.int32),  # MXFP4's
        ):
            result = _cast(x, block, sf, 'e2m1')
            assert (result.data.shape, result.data.dtype) == ((37, 544), torch.int8)
            assert (tuple(result.sf.shape), result.sf.dtype) == (sf_shape, sf_dtype)
        sf_only = per_token_cast_with_sf_only(x, 'e2m1', 16, use_e4m3_sf=True)
        assert (tuple(sf_only.shape), sf_only.dtype) == ((37, 68), torch.float8_e4m3fn)
        given = torch.empty(37, 68, dtype=torch.float8_e4m3fn)
        data = per_token_cast_with_precomputed_sf(x, 'e2m1', 16, given, use_e4m3_sf=True)
        assert (tuple(data.shape), data.dtype) == ((37, 544), torch.int8)
        with pytest.raises(ValueError, match='use_packed_ue8m0=True needs round_sf=True'):
            per_token_cast(x, 'e4m3', 32, use_packed_ue8m0=True)
    schemas = [str(op._schema) for op in per_token_cast.operator.forms.values()]
    options = (
        'str fmt, int num_per_channels, int[]? x_block_size, bool use_tma_aligned_col_major_sf, bool round_sf, '
        'bool use_packed_ue8m0, bool use_e4m3_sf, bool stochastic_cast, int? seed'
    )
    assert schemas == [
        f'cann_ops_tilelang::per_token_cast(Tensor x, {options}) -> (Tensor, Tensor)',
        f'cann_ops_tilelang::per_token_cast_out(Tensor x, {options}, Tensor(a!) out_data, Tensor(b!) out_sf) -> ()',
    ]


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_per_token_cast_values(variant, num_tokens, device):
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    x = scaled_rows(num_tokens, padded_hidden(block), variant['dtype'], device)
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


# (H, block, scale format) of the few-tokens tiling's device check (CUDA: rows of several tiles; elsewhere the
# default tiling, the same check): level 0 one configuration, level 1 a second.
_FEW_TOKENS_CASES = by_level(LEVEL, core=[(7168, 128, 'fp32')], default=[(7168, 128, 'fp32'), (4096, 32, 'ue8m0')])


@pytest.mark.npu
@pytest.mark.parametrize(('hidden', 'block', 'sf'), _FEW_TOKENS_CASES, ids=str)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(1,), default=(1, 5, FEW_TOKENS)))
def test_per_token_cast_few_tokens_values(hidden, block, sf, num_tokens, device):
    """Up to FEW_TOKENS rows (CUDA: 1024-column tiles of 64 threads) the cast is the reference's, bit for bit."""
    x = scaled_rows(num_tokens, hidden, 'bfloat16', device)
    round_sf, packed, _ = _FORMATS[sf]
    cfg = per_token_cast.operator.config(x, 'e4m3', block, round_sf=round_sf, use_packed_ue8m0=packed)
    if backend_of(device) == 'cuda':
        assert (cfg.block_k, cfg.threads) == (1024, 64)
    _assert_matches(_cast(x, block, sf), x, block, sf)


@pytest.mark.npu
def test_per_token_cast_special_values(device):
    """-0.0, subnormals, values past the format's range (saturated), e2m1 ties, and a block holding an inf."""
    tiny = torch.finfo(torch.float32).tiny
    pool = torch.tensor([0.0, -0.0, tiny, -tiny / 8, 1e-30, 3e4, -1e6, 1.0, -448.0, 449.0, 0.25, -2.5, 5.0])
    x = pool[torch.randint(len(pool), (7, 1088))]
    x[2, :128] = 0.0  # all-zero blocks: the amax floor
    x[3, 128:] = float('inf')
    x[4, :64] = -0.0
    x[5, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]).repeat(2)  # e2m1 ties at scale 1
    x[6, :64] = 1e38  # E4M3 scales saturate at 448
    x = x.to(device)
    for block, sf, fmt in ((64, 'pow2', 'e4m3'), (32, 'ue8m0', 'e4m3'), (64, 'pow2', 'e2m1'), (16, 'e4m3', 'e2m1')):
        _assert_matches(_cast(x, block, sf, fmt), x, block, sf, fmt)


def test_per_token_cast_halves_reject():
    with pytest.raises(ValueError, match=r'out_sf must have shape \(4, 2\), got \(4, 1\)'):
        per_token_cast_with_sf_only(X, 'e4m3', 128, out_sf=torch.empty(4, 1))
    with pytest.raises(ValueError, match='use_e4m3_sf=True and round_sf=True exclude each other'):
        per_token_cast_with_sf_only(X, 'e4m3', 128, round_sf=True, use_e4m3_sf=True)
    with pytest.raises(ValueError, match=r'sf must have shape \(4, 2\) \(one per token and block of 128\)'):
        per_token_cast_with_precomputed_sf(X, 'e4m3', 128, torch.ones(4, 4))
    with pytest.raises(ValueError, match='precomputed scales are fp32: use_packed_ue8m0=True is not supported'):
        per_token_cast_with_precomputed_sf(X, 'e4m3', 128, torch.ones(4, 2), round_sf=True, use_packed_ue8m0=True)
    e4m3_scales = torch.ones(4, 16).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match='sf must have dtype torch.float8_e4m3fn with use_e4m3_sf=True'):
        per_token_cast_with_precomputed_sf(X, 'e2m1', 16, torch.ones(4, 16), use_e4m3_sf=True)
    with pytest.raises(TypeError, match='sf must have dtype torch.float32 with use_e4m3_sf=False'):
        per_token_cast_with_precomputed_sf(X, 'e2m1', 16, e4m3_scales)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_token_cast_with_precomputed_sf(X, 'e4m3', 128, torch.ones(4, 2))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_token_cast_with_precomputed_sf(X, 'e2m1', 16, e4m3_scales, use_e4m3_sf=True)


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_per_token_cast_halves_values(variant, device):
    """The scales alone are per_token_cast's; its data again from given scales (fp32 or e4m3), including scales
    the kernel did not compute (zero, tiny: products past the format's range saturate, zeros times inf are NaN)."""
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    x = scaled_rows(37, padded_hidden(block), variant['dtype'], device)
    full = _cast(x, block, sf, fmt)
    scales = per_token_cast_with_sf_only(x, fmt, block, round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf)
    assert_equal(scales.cpu().view(torch.uint8), full.sf.cpu().view(torch.uint8))
    if packed:
        return  # given scales are fp32 or e4m3
    given = scales.clone()
    given[0, 0] = 0.0
    given[1, 1] = 1e-30 if sf != 'e4m3' else 2.0**-9  # tiny: products past the format's maximum
    data = per_token_cast_with_precomputed_sf(x, fmt, block, given, use_e4m3_sf=e4m3_sf)
    expected = per_token_cast_precomputed_ref(x.cpu(), given.cpu(), block, fmt)
    inverse = torch.ones(given.shape) / given.cpu().float()
    assert_equal(
        _without_nan_signs(data.cpu().view(torch.uint8), x, inverse, block, fmt),
        _without_nan_signs(expected.view(torch.uint8), x, inverse, block, fmt),
    )


# ---------------------------------------------------------------- column-major scales (use_tma_aligned_col_major_sf)

# Kernel configurations of their own (col_major_sf), at H = padded_hidden(block). Level 0: two, UE8M0 bytes of a
# padded row (bf16 x, e4m3 data) and E4M3 scales of FP4 data (fp32 x, NVFP4's layout); level 1 adds fp32 and
# power-of-two scales and the other blocks.
_COL_MAJOR_CORE = [
    dict(dtype='bfloat16', block=64, sf='ue8m0', fmt='e4m3'),
    dict(dtype='float32', block=16, sf='e4m3', fmt='e2m1'),
]
COL_MAJOR_VARIANTS = by_level(
    LEVEL,
    core=_COL_MAJOR_CORE,
    default=[
        *_COL_MAJOR_CORE,
        dict(dtype='bfloat16', block=32, sf='fp32', fmt='e4m3'),
        dict(dtype='float32', block=128, sf='fp32', fmt='e2m1'),
        dict(dtype='float32', block=32, sf='ue8m0', fmt='e2m1'),
        dict(dtype='bfloat16', block=16, sf='e4m3', fmt='e4m3'),
        dict(dtype='bfloat16', block=128, sf='pow2', fmt='e2m1'),
        dict(dtype='float32', block=64, sf='pow2', fmt='e4m3'),
    ],
)
COL_MAJOR_TOKENS = by_level(LEVEL, core=(0, 1, 37), default=(0, 1, 37, 300))  # 37: not a multiple of 4 (nor 16)


@pytest.mark.parametrize('num_tokens', [0, 1, 3, 4, 5, 16, 17, 37])
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_per_token_cast_col_major_fake_strides(num_tokens, backend, monkeypatch):
    """While torch traces: the fake kernels return the column-major scales with TileKernels' strides on each
    backend (CUDA: T rounded up to 16 bytes, 4 fp32 / int32 words or 16 E4M3 bytes; Ascend: T), every scale
    format, the cast and the scales alone; the data stays row-major."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    with FakeTensorMode():
        x = torch.empty(num_tokens, 1088, dtype=torch.bfloat16, device='cuda' if backend == 'cuda' else 'cpu')
        for block, sf, fmt in ((32, 'fp32', 'e4m3'), (64, 'ue8m0', 'e4m3'), (16, 'e4m3', 'e2m1'), (64, 'pow2', 'e2m1')):
            round_sf, packed, e4m3_sf = _FORMATS[sf]
            result = _cast(x, block, sf, fmt, use_tma_aligned_col_major_sf=True)
            assert result.data.is_contiguous()
            assert_peer_layout(result.sf, num_tokens, sf, backend)
            alone = per_token_cast_with_sf_only(x, fmt, block, True, round_sf, packed, e4m3_sf)
            assert_peer_layout(alone, num_tokens, sf, backend)


def test_per_token_cast_col_major_out_buffers():
    """A given column-major sf buffer must have the strides the call would return (CPU tensors: the Ascend rule,
    T_pad = T); a row-major one is refused by name. Valid buffers reach the device check."""
    data = torch.empty(4, 256, dtype=torch.float8_e4m3fn)
    row_major = torch.empty(4, 2)
    with pytest.raises(ValueError, match=r'out\[1\] must have strides \(1, 4\) for shape \(4, 2\) .* got \(2, 1\)'):
        _cast(X, out=(data, row_major), use_tma_aligned_col_major_sf=True)
    with pytest.raises(ValueError, match=r'out\[1\] must be contiguous'):  # and the other way round
        _cast(X, out=(data, tma_col_major_sf((4, 2), torch.float32, 'ascend')))
    padded = torch.empty(2, 8).T[:4]  # a padded buffer, but not the padding of this backend's layout
    with pytest.raises(ValueError, match=r'must have strides \(1, 4\) for shape \(4, 2\) .* got \(1, 8\)'):
        _cast(X, out=(data, padded), use_tma_aligned_col_major_sf=True)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(X, out=(data, tma_col_major_sf((4, 2), torch.float32, 'ascend')), use_tma_aligned_col_major_sf=True)
    with pytest.raises(ValueError, match=r'out_sf must have strides \(1, 4\)'):
        per_token_cast_with_sf_only(X, 'e4m3', 32, True, True, True, out_sf=torch.empty(4, 2, dtype=torch.int32))
    words = tma_col_major_sf((4, 2), torch.int32, 'ascend')
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_token_cast_with_sf_only(X, 'e4m3', 32, True, True, True, out_sf=words)
    # One token, or one scale per row: a dimension of size 1 may have any stride (the same bytes either way).
    one = torch.zeros(1, 256, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        _cast(one, out=(data[:1], torch.empty(1, 2)), use_tma_aligned_col_major_sf=True)
    with pytest.raises(ValueError, match='the given scales are read row-major'):
        per_token_cast_with_precomputed_sf(X, 'e4m3', 128, torch.ones(4, 2), use_tma_aligned_col_major_sf=True)


@pytest.mark.npu
@pytest.mark.parametrize('variant', COL_MAJOR_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', COL_MAJOR_TOKENS)
def test_per_token_cast_col_major_values(variant, num_tokens, device):
    """The column-major call writes the row-major call's data and scale values (bit for bit) in TileKernels'
    layout of this backend, into a new buffer or a given one (poisoned: every scale overwritten, the CUDA padding
    columns untouched)."""
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    x = scaled_rows(num_tokens, padded_hidden(block), variant['dtype'], device)
    rows = _cast(x, block, sf, fmt)
    result = _cast(x, block, sf, fmt, use_tma_aligned_col_major_sf=True)
    assert_equal(result.data.cpu().view(torch.uint8), rows.data.cpu().view(torch.uint8))
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(rows.sf))
    assert_peer_layout(result.sf, num_tokens, sf, backend_of(device))
    assert_col_major_buffer_written(
        lambda buffer: _cast(x, block, sf, fmt, use_tma_aligned_col_major_sf=True,
                             out=(torch.empty_like(rows.data), buffer)).sf,
        rows.sf, backend_of(device), device,
    )  # fmt: skip


@pytest.mark.npu
@pytest.mark.parametrize('variant', COL_MAJOR_VARIANTS[2:], ids=make_param_id)  # level 1: new configurations
def test_per_token_cast_col_major_sf_only_values(variant, device):
    """per_token_cast_with_sf_only writes the same column-major scales."""
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    x = scaled_rows(37, padded_hidden(block), variant['dtype'], device)
    rows = _cast(x, block, sf, fmt)
    alone = per_token_cast_with_sf_only(x, fmt, block, True, round_sf, packed, e4m3_sf)
    assert_equal(logical_sf_bytes(alone), logical_sf_bytes(rows.sf))
    assert_peer_layout(alone, 37, sf, backend_of(device))


@pytest.mark.npu
@pytest.mark.parametrize(
    ('hidden', 'block', 'sf'),
    by_level(LEVEL, core=[], default=[(7168, 128, 'fp32'), (8192, 32, 'ue8m0'), (4736, 32, 'ue8m0')]),
)
def test_per_token_cast_col_major_column_tiles(hidden, block, sf, device):
    """Rows cut into several tasks / thread blocks (7168: 2 on Ascend, 4 on CUDA; 8192 with 32-channel UE8M0
    words: 2 tasks of 32 words), and a row whose row-major Ascend task would split a word (4736: 74 blocks a task),
    which the column-major configuration keeps in one task."""
    x = scaled_rows(37, hidden, 'bfloat16', device)
    rows = _cast(x, block, sf)
    result = _cast(x, block, sf, use_tma_aligned_col_major_sf=True)
    assert_equal(result.data.cpu().view(torch.uint8), rows.data.cpu().view(torch.uint8))
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(rows.sf))
    assert_peer_layout(result.sf, 37, sf, backend_of(device))


# ---------------------------------------------------------------- strided rows (the peer takes them)


def _strided(num_tokens, hidden, dtype, device, pad=64):
    """Rows of x, `pad` elements apart beyond H (a view of a wider buffer), and the same values contiguous."""
    wide = scaled_rows(num_tokens, hidden + pad, dtype, device)
    return wide[:, :hidden], wide[:, :hidden].contiguous()


def test_per_token_cast_strided_rows_contract(monkeypatch):
    """Strided rows pass the contract where each starts on 16 bytes and choose the kernel of strided rows; others
    are refused by name (the last dimension must be contiguous, as before)."""
    wide = torch.zeros(4, 256 + 8, dtype=torch.bfloat16)  # rows 528 bytes apart
    with pytest.raises(ValueError, match=r'the rows of a strided x must each start on 16 bytes, got row stride 260'):
        per_token_cast(torch.zeros(4, 260, dtype=torch.bfloat16)[:, :256], 'e4m3', 128)
    with pytest.raises(ValueError, match='rows of a strided x must each start on 16 bytes'):
        per_token_cast_with_sf_only(torch.zeros(4, 258)[:, 1:257], 'e4m3', 128)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        per_token_cast(wide[:, :256], 'e4m3', 128)
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    configure = per_token_cast.operator.config
    assert configure(wide[:, :256], 'e4m3', 128).strided_rows
    assert not configure(wide[:, :256].contiguous(), 'e4m3', 128).strided_rows
    assert not configure(wide[:1, :256], 'e4m3', 128).strided_rows  # one row: any stride
    assert per_token_cast_with_precomputed_sf.operator.config(wide[:, :256], 'e4m3', 128, torch.ones(4, 2)).strided_rows


# Level 0: the first level-0 variant's kernels of strided rows (the cast, the scales alone, the given scales'
# cast); level 1 the other level-0 variants' (each three kernels of their own).
STRIDED_VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS[:1], default=_CORE_VARIANTS)


@pytest.mark.npu
@pytest.mark.parametrize('variant', STRIDED_VARIANTS, ids=make_param_id)
def test_per_token_cast_strided_rows_values(variant, device):
    """Strided rows give the bytes of the same rows contiguous: the cast, the scales alone and the given scales'
    cast (the three calls share the kernel family), also through the fast path's second call."""
    block, sf, fmt = variant['block'], variant['sf'], variant['fmt']
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    strided, rows = _strided(37, padded_hidden(block), variant['dtype'], device)
    want = _cast(rows, block, sf, fmt)
    for _ in range(2):
        got = _cast(strided, block, sf, fmt)
        assert_equal(got.data.cpu().view(torch.uint8), want.data.cpu().view(torch.uint8))
        assert_equal(got.sf.cpu().view(torch.uint8), want.sf.cpu().view(torch.uint8))
    alone = per_token_cast_with_sf_only(strided, fmt, block, False, round_sf, packed, e4m3_sf)
    assert_equal(alone.cpu().view(torch.uint8), want.sf.cpu().view(torch.uint8))
    if not packed:  # the given scales' cast reads fp32 or E4M3 scales
        given = per_token_cast_with_precomputed_sf(strided, fmt, block, want.sf, False, round_sf, False, e4m3_sf)
        from_rows = per_token_cast_with_precomputed_sf(rows, fmt, block, want.sf, False, round_sf, False, e4m3_sf)
        assert_equal(given.cpu().view(torch.uint8), from_rows.cpu().view(torch.uint8))


# ---------------------------------------------------------------- a short last block (H = 64 * odd, 128 channels)

# Level 0: one kernel of its own (bf16, fp32 scales, e4m3 at H 192: blocks of 128 and 64 channels). Level 1: H 2880
# (gpt-oss's hidden; 22 whole blocks and a short one: on CUDA two tiles of 1536, the second reaching past H) in every
# dtype, scale and data format, and H 8128, the widest row an Ascend task holds.
_SHORT_CORE = [dict(dtype='bfloat16', sf='fp32', fmt='e4m3', hidden=192)]
SHORT_VARIANTS = by_level(
    LEVEL,
    core=_SHORT_CORE,
    default=[
        *generate_samples(dtype=['bfloat16', 'float32'], sf=list(_FORMATS), fmt=['e4m3', 'e2m1'], hidden=[2880]),
        dict(dtype='bfloat16', sf='ue8m0', fmt='e4m3', hidden=8128),
    ],
)


def test_per_token_cast_short_block_contract(monkeypatch):
    """H = 64 * odd takes 128-channel blocks, a short last one with a scale of its own (ceil(H / 128) scales, packed
    UE8M0 words of them); an Ascend row past 8128 is refused by name (the row is one task)."""
    x = torch.zeros(5, 2880, dtype=torch.bfloat16)
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    with FakeTensorMode():
        fake = torch.empty(5, 2880, dtype=torch.bfloat16)
        assert tuple(_cast(fake, 128).sf.shape) == (5, 23)
        assert tuple(_cast(fake, 128, 'ue8m0').sf.shape) == (5, 6)
        assert tuple(_cast(fake, 128, fmt='e2m1').data.shape) == (5, 1440)
    cfg = per_token_cast.operator.config(x, 'e4m3', 128)
    assert cfg.short_block
    assert (cfg.block_k, cfg.blocked_hidden, cfg.num_blocks) == (2944, 2944, 23)
    with pytest.raises(ValueError, match='short last block .* needs the row in one task: hidden <= 8128'):
        per_token_cast.operator.config(torch.zeros(5, 8256, dtype=torch.bfloat16), 'e4m3', 128)
    with pytest.raises(ValueError, match=r'sf must have shape \(5, 23\)'):
        per_token_cast_with_precomputed_sf(x, 'e4m3', 128, torch.ones(5, 22))


@pytest.mark.npu
@pytest.mark.parametrize('variant', SHORT_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(1, 37), default=(37,)))
def test_per_token_cast_short_block_values(variant, num_tokens, device):
    """The short block's scale is its 64 channels' (the reference pads it with zeros); nothing past H is written
    (poisoned buffers); the scales alone are the full cast's, the given scales' cast the reference's."""
    sf, fmt, hidden = variant['sf'], variant['fmt'], variant['hidden']
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    x = scaled_rows(num_tokens, hidden, variant['dtype'], device)
    # The short block of one magnitude above every scale floor, its neighbours of 2**-20 .. 2**20: a scale of its own.
    x[:, -64:] = (torch.randn(num_tokens, 64) / 8).to(x.dtype)
    result = _cast(x, 128, sf, fmt)
    _assert_matches(result, x, 128, sf, fmt)
    poisoned = (
        torch.full_like(result.data.view(torch.uint8), 0x7F),
        torch.full_like(result.sf.view(torch.uint8), 0xA5),
    )
    again = _cast(x, 128, sf, fmt, out=tuple(t.view(r.dtype) for t, r in zip(poisoned, result, strict=True)))
    _assert_matches(again, x, 128, sf, fmt)
    if LEVEL == 0:
        return  # the halves are kernels of their own
    alone = per_token_cast_with_sf_only(x, fmt, 128, False, round_sf, packed, e4m3_sf)
    assert_equal(alone.cpu().view(torch.uint8), result.sf.cpu().view(torch.uint8))
    if not packed:  # the given scales' IEEE reciprocals (fp32 scales: not always the cast's m / c)
        given = per_token_cast_with_precomputed_sf(x, fmt, 128, result.sf, False, round_sf, False, e4m3_sf)
        expected = per_token_cast_precomputed_ref(x.cpu(), result.sf.cpu(), 128, fmt)
        inverse = torch.ones(result.sf.shape) / result.sf.cpu().float()
        assert_equal(
            _without_nan_signs(given.cpu().view(torch.uint8), x, inverse, 128, fmt),
            _without_nan_signs(expected.view(torch.uint8), x, inverse, 128, fmt),
        )


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(), default=(37,)))
def test_per_token_cast_short_block_layouts(num_tokens, device):
    """Level 1: the short block with strided rows, column-major packed UE8M0 scales and stochastic rounding give
    the bytes of the plain layouts and of the stochastic reference."""
    strided, rows = _strided(num_tokens, 2880, 'bfloat16', device)
    want = _cast(rows, 128, 'ue8m0')
    got = _cast(strided, 128, 'ue8m0', use_tma_aligned_col_major_sf=True)
    assert_equal(got.data.cpu().view(torch.uint8), want.data.cpu().view(torch.uint8))
    assert_equal(logical_sf_bytes(got.sf), logical_sf_bytes(want.sf))
    for fmt in ('e4m3', 'e2m1'):
        data, scales = _stochastic_ref(rows, 128, 'fp32', 5, fmt)
        result = _cast(rows, 128, 'fp32', fmt, stochastic_cast=True, seed=5)
        bits = result.data.cpu().view(torch.uint8)
        if fmt == 'e2m1':
            bits = _fp4_bits(result, rows, 128, 'fp32')
        assert_equal(bits, data)
        assert_equal(logical_sf_bytes(result.sf), scales)


# ---------------------------------------------------------------- packed UE8M0 rows ending in padding, past one task

# Packed UE8M0 rows of 4 n + r blocks wider than one Ascend task (H > 8192): equal tasks, the row's last storing the
# zero padding after its scales. Level 1 only: 65 blocks of 128 (H 8320: Ascend 5 tasks of 13 blocks, 3 padding
# bytes) and FP4 data in 258 blocks of 32 (H 8256 = 64 * 129: 3 tasks of 86 blocks, 2 padding bytes).
PADDED_WIDE_ROWS = by_level(
    LEVEL,
    core=[],
    default=[
        dict(dtype='bfloat16', hidden=8320, block=128, fmt='e4m3'),
        dict(dtype='float32', hidden=8256, block=32, fmt='e2m1'),
    ],
)


def test_per_token_cast_padded_wide_row_contract(monkeypatch):
    """On Ascend a packed UE8M0 row of 65 blocks (H 8320) takes tasks of 13 blocks, the last one storing the padding;
    column-major words of such a row are refused by name (equal tasks cannot hold whole words)."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    x = torch.zeros(5, 8320, dtype=torch.bfloat16)
    packed = dict(round_sf=True, use_packed_ue8m0=True)
    cfg = per_token_cast.operator.config(x, 'e4m3', 128, **packed)
    assert (cfg.block_k, cfg.num_col_tiles, cfg.sf_cols, cfg.sf_padding) == (1664, 5, 68, 3)
    with pytest.raises(ValueError, match='column-major packed UE8M0 scales .* need hidden <= 8192, got 65 blocks'):
        per_token_cast.operator.config(x, 'e4m3', 128, **packed, use_tma_aligned_col_major_sf=True)


@pytest.mark.npu
@pytest.mark.parametrize('variant', PADDED_WIDE_ROWS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(), default=(3,)))
def test_per_token_cast_padded_wide_row_values(variant, num_tokens, device):
    """Data and scale bytes of rows of several tasks ending in padding are the reference's, into poisoned buffers
    too (the padding bytes written as zeros), and the scales alone are the full cast's."""
    block, fmt = variant['block'], variant['fmt']
    x = scaled_rows(num_tokens, variant['hidden'], variant['dtype'], device)
    result = _cast(x, block, 'ue8m0', fmt)
    _assert_matches(result, x, block, 'ue8m0', fmt)
    poisoned = (
        torch.full_like(result.data.view(torch.uint8), 0x7F),
        torch.full_like(result.sf.view(torch.uint8), 0xA5),
    )
    again = _cast(x, block, 'ue8m0', fmt, out=tuple(t.view(r.dtype) for t, r in zip(poisoned, result, strict=True)))
    _assert_matches(again, x, block, 'ue8m0', fmt)
    alone = per_token_cast_with_sf_only(x, fmt, block, False, True, True, False)
    assert_equal(alone.cpu().view(torch.uint8), result.sf.cpu().view(torch.uint8))


# ---------------------------------------------------------------- stochastic_cast (e4m3 data)


def _stochastic_ref(
    x: torch.Tensor, block: int, sf: str, seed: int, fmt: str = 'e4m3'
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data bits uint8, scale bytes uint8) of per_token_cast(x, fmt, block, ..., stochastic_cast=True, seed=seed)
    from the existing references: the plain cast's scales and inverses (cast_ref.py), and the stochastic rounding
    (stochastic_rounding_ref.py: quant.cast's to e4m3, or the e2m1 rule, packed two codes a byte) of the products
    x * inverse, element t * H + h (the flattened order)."""
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    x = x.cpu()
    blocks = row_blocks(x, block)
    _, inverse = format_scale_and_inverse_ref(
        blocks.abs().amax(dim=-1), fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf
    )
    scaled = from_blocks(blocks * inverse.unsqueeze(-1), x.shape[1])
    _, scales = per_token_cast_format_ref(x, block, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
    if fmt == 'e2m1':
        data = pack_e2m1_ref(stochastic_e2m1_ref(scaled, seed)).view(torch.uint8)
        return _without_nan_signs(data, x, inverse, block, fmt), logical_sf_bytes(scales)
    return stochastic_e4m3_ref(scaled, seed), logical_sf_bytes(scales)


def test_per_token_cast_stochastic_signatures():
    """seed is keyword-only, after out (TileKernels' positional arguments unchanged); the halves have neither
    stochastic_cast nor seed (as TileKernels)."""
    params = inspect.signature(per_token_cast).parameters
    assert list(params)[-3:] == ['stochastic_cast', 'out', 'seed']
    assert params['seed'].kind is inspect.Parameter.KEYWORD_ONLY
    assert params['seed'].default is None
    assert params['out'].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for half in (per_token_cast_with_sf_only, per_token_cast_with_precomputed_sf):
        assert not {'stochastic_cast', 'seed'} & set(inspect.signature(half).parameters)


def test_per_token_cast_stochastic_fast_path(monkeypatch):
    """CPU tensors taken as CUDA ones: the plain and the stochastic kernel have launchers and fast-path keys of
    their own; the stochastic launch passes the data's bits and, last, the seed's key, the seed drawn per call
    where None (torch's default generator: torch.manual_seed reproduces it); a seed without stochastic_cast still
    gets the contract's error once the keys are warm."""
    op = per_token_cast.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, op)
    plans = fast_path.count_plans(monkeypatch, op)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    for _ in range(2):
        per_token_cast(x, 'e4m3', 128)
        per_token_cast(x, 'e4m3', 128, stochastic_cast=True, seed=7)
    assert len(plans) == 2  # one per kernel, then the fast path
    plain, stochastic = launches[0], launches[1]
    assert (plain[0].stochastic, len(plain[1]), plain[1][1].dtype) == (False, 3, torch.float8_e4m3fn)
    assert (stochastic[0].stochastic, len(stochastic[1]), stochastic[1][1].dtype) == (True, 4, torch.uint8)
    assert stochastic[0] == dataclasses.replace(plain[0], stochastic=True)
    assert [len(args) for _, args in launches] == [3, 4, 3, 4]
    assert stochastic[1][3] == launches[3][1][3] == key_argument(seed_key(7))
    torch.manual_seed(3)
    drawn = [per_token_cast(x, 'e4m3', 128, stochastic_cast=True) and launches[-1][1][3] for _ in range(2)]
    torch.manual_seed(3)
    want = [key_argument(seed_key(int(torch.randint(2**32, (), dtype=torch.int64)))) for _ in range(2)]
    assert drawn == want
    assert drawn[0] != drawn[1]
    assert len(plans) == 2
    with pytest.raises(ValueError, match='seed=3 is used only with stochastic_cast=True'):
        per_token_cast(x, 'e4m3', 128, seed=3)
    with pytest.raises(ValueError, match=r'seed must be in \[0, 2\*\*32\)'):
        per_token_cast(x, 'e4m3', 128, stochastic_cast=True, seed=2**32)
    assert len(launches) == 6
    # FP4 data: a stochastic kernel of its own (one plan, then the fast path), its int8 bytes passed as they are,
    # the key last.
    planned = len(plans)
    for _ in range(2):
        per_token_cast(x, 'e2m1', 128, stochastic_cast=True, seed=7)
    assert len(plans) == planned + 1
    assert len(launches) == 8
    fp4_plain_cfg = choose_per_token_cast_config(backend='cuda', num_cores=132, hidden=256, in_dtype='bfloat16',
                                                 block_size=128, fmt='e2m1')  # fmt: skip
    for cfg, args in launches[6:]:
        assert cfg == dataclasses.replace(fp4_plain_cfg, stochastic=True)
        assert (len(args), args[1].dtype, tuple(args[1].shape)) == (4, torch.int8, (4, 128))
        assert args[3] == key_argument(seed_key(7))


def test_per_token_cast_few_tokens_fast_path(monkeypatch):
    """CPU tensors taken as CUDA ones: up to FEW_TOKENS rows a call takes the few-tokens tiling, more the default,
    each with its own fast-path key (a fast call never reuses the other count class's launcher); the halves alike."""
    op = per_token_cast.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, op, per_token_cast_with_sf_only.operator)
    plans = fast_path.count_plans(monkeypatch, op)
    common = dict(backend='cuda', num_cores=132, hidden=7168, in_dtype='bfloat16', block_size=128)
    few = choose_per_token_cast_config(**common, few_tokens=True)
    default = choose_per_token_cast_config(**common)
    assert (few.block_k, default.block_k) == (1024, 1792)
    for _ in range(2):
        for tokens in (1, FEW_TOKENS, FEW_TOKENS + 1, 37):
            per_token_cast(torch.randn(tokens, 7168, dtype=torch.bfloat16), 'e4m3', 128)
    assert len(plans) == 2  # one per count class, then the fast path
    assert [cfg for cfg, _ in launches] == [few, few, default, default] * 2
    per_token_cast_with_sf_only(torch.randn(3, 7168, dtype=torch.bfloat16), 'e4m3', 128)
    assert launches[-1][0] == dataclasses.replace(few, mode='sf_only')


# Level 0: one kernel of its own, the stochastic twin of the first level-0 variant (bf16, 32-channel fp32 scales, H
# 1088; its plain kernel is compiled anyway); level 1 adds fp32 x with E4M3 and UE8M0 scales (column-major).
_STOCHASTIC_CORE = [dict(dtype='bfloat16', block=32, sf='fp32')]
STOCHASTIC_VARIANTS = by_level(
    LEVEL,
    core=_STOCHASTIC_CORE,
    default=[
        *_STOCHASTIC_CORE,
        dict(dtype='float32', block=16, sf='e4m3'),
        dict(dtype='bfloat16', block=128, sf='ue8m0', cm=True),
        dict(dtype='float32', block=64, sf='pow2'),
    ],
)


@pytest.mark.npu
@pytest.mark.parametrize('variant', STOCHASTIC_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 37), default=(1, 300)))
def test_per_token_cast_stochastic_values(variant, num_tokens, device):
    """The data bit for bit the reference's stochastic rounding of x * inverse (element t * H + h), the scales the
    plain cast's; the same seed the same bytes, another seed other bytes; out= buffers."""
    block, sf, cm = variant['block'], variant['sf'], variant.get('cm', False)
    x = scaled_rows(num_tokens, padded_hidden(block), variant['dtype'], device)
    # Signed zeros; no NaN: a block holding one has unspecified values (CUDA's max reduction drops the NaN, the
    # emulator's keeps it; per_token_cast's contract).
    x[:, :2] = torch.tensor([0.0, -0.0], dtype=x.dtype)
    cast = functools.partial(_cast, x, block, sf, 'e4m3', stochastic_cast=True, use_tma_aligned_col_major_sf=cm)
    result = cast(seed=12345)
    assert result.data.dtype == torch.float8_e4m3fn
    want_data, want_sf = _stochastic_ref(x, block, sf, 12345)
    assert_equal(result.data.cpu().view(torch.uint8), want_data)
    assert_equal(logical_sf_bytes(result.sf), want_sf)
    plain = _cast(x, block, sf, 'e4m3', use_tma_aligned_col_major_sf=cm)
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(plain.sf))
    assert_equal(cast(seed=12345).data.cpu().view(torch.uint8), want_data)
    if num_tokens:
        other = cast(seed=12346).data.cpu().view(torch.uint8)
        assert not torch.equal(other, want_data)
        assert_equal(other, _stochastic_ref(x, block, sf, 12346)[0])
    buffers = (torch.empty_like(result.data), result.sf.clone().zero_() if not cm else torch.zeros_like(result.sf))
    if cm:
        buffers = (buffers[0], tma_col_major_sf(tuple(result.sf.shape), result.sf.dtype, backend_of(device), device))
    again = cast(seed=12345, out=buffers)
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    assert_equal(again.data.cpu().view(torch.uint8), want_data)
    assert_equal(logical_sf_bytes(again.sf), want_sf)


@pytest.mark.npu
def test_per_token_cast_stochastic_is_unbiased(device):
    """The level-0 stochastic kernel (bf16, 32-channel fp32 scales, H 1088): row r holds blocks of 448 (scale 1)
    and 31 copies of 1.25 + f_r * 0.125, between the e4m3 neighbours 1.25 and 1.375, f_r = r / 16; over the
    1054 copies of a row the share rounded up is f_r and the dequantised mean is the value, within 5 standard
    errors; over 8 seeds, the data of random rows is x * inverse on average (so the dequantised data is x).
    One kernel, compiled for test_per_token_cast_stochastic_values' level-0 variant."""
    fractions = torch.arange(1, 16, dtype=torch.float64) / 16
    values = 1.25 + fractions * 0.125  # exact in bf16
    x = values.repeat_interleave(1088).reshape(15, 1088).to(torch.bfloat16)
    x[:, ::32] = 448.0
    result = _cast(x.to(device), 32, 'fp32', stochastic_cast=True, seed=99)
    assert_equal(result.sf.cpu(), torch.ones(15, 34))
    data = result.data.cpu().double()
    copies = data[:, x[0].float() != 448.0]
    assert copies.shape == (15, 1054)
    assert ((copies == 1.25) | (copies == 1.375)).all()  # only the two neighbours
    sigma = (fractions * (1 - fractions) / copies.shape[1]).sqrt()
    up = (copies == 1.375).double().mean(dim=1)
    assert ((up - fractions).abs() <= 5 * sigma).all(), (up, fractions)
    assert ((copies.mean(dim=1) - values).abs() <= 5 * sigma * 0.125).all()
    # Any x: E[data] = x * inverse, so E[data * sf] = x. Per element and seed the data is one of the two e4m3
    # neighbours of v = |x * inverse|, u apart: (mean over seeds - v) / u has mean 0 and variance <= 1 / (4 S).
    rows = scaled_rows(37, 1088, 'bfloat16', device)
    blocks = rows.cpu().float().reshape(37, 34, 32)
    _, inverse = format_scale_and_inverse_ref(blocks.abs().amax(dim=-1), 'e4m3')
    v = (blocks * inverse.unsqueeze(-1)).reshape(37, 1088).abs().double()
    u = torch.where(v < 2.0**-6, 2.0**-9, torch.exp2(torch.floor(torch.log2(v.clamp(min=2.0**-6))) - 3))
    seeds = range(8)
    data = torch.stack([_cast(rows, 32, 'fp32', stochastic_cast=True, seed=seed).data.cpu() for seed in seeds])
    magnitude = data.double().abs()
    assert ((magnitude - v).abs() < u).all()  # a neighbour each time
    z = ((magnitude.mean(dim=0) - v) / u)[v > 0]
    assert z.numel() > 40000
    assert z.mean().abs() <= 5 * (0.25 / len(seeds) / z.numel()) ** 0.5, z.mean()


# ---------------------------------------------------------------- stochastic_cast of FP4 data (e2m1)

# Level 0: one kernel of its own, the stochastic twin of the level-0 NVFP4 variant (fp32 x, 16-channel E4M3 scales, H
# 1088; its plain kernel is compiled anyway); level 1 adds MXFP4 (bf16, 32-channel UE8M0 scales), column-major
# power-of-two scales and 128-channel fp32 scales.
_STOCHASTIC_FP4_CORE = [dict(dtype='float32', block=16, sf='e4m3')]
STOCHASTIC_FP4_VARIANTS = by_level(
    LEVEL,
    core=_STOCHASTIC_FP4_CORE,
    default=[
        *_STOCHASTIC_FP4_CORE,
        dict(dtype='bfloat16', block=32, sf='ue8m0'),
        dict(dtype='float32', block=64, sf='pow2', cm=True),
        dict(dtype='bfloat16', block=128, sf='fp32'),
    ],
)


def _fp4_bits(result: QuantTensor, x: torch.Tensor, block: int, sf: str) -> torch.Tensor:
    """The FP4 bytes (uint8) with the sign bits of a NaN product's byte cleared (as the reference's)."""
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    amax = row_blocks(x.cpu(), block).abs().amax(dim=-1)
    _, inverse = format_scale_and_inverse_ref(amax, 'e2m1', round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
    return _without_nan_signs(result.data.cpu().view(torch.uint8), x, inverse, block, 'e2m1')


@pytest.mark.npu
@pytest.mark.parametrize('variant', STOCHASTIC_FP4_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 37), default=(1, 300)))
def test_per_token_cast_stochastic_fp4_values(variant, num_tokens, device):
    """FP4 data: bit for bit the reference's stochastic e2m1 rounding of x * inverse (element t * H + h), the scales
    the plain cast's; the same seed the same bytes, another seed other bytes; out= buffers. Signed zeros, NaN, an
    inf and values on, between and past the grid's points included."""
    block, sf, cm = variant['block'], variant['sf'], variant.get('cm', False)
    hidden = padded_hidden(block)
    x = scaled_rows(num_tokens, hidden, variant['dtype'], device)
    if num_tokens:
        x[:, :2] = torch.tensor([0.0, -0.0], dtype=x.dtype)  # no NaN: its block's values are unspecified
        x[0, -block:] = torch.tensor([6.0, -6.0, 4.0, -3.0, 2.5, -1.25, 0.75, 0.2] * (block // 8), dtype=x.dtype)
        x[-1, -1] = float('-inf')
    cast = functools.partial(_cast, x, block, sf, 'e2m1', stochastic_cast=True, use_tma_aligned_col_major_sf=cm)
    result = cast(seed=12345)
    assert (result.data.dtype, tuple(result.data.shape)) == (torch.int8, (num_tokens, hidden // 2))
    want_data, want_sf = _stochastic_ref(x, block, sf, 12345, 'e2m1')
    assert_equal(_fp4_bits(result, x, block, sf), want_data)
    assert_equal(logical_sf_bytes(result.sf), want_sf)
    plain = _cast(x, block, sf, 'e2m1', use_tma_aligned_col_major_sf=cm)
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(plain.sf))
    assert_equal(cast(seed=12345).data.cpu(), result.data.cpu())
    if num_tokens:
        other = cast(seed=12346)
        assert not torch.equal(other.data.cpu(), result.data.cpu())
        assert_equal(_fp4_bits(other, x, block, sf), _stochastic_ref(x, block, sf, 12346, 'e2m1')[0])
    buffers = (torch.empty_like(result.data), torch.zeros_like(result.sf))
    if cm:
        buffers = (buffers[0], tma_col_major_sf(tuple(result.sf.shape), result.sf.dtype, backend_of(device), device))
    again = cast(seed=12345, out=buffers)
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    assert_equal(_fp4_bits(again, x, block, sf), want_data)
    assert_equal(logical_sf_bytes(again.sf), want_sf)


@pytest.mark.npu
def test_per_token_cast_stochastic_fp4_is_unbiased(device):
    """The level-0 stochastic FP4 kernel (fp32 x, 16-channel E4M3 scales, H 1088): each block holds 6 (scale 1) and
    15 copies of a value between two grid points, 2 + f (spacing 1) in rows 0..14 and 0.5 + f / 2 (spacing 0.5) in
    rows 15..29, f = r / 16; over the 1020 copies of a row only the two neighbours occur, the share rounded up is f
    and the mean is the value, within 5 standard errors. One kernel, compiled for
    test_per_token_cast_stochastic_fp4_values' level-0 variant."""
    fractions = torch.arange(1, 16, dtype=torch.float64) / 16
    lows = torch.tensor([2.0] * 15 + [0.5] * 15, dtype=torch.float64)
    spacings = torch.tensor([1.0] * 15 + [0.5] * 15, dtype=torch.float64)
    values = lows + fractions.repeat(2) * spacings
    x = values.repeat_interleave(1088).reshape(30, 1088).float()
    x[:, ::16] = 6.0
    result = _cast(x.to(device), 16, 'e4m3', 'e2m1', stochastic_cast=True, seed=99)
    assert_equal(result.sf.cpu().float(), torch.ones(30, 68))
    data = unpack_from_e2m1fn_x2(result.data.cpu(), torch.float64)
    copies = data[:, x[0] != 6.0]
    assert copies.shape == (30, 1020)
    lo, hi = lows.unsqueeze(1), (lows + spacings).unsqueeze(1)
    assert ((copies == lo) | (copies == hi)).all()  # only the two neighbours
    f = fractions.repeat(2)
    sigma = (f * (1 - f) / copies.shape[1]).sqrt()
    up = (copies == hi).double().mean(dim=1)
    assert ((up - f).abs() <= 5 * sigma).all(), (up, f)
    assert ((copies.mean(dim=1) - values).abs() <= 5 * sigma * spacings).all()


# ---------------------------------------------------------------- a quantised x (data, sf): the peer's x_block_size

FP8, FP4 = torch.float8_e4m3fn, torch.int8
Q8 = (torch.zeros(4, 256, dtype=FP8), torch.ones(4, 2))  # per-token, 128-channel fp32 scales


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((Q8, 'e4m3', 128), {}, ValueError, r'per_token_cast: a quantised x \(data, sf\) needs x_block_size'),
        (((Q8[0].float(), Q8[1]), 'e4m3', 128, (1, 128)), {}, TypeError, r'x\[0\] must have dtype torch.float8'),
        (((Q8[0], Q8[1].half()), 'e4m3', 128, (1, 128)), {}, TypeError, r'x\[1\] must have dtype torch.float32 or'),
        ((Q8, 'e4m3', 128, (1, 64)), {}, ValueError, r'per_token_cast: x\[1\] must have shape \(4, 4\)'),
        ((Q8, 'e4m3', 128, (1, 128, 1)), {}, ValueError, r'x_block_size must be \(tokens, channels\)'),
        ((Q8, 'e4m3', 128, (3, 128)), {}, ValueError, r'x_block_size\[0\] \(tokens per scale\) must be one of'),
        ((Q8, 'e5m2', 128, (1, 128)), {}, ValueError, r"per_token_cast: fmt must be one of \('e4m3', 'e2m1'\)"),
        ((Q8, 'e4m3', 48, (1, 128)), {}, ValueError, r'num_per_channels must be one of \(16, 32, 64, 128\)'),
        ((Q8, 'e2m1', 128, (1, 128)), {'stochastic_cast': True}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((Q8, 'e4m3', 128, (1, 128)), {'stochastic_cast': True, 'seed': 2**32}, ValueError,
         r'seed must be in \[0, 2\*\*32\)'),
        ((Q8, 'e4m3', 128, (1, 128)), {'stochastic_cast': True, 'seed': 1}, RuntimeError,
         "no kernels for 'cpu' tensors"),
        ((Q8, 'e4m3', 128, (1, 128)), {'seed': 1}, ValueError, 'seed=1 is used only with stochastic_cast=True'),
        ((Q8, 'e4m3', 128, (1, 128)), {'use_packed_ue8m0': True}, ValueError, 'use_packed_ue8m0=True needs round_sf'),
        (((torch.zeros(4, 80, dtype=FP4), torch.ones(4, 3)), 'e4m3', 128, (1, 64)), {}, ValueError,
         r'multiple of 64 for x_block_size \(1, 64\) and FP4 data .*got 160'),
        (((torch.zeros(4, 64, dtype=FP4), torch.ones(4, 4)), 'e4m3', 128, (32, 32)), {}, ValueError,
         r'FP4 \(int8\) data take per-token scales only'),
        ((Q8, 'e4m3', 128, (1, 128)), {'out': (torch.empty(4, 256, dtype=FP8), torch.empty(4, 3))}, ValueError,
         r'out\[1\] must have shape \(4, 2\)'),
        ((Q8, 'e4m3', 128, (1, 128)), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)  # fmt: skip
def test_per_token_cast_quantised_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        per_token_cast(*args, **kwargs)


def test_per_token_cast_quantised_fake_tensors(monkeypatch):
    """While torch traces: a quantised x takes its own forms (two tensors in their schemas), whose fake kernels give
    the eager call's outputs: FP4 data of H / 2 bytes casts H channels; column-major scales of the peer's layout."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    with FakeTensorMode():
        fp4 = (torch.empty(37, 576, dtype=FP4, device='cuda'), torch.empty(37, 72, dtype=FP8, device='cuda'))
        result = per_token_cast(fp4, 'e4m3', 32, (1, 16), use_tma_aligned_col_major_sf=True, round_sf=True)
        assert isinstance(result, QuantTensor)
        assert (result.data.shape, result.data.dtype) == ((37, 1152), FP8)
        assert_peer_layout(result.sf, 37, 'pow2', 'cuda')
        blocks = (torch.empty(37, 1152, dtype=FP8, device='cuda'), torch.empty(1, 3, dtype=torch.int32, device='cuda'))
        result = per_token_cast(blocks, 'e2m1', 16, (128, 128), use_e4m3_sf=True)
        assert (result.data.shape, result.data.dtype, result.sf.shape) == ((37, 576), FP4, (37, 72))
        # The configuration: the two stages the call launches, meeting in fp32 rows of the logical hidden size.
        monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
        cfg = per_token_cast.operator.config  # the tensor form's; the quantised form's below
        assert cfg(torch.empty(37, 1152, device='cuda'), 'e4m3', 32).in_dtype == 'float32'
        recast = QUANTISED.config(fp4, 'e4m3', 32, (1, 16), True, True)
        assert (recast.backend, recast.dequantise.out_dtype, recast.cast.in_dtype) == ('cuda', 'float32', 'float32')
        assert (recast.dequantise.hidden, recast.dequantise.fp4, recast.dequantise.e4m3_sf) == (1152, True, True)
        assert (recast.cast.hidden, recast.cast.block_size, recast.cast.round_sf, recast.cast.col_major_sf) == (
            1152, 32, True, True,
        )  # fmt: skip
        assert recast.cast == choose_per_token_cast_config(backend='cuda', num_cores=7, hidden=1152,
                                                           in_dtype=torch.float32, block_size=32, round_sf=True,
                                                           col_major_sf=True)  # fmt: skip
        assert not recast.fused  # FP4 data: the two stages; e4m3 data: one kernel, which reads x as cast_back would
        assert not QUANTISED.config(blocks, 'e2m1', 16, (128, 128), use_e4m3_sf=True).fused  # FUSE_ON_CUDA off
        monkeypatch.setattr(_INTERFACE, 'FUSE_ON_CUDA', True)
        fused = QUANTISED.config(blocks, 'e2m1', 16, (128, 128), use_e4m3_sf=True)
        assert (fused.fused, fused.dequantise, fused.cast.mode, fused.cast.fmt) == (True, None, 'recast', 'e2m1')
        assert (fused.cast.quantised_x.block_tokens, fused.cast.quantised_x.packed_ue8m0) == (128, True)
    schemas = [str(op._schema) for op in QUANTISED.forms.values()]
    options = (
        'str fmt, int num_per_channels, int[]? x_block_size, bool use_tma_aligned_col_major_sf, bool round_sf, '
        'bool use_packed_ue8m0, bool use_e4m3_sf, bool stochastic_cast, int? seed'
    )
    assert schemas == [
        f'cann_ops_tilelang::per_token_cast_quantised(Tensor x_data, Tensor x_sf, {options}) -> (Tensor, Tensor)',
        f'cann_ops_tilelang::per_token_cast_quantised_out(Tensor x_data, Tensor x_sf, {options}, Tensor(a!) out_data, '
        'Tensor(b!) out_sf) -> ()',
    ]


def test_per_token_cast_quantised_launches(monkeypatch):
    """CPU tensors taken as CUDA ones: e4m3 data is one launch of the fused kernel, (x data, x scales as cast_back's
    kernel takes them, data, scales as the cast kernels take them), planned once and then on the fast path by its
    options and x's formats and layout; FP4 data is the composition, cast_back's launch then per_token_cast's; with
    the fused kernel off (FUSE_ON_CUDA, the default until it has run on a GPU) e4m3 data is the composition too."""
    monkeypatch.setattr(_INTERFACE, 'FUSE_ON_CUDA', True)
    cast_back_op = cast_back.operator
    launches = fast_path.stub_cuda_launches(monkeypatch, QUANTISED, per_token_cast.operator, cast_back_op)
    plans = fast_path.count_plans(monkeypatch, QUANTISED)
    data = torch.zeros(4, 256, dtype=FP8)
    blocks = (data, torch.ones(1, 2))  # 128 x 128 fp32 scales
    for _ in range(2):
        result = per_token_cast(blocks, 'e4m3', 128, (128, 128))
    assert len(plans) == 1
    assert len(launches) == 2
    for cfg, args in launches:
        assert (cfg.fused, len(args)) == (True, 4)
        assert args[0] is data
        assert args[1] is blocks[1]
        assert (args[2].dtype, tuple(args[2].shape), args[3].dtype, tuple(args[3].shape)) == (
            FP8, (4, 256), torch.float32, (4, 2),
        )  # fmt: skip
    assert (result.data.shape, result.sf.shape) == ((4, 256), (4, 2))
    # packed UE8M0 scales in, column-major: cast_back's view (the bytes of sf.T); column-major UE8M0 out: the cast's
    packed = (data, torch.zeros(2, 4, dtype=torch.int32).T)  # 4 tokens' 2 words of 32-channel scales, strides (1, 4)
    result = per_token_cast(packed, 'e4m3', 32, (1, 32), use_tma_aligned_col_major_sf=True, round_sf=True,
                            use_packed_ue8m0=True)  # fmt: skip
    cfg, args = launches[-1]
    assert (cfg.fused, cfg.cast.quantised_x.col_major_sf, cfg.cast.col_major_sf) == (True, True, True)
    assert (args[1].dtype, tuple(args[1].shape), args[1].stride()) == (torch.uint8, (2, 16), (16, 1))
    assert (args[3].dtype, tuple(args[3].shape)) == (torch.uint8, (2, 16))
    assert args[3].data_ptr() == result.sf.data_ptr()
    # FP4 data: the composition, through the public operators (a plan of QUANTISED per call, its check)
    fp4 = (torch.zeros(4, 128, dtype=FP4), torch.ones(4, 2))
    planned, launched = len(plans), len(launches)
    per_token_cast(fp4, 'e4m3', 128, (1, 128))
    assert len(plans) == planned + 1
    stages = [cfg for cfg, _ in launches[launched:]]
    assert [type(cfg).__name__ for cfg in stages] == ['CastBackConfig', 'PerTokenCastConfig']
    assert (stages[0].fp4, stages[1].in_dtype, stages[1].mode) == (True, 'float32', 'cast')
    # More than FEW_TOKENS rows: a plan and a fast-path key of their own (the count class of the tiling; at H 256
    # both classes' tiles are the row)
    planned, launched = len(plans), len(launches)
    many = (torch.zeros(FEW_TOKENS + 1, 256, dtype=FP8), torch.ones(1, 2))
    for _ in range(2):
        per_token_cast(many, 'e4m3', 128, (128, 128))
    assert len(plans) == planned + 1
    assert [cfg for cfg, _ in launches[launched:]] == [launches[0][0]] * 2
    # The fused kernel off: a key of its own, the two stages (a plan per call: the composition has no fast path)
    monkeypatch.setattr(_INTERFACE, 'FUSE_ON_CUDA', False)
    planned, launched = len(plans), len(launches)
    for _ in range(2):
        per_token_cast(blocks, 'e4m3', 128, (128, 128))
    assert len(plans) == planned + 2
    assert [type(cfg).__name__ for cfg, _ in launches[launched:]] == ['CastBackConfig', 'PerTokenCastConfig'] * 2


# (input: producer, data format, block, scale format, column-major; output: fmt, block, scale format, column-major)
# at H 1152. Level 0 on Ascend compiles nothing of its own: the dequantising stages are test_cast_back.py's level-0
# kernels, the cast stage its column-major FP4 one (fp32 rows, 16-channel E4M3 scales), and the producers its
# inputs'; on CUDA the e4m3 inputs are the fused kernel, two of its own (the FP4 input stays the composition).
_QUANTISED_CORE = [
    dict(producer='block', data='e4m3', block_in=(32, 64), sf_in='ue8m0', fmt='e2m1', block=16, sf='e4m3', cm=True),
    dict(producer='token', data='e2m1', block_in=(1, 64), sf_in='ue8m0', fmt='e2m1', block=16, sf='e4m3', cm=True),
    # fp32 input scales: dequantised values that bf16 cannot hold (e4m3 data times a power of two would fit)
    dict(producer='token', data='e4m3', block_in=(1, 16), sf_in='fp32', fmt='e2m1', block=16, sf='e4m3', cm=True),
]
QUANTISED_VARIANTS = by_level(
    LEVEL,
    core=_QUANTISED_CORE,
    default=[
        *_QUANTISED_CORE,
        dict(producer='token', data='e4m3', block_in=(1, 128), sf_in='fp32', fmt='e4m3', block=32, sf='fp32', cm=False),
        dict(producer='block', data='e4m3', block_in=(128, 128), sf_in='fp32', fmt='e4m3', block=128, sf='ue8m0',
             cm=True),
        dict(producer='token', data='e2m1', block_in=(1, 16), sf_in='e4m3', fmt='e4m3', block=64, sf='pow2', cm=False),
        dict(producer='token', data='e4m3', block_in=(1, 32), sf_in='ue8m0', fmt='e2m1', block=32, sf='ue8m0',
             cm=False, cm_in=True),
        # E4M3 scales in (CUDA: widened where the fused kernel loads them)
        dict(producer='token', data='e4m3', block_in=(1, 16), sf_in='e4m3', fmt='e4m3', block=128, sf='fp32',
             cm=False),
        # a short last block in and out (H 2880 = 22.5 blocks of 128): cast_back's and per_token_cast's
        dict(producer='token', data='e4m3', block_in=(1, 128), sf_in='ue8m0', fmt='e4m3', block=128, sf='fp32',
             cm=False, hidden=2880),
        # FP4 data with a short last block of 128 channels in (cast_back's FP4 short block), e4m3 out
        dict(producer='token', data='e2m1', block_in=(1, 128), sf_in='ue8m0', fmt='e4m3', block=32, sf='ue8m0',
             cm=False, hidden=2880),
    ],
)  # fmt: skip


def _quantised_input(x, variant):
    """x quantised by the domain's casts as the variant's input (its scales column-major where `cm_in`)."""
    bt, bc = variant['block_in']
    round_sf, packed, e4m3_sf = _FORMATS[variant['sf_in']]
    if variant['producer'] == 'block':
        return per_block_cast(x, variant['data'], (bt, bc), round_sf=round_sf, use_packed_ue8m0=packed)
    return per_token_cast(x, variant['data'], bc, round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf,
                          use_tma_aligned_col_major_sf=variant.get('cm_in', False))  # fmt: skip


@pytest.mark.npu
@pytest.mark.parametrize('variant', QUANTISED_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 37), default=(1, 300)))
def test_per_token_cast_quantised_values(variant, num_tokens, device):
    """per_token_cast of a quantised x is the cast of its dequantised fp32 values, bit for bit (data, and the scale
    bytes in the logical order, column-major ones in the peer's layout), into new buffers or given ones."""
    _check_quantised_values(variant, num_tokens, device, fused=False)


@pytest.mark.npu
@pytest.mark.parametrize('variant', [v for v in QUANTISED_VARIANTS if v['data'] == 'e4m3'], ids=make_param_id)
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(), default=(1, 37, 300)))  # an option: from level 1
def test_per_token_cast_quantised_fused_values(variant, num_tokens, device, monkeypatch):
    """The fused CUDA kernel of e4m3 data (FUSE_ON_CUDA set): the same bits as the definition."""
    if backend_of(device) != 'cuda':
        pytest.skip('the fused kernel of a quantised x is a CUDA kernel')
    monkeypatch.setattr(_INTERFACE, 'FUSE_ON_CUDA', True)
    _check_quantised_values(variant, num_tokens, device, fused=True)


def _check_quantised_values(variant, num_tokens, device, *, fused):
    x = scaled_rows(num_tokens, variant.get('hidden', 1152), 'bfloat16', device)
    quantised = _quantised_input(x, variant)
    fmt, block, sf, cm = variant['fmt'], variant['block'], variant['sf'], variant['cm']
    result = _cast(quantised, block, sf, fmt, x_block_size=variant['block_in'], use_tma_aligned_col_major_sf=cm)
    # The fused kernel or the composition, both against the same reference.
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    cfg = QUANTISED.config(quantised, fmt, block, variant['block_in'], cm, round_sf, packed, e4m3_sf)
    assert cfg.fused == fused
    data, scales = quantised[0].cpu(), torch.empty(quantised[1].shape, dtype=quantised[1].dtype)
    scales.copy_(quantised[1].cpu())  # row-major: the values of column-major scales
    values = cast_back_ref(data, scales.view(torch.uint8) if scales.dtype == torch.int32 else scales, torch.float32,
                           *variant['block_in'])  # fmt: skip
    want = per_token_cast_format_ref(values, block, fmt, round_sf=round_sf, packed_ue8m0=packed, e4m3_sf=e4m3_sf)
    assert_equal(result.data.cpu().view(torch.uint8), want[0].view(torch.uint8))
    assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(want[1]))
    if cm:
        assert_peer_layout(result.sf, num_tokens, sf, backend_of(device))
    buffers = (torch.empty_like(result.data), torch.empty_like(result.sf) if not cm else result.sf.clone().fill_(0))
    if cm:
        buffers = (buffers[0], tma_col_major_sf(tuple(result.sf.shape), result.sf.dtype, backend_of(device), device))
    again = _cast(quantised, block, sf, fmt, x_block_size=variant['block_in'], use_tma_aligned_col_major_sf=cm,
                  out=buffers)  # fmt: skip
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    assert_equal(again.data.cpu().view(torch.uint8), want[0].view(torch.uint8))
    assert_equal(logical_sf_bytes(again.sf), logical_sf_bytes(want[1]))


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(), default=(37,)))  # level 1: a stochastic fp32 kernel
@pytest.mark.parametrize('fmt', ['e4m3', 'e2m1'])
def test_per_token_cast_quantised_stochastic_values(num_tokens, fmt, device):
    """A quantised x with stochastic_cast: the stochastic rounding of its dequantised values times the inverse
    (element t * H + h), bit for bit the reference's (e4m3 and FP4 data); the seed reproduces it."""
    x = scaled_rows(num_tokens, 1152, 'bfloat16', device)
    quantised = tuple(per_block_cast(x, 'e4m3', (128, 128)))  # fp32 block scales: values bf16 could not hold
    result = per_token_cast(quantised, fmt, 32, (128, 128), stochastic_cast=True, seed=7)
    values = cast_back_ref(quantised[0].cpu(), quantised[1].cpu(), torch.float32, 128, 128)
    want_data, want_sf = _stochastic_ref(values, 32, 'fp32', 7, fmt)
    assert_equal(result.data.cpu().view(torch.uint8), want_data)
    assert_equal(logical_sf_bytes(result.sf), want_sf)
    again = per_token_cast(quantised, fmt, 32, (128, 128), stochastic_cast=True, seed=7)
    assert_equal(again.data.cpu().view(torch.uint8), want_data)


# The peer's shapes (tokens 4001 / 8001, hidden 4096 / 7168), 128-channel fp32 and 32-channel UE8M0 scales.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168], block=[128, 32])


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_per_token_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = params['block'], 'fp32' if params['block'] == 128 else 'ue8m0'
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    result = _cast(x, block, sf)
    _assert_matches(result, x, block, sf)
    time_us = benchmark_timer(lambda: _cast(x, block, sf, out=result))
    round_sf, packed, _ = _FORMATS[sf]
    cfg = per_token_cast.operator.config(x, 'e4m3', block, round_sf=round_sf, use_packed_ue8m0=packed)
    benchmark_record(
        kernel='quant.per_token_cast',
        operation='cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )


# FP4 at the same shapes: NVFP4's layout (16-channel E4M3 scales) and MXFP4's (32-channel UE8M0 scales).
FP4_SCALES = {'e4m3x16': (16, 'e4m3'), 'ue8m0x32': (32, 'ue8m0')}
FP4_BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168], scales=list(FP4_SCALES))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', FP4_BENCHMARK_PARAMS, ids=make_param_id)
def test_per_token_cast_fp4_benchmark(params, device, benchmark_timer, benchmark_record):
    block, sf = FP4_SCALES[params['scales']]
    x = scaled_rows(params['num_tokens'], params['hidden'], 'bfloat16', device)
    result = _cast(x, block, sf, 'e2m1')
    _assert_matches(result, x, block, sf, 'e2m1')
    time_us = benchmark_timer(lambda: _cast(x, block, sf, 'e2m1', out=result))
    round_sf, packed, e4m3_sf = _FORMATS[sf]
    cfg = per_token_cast.operator.config(
        x, 'e2m1', block, round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf
    )
    benchmark_record(
        kernel='quant.per_token_cast',
        operation='cast_fp4',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )
