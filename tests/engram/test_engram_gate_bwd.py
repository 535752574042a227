"""engram_gate_bwd: formulas vs autograd and lowering (CPU tier), argument contract (CPU tier), values and
benchmark (device)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import sys

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang import config, engram_gate_bwd, operator
from cann_ops_tilelang.config import get_num_cores
from cann_ops_tilelang.engram import EngramGateBwdResult, _gate_bwd_counters
from cann_ops_tilelang.engram import engram_gate_bwd_kernel as gb_k
from cann_ops_tilelang.engram._contract import HIDDEN_ALIGN, MAX_HC, MAX_HIDDEN
from cann_ops_tilelang.engram.engram_gate_bwd_kernel import (
    COUNTER_WORDS,
    choose_engram_gate_bwd_config,
    cuda_plan_widths,
    fixed_range_max_tokens,
    get_engram_gate_bwd_kernel,
    make_engram_gate_bwd_kernel,
)
from cann_ops_tilelang.kernel_target import Launcher
from tests.engram.engram_gate_bwd_ref import engram_gate_bwd_autograd_ref, engram_gate_bwd_ref
from tests.engram.engram_gate_fwd_ref import engram_gate_fwd_ref
from tests.engram.lowering_grids import GATE_BWD_CHUNKED_CUDA_SHAPES, GATE_BWD_CLUSTER_CUDA_SHAPES
from tests.testing.bench import config_extras, make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import (
    BENCHMARK_HC,
    BENCHMARK_HIDDEN,
    by_level,
    gen_benchmark_shapes,
    gen_hc,
    gen_hidden,
    gen_num_tokens,
    generate_samples,
    get_test_level,
    skip_off_ascend_below,
)
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import calc_diff, count_bytes

KERNEL_NAME = 'engram_gate_bwd_kernel'
engram_gate_bwd_config = engram_gate_bwd.operator.config  # the configuration a call launches (no launch)
EPS = 1e-6
CLAMP = 1e-6
U32 = 2.0**-24  # fp32 unit roundoff
U16 = 2.0**-8  # bf16 unit roundoff (round to nearest)
_CHECK_CHUNK_TOKENS = 512  # tokens per chunk of _check_result's references
# The most tokens a call on the faked H200 takes fixed token ranges with (more: its blocks claim tokens).
_FIXED_LIMIT = fixed_range_max_tokens(H200_SMS)

LEVEL = get_test_level()
SHAPES = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden)
VALUE_PARAMS = generate_samples(
    LEVEL, hc=gen_hc, hidden=gen_hidden, num_tokens=gen_num_tokens, where=lambda p: p['num_tokens'] > 0
)
# Both sides of every width where the CUDA plan changes class, every hc (the device tests of level 1).
PLAN_WIDTHS = [{'hc': hc, 'hidden': h} for hc in range(1, MAX_HC + 1) for h in cuda_plan_widths(hc, H200_SMS)]


def _inputs(num_tokens: int, hc: int, hidden: int, device, *, clamp_value: float = CLAMP):
    """The operator's tensor arguments: grad_out, x, the packed kv (T, hc + 1, H), w and the forward's saved
    dot, gate_score, rstd_x, rstd_k (fp32 reference).

    Drawn on the device, in the final dtype: the CPU generator would take seconds at the large shapes.
    """
    x = torch.randn(num_tokens, hc, hidden, dtype=torch.bfloat16, device=device)
    kv = torch.randn(num_tokens, hc + 1, hidden, dtype=torch.bfloat16, device=device)
    wh = (1.0 + 0.5 * torch.randn(hc, hidden, device=device)).to(torch.bfloat16)
    we = (1.0 + 0.5 * torch.randn(hc, hidden, device=device)).to(torch.bfloat16)
    w = wh.float() * we.float()  # engram_fused_weight: exact in fp32
    grad_out = torch.randn(num_tokens, hc, hidden, dtype=torch.bfloat16, device=device)
    fwd = engram_gate_fwd_ref(x, kv[:, :hc], kv[:, hc], w, eps=EPS, clamp_value=clamp_value)
    return grad_out, x, kv, w, fwd.dot, fwd.gate_score, fwd.rstd_x, fwd.rstd_k


def _split(inputs):
    """(grad_out, x, k, v, w, dot, g, rx, rk): the references' arguments, k and v views of kv."""
    grad_out, x, kv, *rest = inputs
    hc = kv.shape[1] - 1
    return (grad_out, x, kv[:, :hc], kv[:, hc], *rest)


def _error_bounds(
    grad_out, x, k, v, w, dot, g, rx, rk, *, clamp_value, num_partials, rounded, image_token_mask=None, num_tokens=None
):
    """Element-wise bounds on |actual - autograd| for the four grads (fp64, justified term by term).

    Both sides evaluate the same exact expressions in fp32 in different orders. rfac = g(1-g) / 2 *
    sqrt(s rx rk / |dot|) (0 where clamped; the clamp decision uses the same fp32 d on both sides).
    - dL/dg sums H products: error <= (H + 8) u32 sum|go v|, so |dr| <= rfac (H + 8) u32 sum|go v| + 8 u32 |r|.
    - grad_x = go + r (k w - x cx): few-ulp evaluation error of the terms plus |dr| (|k w| + |x cx|);
      grad_k likewise; grad_v sums hc products; grad_w sums T products per block then P partials.
    Doubled for the two sides; bf16 outputs (`rounded`) add round-to-nearest: u16 |expected| + u16 err.
    Image tokens (image_token_mask) have r = 0 and g = 0 whatever their saved values.
    """
    f = torch.float64
    go, xf, kf, vf, wf = (t.to(f) for t in (grad_out, x, k, v, w))
    dot, g, rx, rk = (t.to(f) for t in (dot, g, rx, rk))
    hidden = xf.shape[-1]
    s = hidden**-0.5
    d = dot.float() * rx.float() * rk.float() * s  # the fp32 decision of the kernels and the reference
    rfac = g * (1 - g) * 0.5 * torch.sqrt(s * rx * rk / dot.abs())
    rfac = torch.where(d.abs() < clamp_value, torch.zeros_like(rfac), rfac)
    if image_token_mask is not None:
        rfac = torch.where(image_token_mask[:, None], torch.zeros_like(rfac), rfac)
        g = torch.where(image_token_mask[:, None], torch.zeros_like(g), g)
    gv_abs = (go * vf.unsqueeze(-2)).abs().sum(-1)
    r = (go * vf.unsqueeze(-2)).sum(-1) * rfac
    dr = (rfac * (hidden + 8) * U32 * gv_abs + 8 * U32 * r.abs()).unsqueeze(-1)
    r3 = r.abs().unsqueeze(-1)
    kw, xw = (kf * wf).abs(), (xf * wf).abs()
    xcx = (xf * (dot * rx * rx / hidden).unsqueeze(-1)).abs()
    kck = (kf * (dot * rk * rk / hidden).unsqueeze(-1)).abs()
    err_x = 8 * U32 * (go.abs() + r3 * (kw + xcx)) + dr * (kw + xcx)
    err_k = 8 * U32 * r3 * (xw + kck) + dr * (xw + kck)
    err_v = (go.shape[1] + 4) * U32 * (go * g.unsqueeze(-1)).abs().sum(-2)
    num_tokens = xf.shape[0] if num_tokens is None else num_tokens  # all the call's: these may be a chunk of them
    err_w = (num_tokens + num_partials + 8) * U32 * (r3 * (xf * kf).abs()).sum(0) + (dr * (xf * kf).abs()).sum(0)
    bounds = [2 * e for e in (err_x, err_k, err_v, err_w)]
    if rounded:
        bounds[:3] = [(1 + U16) * b for b in bounds[:3]]
    return bounds


def _assert_within(name, actual, expected, bound, *, rounded):
    err = (actual.double() - expected.double()).abs()
    limit = bound + (U16 * expected.double().abs() if rounded else 0.0)
    bad = ~(err <= limit)  # NaN fails too
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f'{name}: {int(bad.sum())} of {actual.numel()} elements off; first at {first}: '
            f'{actual[first].item()!r} vs {expected[first].item()!r}, limit {limit[first].item():.3g}'
        )


def _clamp_between(dot, rx, rk, hidden):
    """A clamp_value in the widest relative gap between the middle half of the sorted |d|: between 25 % and
    75 % of the (token, branch) pairs are clamped, and no |d| is near the clamp."""
    d = (dot * rx * rk * hidden**-0.5).abs().flatten().sort().values
    gaps = d[1:] / d[:-1].clamp_min(1e-30)  # gaps[i]: from d[i] to d[i + 1]
    quarter = len(d) // 4
    i = quarter + int(gaps[quarter : len(d) - quarter - 1].argmax())
    return float((d[i] * d[i + 1]).sqrt())  # d[: i + 1] are clamped


# ---------------------------------------------------------------- CPU tier: the formulas are right


