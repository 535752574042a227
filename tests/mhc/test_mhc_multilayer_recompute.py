"""Tests of mhc_multilayer_recompute (TileKernels 2.1.0's recompute of several layers): eagerly a fused kernel on
both backends (up to LAYERS_PER_LAUNCH layers a launch), while torch traces a composition of mhc_pre_apply_mix_fwd
and mhc_post_fwd.

CPU tier: the argument contract on CPU tensors (typed errors before the device guard), torch.compile on fake
tensors (one graph of the stages' ops), the fused kernels' configurations and lowering (the stage kernels'
lowering is their own tests'). Device tier (`npu`; on a CPU-only host the Ascend kernels on the emulator with
`--ascend-emulator`): every layer against the float64 reference of that layer, bit equality with the stages called
one by one, L_post = L and L - 1, 0 tokens; the benchmark.
"""

import dataclasses
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang.mhc import mhc_multilayer_recompute, mhc_post_fwd, mhc_pre_apply_mix_fwd
from cann_ops_tilelang.mhc.mhc_multilayer_recompute_kernel import (
    ASCEND_UB_BUDGET,
    LAYERS_PER_LAUNCH,
    MhcMultilayerRecomputeConfig,
    ascend_ub_bytes,
    choose_mhc_multilayer_recompute_config,
    make_mhc_multilayer_recompute_kernel,
)
from cann_ops_tilelang.operator import OPERATORS
from tests.testing.bench import make_param_id
from tests.testing.fast_path import record_launchers
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import assert_ascend_kernel_lowers, assert_cuda_kernel_lowers
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .mhc_multilayer_recompute_ref import mhc_multilayer_recompute_ref

# (mhc_mult, hidden, layers, post layers): level 0 the stages' mhc_mult 4 and hidden 256 (one configuration of each
# stage), and more layers than one fused launch takes (two launches, the second from the first's last residual);
# level 1 every other mhc_mult with other widths and layer counts.
CASES = by_level(
    get_test_level(),
    core=[(4, 256, 3, 3), (4, 256, 2, 1), (4, 256, 5, 4)],
    default=[(1, 64, 1, 0), (2, 192, 2, 2), (3, 1088, 3, 2), (8, 128, 4, 4), (6, 320, 2, 1)],
)
PARAMS = generate_samples(case=CASES)
NUM_TOKENS = (1, 37)
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[2560, 7168])
BENCHMARK_MULT, BENCHMARK_LAYERS = 4, 4


def make_inputs(num_tokens, mhc_mult, hidden, layers, post_layers, device, seed=0):
    """(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list): values as in a model
    (pre and post mixes in [0, 2], the comb matrices around 1 / M), drawn on the device."""
    generator = torch.Generator(device=device).manual_seed(seed)
    T, M, H = num_tokens, mhc_mult, hidden

    def rand(*shape, scale=1.0):
        return torch.rand(shape, generator=generator, device=device) * scale

    residual = torch.randn((T, M, H), generator=generator, device=device).bfloat16()
    pre = [rand(T, M, scale=2.0) for _ in range(layers)]
    outputs = [torch.randn((T, H), generator=generator, device=device).bfloat16() for _ in range(post_layers)]
    post = [rand(T, M, scale=2.0) for _ in range(post_layers)]
    comb = [rand(T, M, M, scale=2 / M) for _ in range(post_layers)]
    return residual, pre, outputs, post, comb


def poisoned_buffers(num_tokens, mhc_mult, hidden, layers, post_layers, device):
    """(layer_input_list, residual_list), full of NaN."""
    full = torch.full
    layer_inputs = [full((num_tokens, hidden), torch.nan, dtype=torch.bfloat16, device=device) for _ in range(layers)]
    residuals = [
        full((num_tokens, mhc_mult, hidden), torch.nan, dtype=torch.bfloat16, device=device) for _ in range(post_layers)
    ]
    return layer_inputs, residuals


