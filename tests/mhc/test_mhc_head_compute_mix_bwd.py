"""Tests of mhc_head_compute_mix_bwd.

CPU tier: the reference's gradient against finite differences (float64 gradcheck), the argument contract, the
torch.library form on fake tensors. Device tier (`npu`; the Ascend kernel on the emulator with
`--ascend-emulator`): the input gradient and every partial row against the float64 reference (row w holds
the tiles w, w + num_sms, ...), bit-identical repeats, 0 tokens, opcheck; the benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import mhc_head_compute_mix_bwd
from cann_ops_tilelang.mhc.mhc_head_compute_mix_bwd import MhcHeadComputeMixBwdResult
from tests.testing.bench import make_param_id
from tests.testing.generator import generate_samples, get_test_level
from tests.testing.numeric import assert_close, count_bytes
from tests.testing.timing import record_name

from .mhc_head_compute_mix_bwd_ref import mhc_head_compute_mix_bwd_ref
from .mhc_head_compute_mix_fwd_ref import mhc_head_compute_mix_fwd_ref
from .mixes_cases import (
    BENCHMARK_MULT,
    BENCHMARK_TOKENS,
    assert_sums_close,
    gen_mhc_mult,
    gen_num_tokens,
    logits,
)

NUM_SMS = 5  # level 0: one partial count (one compile per mhc_mult); every count takes the same code
PARAMS = generate_samples(get_test_level(), mhc_mult=gen_mhc_mult, num_tokens=gen_num_tokens)
BENCHMARK_PARAMS = generate_samples(mhc_mult=[BENCHMARK_MULT], num_tokens=BENCHMARK_TOKENS)
FORM = mhc_head_compute_mix_bwd.operator.forms['mhc_head_compute_mix_bwd']


def make_args(num_tokens: int, mhc_mult: int, num_sms: int = NUM_SMS, device='cpu') -> list:
    x = logits(num_tokens, mhc_mult, device)
    nan = float('nan')
    return [
        torch.randn(num_tokens, mhc_mult, device=device),  # output_mix_grad
        x,
        torch.rand(1, device=device) + 0.5,
        torch.randn(mhc_mult, device=device),
        torch.full_like(x, nan),
        torch.full((num_sms, 1), nan, device=device),
        torch.full((num_sms, mhc_mult), nan, device=device),
        num_sms,
    ]


# CPU tier: the reference and the contract.


def test_mhc_head_compute_mix_bwd_ref_matches_finite_differences():
    x, scale, base = (t.double().requires_grad_() for t in (torch.randn(6, 3), torch.rand(1) + 0.5, torch.randn(3)))
    assert torch.autograd.gradcheck(lambda *a: mhc_head_compute_mix_fwd_ref(*a, 0.01), (x, scale, base))
    grad = torch.randn(6, 3, dtype=torch.float64)
    dx, dscale, dbase = mhc_head_compute_mix_bwd_ref(grad, x, scale, base)
    s = torch.sigmoid(x * scale + base)
    dz = grad * s * (1 - s)  # the closed form the kernels compute
    torch.testing.assert_close(dx, dz * scale)
    torch.testing.assert_close(dscale, (dz * x).sum().reshape(1))
    torch.testing.assert_close(dbase, dz.sum(0))


@pytest.mark.parametrize(
    ('index', 'make', 'error', 'match'),
    [
        (0, lambda a: a.tolist(), TypeError, 'output_mix_grad must be a torch.Tensor'),
        (1, lambda a: a.bfloat16(), TypeError, 'input_mix must have dtype torch.float32'),
        (1, lambda a: torch.ones(6, 4), ValueError, r'input_mix must have shape \(5, 4\)'),
        (5, lambda a: torch.ones(5, 2), ValueError, r'mhc_scale_grad_partial must have shape \(5, 1\)'),
        (6, lambda a: torch.ones(4, 4), ValueError, r'mhc_base_grad_partial must have shape \(5, 4\)'),
        (7, lambda a: 6, ValueError, r'num_sms \(6\) must be the row count'),
        (7, lambda a: 5.0, TypeError, 'num_sms'),
    ],
    ids=['non-tensor', 'dtype', 'shape', 'scale-partial', 'base-partial', 'num-sms', 'num-sms-type'],
)
def test_mhc_head_compute_mix_bwd_rejects(index, make, error, match):
    args = make_args(5, 4)
    args[index] = make(args[index])
    with pytest.raises(error, match=match):
        mhc_head_compute_mix_bwd(*args)


def test_mhc_head_compute_mix_bwd_rejects_sizes_and_overlap():
    with pytest.raises(ValueError, match=r'mhc_mult \(input_mix.shape\[1\]\) must be in \[1, 8\], got 9'):
        mhc_head_compute_mix_bwd(*make_args(3, 9))
    with pytest.raises(ValueError, match=r'num_sms rows in \[1, 4096\], got 4097'):
        mhc_head_compute_mix_bwd(*make_args(3, 4, 4097))
    with pytest.raises(ValueError, match='token_block_size must be 0'):
        mhc_head_compute_mix_bwd(*make_args(3, 4), 48)
    args = make_args(5, 4)
    args[4] = args[0]  # the input gradient written over output_mix_grad
    with pytest.raises(ValueError, match='input_mix_grad'):
        mhc_head_compute_mix_bwd(*args)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_head_compute_mix_bwd(*make_args(5, 4))


def test_mhc_head_compute_mix_bwd_traced():
    schema = FORM._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == ('input_mix_grad', 'mhc_scale_grad_partial', 'mhc_base_grad_partial')
    with FakeTensorMode():
        args = make_args(40, 4, device='cuda')
        result = mhc_head_compute_mix_bwd(*args)
        assert isinstance(result, MhcHeadComputeMixBwdResult)
        assert all(r is a for r, a in zip(result, args[4:7], strict=True))
        assert FORM(*args, 0) is None
        with pytest.raises(ValueError, match=r'num_sms \(4\) must be the row count'):
            FORM(*args[:7], 4, 0)


# Device tier.


def partial_rows_ref(grad, x, scale, base, num_sms, token_block):
    """Row w of the partials in float64: the sums over the tokens of tiles w, w + num_sms, ..."""
    s = torch.sigmoid(x.double() * scale.double() + base.double())
    dz = grad.double() * s * (1 - s)
    worker = (torch.arange(x.shape[0], device=x.device) // token_block) % num_sms
    rows = torch.zeros(num_sms, x.shape[1], dtype=torch.float64, device=x.device)
    rows_x = torch.zeros_like(rows)
    rows.index_add_(0, worker, dz)
    rows_x.index_add_(0, worker, dz * x.double())
    bound = torch.zeros_like(rows)
    bound.index_add_(0, worker, dz.abs() + (dz * x.double()).abs())
    return rows, rows_x.sum(1, keepdim=True), 1e-6 * bound + 1e-6


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_head_compute_mix_bwd_values(params, device):
    num_tokens, mhc_mult = params['num_tokens'], params['mhc_mult']
    args = make_args(num_tokens, mhc_mult, device=device)
    result = mhc_head_compute_mix_bwd(*args)
    assert all(r is a for r, a in zip(result, args[4:7], strict=True))
    dx, dscale, dbase = mhc_head_compute_mix_bwd_ref(*args[:4])
    assert_close(result.input_mix_grad.double(), dx, atol=1e-6, rtol=1e-5)
    token_block = mhc_head_compute_mix_bwd.operator.config(*args).token_block
    rows, rows_scale, bound = partial_rows_ref(*args[:4], NUM_SMS, token_block)
    assert_sums_close(result.mhc_base_grad_partial, rows, bound)
    assert_sums_close(result.mhc_scale_grad_partial, rows_scale, bound.sum(1, keepdim=True))
    assert_sums_close(result.mhc_base_grad_partial.sum(0), dbase, bound.sum(0) + 1e-6 * rows.abs().sum(0))
    assert_sums_close(result.mhc_scale_grad_partial.sum(0), dscale, bound.sum().reshape(1) * 2)
    # Deterministic: the same bits from a second call.
    again = [*args[:4], torch.empty_like(args[4]), torch.empty_like(args[5]), torch.empty_like(args[6]), NUM_SMS]
    for a, b in zip(mhc_head_compute_mix_bwd(*again), result, strict=True):
        assert torch.equal(a, b)


@pytest.mark.npu
def test_mhc_head_compute_mix_bwd_empty(device):
    args = make_args(0, 4, device=device)
    result = mhc_head_compute_mix_bwd(*args)
    assert result.input_mix_grad.shape == (0, 4)
    assert not result.mhc_scale_grad_partial.any()  # were NaN: written with zeros
    assert not result.mhc_base_grad_partial.any()


@pytest.mark.npu
def test_mhc_head_compute_mix_bwd_opcheck(device):
    torch.library.opcheck(FORM, (*make_args(37, 4, device=device), 0))


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_head_compute_mix_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    num_sms = config.get_num_cores(device)  # one partial row per core, as TileKernels' callers pass
    args = make_args(params['num_tokens'], params['mhc_mult'], num_sms, device)
    mhc_head_compute_mix_bwd(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_head_compute_mix_bwd(*args))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_head_compute_mix_bwd'),
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(*args[:2], args[4]) / time_us / 1e3,
    )