@pytest.mark.parametrize(
    'params',
    [{'num_tokens': 9, 'hc': 3, 'hidden': 192}, {'num_tokens': 40, 'hc': 4, 'hidden': 1088}],
    ids=make_param_id,
)
@pytest.mark.parametrize('clamped', [False, True], ids=['clamp=1e-6', 'clamp=median'])
def test_engram_gate_bwd_formulas_match_autograd(params, clamped):
    """engram.md's explicit formulas (fp64, from the saved tensors) equal autograd of the forward (fp32)."""
    inputs = _inputs(params['num_tokens'], params['hc'], params['hidden'], 'cpu')
    grad_out, x, k, v, w, dot, g, rx, rk = _split(inputs)
    clamp_value = _clamp_between(dot, rx, rk, params['hidden']) if clamped else 1e-6
    if clamped:  # the saved tensors do not depend on the clamp; the gate does
        g = engram_gate_fwd_ref(x, k, v, w, eps=EPS, clamp_value=clamp_value).gate_score
    formulas = engram_gate_bwd_ref(
        grad_out, x, k, v, w, dot, g, rx, rk, clamp_value=clamp_value, compute_dtype=torch.float64
    )
    autograd = engram_gate_bwd_autograd_ref(grad_out, x, k, v, w, eps=EPS, clamp_value=clamp_value)
    bounds = _error_bounds(grad_out, x, k, v, w, dot, g, rx, rk, clamp_value=clamp_value, num_partials=1, rounded=False)
    for name, a, e, b in zip(('grad_x', 'grad_k', 'grad_v', 'grad_w'), formulas, autograd, bounds, strict=True):
        _assert_within(name, a, e, b, rounded=False)
    d = dot * rx * rk * params['hidden'] ** -0.5
    zero_rows = d.abs() < clamp_value
    assert bool(zero_rows.any()) == clamped
    assert torch.equal(formulas.grad_k[zero_rows], torch.zeros_like(formulas.grad_k[zero_rows]))
    assert torch.equal(autograd.grad_k[zero_rows], torch.zeros_like(autograd.grad_k[zero_rows]))


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_gate_bwd_ascend_lowers(params):
    cfg = choose_engram_gate_bwd_config(backend='ascend', **params, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.hc, cfg.hidden, cfg.num_cores) == ('ascend', params['hc'], params['hidden'], 64)
    assert cfg.variant == 'chunked'
    assert cfg.num_blocks == 64  # P: one slice of grad_w_partial per vector core
    assert params['hidden'] % cfg.tile_cols == 0
    assert cfg.tile_cols % 64 == 0
    assert cfg.token_chunk * params['hc'] <= 64  # one vector register of per-(token, branch) scalars
    lowered = assert_ascend_kernel_lowers(lambda: make_engram_gate_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'num_tokens' in lowered.source  # T stays a runtime argument


# The CPU tier lowers with TileLang's default pass configs (tests/testing/lowering.py); the compiled kernel
# also carries tilelang_pass_configs (no automatic shared-memory barriers: its staging slots are
# thread-private), so the lowered source here may hold a few barriers the device kernel does not.
@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_gate_bwd_cuda_lowers(params):
    cfg = choose_engram_gate_bwd_config(backend='cuda', **params, num_cores=H200_SMS)
    assert (cfg.backend, cfg.hc, cfg.hidden) == ('cuda', params['hc'], params['hidden'])
    assert cfg.num_blocks == H200_SMS // cfg.cluster  # one slice of grad_w_partial per token's block or cluster
    if params['hc'] * params['hidden'] <= 4 * 7168:
        assert cfg.variant == 'resident'  # the one-pass kernel up to the benchmark's hc * H at least
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_gate_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'num_tokens' in lowered.source
    assert 'cp_async' in lowered.source  # 16-byte asynchronous staging
    if cfg.variant == 'resident' and cfg.cluster == 1:
        # The prologue stages x / k of the first token only once its grad_out / v have arrived.
        first_x_k = lowered.source.index('((bfloat16_t*)x_s)[')
        assert 0 <= lowered.source.find('tl::cp_async_wait<0>();') < first_x_k, 'x / k staged with grad_out / v'
        assert cfg.dynamic_tokens
        assert 'AtomicAddRet((&(token_counter[0])), 1)' in lowered.source  # the blocks claim tokens
        # ... and the last of the T claims (the one that gets T - 1 back) resets the counter for the next
        # launch on the stream, where the claim's value is published; nothing else touches the counter.
        assert re.search(
            r'if \(claim == \(num_tokens - 1\)\) \{\s*token_counter\[0\] = 0;\s*\}\s*'
            r'\(\(int\*\)tok_s\)\[\(sl & 1\)\] = \(claim \+ ' + str(3 * H200_SMS) + r'\);',
            lowered.source,
        ), 'no reset of the counter by the last claim'
        assert lowered.source.count('token_counter[') == 2  # the claim and the reset
        assert lowered.source.count('Atomic') == 1  # no count of the blocks done
        fixed = choose_engram_gate_bwd_config(backend='cuda', **params, num_cores=H200_SMS, deterministic=True)
        assert not fixed.dynamic_tokens
        lowered = assert_cuda_kernel_lowers(
            lambda: make_engram_gate_bwd_kernel(fixed), key=fixed, kernel_name=KERNEL_NAME
        )
        assert 'Atomic' not in lowered.source  # fixed token ranges: nothing to claim
        assert 'token_counter[' not in lowered.source  # nor to reset


@pytest.mark.parametrize('params', GATE_BWD_CLUSTER_CUDA_SHAPES, ids=make_param_id)
@pytest.mark.parametrize('has_mask', [False, True], ids=['plain', 'mask'])
def test_engram_gate_bwd_cuda_cluster_lowers(params, has_mask):
    """A token split over 2 CTAs: each stages half its columns, pushes its per-warp dL/dg partials into both
    CTAs' shared memory and waits at the cluster barrier before reading them; fixed token ranges per cluster
    (no claims, no counter), and one grad_w_partial slice per cluster (P = SMs / 2)."""
    cfg = choose_engram_gate_bwd_config(backend='cuda', **params, num_cores=H200_SMS, has_mask=has_mask)
    assert (cfg.variant, cfg.cluster, cfg.num_blocks, cfg.dynamic_tokens) == ('resident', 2, H200_SMS // 2, False)
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_gate_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    source = lowered.source
    assert source.count('map_shared_rank(') == 1  # the partials, into each CTA of the cluster
    arrive, wait = source.index('__cluster_barrier_arrive()'), source.index('__cluster_barrier_wait()')
    assert source.index('map_shared_rank(') < arrive < wait < source.index('((float*)xred_s)[', wait)
    assert 'token_counter[' not in source
    assert 'Atomic' not in source
    assert lowered.ub_bytes <= 224 * 1024
    with pytest.raises(ValueError, match='claims tokens'):
        dataclasses.replace(cfg, dynamic_tokens=True)
    with pytest.raises(ValueError, match='cluster'):
        dataclasses.replace(cfg, cluster=3)


@pytest.mark.parametrize('params', GATE_BWD_CHUNKED_CUDA_SHAPES, ids=make_param_id)
def test_engram_gate_bwd_cuda_chunked_lowers(params):
    cfg = choose_engram_gate_bwd_config(backend='cuda', **params, num_cores=H200_SMS)
    assert cfg.variant == 'chunked'
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_gate_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'token_counter[' not in lowered.source  # fixed token ranges: the counter is never touched


@pytest.mark.parametrize(
    ('backend', 'params'),
    [
        ('cuda', {'hc': 4, 'hidden': 4096}),  # resident, claimed tokens
        ('cuda', {'hc': 3, 'hidden': 192}),
        ('cuda', GATE_BWD_CHUNKED_CUDA_SHAPES[0]),  # chunked
        ('ascend', {'hc': 4, 'hidden': 4096}),
        ('ascend', {'hc': 3, 'hidden': 1088}),
    ],
    ids=lambda p: p if isinstance(p, str) else make_param_id(p),
)
def test_engram_gate_bwd_mask_variant_lowers(backend, params):
    """The image-token variant is its own kernel: it reads image_token_mask, mask=None does not."""
    cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    cfg = choose_engram_gate_bwd_config(backend=backend, **params, num_cores=cores, has_mask=True)
    assert cfg.has_mask
    lowered = lower(lambda: make_engram_gate_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'image_token_mask' in lowered.source
    assert 'grad_kv' in lowered.source  # the key and value gradients go straight into the packed grad_kv
    plain = dataclasses.replace(cfg, has_mask=False)
    lowered = lower(lambda: make_engram_gate_bwd_kernel(plain), key=plain, kernel_name=KERNEL_NAME)
    assert 'image_token_mask' not in lowered.source


def _kernel_params(prim_func) -> list[str]:
    """The prim_func's parameters in launch order: buffer names for tensors, variable names for scalars."""
    return [prim_func.buffer_map[p].name if p in prim_func.buffer_map else p.name for p in prim_func.params]


@pytest.mark.parametrize(
    ('backend', 'params', 'deterministic'),
    [
        ('cuda', {'hc': 4, 'hidden': 4096}, False),  # resident, claimed tokens
        ('cuda', {'hc': 4, 'hidden': 4096}, True),  # resident, fixed ranges
        ('cuda', GATE_BWD_CHUNKED_CUDA_SHAPES[0], False),  # chunked
        ('ascend', {'hc': 4, 'hidden': 4096}, False),
    ],
    ids=['cuda-resident', 'cuda-resident-deterministic', 'cuda-chunked', 'ascend'],
)
def test_engram_gate_bwd_kernels_take_kv_whole(backend, params, deterministic):
    """Every variant takes kv (T, hc + 1, H) as one argument with runtime outer strides and a unit last stride,
    not key and value views (one tensor fewer to convert per launch), and the counter last."""
    cores = H200_SMS if backend == 'cuda' else ASCEND_950_VECTOR_CORES
    hc, hidden = params['hc'], params['hidden']
    for has_mask in (False, True):
        cfg = choose_engram_gate_bwd_config(
            backend=backend, **params, num_cores=cores, deterministic=deterministic, has_mask=has_mask
        )
        prim_func = make_engram_gate_bwd_kernel(cfg)
        assert _kernel_params(prim_func) == [
            'grad_out', 'hidden_states', 'kv', 'weight_fused', 'dot', 'gate_score', 'rstd_x', 'rstd_k',
            *(['image_token_mask'] if has_mask else []),
            'grad_x', 'grad_kv', 'grad_w_partial', 'clamp_value', 'token_counter',
        ]  # fmt: skip
        buffers = {b.name: b for b in prim_func.buffer_map.values()}
        assert [str(d) for d in buffers['kv'].shape] == ['num_tokens', str(hc + 1), str(hidden)]
        assert [str(s) for s in buffers['kv'].strides] == ['kv_stride_t', 'kv_stride_h', '1']
        assert [int(d) for d in buffers['token_counter'].shape] == [COUNTER_WORDS]


def test_engram_gate_bwd_config_covers_supported_range():
    """Every supported (hc, H) gets a valid config on both backends (pure Python, no lowering)."""
    for hc in range(1, MAX_HC + 1):
        for hidden in range(HIDDEN_ALIGN, MAX_HIDDEN + 1, HIDDEN_ALIGN):
            cfg = choose_engram_gate_bwd_config(backend='cuda', hc=hc, hidden=hidden, num_cores=H200_SMS)
            if cfg.variant == 'resident':
                covered = cfg.threads * cfg.groups_per_thread * 8  # columns of each CTA
                cols = hidden // cfg.cluster
                assert cols <= covered < cols + 32 * 8 * cfg.groups_per_thread
                assert (3 * hc + 1) * covered * 2 <= 224 * 1024  # thread-private staging slots
                assert cfg.groups_per_thread * hc <= 8
            else:  # the chunked kernel only where neither plan fits: never at hc <= 4
                assert hc > 4
                assert hc * hidden > 32768
            asc = choose_engram_gate_bwd_config(backend='ascend', hc=hc, hidden=hidden, num_cores=64)
            assert hidden % asc.tile_cols == 0
            assert (18 * hc + 4) * asc.tile_cols <= 180 * 1024
    for hidden in BENCHMARK_HIDDEN:  # the benchmark shapes take the one-pass kernel, one CTA per token
        cfg = choose_engram_gate_bwd_config(backend='cuda', hc=4, hidden=hidden, num_cores=132)
        assert (cfg.variant, cfg.cluster) == ('resident', 1)
    with pytest.raises(ValueError, match='backend'):
        dataclasses.replace(choose_engram_gate_bwd_config(backend='cuda', hc=4, hidden=64, num_cores=1), backend='x')


def test_engram_gate_bwd_plan_widths_are_the_class_changes():
    """cuda_plan_widths lists both sides of each width where the chooser's plan class changes (cluster, groups per
    thread, where the weight lives, the shared-memory tier, chunked), and no other width."""
    for hc in range(1, MAX_HC + 1):
        widths = set(cuda_plan_widths(hc, H200_SMS))
        classes = {
            hidden: gb_k._cuda_plan_class(
                choose_engram_gate_bwd_config(backend='cuda', hc=hc, hidden=hidden, num_cores=H200_SMS)
            )
            for hidden in range(HIDDEN_ALIGN, MAX_HIDDEN + 1, HIDDEN_ALIGN)
        }
        changes = {h for h in classes if h > HIDDEN_ALIGN and classes[h] != classes[h - HIDDEN_ALIGN]}
        assert widths == changes | {h - HIDDEN_ALIGN for h in changes}
    assert 8192 in cuda_plan_widths(4, H200_SMS)  # one CTA up to 8192, a cluster from 8256
    assert 8256 in cuda_plan_widths(4, H200_SMS)


def test_engram_gate_bwd_config_token_schedule():
    """Only the resident CUDA kernel claims tokens at run time, and not in deterministic mode."""
    resident = choose_engram_gate_bwd_config(backend='cuda', hc=4, hidden=7168, num_cores=132)
    assert (resident.variant, resident.dynamic_tokens) == ('resident', True)
    fixed = choose_engram_gate_bwd_config(backend='cuda', hc=4, hidden=7168, num_cores=132, deterministic=True)
    assert (fixed.variant, fixed.dynamic_tokens) == ('resident', False)
    for params in GATE_BWD_CHUNKED_CUDA_SHAPES:
        for deterministic in (False, True):
            chunked = choose_engram_gate_bwd_config(
                backend='cuda', **params, num_cores=132, deterministic=deterministic
            )
            assert (chunked.variant, chunked.dynamic_tokens) == ('chunked', False)
    ascend = choose_engram_gate_bwd_config(backend='ascend', hc=4, hidden=7168, num_cores=64)
    assert not ascend.dynamic_tokens
    chunked = choose_engram_gate_bwd_config(backend='cuda', hc=8, hidden=MAX_HIDDEN, num_cores=132)
    with pytest.raises(ValueError, match='claims tokens'):
        dataclasses.replace(chunked, dynamic_tokens=True)
    with pytest.raises(ValueError, match='claims tokens'):
        dataclasses.replace(ascend, dynamic_tokens=True)


# The mask variant's schedules at each CUDA plan: resident with claimed tokens, with fixed ranges, split over a
# cluster, chunked (the level-1 device test runs the same plans).
_MASK_AHEAD_PLANS = [
    ({'hc': 4, 'hidden': 4096}, False),
    ({'hc': 4, 'hidden': 4096}, True),
    (GATE_BWD_CLUSTER_CUDA_SHAPES[0], False),
    (GATE_BWD_CHUNKED_CUDA_SHAPES[0], False),
]
_MASK_AHEAD_IDS = ['resident-claimed', 'resident-fixed', 'cluster', 'chunked']


@pytest.mark.parametrize(('params', 'deterministic'), _MASK_AHEAD_PLANS, ids=_MASK_AHEAD_IDS)
def test_engram_gate_bwd_mask_schedules_lower(params, deterministic):
    """The mask variant's schedules. mask_ahead: the resident kernel's thread 0 loads the mask of c_(i + 2) at
    the top of iteration i into a ring in shared memory (the first two tokens' in the prologue), which every
    thread reads after the wait for grad_out; the chunked kernel reads a token's mask once in phase A and keeps
    it in shared memory for phase B. mask_results (resident): phase B's image-token results chosen after every value
    is computed, by ternaries ('select') or bit masks ('bitwise'), instead of if_then_else per element."""
    cfg = choose_engram_gate_bwd_config(
        backend='cuda', **params, num_cores=H200_SMS, deterministic=deterministic, has_mask=True
    )
    # the chooser keeps the measured schedule (gb_k._CUDA_MASK_AHEAD, _CUDA_MASK_RESULTS)
    assert not cfg.mask_ahead
    assert cfg.mask_results == 'if_then_else'
    ahead = dataclasses.replace(cfg, mask_ahead=True)
    old = assert_cuda_kernel_lowers(lambda: make_engram_gate_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    new = assert_cuda_kernel_lowers(lambda: make_engram_gate_bwd_kernel(ahead), key=ahead, kernel_name=KERNEL_NAME)
    assert 'msk_s' in new.source
    assert new.ub_bytes <= 224 * 1024
    if cfg.variant == 'chunked':
        assert old.source.count('image_token_mask[') == 2  # phase A per tile, phase B per tile and branch
        assert new.source.count('image_token_mask[') == 1  # phase A, once per token
        with pytest.raises(ValueError, match='mask_results'):
            dataclasses.replace(cfg, mask_results='bitwise')
        return
    assert old.source.count('image_token_mask[') == 1  # at the token's start
    assert new.source.count('image_token_mask[') == 3  # c_0 and c_1 in the prologue, c_(i + 2) in the loop
    assert new.source.index('m2 = ') < new.source.index('cp_async_wait<1>')  # issued before the token's wait
    for results in (
        dataclasses.replace(cfg, mask_results='select'),
        dataclasses.replace(cfg, mask_results='bitwise'),
        dataclasses.replace(ahead, mask_results='bitwise'),
    ):
        lowered = assert_cuda_kernel_lowers(
            lambda results=results: make_engram_gate_bwd_kernel(results), key=results, kernel_name=KERNEL_NAME
        )
        # no if / else around a value in phase B ('condval': the clamp's r is left)
        assert lowered.source.count('condval') < old.source.count('condval')
        # 'bitwise': the all-ones word of an image token, through a byte permute
        assert ('__byte_perm(((uint)0 - ' in lowered.source) == (results.mask_results == 'bitwise')


def test_engram_gate_bwd_mask_schedules_config(monkeypatch):
    """mask_ahead and mask_results are schedules of the CUDA mask variant (mask_results: of the resident kernel);
    the chooser gives them (with _CUDA_MASK_AHEAD, _CUDA_MASK_RESULTS) to resident plans with registers to spare,
    not to those at 128 registers a thread, and mask_ahead to the chunked kernel."""
    cfg = choose_engram_gate_bwd_config(backend='cuda', hc=4, hidden=1024, num_cores=H200_SMS, has_mask=True)
    for field, value in (('mask_ahead', True), ('mask_results', 'bitwise')):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(cfg, has_mask=False, **{field: value})
    with pytest.raises(ValueError, match='mask_results must be one of'):
        dataclasses.replace(cfg, mask_results='branch')
    ascend = choose_engram_gate_bwd_config(backend='ascend', hc=4, hidden=1024, num_cores=64, has_mask=True)
    with pytest.raises(ValueError, match='mask_ahead'):
        dataclasses.replace(ascend, mask_ahead=True)
    monkeypatch.setattr(gb_k, '_CUDA_MASK_AHEAD', True)
    monkeypatch.setattr(gb_k, '_CUDA_MASK_RESULTS', 'bitwise')
    for hc, hidden, spare in [(1, 1024, True), (4, 2560, True), (8, 4096, True), (4, 7168, False),
                              (2, 14336, False), (4, 16384, False)]:  # fmt: skip
        for has_mask in (False, True):
            cfg = choose_engram_gate_bwd_config(backend='cuda', hc=hc, hidden=hidden, num_cores=132, has_mask=has_mask)
            assert cfg.mask_ahead == (has_mask and spare), (hc, hidden, has_mask)
            assert cfg.mask_results == ('bitwise' if has_mask and spare else 'if_then_else'), (hc, hidden, has_mask)
    chunked = choose_engram_gate_bwd_config(backend='cuda', hc=8, hidden=8192, num_cores=132, has_mask=True)
    assert (chunked.variant, chunked.mask_ahead, chunked.mask_results) == ('chunked', True, 'if_then_else')
    ascend = choose_engram_gate_bwd_config(backend='ascend', hc=4, hidden=1024, num_cores=64, has_mask=True)
    assert not ascend.mask_ahead


# ---------------------------------------------------------------- CPU tier: argument contract

_ARG_NAMES = ('grad_out', 'hidden_states', 'kv', 'weight_fused', 'dot', 'gate_score', 'rstd_x', 'rstd_k')
_ARG_DTYPES = (torch.bfloat16,) * 3 + (torch.float32,) * 5


def _cpu_args(num_tokens=3, hc=4, hidden=128):
    """The eight tensors and clamp_value, positional as TileKernels' engram_gate_bwd takes them."""
    return [*_inputs(num_tokens, hc, hidden, 'cpu'), CLAMP]


def _call(*args, **kwargs):
    return cann_ops_tilelang.engram_gate_bwd(*args, **kwargs)


def test_engram_gate_bwd_signature():
    """TileKernels 2.1.0's parameter names, order and defaults."""
    params = inspect.signature(cann_ops_tilelang.engram_gate_bwd).parameters
    assert list(params) == [*_ARG_NAMES, 'clamp_value', 'image_token_mask']
    assert params['clamp_value'].default is inspect.Parameter.empty
    assert params['image_token_mask'].default is None
    assert EngramGateBwdResult._fields == ('grad_hidden_states', 'grad_kv', 'grad_w_partial')


@pytest.mark.parametrize('index', range(8), ids=_ARG_NAMES)
def test_engram_gate_bwd_rejects_non_tensors_and_dtypes(index):
    args = _cpu_args()
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=_ARG_DTYPES[index],
        non_tensors=(args[index].float().numpy(), None),
        wrong_dtype=torch.float16,
    )


@pytest.mark.parametrize('index', range(8), ids=_ARG_NAMES)
def test_engram_gate_bwd_rejects_shapes(index):
    args = _cpu_args()
    name = _ARG_NAMES[index]
    assert_rejects_extra_dimension(_call, args, index, name=name)
    bad = list(args)
    if index == 1:  # hidden_states defines T, hc, H: a mismatch is reported on another tensor
        bad[index] = args[index][:2].contiguous()
        with pytest.raises(ValueError, match=r'grad_out must have shape \(2, 4, 128\)'):
            _call(*bad)
        return
    for cut in range(args[index].dim()):  # one fewer row along each axis (kv: hc rows instead of hc + 1)
        shrunk = args[index].narrow(cut, 0, args[index].shape[cut] - 1).contiguous()
        bad[index] = shrunk
        expected = tuple(args[index].shape)
        with pytest.raises(ValueError, match=f'{name} must have shape {re.escape(str(expected))}'):
            _call(*bad)
    if index == 2:  # kv with one middle row too many
        bad[index] = torch.zeros(3, 6, 128, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=re.escape('kv must have shape (3, 5, 128)')):
            _call(*bad)


@pytest.mark.parametrize(
    ('hc', 'hidden', 'match'),
    [
        (0, 128, 'hc'),
        (9, 128, 'hc'),
        (4, 96, 'multiple of 64'),
        (1, 16384 + 64, 'multiple of 64 up to 16384'),
    ],
)
def test_engram_gate_bwd_rejects_hc_hidden(hc, hidden, match):
    args = [
        torch.zeros(2, hc, hidden, dtype=torch.bfloat16),
        torch.zeros(2, hc, hidden, dtype=torch.bfloat16),
        torch.zeros(2, hc + 1, hidden, dtype=torch.bfloat16),
        torch.zeros(hc, hidden),
    ] + [torch.zeros(2, hc) for _ in range(4)]
    with pytest.raises(ValueError, match=match):
        _call(*args, CLAMP)


@pytest.mark.parametrize('index', [0, 1, 3, 4, 5, 6, 7], ids=[_ARG_NAMES[i] for i in (0, 1, 3, 4, 5, 6, 7)])
def test_engram_gate_bwd_rejects_non_contiguous(index):
    args = _cpu_args()
    bad = list(args)
    wide = torch.zeros(*args[index].shape[:-1], 2 * args[index].shape[-1], dtype=args[index].dtype)
    bad[index] = wide[..., : args[index].shape[-1]]  # rows twice as far apart
    with pytest.raises(ValueError, match=f'{_ARG_NAMES[index]} must be contiguous'):
        _call(*bad)


def test_engram_gate_bwd_kv_layouts():
    """kv: any outer strides pass validation (the CPU device is rejected next); the last must be 1."""
    args = _cpu_args()
    good = list(args)
    wide = torch.zeros(3, 5, 3 * 128 + 8, dtype=torch.bfloat16)
    good[2] = wide[..., 5 : 5 + 128]  # odd offset and strides
    with pytest.raises(RuntimeError, match='no kernels'):
        _call(*good)
    good[2] = args[2][:, :1].expand(-1, 5, -1)  # one row broadcast over keys and value
    with pytest.raises(RuntimeError, match='no kernels'):
        _call(*good)
    bad = list(args)
    bad[2] = args[2].transpose(-1, -2).contiguous().transpose(-1, -2)  # last stride != 1
    with pytest.raises(ValueError, match='kv must have a contiguous last dimension'):
        _call(*bad)


def test_engram_gate_bwd_rejects_mask():
    args = _cpu_args()
    with pytest.raises(TypeError, match='image_token_mask must be a torch.Tensor'):
        _call(*args, [True, False, True])
    for dtype in (torch.uint8, torch.int64, torch.float32):
        with pytest.raises(TypeError, match='image_token_mask must have dtype torch.bool'):
            _call(*args, torch.zeros(3, dtype=dtype))
    with pytest.raises(ValueError, match='image_token_mask must have 1 dimensions'):
        _call(*args, torch.zeros(1, 3, dtype=torch.bool))
    for size in (2, 4):
        with pytest.raises(ValueError, match=r'image_token_mask must have shape \(3,\)'):
            _call(*args, image_token_mask=torch.zeros(size, dtype=torch.bool))
    with pytest.raises(ValueError, match='image_token_mask must be contiguous'):
        _call(*args, torch.zeros(3, 2, dtype=torch.bool)[:, 0])
    with pytest.raises(RuntimeError, match='one device'):
        _call(*args, torch.zeros(3, dtype=torch.bool, device='meta'))
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):  # valid: the device check
        _call(*args, torch.zeros(3, dtype=torch.bool))


@pytest.mark.parametrize(
    ('value', 'error', 'match'),
    [
        ('1e-6', TypeError, 'clamp_value must be a float'),
        (None, TypeError, 'clamp_value must be a float'),
        (True, TypeError, 'clamp_value must be a float'),
        (torch.tensor(1e-6), TypeError, 'clamp_value must be a float'),
        (0.0, ValueError, 'clamp_value must be a finite number > 0'),
        (-1e-6, ValueError, 'clamp_value must be a finite number > 0'),
        (float('inf'), ValueError, 'clamp_value must be a finite number > 0'),
        (float('nan'), ValueError, 'clamp_value must be a finite number > 0'),
    ],
)
def test_engram_gate_bwd_rejects_clamp_value(value, error, match):
    with pytest.raises(error, match=match):
        _call(*_cpu_args()[:8], value)


def test_engram_gate_bwd_rejects_devices():
    args = _cpu_args()
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(*args)
    with pytest.raises(RuntimeError, match='no kernels for .cpu. tensors'):
        _call(*(t[:0] for t in args[:3]), args[3], *(t[:0] for t in args[4:8]), CLAMP)  # T = 0 is validated too
    for index in range(1, 8):
        mixed = list(args)
        mixed[index] = args[index].to('meta')
        with pytest.raises(RuntimeError, match='one device'):
            _call(*mixed)
    with pytest.raises(TypeError):
        _call(*args[:8])  # clamp_value has no default (TileKernels' signature)


def _as_h200(monkeypatch) -> None:
    """CPU tensors planned as an H200's, without a device: the backend 'cuda' and the H200's SM count (asked by
    the operator for its fixed token ranges, and by the mechanism for the configuration)."""
    interface = sys.modules[engram_gate_bwd.__module__]
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    monkeypatch.setattr(interface, 'get_num_cores', lambda device: H200_SMS)
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: H200_SMS)


def test_engram_gate_bwd_config_follows_arguments(monkeypatch):
    """engram_gate_bwd_config (what the benchmark records) is the config the operator launches: the mask
    variant only with a mask, fixed token ranges under deterministic algorithms (CUDA device faked)."""
    _as_h200(monkeypatch)
    num_tokens = _FIXED_LIMIT + 1
    args = _cpu_args(num_tokens)
    cfg = engram_gate_bwd_config(*args)
    assert cfg == choose_engram_gate_bwd_config(backend='cuda', hc=4, hidden=128, num_cores=H200_SMS)
    assert (cfg.has_mask, cfg.dynamic_tokens) == (False, True)
    assert engram_gate_bwd_config(*args, torch.zeros(num_tokens, dtype=torch.bool)).has_mask
    with _deterministic_algorithms():
        assert not engram_gate_bwd_config(*args).dynamic_tokens
    small = engram_gate_bwd_config(*_cpu_args(_FIXED_LIMIT))  # a small call: fixed ranges
    assert small == dataclasses.replace(cfg, dynamic_tokens=False)


def test_engram_gate_bwd_config_checks_as_the_call(monkeypatch):
    """The configuration query checks its arguments as the call does: valid calls (a mask, kv's free outer strides,
    a parameter, an int clamp_value) pass, and a call with a violation raises the contract's typed error (CUDA
    device faked)."""
    _as_h200(monkeypatch)
    args = _cpu_args()
    mask = torch.zeros(3, dtype=torch.bool)
    broadcast = args[2][:, :1].expand(-1, 5, -1)  # kv's outer strides are free
    odd = torch.zeros(3, 5, 136, dtype=torch.bfloat16)[..., 3:131]
    for valid in (args, [*args, mask], [*args[:2], broadcast, *args[3:]], [*args[:2], odd, *args[3:]]):
        engram_gate_bwd_config(*valid)
    engram_gate_bwd_config(*args[:3], torch.nn.Parameter(args[3]), *args[4:])
    engram_gate_bwd_config(*args[:8], 1)  # an int clamp_value: valid
    for index, bad in (
        (2, args[2][:, :4]),
        (3, args[3].double()),
        (4, args[4][:2]),
        (7, args[7].t().contiguous().t()),
        (8, 0.0),
        (9, mask[:2]),
    ):
        call = [*args, None]  # ..., clamp_value, image_token_mask
        call[index] = bad
        with pytest.raises((TypeError, ValueError)):
            engram_gate_bwd_config(*call)


def _recorded_launches(monkeypatch, streams: list):
    """engram_gate_bwd on CPU tensors posing as a CUDA device's, each launch recorded as (cfg, arguments)
    instead of run; the launch stream is streams[-1] (None: the stream is capturing a CUDA graph). Returns
    the launches and the device indices whose stream was looked up."""
    launches, lookups = [], []

    class RecordingLauncher:
        def __init__(self, get_kernel, cfg, device):
            self.cfg, self.device = cfg, device

        def launch(self, *args):
            launches.append((self.cfg, args))

    monkeypatch.setattr(operator, 'Launcher', RecordingLauncher)
    monkeypatch.setattr(engram_gate_bwd.operator, '_launchers', {})
    for name in ('COUNTERS', 'UNUSED_COUNTERS'):
        monkeypatch.setattr(_gate_bwd_counters, name, {})
    _as_h200(monkeypatch)
    monkeypatch.setattr(_gate_bwd_counters, 'launch_stream', lambda index: lookups.append(index) or streams[-1])
    return launches, lookups


def test_engram_gate_bwd_token_counter_per_stream(monkeypatch):
    """The claiming kernel gets one kept, zero-filled counter per stream (it leaves it at zero itself), and a
    fresh zero-filled one per call while the stream captures a CUDA graph; the kernels that claim nothing
    (deterministic mode, or a call of at most FIXED_RANGE_MAX_TOKENS_PER_BLOCK tokens per block) get one kept
    placeholder, and no stream is looked up for them."""
    streams = [11]
    launches, lookups = _recorded_launches(monkeypatch, streams)
    num_tokens = _FIXED_LIMIT + 1  # (smaller calls take fixed ranges: below)
    args = _cpu_args(num_tokens)

    def counter(*extra):
        _call(*args, *extra)
        cfg, launched = launches[-1]
        assert cfg.dynamic_tokens
        token_counter = launched[-1]
        assert (token_counter.dtype, tuple(token_counter.shape)) == (torch.int32, (COUNTER_WORDS,))
        assert not bool(token_counter.any())
        return token_counter

    first = counter()
    assert counter() is first  # the same stream: the same buffer, no new fill
    assert counter(torch.zeros(num_tokens, dtype=torch.bool)) is first  # the mask variant shares it
    streams.append(12)
    second = counter()
    assert second is not first
    streams.append(11)
    assert counter() is first
    streams.append(None)  # capturing
    captured = [counter(), counter()]
    assert len({id(c) for c in (first, second, *captured)}) == 4  # each captured call its own, none kept
    assert lookups == [None] * 7  # the tensors' device index (None for these CPU tensors), once per call

    with _deterministic_algorithms():
        _call(*args)
        _call(*args, torch.zeros(num_tokens, dtype=torch.bool))
    _call(*_cpu_args(_FIXED_LIMIT))
    (cfg_a, args_a), (cfg_b, args_b), (cfg_c, args_c) = launches[-3:]
    assert [cfg.dynamic_tokens for cfg in (cfg_a, cfg_b, cfg_c)] == [False] * 3
    assert args_a[-1] is args_b[-1] is args_c[-1]
    assert all(args_a[-1] is not c for c in (first, second, *captured))
    assert len(lookups) == 7  # no stream lookup where nothing is claimed
    _call(*(t[:0] for t in args[:3]), args[3], *(t[:0] for t in args[4:8]), CLAMP)
    assert len(launches) == 10  # T = 0: no launch, no counter


def test_engram_gate_bwd_launch_stream_asks_the_tensors_device(monkeypatch):
    """launch_stream: the current stream of the tensors' device and whether it captures, asked with that
    device current (switched to only when another one is), CUDA calls mocked."""
    current = [0]
    capturing = {0: False, 1: False}

    @contextlib.contextmanager
    def device(index):
        current.append(index)
        try:
            yield
        finally:
            current.pop()

    def raw_stream(index):
        assert index == current[-1]
        return 100 + index

    monkeypatch.setattr(torch._C, '_cuda_getDevice', lambda: current[-1], raising=False)
    monkeypatch.setattr(torch._C, '_cuda_isCurrentStreamCapturing', lambda: capturing[current[-1]], raising=False)
    monkeypatch.setattr(torch._C, '_cuda_getCurrentRawStream', raw_stream, raising=False)
    monkeypatch.setattr(torch.cuda, 'device', device)
    assert _gate_bwd_counters.launch_stream(0) == 100
    assert _gate_bwd_counters.launch_stream(1) == 101
    assert current == [0]  # switched back
    capturing[1] = True
    assert _gate_bwd_counters.launch_stream(1) is None
    assert _gate_bwd_counters.launch_stream(0) == 100


def test_engram_gate_bwd_launches_kv_whole(monkeypatch):
    """kv goes to the kernel itself where its address and used outer strides are 16-byte multiples (strides of
    size-1 dimensions are never used), else as an aligned contiguous copy."""
    launches, _ = _recorded_launches(monkeypatch, [0])

    def sent_kv(kv):
        args = _cpu_args(num_tokens=kv.shape[0])
        args[2] = kv
        _call(*args)
        return launches[-1][1][2]

    kv = _cpu_args()[2]
    assert sent_kv(kv) is kv
    broadcast = kv[:, :1].expand(-1, 5, -1)  # stride 0 over keys and value
    assert sent_kv(broadcast) is broadcast
    single = torch.zeros(641 + 8, dtype=torch.bfloat16).as_strided((1, 5, 128), (641, 128, 1))
    assert sent_kv(single) is single  # T = 1: its odd token stride is never used
    odd_address = torch.randn(3, 5, 128 + 8, dtype=torch.bfloat16)[..., 1:129]
    odd_stride = torch.randn(3, 5, 132, dtype=torch.bfloat16)[..., :128]  # rows 264 bytes apart
    for kv in (odd_address, odd_stride):
        sent = sent_kv(kv)
        assert sent is not kv
        assert sent.is_contiguous()
        assert torch.equal(sent, kv)


# ---------------------------------------------------------------- device tier


@contextlib.contextmanager
def _deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) around the operator calls only (the references use ops that
    this mode restricts), restored afterwards."""
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _poison_allocator(device, num_bytes: int) -> None:
    """Leave NaN bit patterns in the caching allocator's free blocks: outputs the kernel skipped show up."""
    torch.full((num_bytes // 4 + 1024,), float('nan'), device=device)


def _check_result(result, inputs, *, clamp_value, num_cores, image_token_mask=None):
    """Shapes, dtypes and layout of the result; image tokens exactly (grad_x = grad_out bit for bit,
    grad_kv = +0); every grad against autograd of the fp32 forward within `_error_bounds`."""
    grad_out, x, k, v, w, dot, g, rx, rk = _split(inputs)
    num_tokens, hc, hidden = x.shape
    assert isinstance(result, EngramGateBwdResult)
    num_partials = num_cores  # P: a slice per persistent block ...
    if x.is_cuda:  # ... or per cluster, where the CUDA kernel splits a token over 2 CTAs
        num_partials = engram_gate_bwd_config(*inputs, clamp_value, image_token_mask).num_blocks
        assert num_partials in (num_cores, num_cores // 2)
    for t, shape, dtype in zip(
        result,
        ((num_tokens, hc, hidden), (num_tokens, hc + 1, hidden), (num_partials, hc, hidden)),
        (torch.bfloat16, torch.bfloat16, torch.float32),
        strict=True,
    ):
        assert t.shape == shape
        assert t.dtype == dtype
        assert t.device == x.device
        assert t.is_contiguous()
    if image_token_mask is not None:
        img = image_token_mask
        assert torch.equal(result.grad_hidden_states[img].view(torch.int16), grad_out[img].view(torch.int16))
        assert not bool(result.grad_kv[img].view(torch.int16).any()), 'image tokens: grad_kv is not +0'
    # Tokens are independent except for the weight gradient's sum over them: the fp64 references and bounds
    # of a chunk of tokens at a time, the weight gradient's parts added up, so that the largest tests need
    # a few GB of device memory (and run in the two-phase run's parallel phase).
    grad_w_expected = grad_w_bound = 0.0
    for start in range(0, max(num_tokens, 1), _CHECK_CHUNK_TOKENS):
        chunk = slice(start, start + _CHECK_CHUNK_TOKENS)
        mask = None if image_token_mask is None else image_token_mask[chunk]
        expected = engram_gate_bwd_autograd_ref(
            grad_out[chunk], x[chunk], k[chunk], v[chunk], w, eps=EPS, clamp_value=clamp_value, image_token_mask=mask
        )
        bounds = _error_bounds(
            grad_out[chunk],
            x[chunk],
            k[chunk],
            v[chunk],
            w,
            dot[chunk],
            g[chunk],
            rx[chunk],
            rk[chunk],
            clamp_value=clamp_value,
            num_partials=num_cores,
            rounded=True,
            image_token_mask=mask,
            num_tokens=num_tokens,
        )
        where = f' (tokens {start}..)' if num_tokens > _CHECK_CHUNK_TOKENS else ''
        for name, actual, exp, bound in zip(
            ('grad_hidden_states', 'grad_kv[:, :hc]', 'grad_kv[:, hc]'),
            (result.grad_hidden_states[chunk], result.grad_kv[chunk, :hc], result.grad_kv[chunk, hc]),
            expected[:3],
            bounds[:3],
            strict=True,
        ):
            _assert_within(name + where, actual, exp, bound, rounded=True)
            if exp.numel() and float(exp.abs().max()) > 0:
                assert calc_diff(actual, exp) < 1e-5, name + where  # bf16 rounding alone gives ~1e-6
        grad_w_expected = grad_w_expected + expected[3].double()
        grad_w_bound = grad_w_bound + bounds[3]
    grad_w = result.grad_w_partial.double().sum(0)
    _assert_within('grad_w_partial.sum(0)', grad_w, grad_w_expected, grad_w_bound, rounded=False)
    if float(grad_w_expected.abs().max()) > 0:
        assert calc_diff(grad_w, grad_w_expected) < 1e-5, 'grad_w_partial.sum(0)'


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_gate_bwd_values(params, device):
    num_tokens, hc, hidden = params['num_tokens'], params['hc'], params['hidden']
    inputs = _inputs(num_tokens, hc, hidden, device)
    before = [t.clone() for t in inputs]
    num_cores = get_num_cores(device)
    _poison_allocator(device, 4 * (2 * num_tokens * (hc + 1) * hidden + num_cores * hc * hidden))

    result = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)

    _check_result(result, inputs, clamp_value=CLAMP, num_cores=num_cores)
    for t, b in zip(inputs, before, strict=True):
        assert torch.equal(t, b)  # inputs untouched


def _ascend_config_classes() -> list[dict]:
    """The smallest (hc, hidden) of each kind of Ascend tiling the chooser picks (one column tile or several;
    a token chunk filling the 64 lanes or leaving a tail), over hc 1..8 and the tested hidden sizes."""
    chosen = {}
    for hc in range(1, 9):
        for hidden in (64, 192, 1088, 2560, 4096, 5120, 7168, 12288, 16384):
            cfg = choose_engram_gate_bwd_config(
                backend='ascend', hc=hc, hidden=hidden, num_cores=ASCEND_950_VECTOR_CORES
            )
            kind = (cfg.tile_cols == hidden, cfg.token_chunk * hc == 64)
            if kind not in chosen or hc * hidden < chosen[kind]['hc'] * chosen[kind]['hidden']:
                chosen[kind] = {'hc': hc, 'hidden': hidden}
    return sorted(chosen.values(), key=lambda p: (p['hc'], p['hidden']))


@pytest.mark.npu
@pytest.mark.parametrize('params', _ascend_config_classes(), ids=make_param_id)
def test_engram_gate_bwd_every_ascend_config(params, device):
    """Each kind of Ascend tiling once (on the emulator in the CPU tier), with one token more than the vector
    cores and token chunks that do not divide it; on CUDA (from level 1) the same shapes through its own
    configs."""
    skip_off_ascend_below(LEVEL, 1, device)
    inputs = _inputs(ASCEND_950_VECTOR_CORES + 1, params['hc'], params['hidden'], device)
    result = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    _check_result(result, inputs, clamp_value=CLAMP, num_cores=get_num_cores(device))


@pytest.mark.npu
@pytest.mark.parametrize(
    'params',
    by_level(
        LEVEL,
        core=[
            {'num_tokens': 130, 'hc': 4, 'hidden': 4096},
            {'num_tokens': 257, 'hc': 3, 'hidden': 1088},
            {'num_tokens': 7, 'hc': 1, 'hidden': 64},
            {'num_tokens': 40, 'hc': 3, 'hidden': 12288},  # the chunked CUDA kernel
        ],
        default=[{'num_tokens': 1000, 'hc': 4, 'hidden': 7168}],
    ),
    ids=make_param_id,
)
def test_engram_gate_bwd_image_tokens(params, device):
    """Image tokens: grad_x = grad_out bit for bit (-0.0, inf and NaN included), grad_kv = 0 and no share of
    grad_w_partial, whatever their saved values (here those of the unmasked forward) and inputs; text tokens
    get the bits of the call without a mask (fixed token ranges, so that grad_w_partial compares too)."""
    num_tokens, hc, hidden = params['num_tokens'], params['hc'], params['hidden']
    inputs = _inputs(num_tokens, hc, hidden, device)
    grad_out, x = inputs[:2]
    mask = torch.rand(num_tokens, device=device) < 0.3
    mask[0] = mask[-1] = True
    grad_out[0, 0, :4] = torch.tensor([-0.0, float('inf'), -float('inf'), float('nan')])
    x[-1, 0, :2] = torch.tensor([float('inf'), float('nan')])  # would poison grad_w if it were summed
    num_cores = get_num_cores(device)
    _poison_allocator(device, 4 * (2 * num_tokens * (hc + 1) * hidden + num_cores * hc * hidden))
    with _deterministic_algorithms():
        masked = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP, mask)
        # The same text tokens alone, image tokens zeroed out of the inputs: the same weight gradient.
        text_only = [t.clone() for t in inputs]
        for t in text_only[:3]:
            t[mask] = 0
        text_only[4][mask] = 0  # dot = 0: clamped, r = 0
        plain = cann_ops_tilelang.engram_gate_bwd(*text_only, CLAMP)
    text = ~mask
    assert torch.equal(masked.grad_hidden_states[text], plain.grad_hidden_states[text])
    assert torch.equal(masked.grad_kv[text], plain.grad_kv[text])
    assert torch.equal(masked.grad_w_partial, plain.grad_w_partial)  # image tokens add nothing (not even NaN)
    clean = list(inputs)
    clean[0] = torch.where(mask[:, None, None], torch.zeros_like(grad_out), grad_out)  # finite references
    clean[1] = torch.where(mask[:, None, None], torch.zeros_like(x), x)
    result = masked._replace(grad_hidden_states=torch.where(mask[:, None, None], 0, masked.grad_hidden_states))
    assert torch.equal(masked.grad_hidden_states[mask].view(torch.int16), grad_out[mask].view(torch.int16))
    _check_result(result, clean, clamp_value=CLAMP, num_cores=num_cores, image_token_mask=mask)


def _launch(cfg, inputs, mask):
    """One launch of `cfg`'s kernel (not the operator's choice) on the operator's inputs: its three results."""
    x = inputs[1]
    num_tokens, hc, hidden = x.shape
    result = EngramGateBwdResult(
        torch.empty_like(x),
        x.new_empty(num_tokens, hc + 1, hidden),
        torch.empty(cfg.num_blocks, hc, hidden, device=x.device),
    )
    counter = torch.zeros(COUNTER_WORDS, dtype=torch.int32, device=x.device)
    launcher = Launcher(get_engram_gate_bwd_kernel, cfg, x.device)
    launcher.launch(*inputs, *(() if mask is None else (mask,)), *result, CLAMP, counter)
    return result


@pytest.mark.npu
@pytest.mark.cuda_only  # the mask's schedules are the CUDA kernels'
@pytest.mark.parametrize(
    ('params', 'deterministic'),
    by_level(LEVEL, core=[], default=_MASK_AHEAD_PLANS),
    ids=lambda p: make_param_id(p) if isinstance(p, dict) else ('fixed' if p else 'claimed'),
)
def test_engram_gate_bwd_mask_schedules_values(params, deterministic, device):
    """The mask variant's schedules mask_ahead and mask_results: on a text-only batch (an all-False mask) the
    unmasked kernel's bits (grad_w_partial too where tokens keep fixed ranges); with image tokens (an inf in one's
    x) the bits of the mask variant without them, image tokens exact and the text tokens' grads the reference's."""
    hc, hidden = params['hc'], params['hidden']
    num_cores = get_num_cores(device)
    num_tokens = fixed_range_max_tokens(num_cores) + 45  # past the fixed ranges: the claiming kernel where it is
    base = choose_engram_gate_bwd_config(
        backend='cuda', hc=hc, hidden=hidden, num_cores=num_cores, deterministic=deterministic
    )
    old = dataclasses.replace(base, has_mask=True)
    schedules = [{'mask_ahead': True}]
    if base.variant == 'resident':
        schedules += [
            {'mask_results': 'select'},
            {'mask_results': 'bitwise'},
            {'mask_ahead': True, 'mask_results': 'bitwise'},
        ]
    compared = 2 if base.dynamic_tokens else 3  # claimed tokens: each slice sums whichever tokens its block claimed
    inputs = _inputs(num_tokens, hc, hidden, device)
    plain = _launch(base, inputs, None)
    mask = torch.rand(num_tokens, device=device) < 0.3
    mask[0] = mask[-1] = True
    image_inputs = list(inputs)
    image_inputs[1] = inputs[1].clone()
    image_inputs[1][-1, 0, :2] = torch.tensor([float('inf'), float('nan')])  # would poison grad_w if it were summed
    reference = _launch(old, image_inputs, mask)
    clean = list(inputs)
    clean[1] = torch.where(mask[:, None, None], torch.zeros_like(inputs[1]), inputs[1])  # finite references
    for schedule in schedules:
        cfg = dataclasses.replace(old, **schedule)
        text_only = _launch(cfg, inputs, torch.zeros(num_tokens, dtype=torch.bool, device=device))
        for a, b in zip(text_only[:compared], plain[:compared], strict=True):
            assert torch.equal(a, b), schedule
        masked = _launch(cfg, image_inputs, mask)
        for a, b in zip(masked[:compared], reference[:compared], strict=True):
            assert torch.equal(a, b), schedule
        assert torch.equal(masked.grad_hidden_states[mask].view(torch.int16), inputs[0][mask].view(torch.int16))
        assert not bool(masked.grad_kv[mask].view(torch.int16).any())
        _check_result(masked, clean, clamp_value=CLAMP, num_cores=num_cores, image_token_mask=mask)


@pytest.mark.npu
def test_engram_gate_bwd_empty(device):
    inputs = _inputs(0, 4, 192, device)
    num_cores = get_num_cores(device)
    for mask in (None, torch.zeros(0, dtype=torch.bool, device=device)):
        result = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP, mask)
        assert [tuple(t.shape) for t in result[:2]] == [(0, 4, 192), (0, 5, 192)]
        assert [t.dtype for t in result[:2]] == [torch.bfloat16] * 2
        # No launch: P is the block count a launch would use, and the partial weight gradients are zero.
        assert result.grad_w_partial.shape == (num_cores, 4, 192)
        assert result.grad_w_partial.dtype == torch.float32
        assert not bool(result.grad_w_partial.any())
        assert all(t.device == inputs[0].device for t in result)


