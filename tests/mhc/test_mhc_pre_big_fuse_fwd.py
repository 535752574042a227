"""Tests of mhc_pre_big_fuse_fwd (TileKernels 2.1.0's fused pre path): on Ascend one fused kernel (FUSE_ON_ASCEND),
on CUDA a composition of the domain's operators, or with FUSE_ON_CUDA one fused kernel.

CPU tier: the configuration (each stage's, from its own chooser; the fused kernel of each backend where chosen);
the fused kernels' lowering (the stage kernels' is their own tests'; Ascend: the UB within the limit, as the
configuration counts it); the argument contract on CPU tensors (typed errors before the device guard); the
torch.library form (schema, fake kernel, typed errors, torch.compile on fake tensors). Device tier (`npu`; on a
CPU-only host the Ascend kernels on the emulator with `--ascend-emulator`): values against the float64 reference
of the whole path, bit equality with the chain of the public operators and (Ascend) with the composition, the
fused kernels' at more sizes from level 1, 0 tokens, the configuration query, opcheck; the benchmark.
"""

import dataclasses
import importlib
import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config
from cann_ops_tilelang.mhc import (
    mhc_pre_apply_mix_fwd,
    mhc_pre_big_fuse_fwd,
    mhc_pre_split_mixes_fwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
    mhc_sinkhorn_fwd,
)
from cann_ops_tilelang.mhc.mhc_pre_big_fuse_fwd import MhcPreBigFuseFwdResult, fused_launch_args
from cann_ops_tilelang.mhc.mhc_pre_big_fuse_kernel import (
    ASCEND_FUSED_UB_BUDGET,
    choose_mhc_pre_big_fuse_config,
    make_mhc_pre_big_fuse_fwd_kernel,
)
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .mhc_pre_big_fuse_fwd_ref import mhc_pre_big_fuse_fwd_ref
from .pre_big_fuse_cases import (
    ASCEND_FUSED_NUM_TOKENS,
    ASCEND_FUSED_PARAMS,
    ASCEND_LOWERING_CASES,
    BENCHMARK_MULT,
    BENCHMARK_PARAMS,
    BENCHMARK_REPEAT,
    BENCHMARK_SPLITS,
    FUSED_NUM_TOKENS,
    FUSED_PARAMS,
    LOWERING_CASES,
    NUM_TOKENS,
    PARAMS,
    make_inputs,
    poisoned,
    scalars,
)

FORMS = mhc_pre_big_fuse_fwd.operator.forms
# The interface module (its name is also the function the package exports): FUSE_ON_CUDA lives there.
_INTERFACE = importlib.import_module('cann_ops_tilelang.mhc.mhc_pre_big_fuse_fwd')


def _buffers(num_tokens: int, mhc_mult: int, hidden: int, device) -> list[torch.Tensor]:
    """[post_mix, comb_mix, layer_input], full of NaN."""
    return [
        poisoned(num_tokens, mhc_mult, device=device),
        poisoned(num_tokens, mhc_mult * mhc_mult, device=device),
        poisoned(num_tokens, hidden, dtype=torch.bfloat16, device=device),
    ]


def _zeros(num_tokens=4, mhc_mult=4, hidden=256, n_splits=2, device='cpu') -> list[torch.Tensor]:
    """The call's tensors, zeros (also on fake CUDA devices, where random numbers cannot be drawn)."""
    m3 = mhc_mult * (mhc_mult + 2)
    shapes = [(n_splits, num_tokens, m3), (n_splits, num_tokens), (3,), (m3,)]
    tensors = [torch.zeros(s, device=device) for s in shapes]
    tensors.append(torch.zeros(num_tokens, mhc_mult, hidden, dtype=torch.bfloat16, device=device))
    tensors += [torch.zeros(num_tokens, mhc_mult, device=device), torch.zeros(num_tokens, mhc_mult**2, device=device)]
    return [*tensors, torch.zeros(num_tokens, hidden, dtype=torch.bfloat16, device=device)]


