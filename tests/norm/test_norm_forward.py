"""norm_forward: kernel lowering and configuration (CPU tier), the argument contract and the torch.library forms on
CPU / fake tensors (CPU tier), values against the float64 reference (device tier: an accelerator, or the Ascend
kernel on the emulator with --ascend-emulator), the benchmark."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config, operator
from cann_ops_tilelang.norm import norm_forward
from cann_ops_tilelang.norm.norm_forward_kernel import (
    NormForwardConfig,
    choose_norm_forward_config,
    make_norm_forward_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE
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

from .norm_forward_ref import norm_forward_ref

LEVEL = get_test_level()
KERNEL_NAME = 'norm_forward_kernel'
EPS = 1e-6
# (dtype, weight, residual, rstd, hidden): each its own kernel; level 0 compiles each once.
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(dtype=torch.bfloat16, weight=True, residual=True, rstd=True, hidden=192),
        dict(dtype=torch.float32, weight=False, residual=False, rstd=False, hidden=192),
    ],
    default=generate_samples(
        dtype=[torch.bfloat16, torch.float32],
        weight=[True, False],
        residual=[True, False],
        rstd=[True],
        hidden=[64, 4096, 16384],
    ),
)
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 37), default=(130,), full=(4001,))
# Relative error against the float64 value: one ulp of x's dtype (the kernels' fp32 math, a few fp32 ulps off, may
# round a value next to a rounding boundary to the other neighbour), a few fp32 ulps for fp32.
RTOL = {torch.bfloat16: 2**-7, torch.float32: 2**-20}
BENCHMARK_PARAMS = generate_samples(
    num_tokens=[4001, 8001], hidden=[4096, 7168], dtype=[torch.bfloat16], residual=[False, True]
)


def _inputs(v: dict, num_tokens: int, device) -> dict:
    g = torch.Generator().manual_seed(num_tokens * 131 + v['hidden'])
    dtype, hidden = v['dtype'], v['hidden']

    def draw(*shape):
        return torch.randn(shape, generator=g).to(dtype).to(device)

    return {
        'x': draw(num_tokens, hidden),
        'weight': draw(hidden) if v['weight'] else None,
        'residual': draw(num_tokens, hidden) if v['residual'] else None,
    }


def _config(backend: str, v: dict) -> NormForwardConfig:
    return choose_norm_forward_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=v['hidden'], dtype=v['dtype'], with_weight=v['weight'], with_residual=v['residual'],
        with_rstd=v['rstd'],
    )  # fmt: skip


# ---------------------------------------------------------------- CPU tier: kernels and configurations


@pytest.mark.parametrize('v', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_forward_kernel_lowers(backend, v):
    cfg = _config(backend, v)
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    lowers(lambda: make_norm_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


def test_norm_forward_config_stages_and_layout():
    """Two buffer versions where a row's buffers fit UB twice; one at the widest fp32 rows; the CUDA row layout
    keeps at most 4 chunks a thread and covers the row."""
    small = dict(hidden=4096, dtype=torch.bfloat16, weight=True, residual=True, rstd=True)
    wide = dict(hidden=16384, dtype=torch.float32, weight=True, residual=True, rstd=True)
    assert _config('ascend', small).num_stages == 2
    assert _config('ascend', wide).num_stages == 1
    for hidden, dtype in ((64, torch.bfloat16), (4096, torch.bfloat16), (7168, torch.bfloat16), (16384, torch.float32)):
        cfg = _config('cuda', dict(hidden=hidden, dtype=dtype, weight=True, residual=False, rstd=False))
        vec = 8 if dtype == torch.bfloat16 else 4
        assert cfg.threads % 32 == 0
        assert cfg.chunks <= 4
        assert cfg.threads * cfg.chunks * vec >= hidden


def test_norm_forward_config_rejects():
    with pytest.raises(ValueError, match='multiple of 64 up to 16384'):
        NormForwardConfig('cuda', 16448, 'bfloat16', 132, True, False, False, threads=512, chunks=4)
    with pytest.raises(ValueError, match='torch.bfloat16 or torch.float32'):
        choose_norm_forward_config(backend='cuda', num_cores=132, hidden=64, dtype=torch.float16,
                                   with_weight=False, with_residual=False, with_rstd=False)  # fmt: skip


# ---------------------------------------------------------------- CPU tier: argument contract


def _x(num_tokens=4, hidden=64, dtype=torch.bfloat16, device='cpu'):
    return torch.zeros(num_tokens, hidden, dtype=dtype, device=device)


@pytest.mark.parametrize(
    ('call', 'error', 'match'),
    [
        (lambda x: norm_forward(x.tolist(), None, EPS), TypeError, 'x must be a torch.Tensor'),
        (lambda x: norm_forward(x.half(), None, EPS), TypeError, 'x must have dtype'),
        (lambda x: norm_forward(x[0], None, EPS), ValueError, 'x must have 2 dimensions'),
        (lambda x: norm_forward(_x(4, 96), None, EPS), ValueError, 'multiple of 64 up to 16384, got 96'),
        (lambda x: norm_forward(_x(1, 16448), None, EPS), ValueError, 'multiple of 64 up to 16384, got 16448'),
        (lambda x: norm_forward(_x(64, 4).t(), None, EPS), ValueError, 'x must have a contiguous last dimension'),
        (
            lambda x: norm_forward(_x(4, 260)[:, :256], None, EPS),
            ValueError,
            r'the rows of a strided x must each start on 16 bytes, got row stride 260 \(2-byte elements\)',
        ),
        (
            lambda x: norm_forward(x, None, EPS, _x(4, 66)[:, :64]),
            ValueError,
            'the rows of a strided residual must each start on 16 bytes',
        ),
        (
            lambda x: norm_forward(x, None, EPS, x + 1, out=_x(4, 68)[:, :64]),
            ValueError,
            'the rows of a strided out must each start on 16 bytes',
        ),
        (
            lambda x: norm_forward(x, None, EPS, x + 1, residual_out=_x(4, 72)[:, 1:65]),
            ValueError,
            r'the rows of a strided residual_out must each start on 16 bytes, got row stride 72 \(2-byte elements\) '
            r'and data_ptr\(\) = \d+',
        ),
        (lambda x: norm_forward(_x(4, 264)[:, :256], None, EPS), RuntimeError, "no kernels for 'cpu' tensors"),
        (lambda x: norm_forward(_x(8, 72).view(2, 4, 72)[:, :, :64], None, EPS), RuntimeError, "no kernels for 'cpu'"),
        (
            lambda x: norm_forward(_x(16, 64).view(2, 8, 64)[:, :4], None, EPS),
            ValueError,
            'the batches of x must be one batch of rows apart',
        ),
        (lambda x: norm_forward(x, torch.zeros(64), EPS), TypeError, 'weight must have the dtype of x'),
        (lambda x: norm_forward(x, torch.zeros(32, dtype=x.dtype), EPS), ValueError, 'weight must have shape'),
        (lambda x: norm_forward(x, None, 0.0), ValueError, 'eps'),
        (lambda x: norm_forward(x, None, EPS, out_scale=float('inf')), ValueError, 'out_scale'),
        (lambda x: norm_forward(x, None, EPS, x.float()), TypeError, 'residual must have the dtype of x'),
        (lambda x: norm_forward(x, None, EPS, out=x), ValueError, 'out'),
        (lambda x: norm_forward(x, None, EPS, with_rstd=1), TypeError, 'with_rstd'),
        (lambda x: norm_forward(x, None, EPS), RuntimeError, "no kernels for 'cpu' tensors"),
        (lambda x: norm_forward(_x(0), None, EPS), RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=[
        'type',
        'dtype',
        'rank',
        'hidden',
        'too-wide',
        'last-dim',
        'strided-misaligned',
        'strided-residual-misaligned',
        'strided-out-misaligned',
        'strided-residual-out-misaligned',
        'strided-aligned-cpu',
        'strided-batched-cpu',
        'strided-batched-unmergeable',
        'weight-dtype',
        'weight-shape',
        'eps',
        'out-scale',
        'residual-dtype',
        'out-alias',
        'with-rstd',
        'cpu',
        'cpu-empty',
    ],
)
def test_norm_forward_contract(call, error, match):
    with pytest.raises(error, match=match):
        call(_x())


def test_norm_forward_rejects_too_many_elements():
    x = torch.empty(2**31 // 4096, 4096, dtype=torch.bfloat16, device='meta')
    with pytest.raises(ValueError, match='at most 2\\*\\*31 - 1 elements'):
        norm_forward(x, None, EPS)


# ---------------------------------------------------------------- CPU tier: strided rows (the peer takes them)

_VECTORS = re.compile(r'\((\w+)\*\)\((x|residual|residual_out|out|out_bf16) \+')  # CUDA vector accesses of rows


def test_norm_forward_strided_rows_config(monkeypatch):
    """A strided row tensor (any of them, each its own stride) chooses the kernel of strided rows; contiguous rows,
    one row, and a residual_out ignored without residual keep the contiguous kernel."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    configure = norm_forward.operator.config
    x, wide = _x(4, 64), _x(4, 72)
    assert not configure(x, None, EPS, x + 1, out=_x(4, 64), residual_out=_x(4, 64)).strided_rows
    assert configure(wide[:, :64], None, EPS).strided_rows
    assert configure(x, None, EPS, wide[:, :64]).strided_rows
    assert configure(x, None, EPS, out=wide[:, :64]).strided_rows
    assert configure(x, None, EPS, x + 1, residual_out=wide[:, 8:]).strided_rows
    assert not configure(x, None, EPS, residual_out=wide[:, 8:]).strided_rows  # ignored without residual
    assert not configure(wide[:1, :64], None, EPS).strided_rows  # one row: any stride
    cfg = configure(wide[:, :64], None, EPS, x + 1)
    assert cfg == dataclasses.replace(configure(x, None, EPS, x + 1), strided_rows=True)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('v', VARIANTS[:1], ids=make_param_id)