@pytest.mark.npu
@pytest.mark.cuda_only  # the CUDA kernel's split and chunked variants (the Ascend kernel is chunked at every shape)
@pytest.mark.parametrize(
    'params', [{'hc': 3, 'hidden': 12288}, GATE_BWD_CHUNKED_CUDA_SHAPES[1]], ids=['cluster', 'chunked']
)
def test_engram_gate_bwd_wide_values(params, device):
    """hc * H beyond one resident CTA: a cluster of 2 CTAs per token (fixed token ranges of ~64 tokens per
    cluster), and beyond that the chunked variant, with T large enough that a block handles several chunks
    (132 SMs: 33 tokens per block > 32 per chunk) and adds its tiles to its partial slice more than once."""
    num_tokens = 132 * 32 + 5
    inputs = _inputs(num_tokens, params['hc'], params['hidden'], device)
    num_cores = get_num_cores(device)
    result = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    _check_result(result, inputs, clamp_value=CLAMP, num_cores=num_cores)
    cfg = engram_gate_bwd_config(*inputs, CLAMP)
    assert (cfg.variant, cfg.cluster) == (('resident', 2) if params['hc'] == 3 else ('chunked', 1))
    assert result.grad_w_partial.shape[0] == cfg.num_blocks


@pytest.mark.npu
@pytest.mark.cuda_only  # the plans are the CUDA chooser's (the Ascend kernel has one scheme)
@pytest.mark.parametrize('params', by_level(LEVEL, core=[], default=PLAN_WIDTHS), ids=make_param_id)
def test_engram_gate_bwd_plan_widths(params, device):
    """Both sides of every width where the CUDA plan changes (cuda_plan_widths: cluster, groups per thread,
    weight in shared memory or L2, the shared-memory tier; chunked), every hc: claimed tokens (one-CTA plans)
    and fixed ranges give the same grads bit for bit and the reference's values; the mask variant with image
    tokens too."""
    hc, hidden = params['hc'], params['hidden']
    num_cores = get_num_cores(device)
    num_tokens = fixed_range_max_tokens(num_cores) + 45  # past the fixed ranges: the claiming kernel where it is
    inputs = _inputs(num_tokens, hc, hidden, device)
    result = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    _check_result(result, inputs, clamp_value=CLAMP, num_cores=num_cores)
    with _deterministic_algorithms():
        fixed = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    for a, b in zip(result[:2], fixed[:2], strict=True):
        assert torch.equal(a, b)
    mask = torch.rand(num_tokens, device=device) < 0.3
    masked = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP, mask)
    text = ~mask
    assert torch.equal(masked.grad_hidden_states[text], result.grad_hidden_states[text])
    assert torch.equal(masked.grad_kv[text], result.grad_kv[text])
    assert torch.equal(masked.grad_hidden_states[mask], inputs[0][mask])
    assert not bool(masked.grad_kv[mask].any())