def chain(residual, pre, outputs, post, comb):
    """The same layers through the public operators, one by one."""
    T, M, H = residual.shape
    layer_inputs, residuals = [], []
    for layer, mix in enumerate(pre):
        layer_inputs.append(mhc_pre_apply_mix_fwd(residual, mix, residual.new_empty(T, H)))
        if layer < len(outputs):
            new = mhc_post_fwd(outputs[layer][None], residual[None], post[layer].view(1, T, M, 1), comb[layer][None])
            residual = new[0]
            residuals.append(residual)
    return layer_inputs, residuals


def _zeros(T=4, M=4, H=256, L=2, L_post=2, device='cpu'):
    """A call's arguments, zeros (also on fake CUDA devices)."""
    residual = torch.zeros(T, M, H, dtype=torch.bfloat16, device=device)
    f32 = [torch.zeros(T, M, device=device) for _ in range(L)]
    outputs = [torch.zeros(T, H, dtype=torch.bfloat16, device=device) for _ in range(L_post)]
    post = [torch.zeros(T, M, device=device) for _ in range(L_post)]
    comb = [torch.zeros(T, M, M, device=device) for _ in range(L_post)]
    layer_inputs = [torch.zeros(T, H, dtype=torch.bfloat16, device=device) for _ in range(L)]
    residuals = [torch.zeros(T, M, H, dtype=torch.bfloat16, device=device) for _ in range(L_post)]
    return [residual, f32, outputs, post, comb, layer_inputs, residuals]


# CPU tier: the argument contract (validation runs before the device guard).


def _replace(index, item, make):
    args = _zeros()
    if item is None:
        args[index] = make(args[index])
    else:
        args[index] = list(args[index])
        args[index][item] = make(args[index][item])
    return args


REJECTS = [
    ('residual-type', 0, None, lambda a: a.tolist(), TypeError, 'initial_residual must be a torch.Tensor'),
    ('residual-dtype', 0, None, lambda a: a.float(), TypeError, 'initial_residual must have dtype torch.bfloat16'),
    ('residual-rank', 0, None, lambda a: a[0, 0], ValueError, 'at least 2 dimensions'),
    ('mhc-mult', 0, None, lambda a: torch.zeros(4, 9, 256, dtype=a.dtype), ValueError, r'mhc_mult must be in \[1, 8\]'),
    ('hidden', 0, None, lambda a: torch.zeros(4, 4, 100, dtype=a.dtype), ValueError, 'positive multiple of 64'),
    ('residual-layout', 0, None, lambda a: a.transpose(0, 1), ValueError, 'initial_residual must be contiguous'),
    ('list-type', 1, None, lambda a: a[0], TypeError, 'pre_mix_list must be a list of tensors, got Tensor'),
    ('no-layers', 1, None, lambda a: [], ValueError, 'L >= 1 tensors and layer_output_list L or L - 1, got 0 and 2'),
    ('post-count', 2, None, lambda a: a[:0], ValueError, 'layer_output_list L or L - 1, got 2 and 0'),
    ('post-mix-count', 3, None, lambda a: a[:1], ValueError, 'post_mix_list must hold 2 tensors, got 1'),
    ('item-type', 4, 1, lambda a: 1.0, TypeError, r'comb_mix_list\[1\] must be a torch.Tensor, got float'),
    ('item-dtype', 1, 0, lambda a: a.double(), TypeError, r'pre_mix_list\[0\] must have dtype torch.float32'),
    ('item-size', 2, 1, lambda a: a[:3], ValueError, r'layer_output_list\[1\] must hold 1024 elements, got shape'),
    ('item-layout', 3, 0, lambda a: a.t(), ValueError, r'post_mix_list\[0\] must be contiguous'),
    ('written-aligned', 5, 0, lambda a: torch.zeros(1025, dtype=a.dtype)[1:].view(4, 256), ValueError,
     r'layer_input_list\[0\] must start at a 16-byte aligned address'),
]  # fmt: skip


@pytest.mark.parametrize(
    ('index', 'item', 'make', 'error', 'match'), [r[1:] for r in REJECTS], ids=[r[0] for r in REJECTS]
)
def test_mhc_multilayer_recompute_rejects(index, item, make, error, match):
    with pytest.raises(error, match=match):
        mhc_multilayer_recompute(*_replace(index, item, make))