def _chain(inputs, repeat, n_splits):
    """The same path through the public operators, one by one, into fresh buffers."""
    gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual = inputs
    S, T, M3 = gemm_out_mul.shape
    M, H = residual.shape[1:]
    rms_eps, pre_eps, sinkhorn_eps, post_mult, _ = scalars(repeat)
    new = gemm_out_mul.new_empty
    _, _, mixes = mhc_reduce_partials_and_rmsnorm_fwd(
        gemm_out_mul.view(S, T, 1, M3), gemm_out_sqrsum.view(S, T, 1), new(T, 1, M3), new(T, 1), new(T, M3), M * H,
        rms_eps, n_splits,
    )  # fmt: skip
    pre, post, comb = mhc_pre_split_mixes_fwd(
        mixes, mhc_scale, mhc_base, new(T, M), new(T, M), new(T, M * M), post_mult, pre_eps
    )
    comb_mix = mhc_sinkhorn_fwd(comb.view(T, M, M), new(T, M, M), repeat, sinkhorn_eps)
    layer_input = mhc_pre_apply_mix_fwd(residual, pre, residual.new_empty(T, H))
    return post, comb_mix.view(T, M * M), layer_input


# CPU tier: the configuration.


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_mhc_pre_big_fuse_fwd_config_lists_the_stages(backend):
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    cfg = choose_mhc_pre_big_fuse_config(
        backend=backend, num_cores=cores, direction='fwd', mhc_mult=4, hidden=256, n_splits=16, repeat=3
    )
    assert [name for name, _ in cfg.stages] == [
        'reduce_partials_and_rmsnorm_fwd', 'pre_split_mixes_fwd', 'sinkhorn_fwd', 'pre_apply_mix_fwd',
    ]  # fmt: skip
    reduce, split, sinkhorn, apply = (stage for _, stage in cfg.stages)
    assert (reduce.backend, reduce.mhc_mult3, reduce.groups, reduce.n_splits) == (backend, 24, 1, 16)
    assert (split.kind, split.mhc_mult, sinkhorn.direction, sinkhorn.mhc_mult, sinkhorn.repeat) == (
        'split_fwd', 4, 'fwd', 4, 3,
    )  # fmt: skip
    assert (apply.direction, apply.mhc, apply.hidden) == ('fwd', 4, 256)
    with pytest.raises(ValueError, match='direction must be one of'):
        type(cfg)(backend, 'sideways', cfg.stages)


def _fused_config(mhc_mult, hidden, n_splits, repeat, fuse=True, backend='cuda'):
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_pre_big_fuse_config(
        backend=backend, num_cores=cores, direction='fwd', mhc_mult=mhc_mult, hidden=hidden, n_splits=n_splits,
        repeat=repeat, fuse=fuse,
    )  # fmt: skip


def test_mhc_pre_big_fuse_fwd_fuses_the_cuda_forward_where_asked():
    """The fused kernel: the CUDA forward where `fuse` asks (FUSE_ON_CUDA, off by default: the composition until
    the kernel has run on a GPU), its stages the composition's; the backward keeps the stages."""
    assert _INTERFACE.FUSE_ON_CUDA is False
    fused = _fused_config(4, 4096, 16, 20)
    assert fused.fused
    assert fused.stages == _fused_config(4, 4096, 16, 20, fuse=False).stages
    bwd = choose_mhc_pre_big_fuse_config(
        backend='cuda', num_cores=H200_SMS, direction='bwd', mhc_mult=4, hidden=256, n_splits=16, repeat=3, fuse=True
    )
    assert not bwd.fused
    with pytest.raises(ValueError, match='the fused kernel is the forward'):
        dataclasses.replace(bwd, fused=True)
    with pytest.raises(ValueError, match='a composition has no kernel of its own'):
        make_mhc_pre_big_fuse_fwd_kernel(_fused_config(4, 256, 2, 3, fuse=False))


@pytest.mark.parametrize('mhc_mult', range(1, 9))
def test_mhc_pre_big_fuse_fwd_fuses_the_ascend_forward(mhc_mult):
    """Ascend: the fused kernel by default (FUSE_ON_ASCEND), 16 tokens a task, every hidden width the contract
    takes within the UB budget (the residual's hidden block is pre_apply_mix_fwd's, bounded by its own budget);
    the stages where fuse_ascend is off, and for the backward."""
    assert _INTERFACE.FUSE_ON_ASCEND is True
    for hidden in (64, 2560, 7168, 65536):
        cfg = _fused_config(mhc_mult, hidden, 16, 20, fuse=False, backend='ascend')
        assert (cfg.fused, cfg.token_block) == (True, 16)
        assert 0 < cfg.ub_bytes <= ASCEND_FUSED_UB_BUDGET
        composition = choose_mhc_pre_big_fuse_config(
            backend='ascend', num_cores=ASCEND_950_VECTOR_CORES, direction='fwd', mhc_mult=mhc_mult, hidden=hidden,
            n_splits=16, repeat=20, fuse_ascend=False,
        )  # fmt: skip
        assert (composition.fused, composition.token_block, composition.ub_bytes) == (False, 0, 0)
        assert composition.stages == cfg.stages
    bwd = choose_mhc_pre_big_fuse_config(
        backend='ascend', num_cores=ASCEND_950_VECTOR_CORES, direction='bwd', mhc_mult=mhc_mult, hidden=256,
        n_splits=16, repeat=3,
    )  # fmt: skip
    assert not bwd.fused
    with pytest.raises(ValueError, match='multiple of 8'):
        dataclasses.replace(cfg, token_block=12)
    with pytest.raises(ValueError, match="token_block is the Ascend fused kernel's"):
        dataclasses.replace(composition, token_block=16)