@pytest.mark.npu
@pytest.mark.cuda_only  # claimed tokens and fixed ranges are the resident CUDA kernel's two schedules
@pytest.mark.parametrize(
    'params',
    [
        {'num_tokens': 100, 'hc': 4, 'hidden': 4096},  # T < P: blocks 0..99 get one token each
        {'num_tokens': 1000, 'hc': 4, 'hidden': 4096},
        {'num_tokens': 4001, 'hc': 4, 'hidden': 7168},  # a benchmark row: ~30 claims per block
    ],
    ids=make_param_id,
)
def test_engram_gate_bwd_token_schedule(params, device):
    """Tokens claimed at run time (the default) and fixed token ranges (deterministic mode) give the same
    per-token grads bit for bit, since a token's arithmetic does not depend on the block that does it;
    both sum every token into grad_w_partial exactly once; fixed ranges repeat to the bit."""
    num_tokens, hc, hidden = params['num_tokens'], params['hc'], params['hidden']
    inputs = _inputs(num_tokens, hc, hidden, device)
    num_cores = get_num_cores(device)
    claimed = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    with _deterministic_algorithms():
        fixed = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
        fixed_again = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    for result in (claimed, fixed):
        _check_result(result, inputs, clamp_value=CLAMP, num_cores=num_cores)
        if num_tokens < num_cores:  # one token per busy block: exactly T slices are non-zero
            assert int(result.grad_w_partial.flatten(1).ne(0).any(1).sum()) == num_tokens
    for a, b in zip(claimed[:2], fixed[:2], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(fixed, fixed_again, strict=True):
        assert torch.equal(a, b)


@pytest.mark.npu
@pytest.mark.cuda_only  # the resident CUDA kernel is the one that claims tokens
def test_engram_gate_bwd_counter_left_at_zero(device):
    """The claiming kernel leaves its stream's counter at zero, so that the next launch on the stream needs no
    fill: calls back to back (the fewest tokens that claim, one past the fixed ranges; a whole number of tokens
    per block; three tokens per block more) on the current stream and on a side stream, which has a counter of
    its own, all give the right grads, and both counters read zero afterwards. Fewer tokens take fixed ranges
    and touch no counter."""
    num_cores = get_num_cores(device)
    claims_from = fixed_range_max_tokens(num_cores) + 1
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    counters = []
    for stream in (main, side):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            for num_tokens in (claims_from, claims_from + num_cores - 1, claims_from + 3 * num_cores):
                inputs = _inputs(num_tokens, 4, 4096, device)
                _poison_allocator(device, 4 * 3 * (2 * num_tokens * 5 * 4096 + num_cores * 4 * 4096))
                results = [cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP) for _ in range(3)]
                for result in results:
                    _check_result(result, inputs, clamp_value=CLAMP, num_cores=num_cores)
            index = inputs[0].device.index
            counters.append(_gate_bwd_counters.COUNTERS[(index, stream.cuda_stream)])
        main.wait_stream(stream)
    torch.cuda.synchronize(device)
    assert counters[0] is not counters[1]
    for counter in counters:
        assert counter.tolist() == [0] * COUNTER_WORDS