def test_norm_forward_strided_rows_lower(backend, v):
    """strided_rows: each present row tensor's stride a launch argument; on CUDA the rows are read and written in
    the contiguous kernel's 16-byte vectors (the stride's alignment assumed: the interface checks it)."""
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    plain = _config(backend, v)
    sources = [lowers(lambda c=c: make_norm_forward_kernel(c), key=c, kernel_name=KERNEL_NAME).source
               for c in (plain, dataclasses.replace(plain, strided_rows=True))]  # fmt: skip
    names = ('x_stride', 'residual_stride', 'residual_out_stride', 'out_stride')
    assert [[f'{n}' in s for n in names] for s in sources] == [[False] * 4, [True] * 4]
    if backend == 'cuda':
        vectors = [sorted(set(_VECTORS.findall(s))) for s in sources]
        assert {name for _, name in vectors[0]} == {'x', 'residual', 'residual_out', 'out'}
        assert vectors[1] == vectors[0]


# ---------------------------------------------------------------- CPU tier: torch.library forms


def test_norm_forward_forms_registered():
    forms = norm_forward.operator.forms
    assert list(forms) == ['norm_forward', 'norm_forward_out']
    for name, overload in forms.items():
        assert getattr(getattr(torch.ops, NAMESPACE), name).default is overload
    written = [a.name for a in forms['norm_forward_out']._schema.arguments if a.alias_info and a.alias_info.is_write]
    assert written == ['out', 'residual_out', 'rstd']