def test_mhc_multilayer_recompute_rejects_written_tensors_that_overlap():
    """A written tensor apart from every input and every other written tensor (any layer)."""
    args = _zeros()
    args[6] = [args[6][0], args[0]]  # residual_list[1] is initial_residual
    with pytest.raises(ValueError, match=r'initial_residual and residual_list\[1\] overlap'):
        mhc_multilayer_recompute(*args)
    args = _zeros()
    shared = torch.zeros(2 * 4 * 256 + 8, dtype=torch.bfloat16)
    args[5] = [shared[:1024].view(4, 256), shared[1016 : 1016 + 1024].view(4, 256)]  # two written, 8 shared
    with pytest.raises(ValueError, match=r'layer_input_list\[0\] and layer_input_list\[1\] overlap'):
        mhc_multilayer_recompute(*args)
    args = _zeros()
    big = torch.zeros(4 * 4 * 256, dtype=torch.bfloat16)
    args[2] = [big[:1024].view(4, 256), big[2048:3072].view(4, 256)]  # inputs inside one span ...
    args[5] = [args[5][0], big[1024:2048].view(4, 256)]  # ... and a written tensor between them: apart
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_multilayer_recompute(*args)  # the inputs may share memory; the written one overlaps none


@pytest.mark.parametrize('num_tokens', [0, 4])
def test_mhc_multilayer_recompute_refuses_cpu_tensors(num_tokens):
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_multilayer_recompute(*_zeros(T=num_tokens))


def test_mhc_multilayer_recompute_takes_any_shape_with_the_element_count():
    """As through the peer's pointers: leading dimensions on the residual, (T, M, 1) mixes, flat comb matrices."""
    args = _zeros(T=6)
    args[0] = args[0].view(2, 3, 4, 256)
    args[1] = [t.view(6, 4, 1) for t in args[1]]
    args[4] = [t.view(6, 16) for t in args[4]]
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):  # the contract holds: on to the device
        mhc_multilayer_recompute(*args)


def test_mhc_multilayer_recompute_eager_call_views_only_what_the_kernel_reshapes(monkeypatch):
    """The eager host path, the launch stubbed: with the peer's shapes ((T, M) mixes, (T, H) outputs
    and inputs, (T, M, H) residuals) only the comb mixes are viewed, (T, M, M) as the kernel's (T, M * M), once a
    layer (a view costs microseconds, and a call checks 6 L tensors), and the launch gets the caller's tensors."""
    module = sys.modules[mhc_multilayer_recompute.__module__]
    _, launched = record_launchers(monkeypatch, module._KERNEL, 132)
    monkeypatch.setattr(module, 'require_accelerator', lambda *tensors: 'cuda')
    inputs = make_inputs(3, 4, 64, 4, 4, 'cpu')
    buffers = poisoned_buffers(3, 4, 64, 4, 4, 'cpu')

    views = []
    view = torch.Tensor.view
    monkeypatch.setattr(torch.Tensor, 'view', lambda t, *shape: views.append(shape) or view(t, *shape))
    mhc_multilayer_recompute(*inputs, *buffers)
    assert views == [((3, 16),)] * 4
    (args,) = launched
    initial, pre, outputs, post, _ = inputs
    untouched = [initial, *pre, *outputs, *post]
    assert all(a is b for a, b in zip(args, untouched, strict=False))
    assert all(a is b for a, b in zip(args[-8:], [*buffers[0], *buffers[1]], strict=True))


# The fused kernels: (mhc_mult, hidden, layers, post layers) of each launch the tests below make, and the widest
# rows.
FUSED = [(4, 256, 3, 3), (4, 256, 2, 1), (4, 256, 4, 4), (4, 256, 1, 0), (8, 7168, 4, 4), (1, 64, 1, 1)]


@pytest.mark.parametrize('case', FUSED, ids=lambda c: 'x'.join(map(str, c)))
def test_mhc_multilayer_recompute_ascend_kernel_lowers(case):
    mhc_mult, hidden, layers, post_layers = case
    cfg = choose_mhc_multilayer_recompute_config(
        backend='ascend', mhc=mhc_mult, hidden=hidden, layers=layers, post_layers=post_layers, num_cores=64
    )
    assert hidden % cfg.tile == 0
    assert ascend_ub_bytes(mhc_mult, cfg.tile) <= ASCEND_UB_BUDGET
    lowered = assert_ascend_kernel_lowers(
        lambda: make_mhc_multilayer_recompute_kernel(cfg), key=cfg, kernel_name='mhc_multilayer_recompute_kernel'
    )
    # One VF a layer: the residual goes from layer to layer through UB, not through GM.
    assert lowered.source.count('__simd_vf__') >= layers


