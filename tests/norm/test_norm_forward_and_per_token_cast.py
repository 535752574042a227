"""norm_forward_and_per_token_cast: kernel lowering (CPU tier), the argument contract and the torch.library forms
on CPU / fake tensors (CPU tier), and on the device (an accelerator, or the Ascend kernel on the emulator): its bytes
equal per_token_cast(norm_forward(x)) and the quant reference's cast of its bf16 output, bit for bit; the
benchmark."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config, operator
from cann_ops_tilelang.kernel_target import Launcher
from cann_ops_tilelang.norm import norm_forward, norm_forward_and_per_token_cast
from cann_ops_tilelang.norm._norm_common import ASCEND_UB_BUDGET, forward_launch_args
from cann_ops_tilelang.norm._norm_forward_ascend import staging_tile
from cann_ops_tilelang.norm.norm_forward_kernel import (
    NormForwardConfig,
    ascend_ub_bytes,
    choose_norm_forward_config,
    get_norm_forward_kernel,
    make_norm_forward_kernel,
)
from cann_ops_tilelang.quant import per_token_cast
from tests.quant.cast_ref import SCALE_ROWS_2880, per_token_cast_format_ref, tma_col_major_sf
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_close, assert_equal, count_bytes
from tests.testing.timing import record_name

from .norm_forward_and_per_token_cast_ref import norm_forward_and_per_token_cast_ref
from .test_norm_forward import assert_padding, strided_view

LEVEL = get_test_level()
EPS = 1e-6
# scale formats (round_sf, use_packed_ue8m0)
SCALES = {'fp32': (False, False), 'pow2': (True, False), 'ue8m0': (True, True)}
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(dtype=torch.bfloat16, block=32, sf='fp32', weight=True, residual=True, bf16=True, hidden=256),
        dict(dtype=torch.float32, block=16, sf='ue8m0', weight=False, residual=False, bf16=True, hidden=192),
    ],
    default=generate_samples(
        dtype=[torch.bfloat16, torch.float32],
        block=[16, 32, 64, 128],
        sf=list(SCALES),
        weight=[True],
        residual=[True, False],
        bf16=[True],
        hidden=[384, 7168],
    ),
    full=generate_samples(
        dtype=[torch.bfloat16],
        block=[32, 128],
        sf=['ue8m0'],
        weight=[True],
        residual=[True],
        bf16=[False],
        hidden=[16384],
    ),
)
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 37), default=(130,), full=(4001,))
# fp32 x with weight, residual and the bf16 output: on Ascend the weight is streamed per row past these widths (the
# widest row whose buffers fit UB beside the resident fp32 weight), per (block, scale format).
STREAMED_FROM = {(16, 'fp32'): 15296, (16, 'ue8m0'): 15488, (32, 'fp32'): 15680, (64, 'fp32'): 15872,
                 (128, 'fp32'): 16000}  # fmt: skip
STREAMED = dict(dtype=torch.float32, weight=True, residual=True, bf16=True)
# The device check of streamed rows (new kernels at new widths: level 1): 16384, and just past the threshold.
STREAMED_WIDE = by_level(LEVEL, core=[], default=[STREAMED | dict(block=128, sf='fp32', hidden=16384),
                                                  STREAMED | dict(block=16, sf='ue8m0', hidden=15552)])  # fmt: skip
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168], residual=[False, True])


def _call(x, weight, v, residual=None, **kwargs):
    round_sf, packed = SCALES[v['sf']]
    return norm_forward_and_per_token_cast(
        x, weight, EPS, 'e4m3', v['block'], residual, 0.75, round_sf=round_sf, use_packed_ue8m0=packed, **kwargs
    )


def _config_kwargs(backend, v) -> dict:
    round_sf, packed = SCALES[v['sf']]
    return dict(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=v['hidden'], dtype=v['dtype'], with_weight=v['weight'], with_residual=v['residual'], with_rstd=True,
        block_size=v['block'], round_sf=round_sf, packed_ue8m0=packed, with_out_bf16=v['bf16'],
    )  # fmt: skip


def _config(backend, v):
    return choose_norm_forward_config(**_config_kwargs(backend, v))


# ---------------------------------------------------------------- CPU tier


@pytest.mark.parametrize('v', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_and_per_token_cast_kernel_lowers(backend, v):
    cfg = _config(backend, v)
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowers(lambda: make_norm_forward_kernel(cfg), key=cfg, kernel_name='norm_forward_kernel')


def _x(num_tokens=4, hidden=128, dtype=torch.bfloat16, device='cpu'):
    return torch.zeros(num_tokens, hidden, dtype=dtype, device=device)


@pytest.mark.parametrize(
    ('kwargs', 'error', 'match'),
    [
        (dict(fmt='e5m2'), ValueError, 'fmt must be one of'),
        (dict(fmt=3), TypeError, 'fmt'),
        (dict(num_per_channels=48), ValueError, 'num_per_channels must be one of'),
        (dict(x=_x(4, 192), num_per_channels=128), RuntimeError, "no kernels for 'cpu' tensors"),  # a short block
        (dict(use_packed_ue8m0=True), ValueError, 'needs round_sf=True'),
        (
            dict(
                x=_x(8).view(2, 4, 128),
                use_tma_aligned_col_major_sf=True,
                out=(_x(8).view(2, 4, 128).to(torch.float8_e4m3fn), torch.zeros(2, 4, 4)),
            ),
            ValueError,
            r'out is not supported with use_tma_aligned_col_major_sf=True and a batched \(B, T, H\) x',
        ),
        (
            dict(x=_x(8).view(2, 4, 128), use_tma_aligned_col_major_sf=True, residual=_x(8)),
            ValueError,
            r'residual must have the batch and tokens of x, \(2, 4\), got shape \(8, 128\)',
        ),
        (dict(x=_x(8).view(2, 4, 128), use_tma_aligned_col_major_sf=True), RuntimeError, "no kernels for 'cpu'"),
        (dict(x=_x(0).view(0, 4, 128), use_tma_aligned_col_major_sf=True), RuntimeError, "no kernels for 'cpu'"),
        (
            dict(out=(_x(4, 128).to(torch.float8_e4m3fn), torch.zeros(4, 4)), use_tma_aligned_col_major_sf=True),
            ValueError,
            r'out\[1\] must have strides \(1, 4\) for shape \(4, 4\) .* got \(4, 1\)',
        ),
        (
            dict(out=(_x(4, 128).to(torch.float8_e4m3fn), torch.zeros(4, 4).T)),
            ValueError,
            r'out\[1\] must be contiguous',
        ),
        (dict(use_tma_aligned_col_major_sf=True), RuntimeError, "no kernels for 'cpu' tensors"),
        (dict(mega_moe_block_m=128), ValueError, 'mega_moe_block_m=128 is not supported'),
        (dict(out_bf16=_x(4, 128)), ValueError, 'out_bf16 needs with_out_bf16=True'),
        (dict(out=_x(4, 128)), TypeError, 'out must be a tuple'),
        (dict(out=(_x(4, 128), torch.zeros(4, 4))), TypeError, r'out\[0\] must have dtype'),
        (dict(out=(_x(4, 128).to(torch.float8_e4m3fn), torch.zeros(4, 5))), ValueError, r'out\[1\] must have shape'),
        (dict(x=_x(4, 96)), ValueError, 'multiple of 64 up to 16384'),
        (dict(x=_x(4, 132)[:, :128]), ValueError, 'the rows of a strided x must each start on 16 bytes'),
        (dict(residual=_x(4, 130)[:, :128]), ValueError, 'the rows of a strided residual must each start on 16'),
        (
            dict(with_out_bf16=True, out_bf16=_x(4, 136)[:, 4:132]),
            ValueError,
            r'the rows of a strided out_bf16 must each start on 16 bytes, got row stride 136 \(2-byte elements\) '
            r'and data_ptr\(\) = \d+',
        ),
        (
            dict(residual=_x(), residual_out=_x(4, 140)[:, :128]),
            ValueError,
            'the rows of a strided residual_out must each start on 16 bytes, got row stride 140',
        ),
        (dict(x=_x(4, 136)[:, :128], residual=_x(4, 192)[:, 64:]), RuntimeError, "no kernels for 'cpu' tensors"),
        (dict(), RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=[
        'fmt',
        'fmt-type',
        'block',
        'block-hidden-short',
        'packed',
        'col-major-batched-out',
        'col-major-batched-residual',
        'col-major-batched-cpu',
        'col-major-no-batch-cpu',
        'col-major-out-row-major',
        'row-major-out-col-major',
        'col-major-cpu',
        'mega-moe',
        'bf16-buffer',
        'out-type',
        'out-dtype',
        'out-sf-shape',
        'hidden',
        'strided-x-misaligned',
        'strided-residual-misaligned',
        'strided-out-bf16-misaligned',
        'strided-residual-out-misaligned',
        'strided-aligned-cpu',
        'cpu',
    ],
)
def test_norm_forward_and_per_token_cast_contract(kwargs, error, match):
    args = dict(x=_x(), weight=None, eps=EPS, fmt='e4m3', num_per_channels=32) | kwargs
    with pytest.raises(error, match=match):
        norm_forward_and_per_token_cast(**args)


def test_norm_forward_and_per_token_cast_traced():
    forms = norm_forward_and_per_token_cast.operator.forms
    assert list(forms) == ['norm_forward_and_per_token_cast', 'norm_forward_and_per_token_cast_out']
    with FakeTensorMode():
        x = _x(5, 256, device='cuda')
        result = norm_forward_and_per_token_cast(
            x, None, EPS, 'e4m3', 32, torch.empty_like(x), round_sf=True, use_packed_ue8m0=True,
            with_out_bf16=True, with_rstd=True,
        )  # fmt: skip
        data, sf = result.out
        assert (data.shape, data.dtype, sf.shape, sf.dtype) == ((5, 256), torch.float8_e4m3fn, (5, 2), torch.int32)
        assert (result.out_bf16.dtype, result.rstd.shape, result.norm_input.shape) == (torch.bfloat16, (5,), x.shape)
        buffers = (torch.empty_like(data), torch.empty(5, 8, device='cuda'))
        assert norm_forward_and_per_token_cast(x, None, EPS, 'e4m3', 32, out=buffers).out == buffers


def test_norm_forward_and_per_token_cast_batched_traced():
    """A (B, T, H) x, the peer's batched call, on fake tensors: data, sf, out_bf16 and rstd (B, T, ...), given
    buffers returned, a buffer of other tokens refused."""
    with FakeTensorMode():
        x = _x(10, 256, device='cuda').view(2, 5, 256)
        result = norm_forward_and_per_token_cast(
            x, None, EPS, 'e4m3', 32, torch.empty_like(x), round_sf=True, use_packed_ue8m0=True,
            with_out_bf16=True, with_rstd=True,
        )  # fmt: skip
        data, sf = result.out
        assert (data.shape, sf.shape, sf.dtype) == ((2, 5, 256), (2, 5, 2), torch.int32)
        assert (result.out_bf16.shape, result.rstd.shape, result.norm_input.shape) == (x.shape, (2, 5), x.shape)
        buffers = (torch.empty_like(data), torch.empty(2, 5, 8, device='cuda'))
        assert norm_forward_and_per_token_cast(x, None, EPS, 'e4m3', 32, out=buffers).out == buffers
        with pytest.raises(ValueError, match=r'out\[1\] must have the batch and tokens of x, \(2, 5\)'):
            norm_forward_and_per_token_cast(x, None, EPS, 'e4m3', 32, out=(data, torch.empty(10, 8, device='cuda')))


def _batched_peer_strides(num_batches, num_tokens, k, dtype, backend) -> tuple[int, int, int]:
    """TileKernels' (B, T, K) column-major scales of a batched call: each batch a (K, T_pad) block of its own."""
    _, t_pad = tma_col_major_sf((num_tokens, k), dtype, backend).stride()
    return k * t_pad, 1, t_pad