def test_norm_forward_traced_results():
    """On fake tensors: the functional form's results (shapes, dtypes), out= returning the buffers, the typed
    errors, and torch.compile(fullgraph=True) tracing both forms."""
    with FakeTensorMode():
        x = _x(5, 128, device='cuda')
        w, res = torch.empty(128, dtype=x.dtype, device='cuda'), torch.empty_like(x)
        result = norm_forward(x, w, EPS, res, 2.0, with_rstd=True)
        assert (result.out.shape, result.out.dtype, result.rstd.shape, result.rstd.dtype) == (
            x.shape, x.dtype, (5,), torch.float32,
        )  # fmt: skip
        assert result.norm_input.shape == x.shape
        assert result.norm_input is not x
        assert norm_forward(x, None, EPS).norm_input is x
        out = torch.empty_like(x)
        assert norm_forward(x, w, EPS, out=out).out is out
        with pytest.raises(TypeError, match='weight must have the dtype of x'):
            norm_forward(x, w.float(), EPS)
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda x, w, res, out: (norm_forward(x, w, EPS, res).out, norm_forward(x, w, EPS, out=out).out),
            fullgraph=True, backend='eager',
        )  # fmt: skip
        first, second = compiled(x, w, res, out)
        assert first.shape == x.shape
        assert second.shape == x.shape