@pytest.mark.parametrize('case', ASCEND_LOWERING_CASES, ids=lambda c: 'mhc{}-h{}-s{}-r{}'.format(*c))
def test_mhc_pre_big_fuse_fwd_ascend_fused_kernel_lowers(case):
    """One Ascend kernel: its UB within the limit and exactly what the configuration counts (the budget check of
    the chooser), the Sinkhorn in a SIMT VF, no atomics."""
    cfg = _fused_config(*case, fuse=False, backend='ascend')
    lowered = assert_ascend_kernel_lowers(
        lambda: make_mhc_pre_big_fuse_fwd_kernel(cfg), key=cfg, kernel_name='mhc_pre_big_fuse_fwd_kernel'
    )
    assert lowered.ub_bytes == cfg.ub_bytes <= ASCEND_FUSED_UB_BUDGET
    assert '__simt_vf__' in lowered.source
    assert 'atomic' not in lowered.source.lower()


@pytest.mark.parametrize('case', LOWERING_CASES, ids=lambda c: 'mhc{}-h{}-s{}-r{}'.format(*c))
def test_mhc_pre_big_fuse_fwd_fused_kernel_lowers(case):
    """One kernel for sm_90a: the residual read and layer_input written in 16-byte vectors (pre_apply_mix_fwd's
    tile), the Sinkhorn's Newton reciprocal (no IEEE division), no atomics."""
    cfg = _fused_config(*case)
    lowered = assert_cuda_kernel_lowers(
        lambda: make_mhc_pre_big_fuse_fwd_kernel(cfg), key=cfg, kernel_name='mhc_pre_big_fuse_fwd_kernel'
    )
    assert '*(uint4*)(residual + ' in lowered.source
    assert '*(uint4*)(layer_input + ' in lowered.source
    assert '__fdividef' in lowered.source
    assert 'atomic' not in lowered.source.lower()
    assert lowered.source.count('__syncthreads()') == 2  # one per block kind, after its mixes


def test_mhc_pre_big_fuse_fwd_fused_launch_matches_the_kernel_parameters():
    """What the operator passes the fused kernel: its parameters in order (dtypes and shapes, the partials as one RMS
    group), then the stages' scalars, 1 / (M * H) first."""
    T, M, H, S = 4, 4, 256, 2
    tensors = _zeros(T, M, H, S)
    args = fused_launch_args(*tensors, *scalars(3)[:4])
    prim_func = make_mhc_pre_big_fuse_fwd_kernel(_fused_config(M, H, S, 3))
    assert len(args) == len(prim_func.params)
    for arg, param in zip(args, prim_func.params, strict=True):
        if param in prim_func.buffer_map:
            buffer = prim_func.buffer_map[param]
            shape = tuple(T if str(d) == 'num_tokens' else int(d) for d in buffer.shape)
            assert (tuple(arg.shape), str(arg.dtype).removeprefix('torch.')) == (shape, str(buffer.dtype)), buffer.name
        else:
            assert isinstance(arg, float), param.name
    rms_eps, pre_eps, sinkhorn_eps, post_mult, _ = scalars(3)
    assert args[-5:] == (1.0 / (M * H), rms_eps, pre_eps, sinkhorn_eps, post_mult)
    # sinkhorn_eps goes by the name the Sinkhorn routine's macro binds it to (TileLang keeps a value's last name)
    assert [p.name for p in prim_func.params[-5:]] == ['inv_group_size', 'rms_eps', 'pre_eps', 'eps', 'post_mult']


# CPU tier: the argument contract (validation runs before the device guard).