@pytest.mark.parametrize('shape', [(2, 5), (3, 1), (1, 37), (0, 4), (2, 0)])
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_and_per_token_cast_batched_col_major_fake_strides(shape, backend, monkeypatch):
    """While torch traces: a batched x with column-major scales gives the peer's batched layout on each backend,
    fp32 and UE8M0 words; the other results (B, T, ...)."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    device = 'cuda' if backend == 'cuda' else 'cpu'
    with FakeTensorMode():
        x = _x(shape[0] * shape[1], 384, device=device).view(*shape, 384)
        for block, packed, k, dtype in ((32, False, 12, torch.float32), (16, True, 6, torch.int32)):
            result = norm_forward_and_per_token_cast(
                x, None, EPS, 'e4m3', block, torch.empty_like(x), use_tma_aligned_col_major_sf=True, round_sf=packed,
                use_packed_ue8m0=packed, with_out_bf16=True, with_rstd=True,
            )  # fmt: skip
            data, sf = result.out
            assert (data.shape, data.dtype, data.is_contiguous()) == ((*shape, 384), torch.float8_e4m3fn, True)
            assert (sf.shape, sf.dtype) == ((*shape, k), dtype)
            assert sf.stride() == _batched_peer_strides(*shape, k, dtype, backend)
            assert (result.out_bf16.shape, result.rstd.shape, result.norm_input.shape) == (x.shape, shape, x.shape)


@pytest.mark.parametrize('num_tokens', [0, 1, 5, 37])
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_and_per_token_cast_col_major_fake_strides(num_tokens, backend, monkeypatch):
    """While torch traces: column-major scales of per_token_cast's layout on each backend (TileKernels' strides:
    CUDA T rounded up to 16 bytes, Ascend T), fp32 and UE8M0 words, the functional form and the out= form; the
    data row-major."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    device = 'cuda' if backend == 'cuda' else 'cpu'
    with FakeTensorMode():
        x = _x(num_tokens, 384, device=device)
        for sf_name, block in (('fp32', 32), ('ue8m0', 64)):
            v = dict(block=block, sf=sf_name)
            result = _call(x, None, v, use_tma_aligned_col_major_sf=True, with_rstd=True)
            data, sf = result.out
            peer = tma_col_major_sf(tuple(sf.shape), sf.dtype, backend)
            assert (tuple(sf.shape), sf.dtype, sf.stride()) == (tuple(peer.shape), peer.dtype, peer.stride())
            assert data.is_contiguous()
            buffers = (
                torch.empty_like(data),
                torch.empty_strided(sf.shape, peer.stride(), dtype=sf.dtype, device=device),
            )
            assert _call(x, None, v, use_tma_aligned_col_major_sf=True, out=buffers).out == buffers


