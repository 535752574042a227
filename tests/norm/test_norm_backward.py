"""norm_backward: kernel lowering and configuration (CPU tier), the float64 reference against autograd (CPU tier),
the argument contract and the torch.library forms (CPU tier), values, weight-gradient accumulation and
bit-reproducibility (device tier: an accelerator, or the Ascend kernels on the emulator), the benchmark."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config, operator
from cann_ops_tilelang.kernel_target import Launcher, placeholder
from cann_ops_tilelang.norm import norm_backward, norm_forward
from cann_ops_tilelang.norm.norm_backward_kernel import (
    STAGES,
    NormBackwardConfig,
    choose_norm_backward_config,
    get_norm_backward_kernel,
    make_norm_backward_kernel,
)
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

from .norm_backward_ref import norm_backward_ref, norm_forward_math
from .test_norm_forward import assert_padding, strided_view

LEVEL = get_test_level()
EPS = 1e-6
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(dtype=torch.bfloat16, weight=True, rog=True, hidden=192),
        dict(dtype=torch.float32, weight=False, rog=False, hidden=192),
    ],
    default=[
        *generate_samples(
            dtype=[torch.bfloat16, torch.float32], weight=[True, False], rog=[True, False], hidden=[64, 4096, 7168]
        ),
        dict(dtype=torch.float32, weight=True, rog=True, hidden=16384),  # Ascend: in two pieces a row
    ],
    full=generate_samples(dtype=[torch.bfloat16], weight=[True], rog=[True], hidden=[16384]),
)
# The Ascend row kernel in pieces against whole rows (hidden, pieces): two and four pieces of a small row.
PIECES = by_level(LEVEL, core=[(256, 2)], default=[(256, 4), (192, 3)])
# The device check of two rows in flight, an option off by default: from level 1 (level 0 compiles only what calls
# launch), the measured row and the partial chunks (hidden 192).
TWO_ROWS_VARIANTS = by_level(LEVEL, core=[], default=[dict(dtype=torch.bfloat16, weight=True, rog=True, hidden=4096),
                                                       *VARIANTS[:2]])  # fmt: skip
NUM_TOKENS = by_level(LEVEL, core=(0, 1, 70), default=(130,), full=(4001,))
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[4096, 7168], dtype=[torch.bfloat16])


def _config(backend, v, stage='rows', **extra):
    return choose_norm_backward_config(
        backend=backend, num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=v['hidden'], dtype=v['dtype'], with_weight=True if stage == 'reduce' else v['weight'],
        with_residual_out_grad=v['rog'], stage=stage, accumulate=True, **extra,
    )  # fmt: skip


# ---------------------------------------------------------------- CPU tier


@pytest.mark.parametrize('v', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_norm_backward_kernels_lower(backend, v):
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    for stage, name in (('rows', 'norm_backward_kernel'), ('reduce', 'norm_weight_grad_reduce_kernel')):
        cfg = _config(backend, v, stage)
        lowers(lambda cfg=cfg: make_norm_backward_kernel(cfg), key=cfg, kernel_name=name)


def test_norm_backward_config():
    """Ascend: the widest bf16 rows fit whole in one buffer version; fp32 rows with weight and residual gradient
    past what UB holds go in the fewest pieces that fit (15040: 235 registers, 5 pieces of 47). CUDA: the reduce's
    block divides the row."""
    wide = dict(dtype=torch.bfloat16, weight=True, rog=True, hidden=16384)
    assert (_config('ascend', wide).num_stages, _config('ascend', wide).pieces) == (1, 1)
    assert _config('ascend', dict(wide, hidden=4096)).num_stages == 2
    fp32 = dict(wide, dtype=torch.float32)
    assert [_config('ascend', dict(fp32, hidden=h)).pieces for h in (12032, 12096, 15040, 16384)] == [1, 3, 5, 2]
    assert [_config('ascend', dict(fp32, rog=False, hidden=h)).pieces for h in (15040, 15104, 16384)] == [1, 2, 2]
    for bad in (dict(pieces=3), dict(pieces=0)):  # 16384 / 3 columns; none
        with pytest.raises(ValueError, match='pieces .* must divide the row'):
            dataclasses.replace(_config('ascend', fp32), **bad)
    with pytest.raises(ValueError, match='more than one is for the Ascend stage "rows"'):
        dataclasses.replace(_config('cuda', fp32), pieces=2)
    for hidden in (64, 192, 16384):
        cfg = _config('cuda', dict(wide, hidden=hidden), 'reduce')
        assert hidden % cfg.threads == 0
        assert cfg.num_partials >= H200_SMS


@pytest.mark.parametrize('hidden', [15040, 16384])
def test_norm_backward_ascend_pieces_lower(hidden):
    """The widest fp32 rows with weight and residual gradient, in pieces, lower within UB."""
    cfg = _config('ascend', dict(dtype=torch.float32, weight=True, rog=True, hidden=hidden))
    assert cfg.pieces > 1
    lowered = assert_ascend_kernel_lowers(
        lambda: make_norm_backward_kernel(cfg), key=cfg, kernel_name='norm_backward_kernel'
    )
    assert lowered.ub_bytes <= lowered.ub_limit


@pytest.mark.parametrize('v', VARIANTS, ids=make_param_id)
def test_norm_backward_two_rows_in_flight_lowers(v):
    """The CUDA row kernel with the next row's loads in a second set of registers (where two rows fit)."""
    if _config('cuda', v).threads > 256:
        pytest.skip('two rows in flight take blocks of up to 256 threads')
    cfg = _config('cuda', v, rows_in_flight=2)
    lowered = assert_cuda_kernel_lowers(
        lambda: make_norm_backward_kernel(cfg), key=cfg, kernel_name='norm_backward_kernel'
    )
    assert 'x_b[' in lowered.source, 'the second set of row registers is missing'


