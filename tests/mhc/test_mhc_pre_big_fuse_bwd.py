"""Tests of mhc_pre_big_fuse_bwd, the backward of mHC's fused pre path (the peer has none), a composition of the
domain's operators.

CPU tier: the float64 reference of the whole path against finite differences (gradcheck), the configuration (each
stage's, from its own chooser), the argument contract on CPU tensors, the torch.library form on fake tensors.
Device tier (`npu`; on a CPU-only host the Ascend kernels on the emulator with `--ascend-emulator`): every gradient
against autograd of the float64 reference, bit equality with the chain of the public operators, bit-identical
repeats, 0 tokens, the configuration query, opcheck; the benchmark.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import (
    mhc_pre_apply_mix_bwd,
    mhc_pre_big_fuse_bwd,
    mhc_pre_split_mixes_bwd,
    mhc_pre_split_mixes_fwd,
    mhc_reduce_partials_and_rmsnorm_bwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
    mhc_sinkhorn_bwd,
)
from cann_ops_tilelang.mhc.mhc_pre_big_fuse_bwd import MhcPreBigFuseBwdResult
from cann_ops_tilelang.mhc.mhc_pre_big_fuse_kernel import choose_mhc_pre_big_fuse_config
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.lowering import ASCEND_950_VECTOR_CORES, H200_SMS
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .mhc_pre_big_fuse_bwd_ref import mhc_pre_big_fuse_bwd_ref
from .mhc_pre_big_fuse_fwd_ref import mhc_pre_big_fuse_fwd_ref
from .pre_big_fuse_cases import (
    BENCHMARK_MULT,
    BENCHMARK_PARAMS,
    BENCHMARK_REPEAT,
    BENCHMARK_SPLITS,
    NUM_TOKENS,
    PARAMS,
    make_inputs,
    poisoned,
    scalars,
)

FORMS = mhc_pre_big_fuse_bwd.operator.forms
WRITTEN = ['gemm_out_mul_grad', 'gemm_out_sqrsum_grad', 'mhc_scale_grad', 'mhc_base_grad', 'residual_grad']


def _output_grads(num_tokens: int, mhc_mult: int, hidden: int, device) -> list[torch.Tensor]:
    """[post_mix_grad, comb_mix_grad, layer_input_grad]."""
    return [
        torch.randn(num_tokens, mhc_mult, device=device),
        torch.randn(num_tokens, mhc_mult * mhc_mult, device=device),
        torch.randn(num_tokens, hidden, device=device).bfloat16(),
    ]


def _buffers(num_tokens: int, mhc_mult: int, hidden: int, residual_grad: torch.Tensor, device) -> list:
    """[gemm_out_mul_grad, gemm_out_sqrsum_grad, mhc_scale_grad, mhc_base_grad] full of NaN, and a copy of
    residual_grad (accumulated into)."""
    m3 = mhc_mult * (mhc_mult + 2)
    return [
        poisoned(num_tokens, m3, device=device),
        poisoned(num_tokens, device=device),
        poisoned(3, device=device),
        poisoned(m3, device=device),
        residual_grad.clone(),
    ]


def _zeros(num_tokens=4, mhc_mult=4, hidden=256, n_splits=2, device='cpu') -> list[torch.Tensor]:
    """The call's tensors, zeros (also on fake CUDA devices, where random numbers cannot be drawn)."""
    m3 = mhc_mult * (mhc_mult + 2)
    bf16 = {'dtype': torch.bfloat16, 'device': device}
    return [
        torch.zeros(num_tokens, mhc_mult, device=device),
        torch.zeros(num_tokens, mhc_mult**2, device=device),
        torch.zeros(num_tokens, hidden, **bf16),
        torch.zeros(n_splits, num_tokens, m3, device=device),
        torch.zeros(n_splits, num_tokens, device=device),
        torch.zeros(3, device=device),
        torch.zeros(m3, device=device),
        torch.zeros(num_tokens, mhc_mult, hidden, **bf16),
        torch.zeros(num_tokens, m3, device=device),
        torch.zeros(num_tokens, device=device),
        torch.zeros(3, device=device),
        torch.zeros(m3, device=device),
        torch.zeros(num_tokens, mhc_mult, hidden, **bf16),
    ]