@pytest.mark.npu
@pytest.mark.parametrize('layout', ['strided', 'odd_offset', 'branch_major', 'broadcast'])
def test_engram_gate_bwd_non_contiguous_kv(layout, device):
    num_tokens, hc, hidden = 257, 3, 1088
    grad_out, x, kv, w, *_ = _inputs(num_tokens, hc, hidden, device)
    if layout == 'broadcast':
        kv = kv[:, :1].expand(-1, hc + 1, -1)  # stride 0 over keys and value
    elif layout == 'branch_major':
        kv = kv.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        pad = 64 if layout == 'strided' else 5  # 5: neither the address nor the strides are 16-byte multiples
        kv_wide = torch.zeros(num_tokens, hc + 1, hidden + 2 * pad, dtype=kv.dtype, device=device)
        kv_wide[:, :, pad : pad + hidden] = kv
        kv = kv_wide[:, :, pad : pad + hidden]
    assert not kv.is_contiguous()
    fwd = engram_gate_fwd_ref(x, kv[:, :hc], kv[:, hc], w, eps=EPS)
    inputs = (grad_out, x, kv, w, fwd.dot, fwd.gate_score, fwd.rstd_x, fwd.rstd_k)
    num_cores = get_num_cores(device)
    result = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    _check_result(result, inputs, clamp_value=CLAMP, num_cores=num_cores)
    # Same values as with a contiguous copy, bit for bit (the kernels read the same numbers; fixed token
    # ranges so that grad_w_partial compares too).
    with _deterministic_algorithms():
        strided = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
        contiguous = cann_ops_tilelang.engram_gate_bwd(*inputs[:2], kv.contiguous(), *inputs[3:], CLAMP)
    for a, b in zip(strided, contiguous, strict=True):
        assert torch.equal(a, b)