def test_norm_backward_rows_in_flight_config():
    """2 by default for the CUDA row kernel with blocks of up to 256 threads (measured faster), with half the
    blocks per SM, which the reduce of the same choice sums; 1 for wider blocks and on Ascend."""
    v = dict(dtype=torch.bfloat16, weight=True, rog=False, hidden=4096)
    one, two = _config('cuda', v, rows_in_flight=1), _config('cuda', v, rows_in_flight=2)
    assert (one.rows_in_flight, two.rows_in_flight) == (1, 2)
    assert _config('cuda', v) == two
    assert two.num_partials * 2 == one.num_partials
    assert _config('cuda', v, 'reduce').num_partials == two.num_partials
    assert _config('cuda', v, 'reduce', rows_in_flight=1).num_partials == one.num_partials
    assert _config('cuda', dict(v, dtype=torch.float32, hidden=7168)).rows_in_flight == 1  # 448 threads
    assert _config('ascend', v).rows_in_flight == 1
    for bad in (0, 3):
        with pytest.raises(ValueError, match='rows_in_flight must be 1 or 2'):
            dataclasses.replace(one, rows_in_flight=bad)
    with pytest.raises(ValueError, match='rows_in_flight 2 is for the CUDA stage "rows"'):
        _config('cuda', dict(v, dtype=torch.float32, hidden=7168), rows_in_flight=2)  # 448 threads
    with pytest.raises(ValueError, match='rows_in_flight 2 is for the CUDA stage "rows"'):
        _config('ascend', v, rows_in_flight=2)
    with pytest.raises(ValueError, match='rows_in_flight 2 is for the CUDA stage "rows"'):
        NormBackwardConfig('cuda', 4096, 'bfloat16', H200_SMS, True, False, 'reduce', threads=128, chunks=1,
                           rows_in_flight=2)  # fmt: skip


# The CUDA schedule fields prepared for H 4096 (docs/norm.md, "norm_backward at H 4096"), off in every chosen
# configuration: (name, changes of the rows stage, changes of the reduce, None: no reduce kernel). 'wide': 32
# columns a reduce block, a thread's loads of up to 66 partial rows issued at once; 'g2': two row groups a block
# (half the partials); 'fused': the reduce in the rows kernel after a grid barrier.
CUDA_SCHEDULES = [
    ('wide', {}, dict(threads=32)),
    ('g2', dict(row_groups=2), {}),
    ('fused', dict(fused_reduce=True, weight_grad_dtype='float32', accumulate=True), None),
]