@pytest.mark.parametrize('case', FUSED, ids=lambda c: 'x'.join(map(str, c)))
def test_mhc_multilayer_recompute_cuda_kernel_lowers(case):
    mhc_mult, hidden, layers, post_layers = case
    cfg = choose_mhc_multilayer_recompute_config(
        backend='cuda', mhc=mhc_mult, hidden=hidden, layers=layers, post_layers=post_layers, num_cores=132
    )
    lowered = assert_cuda_kernel_lowers(
        lambda: make_mhc_multilayer_recompute_kernel(cfg), key=cfg, kernel_name='mhc_multilayer_recompute_kernel'
    )
    # 16-byte accesses, the residual in registers from layer to layer: no shared memory, no barrier.
    assert 'uint4' in lowered.source
    assert '__shared__' not in lowered.source
    assert '__syncthreads' not in lowered.source


@pytest.mark.parametrize('prefetch', range(LAYERS_PER_LAUNCH))
def test_mhc_multilayer_recompute_cuda_kernel_lowers_at_every_prefetch(prefetch):
    """Every distance the loads may run ahead (the device runs the default one): the same 16-byte accesses, each
    layer's reads and writes once."""
    cfg = dataclasses.replace(
        choose_mhc_multilayer_recompute_config(
            backend='cuda', mhc=4, hidden=256, layers=3, post_layers=2, num_cores=132
        ),
        prefetch=prefetch,
    )
    lowered = assert_cuda_kernel_lowers(
        lambda: make_mhc_multilayer_recompute_kernel(cfg), key=cfg, kernel_name='mhc_multilayer_recompute_kernel'
    )
    for k in range(3):
        assert f'li{k} + ' in lowered.source
        assert f'pre{k}[' in lowered.source
    assert 'lo2' not in lowered.source.split('{', 1)[1]  # the third layer has no post mapping: its slot untouched


def test_mhc_multilayer_recompute_ascend_tiles():
    """The widest tile dividing H whose buffers fit: half of H = 4096 at M = 4, a seventh of 7168 at M = 8."""
    choose = choose_mhc_multilayer_recompute_config
    assert choose(backend='ascend', mhc=4, hidden=4096, layers=4, post_layers=4, num_cores=64).tile == 2048
    assert choose(backend='ascend', mhc=8, hidden=7168, layers=4, post_layers=4, num_cores=64).tile == 1024


@pytest.mark.parametrize(
    ('fields', 'match'),
    [
        ({'backend': 'npu'}, 'backend must be "ascend" or "cuda"'),
        ({'mhc': 9}, 'mhc must be in'),
        ({'hidden': 96}, 'hidden must be a positive multiple'),
        ({'layers': LAYERS_PER_LAUNCH + 1}, 'layers must be in'),
        ({'post_layers': 1}, 'post_layers'),
        ({'tile': 96}, 'tile 96'),
        ({'threads': 48}, 'threads must be'),
        ({'prefetch': -1}, 'prefetch must be in'),
        ({'prefetch': LAYERS_PER_LAUNCH}, 'prefetch must be in'),
        ({'hidden': 65536, 'tile': 65536}, 'UB budget'),
    ],
)
def test_mhc_multilayer_recompute_config_rejects(fields, match):
    base = {'backend': 'ascend', 'mhc': 4, 'hidden': 256, 'layers': 3, 'post_layers': 3, 'num_cores': 64, 'tile': 256}
    with pytest.raises(ValueError, match=match):
        MhcMultilayerRecomputeConfig(**base | fields)


def test_mhc_multilayer_recompute_is_a_composition_not_an_op():
    """No torch.library op of its own: torch.compile traces through it into its stages' ops (the eager call takes
    the fused kernel)."""
    assert 'mhc_multilayer_recompute' not in OPERATORS