def _chain(grads, inputs, residual_grad, repeat, n_splits):
    """The same backward through the public operators, one by one, into fresh buffers (residual_grad: updated)."""
    post_mix_grad, comb_mix_grad, layer_input_grad = grads
    gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual = inputs
    S, T, M3 = gemm_out_mul.shape
    M, H = residual.shape[1:]
    rms_eps, pre_eps, sinkhorn_eps, post_mult, _ = scalars(repeat)
    new = gemm_out_mul.new_empty
    out_mul, sqrsum, mixes = mhc_reduce_partials_and_rmsnorm_fwd(
        gemm_out_mul.view(S, T, 1, M3), gemm_out_sqrsum.view(S, T, 1), new(T, 1, M3), new(T, 1), new(T, M3), M * H,
        rms_eps, n_splits,
    )  # fmt: skip
    pre, post, comb = mhc_pre_split_mixes_fwd(
        mixes, mhc_scale, mhc_base, new(T, M), new(T, M), new(T, M * M), post_mult, pre_eps
    )
    comb_grad = mhc_sinkhorn_bwd(comb_mix_grad.view(T, M, M), comb.view(T, M, M), new(T, M, M), repeat, sinkhorn_eps)
    pre_grad = mhc_pre_apply_mix_bwd(layer_input_grad, residual, pre, residual_grad)
    mixes_grad, scale_grad, base_grad = mhc_pre_split_mixes_bwd(
        pre_grad, post_mix_grad, comb_grad.view(T, M * M), mixes, post, mhc_scale, mhc_base, new(T, M3), new(3),
        new(M3), post_mult,
    )  # fmt: skip
    mul_grad, sqrsum_grad = mhc_reduce_partials_and_rmsnorm_bwd(
        mixes_grad, out_mul, sqrsum, new(T, 1, M3), new(T, 1), M * H, rms_eps
    )
    return mul_grad.view(T, M3), sqrsum_grad.view(T), scale_grad, base_grad, residual_grad


# CPU tier: the reference and the configuration.


def test_mhc_pre_big_fuse_fwd_ref_matches_finite_differences():
    """The float64 reference whose autograd the backward is checked against, against finite differences."""
    inputs = [t.double().requires_grad_() for t in make_inputs(2, 2, 64, 2, 'cpu')]
    assert torch.autograd.gradcheck(lambda *a: mhc_pre_big_fuse_fwd_ref(*a, *scalars(2)), inputs)


def test_mhc_pre_big_fuse_bwd_ref_splits_share_a_gradient():
    """What the backward's gemm_out_*_grad stand for: every split's partial gets the same gradient."""
    inputs = make_inputs(3, 2, 64, 4, 'cpu')
    mul_grad, sqrsum_grad, *_ = mhc_pre_big_fuse_bwd_ref(*_output_grads(3, 2, 64, 'cpu'), *inputs, *scalars(2))
    assert_equal(mul_grad, mul_grad[:1].expand_as(mul_grad), check_stride=False)
    assert_equal(sqrsum_grad, sqrsum_grad[:1].expand_as(sqrsum_grad), check_stride=False)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_mhc_pre_big_fuse_bwd_config_lists_the_stages(backend):
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    cfg = choose_mhc_pre_big_fuse_config(
        backend=backend, num_cores=cores, direction='bwd', mhc_mult=4, hidden=256, n_splits=16, repeat=3
    )
    assert [name for name, _ in cfg.stages] == [
        'reduce_partials_and_rmsnorm_fwd', 'pre_split_mixes_fwd', 'sinkhorn_bwd', 'pre_apply_mix_bwd',
        'pre_split_mixes_bwd', 'pre_split_mixes_reduce', 'reduce_partials_and_rmsnorm_bwd',
    ]  # fmt: skip
    assert (cfg.stage('sinkhorn_bwd').direction, cfg.stage('sinkhorn_bwd').repeat) == ('bwd', 3)
    assert cfg.stage('pre_apply_mix_bwd').direction == 'bwd'
    assert cfg.stage('pre_split_mixes_bwd').num_partials == cores  # one partial row per worker
    assert (cfg.stage('reduce_partials_and_rmsnorm_bwd').mhc_mult3, cfg.backend) == (24, backend)


# CPU tier: the argument contract (validation runs before the device guard).