def test_norm_forward_batched_traced_results():
    """A (B, T, H) x, the peer's batched call, on fake tensors: results (B, T, ...), given buffers returned, the
    batched tensors' errors, and torch.compile(fullgraph=True) tracing it."""
    with FakeTensorMode():
        x = torch.empty(2, 5, 128, dtype=torch.bfloat16, device='cuda')
        w, res = torch.empty(128, dtype=x.dtype, device='cuda'), torch.empty_like(x)
        result = norm_forward(x, w, EPS, res, 2.0, with_rstd=True)
        assert (result.out.shape, result.rstd.shape, result.norm_input.shape) == (x.shape, (2, 5), x.shape)
        assert norm_forward(x, None, EPS).norm_input is x
        out, res_out = torch.empty_like(x), torch.empty_like(x)
        given = norm_forward(x, w, EPS, res, out=out, residual_out=res_out)
        assert given.out is out
        assert given.norm_input is res_out
        with pytest.raises(ValueError, match=r'residual must have the batch and tokens of x, \(2, 5\)'):
            norm_forward(x, w, EPS, torch.empty(10, 128, dtype=x.dtype, device='cuda'))
        with pytest.raises(ValueError, match='norm_forward: the batches of x must be one batch of rows apart'):
            norm_forward(x.transpose(0, 1), w, EPS)
        with pytest.raises(TypeError, match='weight must have the dtype of x'):
            norm_forward(x, w.float(), EPS)
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, w: norm_forward(x, w, EPS, with_rstd=True), fullgraph=True, backend='eager')
        traced = compiled(x, w)
        assert (traced.out.shape, traced.rstd.shape) == (x.shape, (2, 5))


# ---------------------------------------------------------------- device tier: values


def _check(result, x, weight, residual, with_rstd):
    out, rstd, norm_input = norm_forward_ref(x.cpu(), None if weight is None else weight.cpu(), EPS,
                                             None if residual is None else residual.cpu(), 0.75)  # fmt: skip
    # out: within one ulp of x's dtype of the float64 value
    assert_close(result.out.cpu().double(), out.double(), atol=1e-6, rtol=RTOL[x.dtype])
    assert_equal(result.norm_input.cpu(), norm_input)  # the residual add rounds once: exact
    if with_rstd:
        assert_close(result.rstd.cpu().double(), rstd, atol=0, rtol=2**-20)
    else:
        assert result.rstd is None


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
@pytest.mark.parametrize('v', VARIANTS, ids=make_param_id)
def test_norm_forward_values(v, num_tokens, device):
    args = _inputs(v, num_tokens, device)
    x, weight, residual = args['x'], args['weight'], args['residual']
    result = norm_forward(x, weight, EPS, residual, 0.75, with_rstd=v['rstd'])
    _check(result, x, weight, residual, v['rstd'])
    if residual is None:
        assert result.norm_input is x
    # out= buffers, poisoned: an element the kernel skips stays NaN
    out = torch.full_like(x, float('nan'))
    residual_out = torch.full_like(x, float('nan')) if residual is not None else None
    again = norm_forward(x, weight, EPS, residual, 0.75, out=out, residual_out=residual_out, with_rstd=v['rstd'])
    assert again.out is out
    assert residual is None or again.norm_input is residual_out
    _check(again, x, weight, residual, v['rstd'])
    assert_equal(again.out, result.out)  # deterministic


@pytest.mark.npu
def test_norm_forward_batched_values(device):
    """A (B, T, H) x gives the bits of its rows' call, in (B, T, ...) results (the first variant's kernel)."""
    v = VARIANTS[0]
    args = _inputs(v, 6, device)
    x, weight, residual = args['x'], args['weight'], args['residual']
    rows = norm_forward(x, weight, EPS, residual, 0.75, with_rstd=True)
    batched = norm_forward(x.view(2, 3, -1), weight, EPS, residual.view(2, 3, -1), 0.75, with_rstd=True)
    assert_equal(batched.out, rows.out.view(2, 3, -1))
    assert_equal(batched.rstd, rows.rstd.view(2, 3))
    assert_equal(batched.norm_input, rows.norm_input.view(2, 3, -1))