def test_mhc_multilayer_recompute_compiles_into_one_graph():
    record = GraphRecorder()

    def step(*args):
        mhc_multilayer_recompute(*args)
        return args[5][-1] * 2, args[6][-1].sum()

    with FakeTensorMode():
        args = _zeros(L=2, L_post=1, device='cuda')
        doubled, _ = torch.compile(step, fullgraph=True, backend=record)(*args)
        assert doubled.shape == (4, 256)
    assert len(record.graphs) == 1
    targets = [str(n.target) for n in record.graphs[0].graph.nodes if n.op == 'call_function']
    stages = [t for t in targets if 'mhc_pre_apply_mix_fwd' in t or 'mhc_post_fwd' in t]
    assert len(stages) == 3, targets  # apply, post, apply


# Device tier.


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_mhc_multilayer_recompute_values(params, device):
    """Each layer against the float64 reference from the layer's own input residual (one bf16 rounding per
    result); bit for bit the stages called one by one (the fused kernel against the stages' kernels)."""
    mhc_mult, hidden, layers, post_layers = params['case']
    for num_tokens in NUM_TOKENS:
        inputs = make_inputs(num_tokens, mhc_mult, hidden, layers, post_layers, device)
        layer_inputs, residuals = poisoned_buffers(num_tokens, mhc_mult, hidden, layers, post_layers, device)
        assert mhc_multilayer_recompute(*inputs, layer_inputs, residuals) is None
        expected_inputs, expected_residuals = chain(*inputs)
        for actual, expected in zip([*layer_inputs, *residuals], [*expected_inputs, *expected_residuals], strict=True):
            assert_equal(actual, expected)
        starts = [inputs[0], *residuals]
        cpu = [[t.cpu() for t in ts] for ts in inputs[1:]]
        for layer in range(layers):
            one = [ts[layer : layer + 1] for ts in cpu]
            (ref_input,), ref_residual = mhc_multilayer_recompute_ref(starts[layer].cpu(), *one)
            # bf16: half an ulp of the result (2**-8 relative) and the fp32 sums' error on the sum of magnitudes.
            magnitude = (starts[layer].cpu().double().abs() * 2).sum(-2)
            bound = 2.0**-7 * ref_input.double().abs() + 2.0**-16 * magnitude
            assert bool(((layer_inputs[layer].cpu().double() - ref_input.double()).abs() <= bound).all()), layer
            if layer < post_layers:
                got, want = residuals[layer].cpu().double(), ref_residual[0].double()
                scale = 2.0**-16 * (magnitude.unsqueeze(-2) + 2 * inputs[2][layer].cpu().double().abs().unsqueeze(-2))
                assert bool(((got - want).abs() <= 2.0**-7 * want.abs() + scale).all()), layer


@pytest.mark.npu
def test_mhc_multilayer_recompute_empty(device):
    """0 tokens: nothing launched, the buffers untouched (empty)."""
    inputs = make_inputs(0, 4, 256, 2, 2, device)
    buffers = poisoned_buffers(0, 4, 256, 2, 2, device)
    assert mhc_multilayer_recompute(*inputs, *buffers) is None


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_mhc_multilayer_recompute_benchmark(params, device, benchmark_timer, benchmark_record):
    num_tokens, hidden = params['num_tokens'], params['hidden']
    shape = (num_tokens, BENCHMARK_MULT, hidden, BENCHMARK_LAYERS, BENCHMARK_LAYERS)
    inputs = make_inputs(*shape, device)
    buffers = poisoned_buffers(*shape, device)
    args = (*inputs, *buffers)
    mhc_multilayer_recompute(*args)  # compile and warm up outside the timing
    time_us = benchmark_timer(lambda: mhc_multilayer_recompute(*args))
    tensors = [inputs[0], *(t for ts in (*inputs[1:], *buffers) for t in ts)]
    benchmark_record(
        kernel=record_name('mhc', 'mhc_multilayer_recompute'),
        operation='fwd',
        params={**params, 'mhc_mult': BENCHMARK_MULT, 'layers': BENCHMARK_LAYERS},
        time_us=time_us,
        bandwidth_gbs=count_bytes(*tensors) / time_us / 1e3,
    )