@pytest.mark.parametrize(
    ('index', 'make', 'error', 'match'),
    [
        (0, lambda a: a.tolist(), TypeError, 'post_mix_grad must be a torch.Tensor, got list'),
        (2, lambda a: a.float(), TypeError, 'layer_input_grad must have dtype torch.bfloat16, got torch.float32'),
        (8, lambda a: a[:, :20].contiguous(), ValueError, r'gemm_out_mul_grad must have shape \(4, 24\)'),
        (9, lambda a: a.view(4, 1), ValueError, 'gemm_out_sqrsum_grad must have 1 dimension'),
        (12, lambda a: torch.zeros(4, 4, 256), TypeError, 'residual_grad must have dtype torch.bfloat16'),
        (16, lambda a: 0.0, ValueError, 'mhc_post_mult_value must be nonzero'),
        (17, lambda a: 257, ValueError, r'repeat must be in \[1, 256\], got 257'),
        (18, lambda a: 16, ValueError, r'n_splits \(16\) must be the first size of gemm_out_mul \(2\)'),
    ],
    ids=['non-tensor', 'dtype', 'shape', 'rank', 'grad-dtype', 'post-mult', 'repeat', 'n-splits'],
)
def test_mhc_pre_big_fuse_bwd_rejects(index, make, error, match):
    args = [*_zeros(), *scalars(3), 2]
    args[index] = make(args[index])
    with pytest.raises(error, match=match):
        mhc_pre_big_fuse_bwd(*args)


def test_mhc_pre_big_fuse_bwd_rejects_overlapping_buffers():
    args = [*_zeros(), *scalars(3), 2]
    args[12] = args[7]  # residual_grad is residual
    with pytest.raises(ValueError, match='residual_grad .updated in place. must not alias the input residual'):
        mhc_pre_big_fuse_bwd(*args)


@pytest.mark.parametrize('num_tokens', [0, 4])
def test_mhc_pre_big_fuse_bwd_refuses_cpu_tensors(num_tokens):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_pre_big_fuse_bwd(*_zeros(num_tokens), *scalars(3), 2)


# CPU tier: the torch.library form, on fake tensors.


def test_mhc_pre_big_fuse_bwd_op_is_registered():
    assert OPERATORS['mhc_pre_big_fuse_bwd'] is mhc_pre_big_fuse_bwd.operator
    assert list(FORMS) == ['mhc_pre_big_fuse_bwd']
    assert getattr(torch.ops, NAMESPACE).mhc_pre_big_fuse_bwd.default is FORMS['mhc_pre_big_fuse_bwd']
    schema = FORMS['mhc_pre_big_fuse_bwd']._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert (written, len(schema.returns)) == (WRITTEN, 0)


def test_mhc_pre_big_fuse_bwd_fake_calls():
    with FakeTensorMode():
        args = [*_zeros(device='cuda'), *scalars(3), 2]
        result = mhc_pre_big_fuse_bwd(*args)
        assert isinstance(result, MhcPreBigFuseBwdResult)
        assert all(r is b for r, b in zip(result, args[8:13], strict=True))
        assert FORMS['mhc_pre_big_fuse_bwd'](*args) is None
        for call in (mhc_pre_big_fuse_bwd, FORMS['mhc_pre_big_fuse_bwd']):
            with pytest.raises(TypeError, match='comb_mix_grad must have dtype torch.float32'):
                call(args[0], args[1].double(), *args[2:])
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(*_zeros(), *scalars(3), 2)


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_pre_big_fuse_bwd_values(params, device):
    """Every gradient against autograd of the float64 reference; bit for bit the chain of the public operators;
    the same bits on a second run (no atomics)."""
    mhc_mult, hidden, n_splits, repeat = params['case']
    for num_tokens in NUM_TOKENS:
        inputs = make_inputs(num_tokens, mhc_mult, hidden, n_splits, device)
        grads = _output_grads(num_tokens, mhc_mult, hidden, device)
        residual_grad = torch.randn(num_tokens, mhc_mult, hidden, device=device).bfloat16()
        buffers = _buffers(num_tokens, mhc_mult, hidden, residual_grad, device)
        result = mhc_pre_big_fuse_bwd(*grads, *inputs, *buffers, *scalars(repeat), n_splits)
        assert all(r is b for r, b in zip(result, buffers, strict=True))
        mul_ref, sqrsum_ref, scale_ref, base_ref, residual_ref = mhc_pre_big_fuse_bwd_ref(
            *(t.cpu() for t in (*grads, *inputs)), *scalars(repeat)
        )
        for name, actual, expected in [
            ('gemm_out_mul_grad', result.gemm_out_mul_grad, mul_ref[0]),
            ('gemm_out_sqrsum_grad', result.gemm_out_sqrsum_grad, sqrsum_ref[0]),
            ('mhc_scale_grad', result.mhc_scale_grad, scale_ref),
            ('mhc_base_grad', result.mhc_base_grad, base_ref),
        ]:
            # fp32 stages (2 * repeat - 1 Sinkhorn steps back, sums over tokens and mixes) against float64.
            scale = float(expected.abs().max())
            torch.testing.assert_close(actual.cpu().double(), expected, atol=1e-4 * scale, rtol=1e-3, msg=name)
        # residual_grad: the given values plus the reference's gradient, rounded once to bf16.
        accumulated = residual_grad.cpu().double() + residual_ref
        bound = 2.0**-8 * accumulated.abs() + 2.0**-16 * (residual_ref.abs() + 1)
        assert bool(((result.residual_grad.cpu().double() - accumulated).abs() <= bound).all()), 'residual_grad'
        chain = _chain(grads, inputs, residual_grad.clone(), repeat, n_splits)
        for actual, expected in zip(result, chain, strict=True):
            assert_equal(actual, expected)
        again = mhc_pre_big_fuse_bwd(
            *grads, *inputs, *_buffers(num_tokens, mhc_mult, hidden, residual_grad, device), *scalars(repeat), n_splits
        )
        for first, second in zip(result, again, strict=True):
            assert_equal(second, first)