def _schedule(v, name, num_partials=None):
    """(rows, reduce or None) configurations of CUDA schedule `name` for variant v (`num_partials` blocks of the
    rows stage; None: the chosen ones, halved for two row groups)."""
    _, rows_change, reduce_change = next(s for s in CUDA_SCHEDULES if s[0] == name)
    rows, red = _config('cuda', v), _config('cuda', v, 'reduce')
    blocks = num_partials or rows.num_partials // rows_change.get('row_groups', 1)
    loads = max(d for d in range(1, 67) if blocks % d == 0)
    if reduce_change is None:
        return dataclasses.replace(rows, num_partials=blocks, reduce_loads=loads, **rows_change), None
    rows = dataclasses.replace(rows, num_partials=blocks, **rows_change)
    if name == 'wide':
        reduce_change = dict(reduce_change, reduce_loads=loads)
    return rows, dataclasses.replace(red, num_partials=blocks, **reduce_change)


@pytest.mark.parametrize('name', [s[0] for s in CUDA_SCHEDULES])
@pytest.mark.parametrize('v', [VARIANTS[0], dict(dtype=torch.bfloat16, weight=True, rog=False, hidden=4096)],
                         ids=make_param_id)  # fmt: skip
def test_norm_backward_cuda_schedules_lower(v, name):
    """Each schedule's kernels lower: 'g2' two groups of the row's threads with a named barrier each, the block's
    partial through shared memory; 'wide' the reduce's blocks of 32 columns with all loads of a group unrolled;
    'fused' the rows kernel taking weight_grad, the grid barrier and the loads unrolled after it."""
    rows, red = _schedule(v, name)
    row_source = assert_cuda_kernel_lowers(
        lambda: make_norm_backward_kernel(rows), key=rows,
        kernel_name='norm_backward_fused_kernel' if rows.fused_reduce else 'norm_backward_kernel',
    ).source  # fmt: skip
    if red is None:
        assert 'cooperative_groups::this_grid().sync();' in row_source
        assert f'u < {rows.reduce_loads};' in row_source
        assert 'weight_grad[' in row_source.split('this_grid().sync();')[1]
        return
    reduce_source = assert_cuda_kernel_lowers(
        lambda: make_norm_backward_kernel(red), key=red, kernel_name='norm_weight_grad_reduce_kernel'
    ).source
    if name == 'g2':
        assert f'__launch_bounds__({2 * rows.threads}, 1)' in row_source
        for barrier in (1, 2):
            assert f'__sync_thread_partial({barrier}, {rows.threads})' in row_source
        assert 'merge' in row_source
    else:
        assert '__launch_bounds__(32, 1)' in reduce_source
        assert f'u < {red.reduce_loads};' in reduce_source


def test_norm_backward_cuda_schedules_config():
    """Off in the chosen configurations; 'g2' only for the CUDA rows stage of up to 128 threads a group,
    fused_reduce only for the CUDA rows stage with a weight, reduce_loads only where partials are summed (the CUDA
    reduce, a fused rows stage) and a divisor of their number."""
    v = dict(dtype=torch.bfloat16, weight=True, rog=False, hidden=4096)
    for stage in STAGES:
        for backend in ('ascend', 'cuda'):
            cfg = _config(backend, v, stage)
            assert (cfg.row_groups, cfg.reduce_loads, cfg.fused_reduce) == (1, 0, False)
    rows, red = _config('cuda', v), _config('cuda', v, 'reduce')
    assert dataclasses.replace(rows, row_groups=2).row_groups == 2
    assert dataclasses.replace(rows, fused_reduce=True, reduce_loads=66).reduce_loads == 66
    for cfg in (red, _config('ascend', v), _config('cuda', dict(v, weight=False))):
        with pytest.raises(ValueError, match='fused_reduce is for the CUDA stage "rows" with a weight'):
            dataclasses.replace(cfg, fused_reduce=True)
    assert dataclasses.replace(red, reduce_loads=66).reduce_loads == 66  # 264 partials at 132 SMs
    for bad in (
        dict(cfg=rows, row_groups=3),
        dict(cfg=_config('cuda', dict(v, hidden=7168)), row_groups=2),  # 224 threads a group
        dict(cfg=_config('ascend', v), row_groups=2),
        dict(cfg=red, row_groups=2),
    ):
        with pytest.raises(ValueError, match='row_groups must be 1, or 2 for the CUDA stage "rows"'):
            dataclasses.replace(bad.pop('cfg'), **bad)
    for cfg, loads in ((red, 5), (red, -2), (rows, 2), (_config('ascend', v, 'reduce'), 2)):
        with pytest.raises(ValueError, match='reduce_loads .* must divide num_partials'):
            dataclasses.replace(cfg, reduce_loads=loads)