@pytest.mark.npu
@pytest.mark.parametrize(
    'params',
    by_level(
        LEVEL,
        # level 0: the shape of an image-token test, so that the kernel compiled there serves here too
        core=[{'num_tokens': 257, 'hc': 3, 'hidden': 1088}],
        default=[{'num_tokens': 257, 'hc': 3, 'hidden': 192}, {'num_tokens': 1000, 'hc': 4, 'hidden': 4096}],
    ),
    ids=make_param_id,
)
def test_engram_gate_bwd_clamp_region(params, device):
    """Tokens with |d| < clamp_value get r = 0: grad_k = 0 and grad_hidden_states = grad_out exactly."""
    num_tokens, hc, hidden = params['num_tokens'], params['hc'], params['hidden']
    grad_out, x, kv, w, dot, _, rx, rk = _inputs(num_tokens, hc, hidden, device)
    clamp_value = _clamp_between(dot, rx, rk, hidden)
    g = engram_gate_fwd_ref(x, kv[:, :hc], kv[:, hc], w, eps=EPS, clamp_value=clamp_value).gate_score
    inputs = (grad_out, x, kv, w, dot, g, rx, rk)
    num_cores = get_num_cores(device)
    result = cann_ops_tilelang.engram_gate_bwd(*inputs, clamp_value)
    _check_result(result, inputs, clamp_value=clamp_value, num_cores=num_cores)
    clamped = (dot * rx * rk * hidden**-0.5).abs() < clamp_value
    assert 0.25 <= float(clamped.float().mean()) <= 0.75
    grad_k = result.grad_kv[:, :hc]
    assert torch.equal(grad_k[clamped], torch.zeros_like(grad_k[clamped]))
    assert torch.equal(result.grad_hidden_states[clamped], grad_out[clamped])
    assert bool(grad_k[~clamped].any())