@pytest.mark.parametrize(
    ('index', 'make', 'error', 'match'),
    [
        (0, lambda a: a.tolist(), TypeError, 'gemm_out_mul must be a torch.Tensor, got list'),
        (4, lambda a: a.float(), TypeError, 'residual must have dtype torch.bfloat16, got torch.float32'),
        (1, lambda a: a[:1], ValueError, r'gemm_out_sqrsum must have shape \(2, 4\)'),
        (0, lambda a: a[:, :, :20].contiguous(), ValueError, r'must number mhc_mult \* \(mhc_mult \+ 2\) = 24'),
        (4, lambda a: torch.zeros(4, 4, 100, dtype=a.dtype), ValueError, 'hidden must be a positive multiple of 64'),
        (4, lambda a: torch.zeros(4, 9, 256, dtype=a.dtype), ValueError, r'mhc_mult must be in \[1, 8\], got 9'),
        (6, lambda a: torch.zeros(4, 15), ValueError, r'comb_mix must have shape \(4, 16\)'),
        (5, lambda a: torch.zeros(4, 4).t(), ValueError, 'post_mix must be contiguous'),
        (13, lambda a: 3, ValueError, r'n_splits \(3\) must be the first size of gemm_out_mul \(2\)'),
        (12, lambda a: 0, ValueError, r'repeat must be in \[1, '),
        (12, lambda a: 2.0, TypeError, 'sinkhorn_repeat must be an int'),
        (8, lambda a: -1.0, ValueError, 'rms_eps must be >= 0'),
    ],
    ids=[
        'non-tensor',
        'dtype',
        'shape',
        'mixes',
        'hidden',
        'mhc-mult',
        'comb',
        'layout',
        'n-splits',
        'repeat',
        'repeat-type',
        'rms-eps',
    ],
)
def test_mhc_pre_big_fuse_fwd_rejects(index, make, error, match):
    args = [*_zeros(), *scalars(3), 2]
    args[index] = make(args[index])
    with pytest.raises(error, match=match):
        mhc_pre_big_fuse_fwd(*args)


def test_mhc_pre_big_fuse_fwd_rejects_overlapping_buffers():
    args = [*_zeros(), *scalars(3), 2]
    args[5] = args[3][:16].view(4, 4)  # post_mix inside mhc_base
    with pytest.raises(ValueError, match='post_mix .written in place. must not alias the input mhc_base'):
        mhc_pre_big_fuse_fwd(*args)
    args = [*_zeros(), *scalars(3), 2]
    args[5] = args[6][:, :4]  # post_mix inside comb_mix (and not contiguous)
    with pytest.raises(ValueError, match='post_mix'):
        mhc_pre_big_fuse_fwd(*args)


@pytest.mark.parametrize('num_tokens', [0, 4])
def test_mhc_pre_big_fuse_fwd_refuses_cpu_tensors(num_tokens):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_pre_big_fuse_fwd(*_zeros(num_tokens), *scalars(3), 2)


# CPU tier: the torch.library form, on fake tensors.


def test_mhc_pre_big_fuse_fwd_op_is_registered():
    assert OPERATORS['mhc_pre_big_fuse_fwd'] is mhc_pre_big_fuse_fwd.operator
    assert list(FORMS) == ['mhc_pre_big_fuse_fwd']
    assert getattr(torch.ops, NAMESPACE).mhc_pre_big_fuse_fwd.default is FORMS['mhc_pre_big_fuse_fwd']
    schema = FORMS['mhc_pre_big_fuse_fwd']._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert (written, len(schema.returns)) == (['post_mix', 'comb_mix', 'layer_input'], 0)
    assert schema.arguments[-1].name == 'n_splits'
    assert inspect.signature(mhc_pre_big_fuse_fwd).parameters['n_splits'].default == 16  # the peer's


def test_mhc_pre_big_fuse_fwd_fake_calls():
    with FakeTensorMode():
        args = [*_zeros(device='cuda'), *scalars(3), 2]
        result = mhc_pre_big_fuse_fwd(*args)
        assert isinstance(result, MhcPreBigFuseFwdResult)
        assert all(r is b for r, b in zip(result, args[5:8], strict=True))
        assert FORMS['mhc_pre_big_fuse_fwd'](*args) is None
        for call in (mhc_pre_big_fuse_fwd, FORMS['mhc_pre_big_fuse_fwd']):
            with pytest.raises(TypeError, match='mhc_scale must have dtype torch.float32'):
                call(*args[:2], args[2].double(), *args[3:])
            with pytest.raises(ValueError, match=r'layer_input must have shape \(4, 256\)'):
                call(*args[:7], torch.empty(3, 256, dtype=torch.bfloat16, device='cuda'), *args[8:])
            with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
                call(*_zeros(), *scalars(3), 2)