@pytest.mark.parametrize('with_weight', [True, False])
def test_norm_backward_ref_matches_autograd(with_weight):
    """The float64 reference's formulas equal autograd through the forward's math."""
    g = torch.Generator().manual_seed(3)
    r = torch.randn(9, 128, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(128, generator=g, dtype=torch.float64, requires_grad=with_weight) if with_weight else None
    out_grad = torch.randn(9, 128, generator=g, dtype=torch.float64)
    rog = torch.randn(9, 128, generator=g, dtype=torch.float64)
    norm_forward_math(r, weight, EPS, 0.75).backward(out_grad)
    rstd = (r.detach().square().mean(dim=-1) + EPS).rsqrt()
    x_grad, weight_grad = norm_backward_ref(out_grad, r.detach(), weight, rstd, rog, 0.75)
    torch.testing.assert_close(x_grad, r.grad + rog, rtol=1e-12, atol=1e-12)
    if with_weight:
        torch.testing.assert_close(weight_grad, weight.grad, rtol=1e-12, atol=1e-12)


def _x(num_tokens=4, hidden=64, dtype=torch.bfloat16, device='cpu'):
    return torch.zeros(num_tokens, hidden, dtype=dtype, device=device)


@pytest.mark.parametrize(
    ('kwargs', 'error', 'match'),
    [
        (dict(out_grad=_x().float()), TypeError, 'out_grad must have'),
        (dict(rstd=torch.zeros(4, dtype=torch.bfloat16)), TypeError, 'rstd must have dtype'),
        (dict(rstd=torch.zeros(5)), ValueError, 'rstd must have shape'),
        (dict(weight=torch.zeros(64)), TypeError, 'weight must have the dtype of x'),
        (dict(weight_grad=torch.zeros(64)), ValueError, 'it needs weight'),
        (
            dict(weight=torch.zeros(64, dtype=torch.bfloat16), weight_grad=torch.zeros(64, dtype=torch.float16)),
            TypeError,
            'weight_grad must have dtype',
        ),
        (dict(residual_out_grad=_x(4, 128)), ValueError, 'residual_out_grad must have shape'),
        (dict(out_scale=float('nan')), ValueError, 'out_scale'),
        (dict(x=_x(4, 96), out_grad=_x(4, 96)), ValueError, 'multiple of 64 up to 16384, got 96'),
        (dict(x=_x(64, 4).t()), ValueError, 'x must have a contiguous last dimension'),
        (
            dict(out_grad=_x(4, 68)[:, :64]),
            ValueError,
            r'the rows of a strided out_grad must each start on 16 bytes, got row stride 68 \(2-byte elements\)',
        ),
        (dict(x=_x(4, 66)[:, :64]), ValueError, 'the rows of a strided x must each start on 16 bytes'),
        (
            dict(residual_out_grad=_x(4, 80)[:, 1:65]),
            ValueError,
            r'the rows of a strided residual_out_grad must each start on 16 bytes, got row stride 80 \(2-byte '
            r'elements\) and data_ptr\(\) = \d+',
        ),
        (dict(x=_x(4, 72)[:, :64], out_grad=_x(4, 128)[:, 64:]), RuntimeError, "no kernels for 'cpu' tensors"),
        (dict(), RuntimeError, "no kernels for 'cpu' tensors"),
    ],
    ids=[
        'grad-dtype',
        'rstd-dtype',
        'rstd-shape',
        'weight-dtype',
        'weight-grad-alone',
        'weight-grad-dtype',
        'rog-shape',
        'out-scale',
        'hidden',
        'last-dim',
        'strided-grad-misaligned',
        'strided-x-misaligned',
        'strided-rog-misaligned',
        'strided-aligned-cpu',
        'cpu',
    ],
)
def test_norm_backward_contract(kwargs, error, match):
    args = dict(out_grad=_x(), x=_x(), weight=None, rstd=torch.zeros(4)) | kwargs
    with pytest.raises(error, match=match):
        norm_backward(**args)


def test_norm_backward_strided_rows_config(monkeypatch):
    """A strided out_grad, x or residual_out_grad chooses the row kernel of strided rows (the reduction's
    configuration has no such field); contiguous rows and one row keep the contiguous kernel."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    configure = norm_backward.operator.config
    x, wide, rstd = _x(), _x(4, 72), torch.zeros(4)
    assert not configure(x, x, None, rstd, x).strided_rows
    assert configure(wide[:, 8:], x, None, rstd).strided_rows
    assert configure(x, wide[:, :64], None, rstd).strided_rows
    assert configure(x, x, None, rstd, wide[:, :64]).strided_rows
    assert not configure(wide[:1, :64], wide[:1, 8:], None, rstd[:1]).strided_rows  # one row: any stride
    plain = _config('ascend', VARIANTS[0], 'reduce')
    assert _config('ascend', VARIANTS[0], 'reduce', strided_rows=True) == plain
    with pytest.raises(ValueError, match='strided_rows is an option of the stage "rows"'):
        dataclasses.replace(plain, strided_rows=True)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('v', VARIANTS[:1], ids=make_param_id)
def test_norm_backward_strided_rows_lower(backend, v):
    """strided_rows: the strides of x, out_grad and residual_out_grad launch arguments, x_grad contiguous; on CUDA
    the contiguous kernel's vector loads (the strides' alignment assumed: the interface checks it)."""
    lowers = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    plain = _config(backend, v)
    sources = [lowers(lambda c=c: make_norm_backward_kernel(c), key=c, kernel_name='norm_backward_kernel').source
               for c in (plain, dataclasses.replace(plain, strided_rows=True))]  # fmt: skip
    names = ('x_stride', 'out_grad_stride', 'residual_out_grad_stride', 'x_grad_stride')
    assert [[n in s for n in names] for s in sources] == [[False] * 4, [True, True, True, False]]
    if backend == 'cuda':
        accesses = re.compile(r'\((\w+)\*\)\((x|out_grad|residual_out_grad|x_grad) \+')
        vectors = [sorted(set(accesses.findall(s))) for s in sources]
        assert {name for _, name in vectors[0]} == {'x', 'out_grad', 'residual_out_grad', 'x_grad'}
        assert vectors[1] == vectors[0]


def test_norm_backward_traced():
    assert list(norm_backward.operator.forms) == ['norm_backward', 'norm_backward_accumulate']
    with FakeTensorMode():
        x = _x(5, 128, device='cuda')
        weight, rstd = torch.empty(128, dtype=x.dtype, device='cuda'), torch.empty(5, device='cuda')
        result = norm_backward(torch.empty_like(x), x, weight, rstd)
        assert (result.x_grad.shape, result.weight_grad.shape, result.weight_grad.dtype) == (x.shape, (128,), x.dtype)
        weight_grad = torch.empty(128, device='cuda')
        assert norm_backward(torch.empty_like(x), x, weight, rstd, weight_grad=weight_grad).weight_grad is weight_grad
        assert norm_backward(torch.empty_like(x), x, None, rstd).weight_grad is None


# ---------------------------------------------------------------- device tier


def _inputs(v, num_tokens, device):
    g = torch.Generator().manual_seed(num_tokens * 5 + v['hidden'])
    dtype, hidden = v['dtype'], v['hidden']

    def draw(*shape):
        return torch.randn(shape, generator=g).to(dtype).to(device)

    x, weight = draw(num_tokens, hidden), draw(hidden) if v['weight'] else None
    rstd = norm_forward(x, weight, EPS, with_rstd=True).rstd  # the forward's saved rstd
    return draw(num_tokens, hidden), x, weight, rstd, draw(num_tokens, hidden) if v['rog'] else None


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
@pytest.mark.parametrize('v', VARIANTS, ids=make_param_id)
def test_norm_backward_values(v, num_tokens, device):
    out_grad, x, weight, rstd, rog = _inputs(v, num_tokens, device)
    result = norm_backward(out_grad, x, weight, rstd, rog, 0.75)
    x_grad, weight_grad = norm_backward_ref(*(None if t is None else t.cpu() for t in (out_grad, x, weight, rstd, rog)),
                                            0.75)  # fmt: skip
    # x_grad: one rounding to x's dtype of a value whose fp32 terms cancel partly (scale: the row's magnitude)
    rtol = 2**-7 if v['dtype'] == torch.bfloat16 else 2**-18
    scale = max(1.0, float(x_grad.abs().max())) if num_tokens else 1.0
    assert_close(result.x_grad.cpu().double(), x_grad, atol=rtol * scale, rtol=rtol)
    if weight is None:
        assert result.weight_grad is None
        return
    # a new weight gradient has weight's dtype; zeros for T = 0
    assert result.weight_grad.dtype == weight.dtype
    assert_close(result.weight_grad.cpu().double(), weight_grad, atol=1e-3 * (1 + num_tokens) ** 0.5,
                 rtol=2**-7 if weight.dtype == torch.bfloat16 else 1e-5)  # fmt: skip
    # accumulated into fp32, bit-reproducible from run to run
    start = torch.randn(v['hidden'], generator=torch.Generator().manual_seed(1)).to(device)
    first, second = start.clone(), start.clone()
    again = norm_backward(out_grad, x, weight, rstd, rog, 0.75, first)
    norm_backward(out_grad, x, weight, rstd, rog, 0.75, second)
    assert again.weight_grad is first
    assert_equal(first, second)
    assert_equal(again.x_grad, result.x_grad)
    assert_close(first.cpu().double(), start.cpu().double() + weight_grad, atol=1e-3 * (1 + num_tokens) ** 0.5,
                 rtol=1e-5)  # fmt: skip


# Level 1 (level 0 compiles the forwards' kernels of strided rows only): the first variant's row kernel of strided
# rows, and an fp32 one without weight.
STRIDED_VARIANTS = by_level(
    LEVEL, core=[], default=[VARIANTS[0], *[v for v in VARIANTS if v['dtype'] == torch.float32 and not v['weight']][:1]]
)


@pytest.mark.npu
@pytest.mark.parametrize('v', STRIDED_VARIANTS, ids=make_param_id)
def test_norm_backward_strided_rows_values(v, device):
    """Rows of views of wider buffers (out_grad, x, residual_out_grad, each its own stride) give the bits of the
    same rows contiguous (x_grad and the weight gradient, accumulated too); the padding is never read (NaN)."""
    out_grad, x, weight, rstd, rog = _inputs(v, 37, device)
    want = norm_backward(out_grad, x, weight, rstd, rog, 0.75)
    strided = (strided_view(out_grad, 8), strided_view(x, 64), None if rog is None else strided_view(rog, 24))
    for _ in range(2):  # the second call: the fast path's (it takes no key: the full check again)
        got = norm_backward(strided[0], strided[1], weight, rstd, strided[2], 0.75)
        assert_equal(got.x_grad, want.x_grad)
        if weight is not None:
            assert_equal(got.weight_grad, want.weight_grad)
    if weight is not None:
        first, second = torch.ones(v['hidden'], device=device), torch.ones(v['hidden'], device=device)
        norm_backward(out_grad, x, weight, rstd, rog, 0.75, first)
        norm_backward(strided[0], strided[1], weight, rstd, strided[2], 0.75, second)
        assert_equal(second, first)
    for t in strided:
        if t is not None:
            assert_padding(t)


@pytest.mark.npu
@pytest.mark.parametrize(('hidden', 'pieces'), PIECES, ids=lambda v: str(v))
def test_norm_backward_ascend_pieces_same_bits(hidden, pieces, device):
    """The Ascend row kernel in pieces gives the bits of whole rows: x_grad and the partial weight gradients
    (fp32 with weight and residual gradient; 70 rows over the cores, so that cores take one row and two)."""
    if config.backend_of(device) != 'ascend':
        pytest.skip('row pieces are an Ascend kernel')
    v = dict(dtype=torch.float32, weight=True, rog=True, hidden=hidden)
    out_grad, x, weight, rstd, rog = _inputs(v, 70, device)
    results = []
    for cfg in (_config('ascend', v), dataclasses.replace(_config('ascend', v), pieces=pieces)):
        x_grad = torch.full_like(x, float('nan'))
        partials = torch.full((cfg.num_partials, hidden), float('nan'), device=device)
        Launcher(get_norm_backward_kernel, cfg, device).launch(x, weight, out_grad, rstd, rog, x_grad, partials, 0.75)
        results.append((x_grad, partials))
    assert_equal(results[1][0], results[0][0])
    assert_equal(results[1][1], results[0][1])


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', [1, 70])
@pytest.mark.parametrize('v', TWO_ROWS_VARIANTS, ids=make_param_id)
def test_norm_backward_two_rows_in_flight_same_bits(v, num_tokens, device):
    """The CUDA row kernel gives the same bits with one or two rows in flight (same blocks: few, so that each
    takes many rows and both tails, a lone last row and a whole last pair, occur)."""
    if device.type != 'cuda':
        pytest.skip('two rows in flight is a CUDA kernel')
    out_grad, x, weight, rstd, rog = _inputs(v, num_tokens, device)
    results = []
    for rows_in_flight in (1, 2):
        cfg = dataclasses.replace(_config('cuda', v), num_partials=3, rows_in_flight=rows_in_flight)
        x_grad = torch.empty_like(x)
        partials = (
            torch.empty(3, v['hidden'], device=device) if weight is not None else placeholder(device, torch.float32)
        )
        Launcher(get_norm_backward_kernel, cfg, device).launch(
            x, placeholder(device, x.dtype) if weight is None else weight, out_grad, rstd,
            placeholder(device, x.dtype) if rog is None else rog, x_grad, partials, 0.75,
        )  # fmt: skip
        results.append((x_grad, partials))
    assert_equal(results[1][0], results[0][0])
    if weight is not None:
        assert_equal(results[1][1], results[0][1])


# Level 1 (the schedules are off in every chosen configuration): the measured row and the partial chunks (192).
SCHEDULE_VARIANTS = by_level(
    LEVEL, core=[], default=[dict(dtype=torch.bfloat16, weight=True, rog=True, hidden=4096), VARIANTS[0],
                             dict(dtype=torch.float32, weight=True, rog=False, hidden=192)]
)  # fmt: skip


def _launch_rows(cfg, inputs, device, start=None):
    """(x_grad, partials) of the CUDA rows stage `cfg` (weight given); with fused_reduce also the weight
    gradient accumulated into a copy of `start`."""
    out_grad, x, weight, rstd, rog = inputs
    x_grad = torch.empty_like(x)
    partials = torch.full((cfg.num_partials, cfg.hidden), float('nan'), device=device)
    args = (x, weight, out_grad, rstd, placeholder(device, x.dtype) if rog is None else rog, x_grad, partials, 0.75)
    if not cfg.fused_reduce:
        Launcher(get_norm_backward_kernel, cfg, device).launch(*args)
        return x_grad, partials
    weight_grad = start.clone()
    Launcher(get_norm_backward_kernel, cfg, device).launch(*args, weight_grad)
    return x_grad, partials, weight_grad


def _reduce(cfg, partials, start):
    weight_grad = start.clone()
    Launcher(get_norm_backward_kernel, cfg, partials.device).launch(partials, weight_grad)
    return weight_grad


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', [1, 70])
@pytest.mark.parametrize('v', SCHEDULE_VARIANTS, ids=make_param_id)
def test_norm_backward_cuda_schedules_values(v, num_tokens, device):
    """'wide' reduces the default's partials to the default's bits; 'g2' (3 blocks of two groups, so that each
    group takes many rows and both tails occur) gives the default's x_grad and, as block b's partial, the sum of
    the default's partials 2b and 2b + 1 of 6 blocks (one fp32 add: the same bits); 'fused' (3 and 6 blocks) the
    bits of the two kernels of the same blocks; all end to end against the reference, and the same bits on a
    second run."""
    if device.type != 'cuda':
        pytest.skip('the schedules are CUDA kernels')
    inputs = _inputs(v, num_tokens, device)
    start = torch.randn(v['hidden'], generator=torch.Generator().manual_seed(1)).to(device)
    rows, red = _config('cuda', v), _config('cuda', v, 'reduce')
    x_grad, partials = _launch_rows(rows, inputs, device)
    want = _reduce(red, partials, start)
    wide_rows, wide_red = _schedule(v, 'wide', rows.num_partials)
    assert wide_rows == rows
    assert_equal(_reduce(wide_red, partials, start), want)

    six = dataclasses.replace(rows, num_partials=6)
    x_grad_six, partials_six = _launch_rows(six, inputs, device)
    g2_rows, g2_red = _schedule(v, 'g2', 3)
    runs = [_launch_rows(g2_rows, inputs, device) for _ in range(2)]
    for x_grad_g2, partials_g2 in runs:
        assert_equal(x_grad_g2, x_grad_six)
        assert_equal(partials_g2, partials_six[0::2] + partials_six[1::2])
    assert_equal(x_grad_six, x_grad)
    g2_sums = [_reduce(g2_red, partials_g2, start) for _, partials_g2 in runs]
    assert_equal(g2_sums[1], g2_sums[0])
    # fused: the reduce of the same blocks (few: every block resident, many column tiles each), in one kernel
    fused_sums = []
    for blocks in (3, 6):
        fused_rows, _ = _schedule(v, 'fused', blocks)
        plain = dataclasses.replace(rows, num_partials=blocks)
        x_grad_plain, partials_plain = _launch_rows(plain, inputs, device)
        plain_sum = _reduce(dataclasses.replace(red, num_partials=blocks), partials_plain, start)
        for _ in range(2):
            x_grad_fused, partials_fused, fused_sum = _launch_rows(fused_rows, inputs, device, start)
            assert_equal(x_grad_fused, x_grad_plain)
            assert_equal(partials_fused, partials_plain)
            assert_equal(fused_sum, plain_sum)
        fused_sums.append(fused_sum)
    _, weight_grad = norm_backward_ref(*(None if t is None else t.cpu() for t in inputs), 0.75)
    for got in (want, g2_sums[0], *fused_sums):
        assert_close(got.cpu().double(), start.cpu().double() + weight_grad, atol=1e-3 * (1 + num_tokens) ** 0.5,
                     rtol=1e-5)  # fmt: skip


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_norm_backward_benchmark(params, device, benchmark_timer, benchmark_record):
    v = dict(dtype=params['dtype'], weight=True, rog=True, hidden=params['hidden'])
    out_grad, x, weight, rstd, rog = _inputs(v, params['num_tokens'], device)
    weight_grad = torch.zeros(params['hidden'], device=device)
    result = norm_backward(out_grad, x, weight, rstd, rog, 1.0, weight_grad)
    time_us = benchmark_timer(lambda: norm_backward(out_grad, x, weight, rstd, rog, 1.0, weight_grad))
    benchmark_record(
        kernel=record_name('norm', 'norm_backward'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(out_grad, x, rstd, rog, result.x_grad) / time_us / 1e3,
        extras=config_extras(norm_backward.operator.config(out_grad, x, weight, rstd, rog, 1.0, weight_grad)),
    )