# The grid, and at T = 4001 both sides of every width where the CUDA plan of hc = 4 changes (so that each plan
# has a baseline: issue #36's cliff sat between the grid's widths).
BENCHMARK_SHAPES = gen_benchmark_shapes() + [
    {'num_tokens': 4001, 'hidden': h, 'hc': BENCHMARK_HC}
    for h in cuda_plan_widths(BENCHMARK_HC, H200_SMS)
    if h not in BENCHMARK_HIDDEN
]


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_SHAPES, ids=make_param_id)
def test_engram_gate_bwd_benchmark(params, device, benchmark_timer, benchmark_record):
    assert params['hc'] == BENCHMARK_HC
    inputs = _inputs(params['num_tokens'], params['hc'], params['hidden'], device)
    result = cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP)
    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_gate_bwd(*inputs, CLAMP))
    # Reads grad_out, x, kv and the four saved fp32 tensors (weight_fused is L2-resident: not counted);
    # writes grad_x, grad_kv and the fp32 partial weight gradients.
    num_bytes = count_bytes(*inputs[:3], *inputs[4:], *result)
    benchmark_record(
        kernel='engram_gate_bwd',
        operation='bwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=num_bytes / time_us / 1e3,
        extras=config_extras(engram_gate_bwd_config(*inputs, CLAMP)),
    )
