"""Tests of mhc_pre_split_mixes_bwd.

CPU tier: the reference's gradient against finite differences (float64 gradcheck), the argument contract, the
torch.library form on fake tensors. Device tier (`npu`; the Ascend kernels on the emulator with
`--ascend-emulator`): the input, scale and base gradients against autograd of the float64 reference for every
mhc_mult of the level, bit-identical repeats (the two-pass reduction), 0 tokens, opcheck; the benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang.mhc import mhc_pre_split_mixes_bwd
from cann_ops_tilelang.mhc.mhc_pre_split_mixes_bwd import MhcPreSplitMixesBwdResult
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.numeric import assert_close, count_bytes
from tests.testing.timing import record_name

from .mhc_pre_split_mixes_bwd_ref import mhc_pre_split_mixes_bwd_ref
from .mhc_pre_split_mixes_fwd_ref import mhc_pre_split_mixes_fwd_ref
from .mixes_cases import (
    BENCHMARK_MULT,
    BENCHMARK_TOKENS,
    assert_sums_close,
    gen_mhc_mult,
    gen_num_tokens,
    logits,
    sum_tolerance,
)

POST_MULT = 2.0
PARAMS = generate_samples(get_test_level(), mhc_mult=gen_mhc_mult, num_tokens=gen_num_tokens)
BENCHMARK_PARAMS = generate_samples(mhc_mult=[BENCHMARK_MULT], num_tokens=BENCHMARK_TOKENS)
FORM = mhc_pre_split_mixes_bwd.operator.forms['mhc_pre_split_mixes_bwd']


def make_args(num_tokens: int, mhc_mult: int, device='cpu', *, fake=False) -> list:
    """The arguments of a call; post_layer_mix the forward's (fake: any, for shapes only)."""
    width = mhc_mult * (mhc_mult + 2)
    x = logits(num_tokens, width, device)
    scale = torch.rand(3, device=device) + 0.5
    base = torch.randn(width, device=device)
    if fake:
        post = torch.empty(num_tokens, mhc_mult, device=device)
    else:
        post = mhc_pre_split_mixes_fwd_ref(x, scale, base, mhc_mult, POST_MULT, 0.0)[1].float()
    nan = float('nan')
    return [
        torch.randn(num_tokens, mhc_mult, device=device),
        torch.randn(num_tokens, mhc_mult, device=device),
        torch.randn(num_tokens, mhc_mult * mhc_mult, device=device),
        x,
        post,
        scale,
        base,
        torch.full_like(x, nan),
        torch.full((3,), nan, device=device),
        torch.full((width,), nan, device=device),
        POST_MULT,
    ]


# CPU tier: the reference and the contract.


def test_mhc_pre_split_mixes_bwd_ref_matches_finite_differences():
    m = 2
    x, scale, base = (t.double().requires_grad_() for t in (torch.randn(5, 8), torch.rand(3) + 0.5, torch.randn(8)))
    assert torch.autograd.gradcheck(lambda *a: mhc_pre_split_mixes_fwd_ref(*a, m, POST_MULT, 0.01), (x, scale, base))
    grads = torch.randn(5, m, dtype=torch.float64), torch.randn(5, m, dtype=torch.float64), torch.randn(5, 4)
    dx, dscale, dbase = mhc_pre_split_mixes_bwd_ref(*grads, x, scale, base, POST_MULT)
    # The closed form the kernels compute, the post sigmoid from the forward's output.
    post = torch.sigmoid(x[:, m : 2 * m] * scale[1] + base[m : 2 * m]) * POST_MULT
    s = torch.sigmoid(x[:, :m] * scale[0] + base[:m])
    dz = torch.cat([grads[0] * s * (1 - s), grads[1] * post * (1 - post / POST_MULT), grads[2].double()], 1)
    torch.testing.assert_close(dbase, dz.sum(0))
    segments = (slice(0, m), slice(m, 2 * m), slice(2 * m, None))
    torch.testing.assert_close(dscale, torch.stack([(dz * x)[:, c].sum() for c in segments]))
    torch.testing.assert_close(dx[:, :m], dz[:, :m] * scale[0])