def test_norm_forward_and_per_token_cast_col_major_config():
    """The layout is a configuration field of its own, of the cast only; both kernels lower with it (the row
    stride a launch argument; Ascend: one DMA of single-scale / UE8M0-word bursts per row)."""
    v = VARIANTS[0]
    rows = _config('ascend', v)
    cols = choose_norm_forward_config(**_config_kwargs('ascend', v), col_major_sf=True)
    assert (cols.col_major_sf, rows.col_major_sf, cols != rows, hash(cols) != hash(rows)) == (True, False, True, True)
    with pytest.raises(ValueError, match='col_major_sf belong to the cast'):
        choose_norm_forward_config(**_config_kwargs('ascend', v) | {'block_size': 0, 'round_sf': False,
                                   'with_out_bf16': False}, col_major_sf=True)  # fmt: skip


@pytest.mark.parametrize('v', VARIANTS[:2], ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_and_per_token_cast_col_major_lowers(backend, v):
    cfg = choose_norm_forward_config(**_config_kwargs(backend, v), col_major_sf=True)
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lowers(lambda: make_norm_forward_kernel(cfg), key=cfg, kernel_name='norm_forward_kernel').source
    assert 'sf_stride' in source
    if backend == 'ascend':
        burst = 4  # an fp32 scale or a UE8M0 word
        bursts = cfg.sf_cols // (4 if cfg.packed_ue8m0 else 1)
        assert re.search(rf'asc_copy_ub2gm_align\([^;]*sf\[[^;]*, {bursts}, {burst}, [^;]*sf_stride[^;]*, {burst}\);',
                         source)  # fmt: skip


def test_norm_forward_and_per_token_cast_strided_rows_config(monkeypatch):
    """A strided x, residual, residual_out or out_bf16 chooses the kernel of strided rows (the cast's data and
    scales keep their layouts); contiguous rows and one row keep the contiguous kernel."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    configure = norm_forward_and_per_token_cast.operator.config
    x, wide = _x(), _x(4, 136)

    def strided(**kwargs):
        return configure(**dict(x=x, weight=None, eps=EPS, fmt='e4m3', num_per_channels=32) | kwargs).strided_rows

    assert not strided(residual=_x(), residual_out=_x(), with_out_bf16=True, out_bf16=_x())
    assert strided(x=wide[:, :128])
    assert strided(residual=wide[:, 8:])
    assert strided(residual=_x(), residual_out=wide[:, :128])
    assert not strided(residual_out=wide[:, :128])  # ignored without residual
    assert strided(with_out_bf16=True, out_bf16=wide[:, :128])
    assert strided(x=wide[:, :128], use_tma_aligned_col_major_sf=True)
    assert not strided(x=wide[:1, :128])  # one row: any stride


@pytest.mark.parametrize('v', VARIANTS[:2], ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_and_per_token_cast_strided_rows_lower(backend, v):
    """strided_rows: the stride of each present row tensor a launch argument (bf16 x: y is `out`; fp32 x: the
    bf16 output its own `out_bf16`), data contiguous; on CUDA the contiguous kernel's vector accesses."""
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    plain = _config(backend, v)
    strided = dataclasses.replace(plain, strided_rows=True)
    sources = [lowers(lambda c=c: make_norm_forward_kernel(c), key=c, kernel_name='norm_forward_kernel').source
               for c in (plain, strided)]  # fmt: skip
    rows = {'x', 'residual', 'residual_out', 'out'} if v['residual'] else {'x', 'out_bf16'}
    assert set(strided.row_tensors) == rows
    for name in strided.row_tensors:
        assert [re.search(rf'\b{name}_stride\b', s) is not None for s in sources] == [False, True]
    assert 'data_stride' not in sources[1]
    if backend == 'cuda':
        accesses = re.compile(r'\((\w+)\*\)\((x|residual|residual_out|out|out_bf16|data) \+')
        vectors = [sorted(set(accesses.findall(s))) for s in sources]
        assert {name for _, name in vectors[0]} == {*strided.row_tensors, 'data'}
        assert vectors[1] == vectors[0]


def _ub(v, streamed=False) -> int:
    """The Ascend kernel's UB estimate (both buffer kinds, one version) for variant `v`."""
    per_stage, resident = ascend_ub_bytes(
        hidden=v['hidden'], dtype='float32' if v['dtype'] == torch.float32 else 'bfloat16', with_weight=v['weight'],
        with_residual=v['residual'], block_size=v['block'], packed_ue8m0=SCALES[v['sf']][1], with_out_bf16=v['bf16'],
        weight_streamed=streamed,
    )  # fmt: skip
    return per_stage + resident


@pytest.mark.parametrize(('block', 'sf'), list(STREAMED_FROM), ids=lambda v: str(v))
def test_norm_forward_and_per_token_cast_weight_streamed_config(block, sf):
    """Ascend keeps the fp32 weight resident wherever the row's buffers fit UB beside it (the kernel of before);
    from the first width where they do not, up to 16384, it streams the weight (one buffer version), and the
    streamed buffers fit. Every other option set keeps the resident weight at 16384."""
    last = STREAMED_FROM[(block, sf)]
    step = max(64, block)
    for hidden in (last - step, last, last + step, 16384):
        v = STREAMED | dict(block=block, sf=sf, hidden=hidden)
        cfg = _config('ascend', v)
        fits = _ub(v) <= ASCEND_UB_BUDGET
        assert (cfg.weight_streamed, fits) == (hidden > last, hidden <= last), hidden
        if cfg.weight_streamed:
            assert cfg.num_stages == 1
            assert _ub(v, streamed=True) <= ASCEND_UB_BUDGET
        assert not _config('cuda', v).weight_streamed
    wide = STREAMED | dict(block=block, sf=sf, hidden=16384)
    for other in (dict(bf16=False), dict(residual=False), dict(dtype=torch.bfloat16), dict(sf='pow2', bf16=False)):
        assert not _config('ascend', wide | other).weight_streamed, other
    with pytest.raises(ValueError, match='weight_streamed is an Ascend option of a kernel with weight'):
        dataclasses.replace(_config('cuda', wide), weight_streamed=True)
    with pytest.raises(ValueError, match='weight_streamed is an Ascend option of a kernel with weight'):
        dataclasses.replace(_config('ascend', wide | dict(weight=False)), weight_streamed=True)


@pytest.mark.parametrize('block', [16, 128])
def test_norm_forward_and_per_token_cast_weight_streamed_lowers(block):
    """The streamed kernel at 16384 lowers within UB and within the estimate; one weight tile per DMA."""
    cfg = _config('ascend', STREAMED | dict(block=block, sf='fp32', hidden=16384))
    assert cfg.weight_streamed
    lowered = assert_ascend_kernel_lowers(lambda: make_norm_forward_kernel(cfg), key=cfg,
                                          kernel_name='norm_forward_kernel')  # fmt: skip
    assert lowered.ub_bytes <= _ub(STREAMED | dict(block=block, sf='fp32', hidden=16384), streamed=True)
    tile = staging_tile(16384)
    assert re.search(rf'for \(int32_t k = 0; k < {16384 // tile}; \+\+k\) \{{', lowered.source)
    assert re.search(rf'asc_copy_gm2ub_align\([^;]*weight\[\(k \* {tile}\)\][^;]*, 1, {tile * 4}, ', lowered.source)


# ---------------------------------------------------------------- device tier


def _inputs(v, num_tokens, device):
    g = torch.Generator().manual_seed(num_tokens * 7 + v['hidden'] + v['block'])

    def draw(*shape):
        return (torch.randn(shape, generator=g) * 3).to(v['dtype']).to(device)

    return (draw(num_tokens, v['hidden']), draw(v['hidden']) if v['weight'] else None,
            draw(num_tokens, v['hidden']) if v['residual'] else None)  # fmt: skip


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
@pytest.mark.parametrize('v', VARIANTS, ids=make_param_id)
def test_norm_forward_and_per_token_cast_values(v, num_tokens, device):
    _assert_values(v, num_tokens, device)


@pytest.mark.npu
@pytest.mark.parametrize('v', STREAMED_WIDE, ids=make_param_id)
def test_norm_forward_and_per_token_cast_weight_streamed_values(v, device):
    """fp32 rows with weight, residual and the bf16 output past what UB holds beside the resident weight (Ascend
    streams the weight per row): the composition's bits and the references, as every width."""
    if config.backend_of(device) == 'ascend':
        round_sf, packed = SCALES[v['sf']]
        x, weight, residual = _inputs(v, 1, device)
        cfg = norm_forward_and_per_token_cast.operator.config(
            x, weight, EPS, 'e4m3', v['block'], residual, round_sf=round_sf, use_packed_ue8m0=packed,
            with_out_bf16=True, with_rstd=True,
        )  # fmt: skip
        assert cfg.weight_streamed
    _assert_values(v, 3, device)


def _assert_values(v, num_tokens, device, inputs=None):
    x, weight, residual = inputs or _inputs(v, num_tokens, device)
    round_sf, packed = SCALES[v['sf']]
    result = _call(x, weight, v, residual, with_out_bf16=v['bf16'], with_rstd=True)
    # The fused call is the two operators' composition, bit for bit.
    plain = norm_forward(x, weight, EPS, residual, 0.75, with_rstd=True)
    cast = per_token_cast(plain.out, 'e4m3', v['block'], round_sf=round_sf, use_packed_ue8m0=packed)
    assert_equal(result.out.data.view(torch.uint8), cast.data.view(torch.uint8))
    assert_equal(result.out.sf, cast.sf)
    assert_equal(result.rstd, plain.rstd)
    assert_equal(result.norm_input, plain.norm_input)
    if v['bf16']:
        assert_equal(result.out_bf16, plain.out.to(torch.bfloat16))
    else:
        assert result.out_bf16 is None
    # ... and the quant reference's cast of its own output, which is within a rounding of the float64 norm.
    data, sf = per_token_cast_format_ref(plain.out.cpu(), v['block'], 'e4m3', round_sf=round_sf, packed_ue8m0=packed)
    assert_equal(result.out.data.cpu().view(torch.uint8), data.view(torch.uint8))
    assert_equal(result.out.sf.cpu().view(torch.uint8), sf.view(torch.uint8))
    _, y, _, norm_input = norm_forward_and_per_token_cast_ref(
        x.cpu(), None if weight is None else weight.cpu(), EPS, v['block'],
        None if residual is None else residual.cpu(), 0.75, round_sf, packed,
    )  # fmt: skip
    rtol = 2**-7 if v['dtype'] == torch.bfloat16 else 2**-20  # one bf16 ulp (test_norm_forward.RTOL)
    assert_close(plain.out.cpu().double(), y.double(), atol=1e-6, rtol=rtol)
    assert_equal(result.norm_input.cpu(), norm_input)
    # out= buffers, poisoned
    buffers = tuple(torch.full_like(t.view(torch.uint8), 0xFF).view(t.dtype) for t in result.out)
    again = _call(x, weight, v, residual, with_out_bf16=v['bf16'], out=buffers)
    assert again.out == buffers
    assert_equal(buffers[0].view(torch.uint8), result.out.data.view(torch.uint8))
    assert_equal(buffers[1], result.out.sf)


def _launch(cfg, x, weight, residual) -> tuple:
    """cfg's kernel launched into poisoned buffers: (data and sf as bytes, y or the separate bf16 output,
    residual_out (NaN without residual), rstd)."""
    n, device = x.shape[0], x.device
    data = torch.full(x.shape, 0xFF, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sf_t = torch.full((n, cfg.sf_cols), 0xFF if cfg.packed_ue8m0 else float('nan'), device=device,
                      dtype=torch.uint8 if cfg.packed_ue8m0 else torch.float32)  # fmt: skip
    bf16 = torch.full(x.shape, float('nan'), dtype=torch.bfloat16, device=device)
    y = torch.full_like(x, float('nan')) if cfg.writes_y else None
    residual_out = torch.full_like(x, float('nan'))
    rstd = torch.full((n,), float('nan'), device=device)
    args = forward_launch_args(x, weight, residual, residual_out, y, rstd, data, sf_t,
                               None if cfg.writes_y else bf16, EPS, 0.75)  # fmt: skip
    Launcher(get_norm_forward_kernel, cfg, device).launch(*args)
    return data.view(torch.uint8), sf_t.view(torch.uint8), bf16 if y is None else y, residual_out, rstd


# The streamed kernel forced at a small width (3 weight tiles of 448), against the resident one: (dtype, block, sf).
FORCED_STREAMED = by_level(LEVEL, core=[(torch.float32, 32, 'fp32')], default=[(torch.bfloat16, 16, 'ue8m0')])


@pytest.mark.npu
@pytest.mark.parametrize(('dtype', 'block', 'sf'), FORCED_STREAMED, ids=lambda v: str(v))
def test_norm_forward_and_per_token_cast_weight_streamed_same_bits(dtype, block, sf, device):
    """The Ascend kernel that streams the weight per row gives the resident kernel's bits, every output (forced
    where the resident one fits; 4 cores for 9 rows, so that cores take two rows and three)."""
    if config.backend_of(device) != 'ascend':
        pytest.skip('weight streaming is an Ascend kernel')
    v = dict(dtype=dtype, block=block, sf=sf, weight=True, residual=True, bf16=True, hidden=1344)
    assert staging_tile(v['hidden']) == 448
    x, weight, residual = _inputs(v, 9, device)
    resident = dataclasses.replace(_config('ascend', v), num_cores=4, num_stages=1)
    assert not resident.weight_streamed
    forced = dataclasses.replace(resident, weight_streamed=True)
    results = [_launch(cfg, x, weight, residual) for cfg in (resident, forced)]
    for streamed, whole in zip(results[1], results[0], strict=True):
        assert_equal(streamed.cpu().view(torch.uint8), whole.cpu().view(torch.uint8))
    for written in results[0][2:]:  # y (or the bf16 output), residual_out, rstd
        assert not torch.isnan(written.float()).any()


# ---------------------------------------------------------------- CUDA schedules of the widest rows

# Changes to the chosen CUDA configuration at H 16384 (512 threads x 4 chunks: one block per SM by its registers)
# that let an SM hold more blocks or warps; what ptxas says of each, docs/norm.md. Timed by
# .device/nfc_variants.py, values checked here (level 1). The same threads and chunks keep every sum's order, so
# the chosen kernel's bits; other threads x chunks sum the row in another order (rstd's last bits).
CUDA_SCHEDULES = {
    '512x4 m2': dict(min_blocks=2),  # two blocks per SM (a register cap)
    '1024x2': dict(threads=1024, chunks=2),  # one block of twice the warps
    '1024x2 m2': dict(threads=1024, chunks=2, min_blocks=2, narrow_row=True, late_weight=True),  # every thread slot
    '256x8': dict(threads=256, chunks=8),  # twice the bytes in flight a thread, smaller blocks
}
_WIDE = dict(dtype=torch.bfloat16, weight=True, bf16=True, hidden=16384)
CUDA_SCHEDULE_ROWS = by_level(
    LEVEL,
    core=[],
    default=[_WIDE | dict(block=32, sf='fp32', residual=False), _WIDE | dict(block=128, sf='fp32', residual=True),
             _WIDE | dict(block=32, sf='ue8m0', residual=True)],
)  # fmt: skip


def _schedule(v, name):
    chosen = _config('cuda', v)
    return chosen, dataclasses.replace(chosen, **CUDA_SCHEDULES[name])


def test_norm_forward_and_per_token_cast_cuda_schedule_config():
    """The schedules' fields: CUDA only, late_weight with a weight, min_blocks within an SM's threads."""
    v = _WIDE | dict(block=32, sf='fp32', residual=True)
    chosen = _config('cuda', v)
    assert (chosen.threads, chosen.chunks, chosen.min_blocks, chosen.late_weight, chosen.narrow_row) == (
        512, 4, 0, False, False)  # fmt: skip
    for changes in (dict(min_blocks=2), dict(late_weight=True), dict(narrow_row=True)):
        with pytest.raises(ValueError, match='are CUDA options'):
            dataclasses.replace(_config('ascend', v), **changes)
    with pytest.raises(ValueError, match='late_weight needs with_weight'):
        dataclasses.replace(chosen, with_weight=False, late_weight=True)
    with pytest.raises(ValueError, match=r'min_blocks \* threads must be in 0..2048, got 5 \* 512'):
        dataclasses.replace(chosen, min_blocks=5)


@pytest.mark.parametrize('name', list(CUDA_SCHEDULES))
def test_norm_forward_and_per_token_cast_cuda_schedule_lowers(name):
    """Each schedule lowers (sm_90a): its launch bounds, the weight read after the reduction's barrier
    (late_weight), no fp32 copy of the row (narrow_row)."""
    v = _WIDE | dict(block=32, sf='ue8m0', residual=True)
    _, cfg = _schedule(v, name)
    source = assert_cuda_kernel_lowers(lambda: make_norm_forward_kernel(cfg), key=cfg,
                                       kernel_name='norm_forward_kernel').source  # fmt: skip
    assert f'__launch_bounds__({cfg.threads}, {max(cfg.min_blocks, 1)})' in source
    barrier = source.index('__syncthreads()')
    assert (source.index('weight + ') > barrier) == cfg.late_weight
    assert ('float v_l[' in source) != cfg.narrow_row


@pytest.mark.npu
@pytest.mark.parametrize('name', list(CUDA_SCHEDULES))
@pytest.mark.parametrize('v', CUDA_SCHEDULE_ROWS, ids=make_param_id)
def test_norm_forward_and_per_token_cast_cuda_schedule_values(v, name, device):
    """Each schedule against the chosen kernel (bit for bit where it keeps the threads and chunks, else residual_out
    bit for bit and rstd within fp32 rounding) and against the references: y within a bf16 rounding of the float64
    norm, data and scales the quant reference's cast of its own y, bit for bit."""
    if config.backend_of(device) != 'cuda':
        pytest.skip('CUDA schedules')
    chosen, cfg = _schedule(v, name)
    x, weight, residual = _inputs(v, 37, device)
    reference, result = (_launch(c, x, weight, residual) for c in (chosen, cfg))
    data, sf, y, residual_out, rstd = result
    if (cfg.threads, cfg.chunks) == (chosen.threads, chosen.chunks):
        for ours, want in zip(result, reference, strict=True):
            assert_equal(ours.view(torch.uint8), want.view(torch.uint8))
    else:
        assert_equal(residual_out, reference[3])
        assert_close(rstd, reference[4], atol=0, rtol=2**-20)
    round_sf, packed = SCALES[v['sf']]
    want_data, want_sf = per_token_cast_format_ref(y.cpu(), v['block'], 'e4m3', round_sf=round_sf,
                                                   packed_ue8m0=packed)  # fmt: skip
    assert_equal(data.cpu(), want_data.view(torch.uint8))
    assert_equal(sf.cpu(), want_sf.view(torch.uint8))
    _, want_y, _, norm_input = norm_forward_and_per_token_cast_ref(
        x.cpu(), weight.cpu(), EPS, v['block'], None if residual is None else residual.cpu(), 0.75, round_sf, packed
    )
    assert_close(y.cpu().double(), want_y.double(), atol=1e-6, rtol=2**-7)
    if residual is not None:
        assert_equal(residual_out.cpu(), norm_input)


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """t's values in a new row-major CPU tensor (whatever t's strides, those of a size-1 dimension included)."""
    return torch.empty(t.shape, dtype=t.dtype).copy_(t.cpu())


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
@pytest.mark.parametrize('v', VARIANTS[:2], ids=make_param_id)  # level 0's configurations, column-major
def test_norm_forward_and_per_token_cast_col_major_values(v, num_tokens, device):
    """use_tma_aligned_col_major_sf=True: the row-major call's data and scale values, bit for bit, in
    per_token_cast's column-major layout of this backend, also into a given buffer (poisoned: every scale
    overwritten, CUDA's padding columns untouched) and through the fast path's second call."""
    _assert_col_major_values(v, num_tokens, device)


def _assert_col_major_values(v, num_tokens, device, inputs=None):
    x, weight, residual = inputs or _inputs(v, num_tokens, device)
    rows = _call(x, weight, v, residual, with_out_bf16=v['bf16'], with_rstd=True)
    for _ in range(2):  # the second call: the fast path's key
        result = _call(x, weight, v, residual, with_out_bf16=v['bf16'], with_rstd=True,
                       use_tma_aligned_col_major_sf=True)  # fmt: skip
        assert_equal(result.out.data.view(torch.uint8), rows.out.data.view(torch.uint8))
        assert_equal(_row_major(result.out.sf), rows.out.sf.cpu())
        backend = 'cuda' if torch.device(device).type == 'cuda' else 'ascend'
        peer = tma_col_major_sf(tuple(rows.out.sf.shape), rows.out.sf.dtype, backend)
        assert result.out.sf.stride() == peer.stride()
        assert_equal(result.rstd, rows.rstd)
        assert_equal(result.norm_input, rows.norm_input)
    if num_tokens > 1:  # a buffer of other strides than this backend's layout is refused
        with pytest.raises(ValueError, match=r'out\[1\] must have strides'):
            _call(x, weight, v, residual, use_tma_aligned_col_major_sf=True, out=(torch.empty_like(rows.out.data),
                  torch.empty_like(rows.out.sf)))  # fmt: skip
    buffer = tma_col_major_sf(tuple(rows.out.sf.shape), rows.out.sf.dtype, backend, device)
    nbytes = buffer.untyped_storage().nbytes()
    whole = torch.empty(0, dtype=torch.uint8, device=device).set_(buffer.untyped_storage(), 0, (nbytes,))
    whole.fill_(0xA5)
    again = _call(x, weight, v, residual, use_tma_aligned_col_major_sf=True,
                  out=(torch.empty_like(rows.out.data), buffer))  # fmt: skip
    assert again.out.sf is buffer
    assert_equal(_row_major(buffer), rows.out.sf.cpu())
    if num_tokens:
        k, width = rows.out.sf.shape[1], num_tokens * rows.out.sf.element_size()
        image = torch.full((k, nbytes // k), 0xA5, dtype=torch.uint8)
        image[:, :width] = _row_major(rows.out.sf.T).view(torch.uint8).view(k, width)
        assert_equal(whole.cpu().view(k, -1), image)


# Level 0: the first variant's kernel of strided rows (bf16: y is `out`); level 1 also an fp32 one (out_bf16 a
# row tensor of its own).
STRIDED_VARIANTS = by_level(
    LEVEL, core=VARIANTS[:1], default=[VARIANTS[0], *[v for v in VARIANTS if v['dtype'] == torch.float32][:1]]
)


@pytest.mark.npu
@pytest.mark.parametrize('v', STRIDED_VARIANTS, ids=make_param_id)
def test_norm_forward_and_per_token_cast_strided_rows_values(v, device):
    """Rows of views of wider buffers (x, residual, and the given out_bf16 and residual_out, each its own
    stride) give the bytes of the same rows contiguous, the buffers' padding untouched (poisoned NaN); data and
    scales in their layouts (from level 1 also column-major), also through a second call."""
    x, weight, residual = _inputs(v, 37, device)
    want = _call(x, weight, v, residual, with_out_bf16=True, with_rstd=True)
    sx = strided_view(x, 64)
    sres = None if residual is None else strided_view(residual, 8)
    for col_major in (False, True) if LEVEL else (False,):  # level 0: one kernel of strided rows
        sf = want.out.sf
        if col_major:  # the contiguous rows' scales, column-major
            sf = _call(
                x, weight, v, residual, with_out_bf16=True, with_rstd=True, use_tma_aligned_col_major_sf=True
            ).out.sf
        for _ in range(2):  # the second call: the fast path's (it takes no key: the full check again)
            got = _call(sx, weight, v, sres, with_out_bf16=True, with_rstd=True, use_tma_aligned_col_major_sf=col_major)
            assert_equal(got.out.data.view(torch.uint8), want.out.data.view(torch.uint8))
            assert_equal(got.out.sf, sf)
            assert_equal(got.out_bf16, want.out_bf16)
            assert_equal(got.rstd, want.rstd)
            assert_equal(got.norm_input, want.norm_input, check_stride=False)  # x itself without residual
    out_bf16 = strided_view(torch.empty_like(want.out_bf16), 24)
    res_out = None if residual is None else strided_view(torch.empty_like(x), 40)
    into = _call(sx, weight, v, sres, with_out_bf16=True, out_bf16=out_bf16, residual_out=res_out, with_rstd=True)
    assert into.out_bf16 is out_bf16
    assert_equal(out_bf16, want.out_bf16, check_stride=False)
    assert_equal(into.out.data.view(torch.uint8), want.out.data.view(torch.uint8))
    assert_equal(into.out.sf, want.out.sf)
    if residual is not None:
        assert into.norm_input is res_out
        assert_equal(res_out, want.norm_input, check_stride=False)
    for t in (sx, sres, out_bf16, res_out):
        if t is not None:
            assert_padding(t)


@pytest.mark.npu
def test_norm_forward_and_per_token_cast_batched_values(device):
    """A (B, T, H) x gives the bits of its rows' call, in (B, T, ...) results (the first variant's kernel)."""
    v = VARIANTS[0]
    x, weight, residual = _inputs(v, 6, device)
    rows = _call(x, weight, v, residual, with_out_bf16=v['bf16'], with_rstd=True)
    batched = _call(x.view(2, 3, -1), weight, v, residual.view(2, 3, -1), with_out_bf16=v['bf16'], with_rstd=True)
    assert_equal(batched.out.data.view(torch.uint8), rows.out.data.view(torch.uint8).view(2, 3, -1))
    assert_equal(batched.out.sf, rows.out.sf.view(2, 3, -1))
    assert_equal(batched.out_bf16, rows.out_bf16.view(2, 3, -1))
    assert_equal(batched.rstd, rows.rstd.view(2, 3))
    assert_equal(batched.norm_input, rows.norm_input.view(2, 3, -1))


@pytest.mark.npu
@pytest.mark.parametrize('lead', [(2, 3), (3, 37)])
def test_norm_forward_and_per_token_cast_batched_col_major_values(lead, device):
    """A batched x with column-major scales: the rows' call's data and scale values, bit for bit, each batch's
    scales in its own block of the peer's layout (the first variant's column-major kernel)."""
    v = VARIANTS[0]
    x, weight, residual = _inputs(v, lead[0] * lead[1], device)
    rows = _call(x, weight, v, residual, with_out_bf16=v['bf16'], with_rstd=True)
    batched = _call(x.view(*lead, -1), weight, v, residual.view(*lead, -1), with_out_bf16=v['bf16'], with_rstd=True,
                    use_tma_aligned_col_major_sf=True)  # fmt: skip
    data, sf = batched.out
    assert_equal(data.view(torch.uint8), rows.out.data.view(torch.uint8).view(*lead, -1))
    assert_equal(_row_major(sf), rows.out.sf.cpu().view(*lead, -1))
    backend = 'cuda' if torch.device(device).type == 'cuda' else 'ascend'
    assert sf.stride() == _batched_peer_strides(*lead, sf.shape[2], sf.dtype, backend)
    assert_equal(batched.out_bf16, rows.out_bf16.view(*lead, -1))
    assert_equal(batched.rstd, rows.rstd.view(lead))
    assert_equal(batched.norm_input, rows.norm_input.view(*lead, -1))


# ---------------------------------------------------------------- a short last block (H = 64 * odd, 128 channels)

# per_token_cast's short last block (tests/quant/test_per_token_cast.py): ceil(H / 128) scales, the last of its 64
# channels. Level 0: one kernel of its own (bf16 at H 192: a block of 128 channels and one of 64). Level 1: H 2880
# (gpt-oss's hidden: 22 whole blocks and a short one) in both dtypes, fp32 and packed UE8M0 scales, row- and
# column-major.
_SHORT = dict(block=128, weight=True, residual=True, bf16=True)
SHORT_VARIANTS = by_level(
    LEVEL,
    core=[_SHORT | dict(dtype=torch.bfloat16, sf='fp32', hidden=192)],
    default=[_SHORT | s for s in generate_samples(dtype=[torch.bfloat16, torch.float32], sf=['fp32', 'ue8m0'],
                                                  hidden=[2880])],
)  # fmt: skip


def test_norm_forward_and_per_token_cast_short_block_contract(monkeypatch):
    """H = 64 * odd takes 128-channel blocks with per_token_cast's scale layouts (ceil(H / 128) scales, packed UE8M0
    words of them, column-major alike); H off whole 64-lane registers is still refused."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    with FakeTensorMode():
        x = _x(5, 2880)
        for sf_name, shape, dtype in (('fp32', (5, 23), torch.float32), ('ue8m0', (5, 6), torch.int32)):
            for col_major in (False, True):
                sf = _call(x, None, dict(block=128, sf=sf_name), use_tma_aligned_col_major_sf=col_major).out.sf
                round_sf, packed = SCALES[sf_name]
                want = per_token_cast(
                    x, 'e4m3', 128, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed
                ).sf
                assert (tuple(sf.shape), sf.dtype, sf.stride()) == (shape, dtype, want.stride())
    cfg = norm_forward_and_per_token_cast.operator.config(_x(5, 2880), None, EPS, 'e4m3', 128)
    assert (cfg.short_block, cfg.num_blocks, cfg.sf_cols) == (True, 23, 23)
    with pytest.raises(ValueError, match='multiple of 64'):
        norm_forward_and_per_token_cast(_x(5, 2912), None, EPS, 'e4m3', 128)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_and_per_token_cast_short_block_config(backend):
    """The scale row is per_token_cast's (RowScales): a short block only with 128 channels and H = 64 * odd; no
    scales without the cast."""
    v = _SHORT | dict(dtype=torch.bfloat16, sf='fp32', hidden=2880)
    for (block, sf), want in SCALE_ROWS_2880.items():
        cfg = _config(backend, v | dict(block=block, sf=sf))
        assert (cfg.short_block, cfg.num_blocks, cfg.sf_cols, cfg.sf_padding) == want, (block, sf)
        assert cfg.sf_dtype == ('uint8' if sf == 'ue8m0' else 'float32')
    assert not _config(backend, v | dict(block=128, hidden=2816)).short_block
    plain = dataclasses.replace(_config(backend, v), block_size=0, round_sf=False, packed_ue8m0=False,
                                with_out_bf16=False)  # fmt: skip
    assert (plain.short_block, plain.num_blocks, plain.sf_cols) == (False, 0, 0)
    with pytest.raises(ValueError, match='block_size 48 must be one of'):
        NormForwardConfig(backend, 2880, 'bfloat16', 1, True, True, True, block_size=48,
                          **({'threads': 96, 'chunks': 4} if backend == 'cuda' else {}))  # fmt: skip


@pytest.mark.parametrize('v', [SHORT_VARIANTS[0], _SHORT | dict(dtype=torch.float32, sf='ue8m0', hidden=2880)],
                         ids=make_param_id)  # fmt: skip
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_and_per_token_cast_short_block_lowers(backend, v):
    """Ascend: the block maxima of H // 128 register pairs, then the short block's one register, its scale at
    index H // 128 (two vcmax where whole 128-channel blocks have one), the data over every register. CUDA: no code
    of its own: the row's chunk guard is on (the block's missing half are lanes past the row, zeros), a block's
    first lane of 16 / 32 stores the scale, the packed row's padding after H // 128 + 1 bytes."""
    cfg = _config(backend, v)
    assert cfg.short_block
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lowers(lambda: make_norm_forward_kernel(cfg), key=cfg, kernel_name='norm_forward_kernel').source
    pairs = v['hidden'] // 128
    if backend == 'ascend':
        assert pairs == 1 or re.search(rf'for \(int32_t p = 0; p < {pairs}; \+\+p\)', source)  # one: unrolled
        assert source.count('simd_inst::vcmax(') == 2
        assert re.search(rf'for \(int32_t c_\d+ = 0; c_\d+ < {v["hidden"] // 64}; \+\+c_\d+\)', source)
        if cfg.packed_ue8m0:
            assert f'update_mask_b32({pairs + 1})' in source
    else:
        chunk = 16 // (2 if v['dtype'] == torch.bfloat16 else 4)
        lanes = 128 // chunk  # of a block
        assert (v['hidden'] // chunk) % cfg.threads != 0  # the row's guard
        assert f'% {lanes}) == 0)' in source
        assert f'amax[0], {lanes // 2}, 32)' in source  # the butterfly over the whole block's lanes
        if cfg.packed_ue8m0:
            padding = f'(int64_t){cfg.sf_cols}) + ((int64_t)((int)threadIdx.x))) + (int64_t){pairs + 1})] = (uchar)0'
            assert padding in source


def _short_inputs(v, num_tokens, device):
    """_inputs with the short block's x and residual 16 times smaller: y's short block then has a scale of its own,
    not its neighbour's."""
    x, weight, residual = _inputs(v, num_tokens, 'cpu')
    x[:, -64:] /= 16
    residual[:, -64:] /= 16
    return x.to(device), weight.to(device), residual.to(device)


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', by_level(LEVEL, core=(0, 1, 37), default=(37,)))
@pytest.mark.parametrize('v', SHORT_VARIANTS, ids=make_param_id)
def test_norm_forward_and_per_token_cast_short_block_values(v, num_tokens, device):
    """per_token_cast(norm_forward(x)) bit for bit with a short last block (the quant reference pads it with
    zeros), into poisoned buffers too (nothing past H, the packed words' padding zero); from level 1 also
    column-major, equal to the row-major values and to per_token_cast's column-major scales."""
    inputs = _short_inputs(v, num_tokens, device)
    _assert_values(v, num_tokens, device, inputs)
    if LEVEL == 0:
        return  # the column-major kernel is one more of its own
    _assert_col_major_values(v, num_tokens, device, inputs)
    x, weight, residual = inputs
    plain = norm_forward(x, weight, EPS, residual, 0.75)
    round_sf, packed = SCALES[v['sf']]
    cast = per_token_cast(
        plain.out, 'e4m3', 128, use_tma_aligned_col_major_sf=True, round_sf=round_sf, use_packed_ue8m0=packed
    )
    fused = _call(x, weight, v, residual, use_tma_aligned_col_major_sf=True).out.sf
    assert fused.stride() == cast.sf.stride()
    assert_equal(_row_major(fused), _row_major(cast.sf))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_norm_forward_and_per_token_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    v = dict(dtype=torch.bfloat16, block=32, sf='ue8m0', weight=True, residual=params['residual'],
             hidden=params['hidden'])  # fmt: skip
    x, weight, residual = _inputs(v, params['num_tokens'], device)
    result = _call(x, weight, v, residual)
    norm_input = result.norm_input if residual is not None else None
    time_us = benchmark_timer(lambda: _call(x, weight, v, residual, out=result.out, residual_out=norm_input))
    round_sf, packed = SCALES[v['sf']]
    cfg = norm_forward_and_per_token_cast.operator.config(
        x, weight, EPS, 'e4m3', 32, residual, round_sf=round_sf, use_packed_ue8m0=packed
    )
    benchmark_record(
        kernel=record_name('norm', 'norm_forward_and_per_token_cast'),
        operation='fwd_cast',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, residual, norm_input, *result.out) / time_us / 1e3,
        extras=config_extras(cfg),
    )


@pytest.mark.npu
@pytest.mark.parametrize('col_major', [False, True])
def test_norm_forward_and_per_token_cast_opcheck(col_major, device):
    """torch.library.opcheck of the functional form (the first level-0 configuration): schema, autograd
    registration, the fake kernel against the real one (strides included: the column-major scales), AOTAutograd
    with dynamic shapes against eager."""
    v = VARIANTS[0]
    x, weight, residual = _inputs(v, 37, device)
    args = (x, weight, EPS, 'e4m3', v['block'], residual, 0.75, col_major, *SCALES[v['sf']], v['bf16'], True)
    utils = ['test_schema', 'test_autograd_registration', 'test_faketensor', 'test_aot_dispatch_dynamic']
    torch.library.opcheck(torch.ops.cann_ops_tilelang.norm_forward_and_per_token_cast.default, args, test_utils=utils)