def test_mhc_pre_big_fuse_fwd_compiles_into_one_graph():
    record = GraphRecorder()

    def step(*tensors):
        post_mix, comb_mix, layer_input = mhc_pre_big_fuse_fwd(*tensors, *scalars(3), 2)
        return post_mix * 2, comb_mix.sum(), layer_input

    with FakeTensorMode():
        tensors = _zeros(device='cuda')
        post2, _, layer_input = torch.compile(step, fullgraph=True, backend=record)(*tensors)
        assert (post2.shape, layer_input.dtype) == ((4, 4), torch.bfloat16)
    assert len(record.graphs) == 1
    targets = record.targets()
    assert str(FORMS['mhc_pre_big_fuse_fwd']) in targets, targets


# Device tier.


def _check_values(params, num_tokens_list, device, *, fused):
    """Against the float64 reference (fp32 stages; one bf16 rounding of layer_input); bit for bit the chain of the
    public operators; the same bits on a second run. `fused`: what the configuration must be."""
    mhc_mult, hidden, n_splits, repeat = params['case']
    for num_tokens in num_tokens_list:
        inputs = make_inputs(num_tokens, mhc_mult, hidden, n_splits, device)
        buffers = _buffers(num_tokens, mhc_mult, hidden, device)
        assert mhc_pre_big_fuse_fwd.operator.config(*inputs, *buffers, *scalars(repeat), n_splits).fused == fused
        result = mhc_pre_big_fuse_fwd(*inputs, *buffers, *scalars(repeat), n_splits)
        assert all(r is b for r, b in zip(result, buffers, strict=True))
        post_ref, comb_ref, layer_input_ref = mhc_pre_big_fuse_fwd_ref(*(t.cpu() for t in inputs), *scalars(repeat))
        post_mix, comb_mix, layer_input = (t.cpu() for t in result)
        # fp32 stages: a few roundings per step; Sinkhorn's 2 * repeat - 1 steps keep values in [0, 1].
        torch.testing.assert_close(post_mix.double(), post_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(comb_mix.double(), comb_ref, atol=1e-5, rtol=1e-4)
        # bf16: half an ulp of the result (2**-8 relative) and the fp32 mix's error on the sum of magnitudes.
        magnitude = (inputs[4].cpu().double().abs() * 2).sum(1)
        bound = 2.0**-8 * layer_input_ref.abs() + 2.0**-16 * magnitude
        assert bool(((layer_input.double() - layer_input_ref).abs() <= bound).all()), 'layer_input'
        for actual, expected in zip(result, _chain(inputs, repeat, n_splits), strict=True):
            assert_equal(actual, expected)
        again = mhc_pre_big_fuse_fwd(*inputs, *_buffers(num_tokens, mhc_mult, hidden, device), *scalars(repeat),
                                     n_splits)  # fmt: skip
        for first, second in zip(result, again, strict=True):
            assert_equal(second, first)


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_pre_big_fuse_fwd_values(params, device):
    """The default path: on Ascend the fused kernel (FUSE_ON_ASCEND), on CUDA the composition (FUSE_ON_CUDA off)."""
    _check_values(params, NUM_TOKENS, device, fused=config.backend_of(device) == 'ascend')


@pytest.mark.npu
@pytest.mark.parametrize('params', FUSED_PARAMS, ids=make_param_id)
def test_mhc_pre_big_fuse_fwd_fused_values(params, device, monkeypatch):
    """The fused CUDA kernel (FUSE_ON_CUDA set): the composition's bits, close to the reference (from level 1)."""
    if config.backend_of(device) != 'cuda':
        pytest.skip('the fused kernel of the pre path is a CUDA kernel')
    monkeypatch.setattr(_INTERFACE, 'FUSE_ON_CUDA', True)
    _check_values(params, FUSED_NUM_TOKENS, device, fused=True)


@pytest.mark.npu
@pytest.mark.parametrize('params', ASCEND_FUSED_PARAMS, ids=make_param_id)
def test_mhc_pre_big_fuse_fwd_ascend_fused_values(params, device):
    """The fused Ascend kernel at more sizes (from level 1): every mhc_mult, 1 / 2 / 16 splits, repeat 1 / 20,
    hidden 64 / 192 / 2560, tokens up to tasks on many cores."""
    if config.backend_of(device) != 'ascend':
        pytest.skip('the default fused kernel of the pre path is the Ascend one')
    _check_values(params, ASCEND_FUSED_NUM_TOKENS, device, fused=True)


@pytest.mark.npu
def test_mhc_pre_big_fuse_fwd_ascend_fused_equals_the_composition(device, monkeypatch):
    """The fused Ascend kernel and the composition of the same call (FUSE_ON_ASCEND off): the same bits."""
    if config.backend_of(device) != 'ascend':
        pytest.skip('the default fused kernel of the pre path is the Ascend one')
    mhc_mult, hidden, n_splits, repeat, num_tokens = 4, 256, 16, 3, 37
    inputs = make_inputs(num_tokens, mhc_mult, hidden, n_splits, device)
    results = {}
    for fuse in (False, True):
        monkeypatch.setattr(_INTERFACE, 'FUSE_ON_ASCEND', fuse)
        buffers = _buffers(num_tokens, mhc_mult, hidden, device)
        assert mhc_pre_big_fuse_fwd.operator.config(*inputs, *buffers, *scalars(repeat), n_splits).fused == fuse
        results[fuse] = mhc_pre_big_fuse_fwd(*inputs, *buffers, *scalars(repeat), n_splits)
    for fused, composed in zip(results[True], results[False], strict=True):
        assert_equal(fused, composed)


@pytest.mark.npu
def test_mhc_pre_big_fuse_fwd_empty(device):
    """0 tokens: nothing launched, the (empty) buffers returned."""
    inputs = make_inputs(0, 4, 256, 16, device)
    buffers = _buffers(0, 4, 256, device)
    result = mhc_pre_big_fuse_fwd(*inputs, *buffers, *scalars(3))  # n_splits: the default 16
    assert all(r is b for r, b in zip(result, buffers, strict=True))


@pytest.mark.npu
def test_mhc_pre_big_fuse_fwd_config(device):
    """The configuration query: each stage's configuration is the one its own operator's call takes."""
    inputs = make_inputs(1, 4, 256, 16, device)
    buffers = _buffers(1, 4, 256, device)
    cfg = mhc_pre_big_fuse_fwd.operator.config(*inputs, *buffers, *scalars(3), 16)
    backend, num_cores = config.backend_of(device), config.get_num_cores(device)
    assert cfg == choose_mhc_pre_big_fuse_config(
        backend=backend, num_cores=num_cores, direction='fwd', mhc_mult=4, hidden=256, n_splits=16, repeat=3
    )
    scratch = torch.empty(1, 24, device=device)
    assert cfg.stage('reduce_partials_and_rmsnorm_fwd') == mhc_reduce_partials_and_rmsnorm_fwd.operator.config(
        inputs[0].view(16, 1, 1, 24), inputs[1].view(16, 1, 1), scratch.view(1, 1, 24).clone(),
        torch.empty(1, 1, device=device), scratch, 1024, 1e-6, 16,
    )  # fmt: skip
    assert cfg.stage('pre_apply_mix_fwd') == mhc_pre_apply_mix_fwd.operator.config(inputs[4], buffers[0], buffers[2])


@pytest.mark.npu
def test_mhc_pre_big_fuse_fwd_opcheck(device):
    args = [*make_inputs(1, 4, 256, 16, device), *_buffers(1, 4, 256, device), *scalars(3), 16]
    torch.library.opcheck(FORMS['mhc_pre_big_fuse_fwd'], args)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_pre_big_fuse_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    num_tokens, hidden = params['num_tokens'], params['hidden']
    inputs = make_inputs(num_tokens, BENCHMARK_MULT, hidden, BENCHMARK_SPLITS, device)
    buffers = _buffers(num_tokens, BENCHMARK_MULT, hidden, device)
    args = (*inputs, *buffers, *scalars(BENCHMARK_REPEAT), BENCHMARK_SPLITS)
    mhc_pre_big_fuse_fwd(*args)  # compile and warm up outside the timing
    for actual, expected in zip(buffers, _chain(inputs, BENCHMARK_REPEAT, BENCHMARK_SPLITS), strict=True):
        assert_equal(actual, expected)
    time_us = benchmark_timer(lambda: mhc_pre_big_fuse_fwd(*args))
    benchmark_record(
        kernel=record_name('mhc', 'mhc_pre_big_fuse_fwd'),
        operation='fwd',
        params={**params, 'mhc_mult': BENCHMARK_MULT, 'n_splits': BENCHMARK_SPLITS, 'repeat': BENCHMARK_REPEAT},
        time_us=time_us,
        bandwidth_gbs=count_bytes(*inputs, *buffers) / time_us / 1e3,
    )