def strided_view(t: torch.Tensor, pad: int, poison: float = float('nan')) -> torch.Tensor:
    """t's values as the first columns of a wider buffer (rows `pad` elements longer, the padding `poison`): a
    strided view."""
    wide = torch.full((t.shape[0], t.shape[1] + pad), poison, dtype=t.dtype, device=t.device)
    wide[:, : t.shape[1]] = t
    return wide[:, : t.shape[1]]


def assert_padding(view: torch.Tensor, poison: float = float('nan')) -> None:
    """The padding columns of strided_view's buffer (after the view's last row: none) still hold `poison`."""
    rows, width = view.shape[0], view.stride(0)
    wide = view.as_strided((rows, width), (width, 1))
    want = torch.full((rows, width - view.shape[1]), poison, dtype=view.dtype)
    assert_equal(wide[:, view.shape[1] :].cpu().view(torch.uint8), want.view(torch.uint8), check_stride=False)


# Level 0: the first variant's kernel of strided rows; level 1 also the second's (fp32, no weight, no residual).
STRIDED_VARIANTS = by_level(
    LEVEL, core=VARIANTS[:1], default=[VARIANTS[0], *[v for v in VARIANTS if not v['residual']][:1]]
)


@pytest.mark.npu
@pytest.mark.parametrize('v', STRIDED_VARIANTS, ids=make_param_id)
def test_norm_forward_strided_rows_values(v, device):
    """Rows of views of wider buffers (x, residual, and the given out and residual_out, each its own stride) give
    the bits of the same rows contiguous, and leave the buffers' padding untouched (poisoned NaN); also one row
    of a strided buffer (the contiguous kernel)."""
    for num_tokens in (37, 1):
        args = _inputs(v, num_tokens, device)
        x, weight, residual = args['x'], args['weight'], args['residual']
        want = norm_forward(x, weight, EPS, residual, 0.75, with_rstd=True)
        sx = strided_view(x, 64)
        sres = None if residual is None else strided_view(residual, 8)
        out = strided_view(torch.empty_like(x), 24)
        res_out = None if residual is None else strided_view(torch.empty_like(x), 40)
        for _ in range(2):  # the second call: the fast path's (it takes no key: the full check again)
            got = norm_forward(sx, weight, EPS, sres, 0.75, with_rstd=True)
            assert_equal(got.out, want.out)
            assert_equal(got.rstd, want.rstd)
            assert_equal(got.norm_input, want.norm_input, check_stride=False)  # x itself without residual
        into = norm_forward(sx, weight, EPS, sres, 0.75, out=out, residual_out=res_out, with_rstd=True)
        assert into.out is out
        assert_equal(out, want.out, check_stride=False)
        assert_equal(into.rstd, want.rstd)
        for t in (sx, sres, out, res_out):
            if t is not None:
                assert_padding(t)
        if residual is not None:
            assert into.norm_input is res_out
            assert_equal(res_out, want.norm_input, check_stride=False)


@pytest.mark.npu
def test_norm_forward_config_query(device):
    v = VARIANTS[0]
    args = _inputs(v, 3, device)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    expected = choose_norm_forward_config(
        backend=backend, num_cores=num_cores, hidden=v['hidden'], dtype=v['dtype'], with_weight=v['weight'],
        with_residual=v['residual'], with_rstd=v['rstd'],
    )  # fmt: skip
    assert norm_forward.operator.config(args['x'], args['weight'], EPS, args['residual'], with_rstd=True) == expected


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_norm_forward_benchmark(params, device, benchmark_timer, benchmark_record):
    v = dict(dtype=params['dtype'], weight=True, residual=params['residual'], hidden=params['hidden'])
    args = _inputs(v, params['num_tokens'], device)
    x, weight, residual = args['x'], args['weight'], args['residual']
    result = norm_forward(x, weight, EPS, residual)
    out, norm_input = result.out, result.norm_input if residual is not None else None
    time_us = benchmark_timer(lambda: norm_forward(x, weight, EPS, residual, out=out, residual_out=norm_input))
    benchmark_record(
        kernel=record_name('norm', 'norm_forward'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, residual, out, norm_input) / time_us / 1e3,
        extras=config_extras(norm_forward.operator.config(x, weight, EPS, residual)),
    )