@pytest.mark.npu
def test_mhc_pre_big_fuse_bwd_empty(device):
    """0 tokens: zero parameter gradients, nothing launched."""
    inputs = make_inputs(0, 4, 256, 16, device)
    buffers = _buffers(0, 4, 256, torch.zeros(0, 4, 256, dtype=torch.bfloat16, device=device), device)
    result = mhc_pre_big_fuse_bwd(*_output_grads(0, 4, 256, device), *inputs, *buffers, *scalars(3))
    assert all(r is b for r, b in zip(result, buffers, strict=True))
    assert_equal(result.mhc_scale_grad, torch.zeros(3, device=device))
    assert_equal(result.mhc_base_grad, torch.zeros(24, device=device))


@pytest.mark.npu
def test_mhc_pre_big_fuse_bwd_config(device):
    inputs = make_inputs(1, 4, 256, 16, device)
    residual_grad = torch.zeros(1, 4, 256, dtype=torch.bfloat16, device=device)
    args = (*_output_grads(1, 4, 256, device), *inputs, *_buffers(1, 4, 256, residual_grad, device))
    cfg = mhc_pre_big_fuse_bwd.operator.config(*args, *scalars(3), 16)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    assert cfg == choose_mhc_pre_big_fuse_config(
        backend=backend, num_cores=num_cores, direction='bwd', mhc_mult=4, hidden=256, n_splits=16, repeat=3
    )
    assert cfg.stage('pre_apply_mix_bwd') == mhc_pre_apply_mix_bwd.operator.config(
        args[2], inputs[4], args[0], residual_grad
    )


@pytest.mark.npu
def test_mhc_pre_big_fuse_bwd_opcheck(device):
    inputs = make_inputs(1, 4, 256, 16, device)
    residual_grad = torch.zeros(1, 4, 256, dtype=torch.bfloat16, device=device)
    args = [*_output_grads(1, 4, 256, device), *inputs, *_buffers(1, 4, 256, residual_grad, device), *scalars(3), 16]
    torch.library.opcheck(FORMS['mhc_pre_big_fuse_bwd'], args)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_pre_big_fuse_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    num_tokens, hidden = params['num_tokens'], params['hidden']
    inputs = make_inputs(num_tokens, BENCHMARK_MULT, hidden, BENCHMARK_SPLITS, device)
    grads = _output_grads(num_tokens, BENCHMARK_MULT, hidden, device)
    residual_grad = torch.zeros(num_tokens, BENCHMARK_MULT, hidden, dtype=torch.bfloat16, device=device)
    buffers = _buffers(num_tokens, BENCHMARK_MULT, hidden, residual_grad, device)
    args = (*grads, *inputs, *buffers, *scalars(BENCHMARK_REPEAT), BENCHMARK_SPLITS)
    mhc_pre_big_fuse_bwd(*args)  # compile and warm up outside the timing (residual_grad keeps accumulating)
    time_us = benchmark_timer(lambda: mhc_pre_big_fuse_bwd(*args))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_pre_big_fuse_bwd'),
        operation='bwd',
        params={**params, 'mhc_mult': BENCHMARK_MULT, 'n_splits': BENCHMARK_SPLITS, 'repeat': BENCHMARK_REPEAT},
        time_us=time_us,
        # residual_grad is read and written
        bandwidth_gbs=count_bytes(*grads, *inputs, *buffers, residual_grad) / time_us / 1e3,
    )