@pytest.mark.parametrize(
    ('index', 'make', 'error', 'match'),
    [
        (0, lambda a: a.tolist(), TypeError, 'pre_layer_mix_grad must be a torch.Tensor'),
        (3, lambda a: a.half(), TypeError, 'input_mixes must have dtype torch.float32'),
        (3, lambda a: torch.ones(5, 23), ValueError, r'input_mixes.shape\[1\] must be mhc_mult \* \(mhc_mult \+ 2\)'),
        (2, lambda a: torch.ones(5, 15), ValueError, r'comb_res_mix_grad must have shape \(5, 16\)'),
        (4, lambda a: torch.ones(6, 4), ValueError, r'post_layer_mix must have shape \(5, 4\)'),
        (8, lambda a: torch.ones(1), ValueError, r'mhc_scale_grad must have shape \(3,\)'),
        (9, lambda a: torch.ones(24, dtype=torch.float64), TypeError, 'mhc_base_grad must have dtype torch.float32'),
        (10, lambda a: 0.0, ValueError, 'mhc_post_mult_value must be nonzero'),
    ],
    ids=['non-tensor', 'dtype', 'width', 'comb', 'post', 'scale-grad', 'base-grad', 'post-mult'],
)
def test_mhc_pre_split_mixes_bwd_rejects(index, make, error, match):
    args = make_args(5, 4)
    args[index] = make(args[index])
    with pytest.raises(error, match=match):
        mhc_pre_split_mixes_bwd(*args)


def test_mhc_pre_split_mixes_bwd_rejects_overlap_and_cpu():
    args = make_args(5, 4)
    args[7] = args[3]  # the input gradient written over input_mixes
    with pytest.raises(ValueError, match='input_mixes_grad'):
        mhc_pre_split_mixes_bwd(*args)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_pre_split_mixes_bwd(*make_args(5, 4))


def test_mhc_pre_split_mixes_bwd_traced():
    schema = FORM._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('input_mixes_grad', 'mhc_scale_grad', 'mhc_base_grad')
    with FakeTensorMode():
        args = make_args(40, 4, 'cuda', fake=True)
        result = mhc_pre_split_mixes_bwd(*args)
        assert isinstance(result, MhcPreSplitMixesBwdResult)
        assert all(r is a for r, a in zip(result, args[7:10], strict=True))
        assert FORM(*args) is None
        with pytest.raises(ValueError, match='mhc_post_mult_value must be nonzero'):
            FORM(*args[:10], 0.0)


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_pre_split_mixes_bwd_values(params, device):
    mhc_mult = params['mhc_mult']
    args = make_args(params['num_tokens'], mhc_mult, device)
    result = mhc_pre_split_mixes_bwd(*args)
    assert all(r is a for r, a in zip(result, args[7:10], strict=True))
    dx, dscale, dbase = mhc_pre_split_mixes_bwd_ref(*args[:4], args[5], args[6], POST_MULT)
    assert_close(result.input_mixes_grad.double(), dx, atol=1e-6, rtol=1e-5)
    widths = (mhc_mult, mhc_mult, mhc_mult * mhc_mult)
    dz = dx / torch.cat([args[5][i : i + 1].double().expand(n) for i, n in enumerate(widths)])  # dL/dz
    assert_sums_close(result.mhc_base_grad, dbase, sum_tolerance(dz, 0))
    assert_sums_close(result.mhc_scale_grad, dscale, sum_tolerance(dz * args[3].double(), (0, 1)).expand(3))
    # Deterministic: the same bits from a second call (fixed partial rows, added in row order).
    again = [*args[:7], torch.empty_like(args[7]), torch.empty(3, device=device), torch.empty_like(args[9]), POST_MULT]
    for a, b in zip(mhc_pre_split_mixes_bwd(*again), result, strict=True):
        assert torch.equal(a, b)


@pytest.mark.npu
def test_mhc_pre_split_mixes_bwd_empty(device):
    result = mhc_pre_split_mixes_bwd(*make_args(0, 4, device))
    assert result.input_mixes_grad.shape == (0, 24)
    assert not result.mhc_scale_grad.any()  # were NaN: written with zeros
    assert not result.mhc_base_grad.any()


@pytest.mark.npu
def test_mhc_pre_split_mixes_bwd_opcheck(device):
    torch.library.opcheck(FORM, tuple(make_args(37, 4, device)))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_pre_split_mixes_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    args = make_args(params['num_tokens'], params['mhc_mult'], device)
    mhc_pre_split_mixes_bwd(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_pre_split_mixes_bwd(*args))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_pre_split_mixes_bwd'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*args[:5], args[7]) / time_us / 1e3,
    )
