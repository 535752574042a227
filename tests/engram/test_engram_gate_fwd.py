"""engram_gate_fwd: lowering (CPU tier), argument contract (CPU tier), values, layouts and benchmark (device)."""

from __future__ import annotations

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang.engram import EngramGateFwdResult
from cann_ops_tilelang.engram.engram_gate_fwd import engram_gate_fwd_config
from cann_ops_tilelang.engram.engram_gate_fwd_kernel import (
    ASCEND_UB_BUDGET,
    _ascend_ub_bytes,
    choose_engram_gate_fwd_config,
    make_engram_gate_fwd_kernel,
)
from tests.engram._extras import config_extras
from tests.engram.engram_gate_fwd_ref import engram_gate_fwd_ref
from tests.testing.bench import make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import (
    gen_benchmark_shapes,
    gen_hc,
    gen_hidden,
    gen_num_tokens,
    generate_samples,
    get_test_level,
)
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_close, assert_equal, count_bytes

KERNEL_NAME = 'engram_gate_fwd_kernel'

LEVEL = get_test_level()
VALUE_PARAMS = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden, num_tokens=gen_num_tokens)
# The token count is a runtime size (T.dynamic): the kernels of a level are those of its (hc, hidden) pairs.
SHAPES = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden)


def _inputs(num_tokens: int, hc: int, hidden: int, device) -> tuple[torch.Tensor, ...]:
    # Drawn on the device, in the final dtype: the CPU generator would take seconds at benchmark shapes.
    x = torch.randn(num_tokens, hc, hidden, dtype=torch.bfloat16, device=device)
    k = torch.randn(num_tokens, hc, hidden, dtype=torch.bfloat16, device=device)
    v = torch.randn(num_tokens, hidden, dtype=torch.bfloat16, device=device)
    w = 1.0 + 0.5 * torch.randn(hc, hidden, device=device)  # a product of two RMSNorm weights around 1
    return x, k, v, w


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_gate_fwd_ascend_lowers(params):
    hc, hidden = params['hc'], params['hidden']
    cfg = choose_engram_gate_fwd_config(backend='ascend', hc=hc, hidden=hidden, num_cores=ASCEND_950_VECTOR_CORES)
    assert (cfg.backend, cfg.hc, cfg.hidden, cfg.num_cores, cfg.save_for_backward) == ('ascend', hc, hidden, 64, True)
    assert hc % cfg.group == 0
    assert cfg.stages in (1, 2)
    assert _ascend_ub_bytes(hc, hidden, cfg.group, cfg.stages, cfg.weight_resident) <= ASCEND_UB_BUDGET
    lowered = assert_ascend_kernel_lowers(lambda: make_engram_gate_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert '__simd_vf__' in lowered.source  # the SIMD path, no SIMT reservation needed
    assert 'num_tokens' in lowered.source
    assert 'k_stride_t' in lowered.source  # k rows addressed through the tensor's strides
    # The UB model of the config chooser covers what the compiler allocated.
    assert lowered.ub_bytes <= _ascend_ub_bytes(hc, hidden, cfg.group, cfg.stages, cfg.weight_resident)


@pytest.mark.parametrize('params', SHAPES, ids=make_param_id)
def test_engram_gate_fwd_cuda_lowers(params):
    hc, hidden = params['hc'], params['hidden']
    cfg = choose_engram_gate_fwd_config(backend='cuda', hc=hc, hidden=hidden, num_cores=H200_SMS)
    assert (cfg.backend, cfg.hc, cfg.hidden, cfg.num_cores, cfg.vec) == ('cuda', hc, hidden, H200_SMS, 8)
    assert cfg.threads * cfg.chunks * 8 >= hidden
    assert cfg.chunks <= 8
    lowered = assert_cuda_kernel_lowers(lambda: make_engram_gate_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'uint4' in lowered.source  # 16-byte accesses
    assert 'k_stride_t' in lowered.source
    assert 'num_tokens' in lowered.source


def test_engram_gate_fwd_variants_lower():
    """No saved tensors, and the narrower accesses taken for misaligned tensors, on both backends."""
    for backend, cores in (('ascend', ASCEND_950_VECTOR_CORES), ('cuda', H200_SMS)):
        cfg = choose_engram_gate_fwd_config(
            backend=backend, hc=4, hidden=4096, num_cores=cores, save_for_backward=False
        )
        lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
        lowered = lower(lambda cfg=cfg: make_engram_gate_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
        assert 'dot_o' not in lowered.source
    for vec in (4, 1):
        cfg = choose_engram_gate_fwd_config(backend='cuda', hc=3, hidden=192, num_cores=H200_SMS, vec=vec)
        lowered = assert_cuda_kernel_lowers(
            lambda cfg=cfg: make_engram_gate_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
        )
        assert 'uint4' not in lowered.source


def test_engram_gate_fwd_config_limits():
    # The largest shapes fit: CUDA by more threads per block, Ascend by a smaller branch group / one stage.
    cfg = choose_engram_gate_fwd_config(backend='cuda', hc=8, hidden=16384, num_cores=H200_SMS)
    assert cfg.threads * cfg.chunks * 8 == 16384
    assert cfg.chunks <= 8
    cfg = choose_engram_gate_fwd_config(backend='ascend', hc=8, hidden=16384, num_cores=64)
    assert (cfg.group, cfg.stages, cfg.weight_resident) == (1, 1, False)
    for hc in range(1, 9):
        for hidden in (64, 4096, 7168, 16384):
            cfg = choose_engram_gate_fwd_config(backend='ascend', hc=hc, hidden=hidden, num_cores=64)
            assert _ascend_ub_bytes(hc, hidden, cfg.group, cfg.stages, cfg.weight_resident) <= ASCEND_UB_BUDGET
    # The benchmark shapes keep the whole weight row of a branch in registers at >= 3 blocks per SM.
    for hidden in (4096, 7168):
        cfg = choose_engram_gate_fwd_config(backend='cuda', hc=4, hidden=hidden, num_cores=H200_SMS)
        assert cfg.threads == 128
        assert cfg.blocks_per_core >= 3
    with pytest.raises(ValueError, match='backend'):
        choose_engram_gate_fwd_config(backend='cpu', hc=4, hidden=4096, num_cores=64)


# ---------------------------------------------------------------- CPU tier: argument contract


def _call(*args, **kwargs):
    return cann_ops_tilelang.engram_gate_fwd(*args, **kwargs)


_ARG_NAMES = ('hidden_states', 'k', 'v', 'weight_fused')
_ARG_DTYPES = (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32)


@pytest.mark.parametrize('index', range(4), ids=_ARG_NAMES)
def test_engram_gate_fwd_rejects_non_tensors_and_dtypes(index):
    args = list(_inputs(3, 4, 128, 'cpu'))
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=_ARG_DTYPES[index],
        non_tensors=(args[index].float().numpy(), None),
        wrong_dtype=torch.float16,
    )


@pytest.mark.parametrize('index', range(4), ids=_ARG_NAMES)
def test_engram_gate_fwd_rejects_ndim(index):
    assert_rejects_extra_dimension(_call, _inputs(3, 4, 128, 'cpu'), index, name=_ARG_NAMES[index])


@pytest.mark.parametrize(
    ('index', 'shape', 'expected'),
    [
        (1, (2, 4, 128), r'k must have shape \(3, 4, 128\)'),  # token count
        (1, (3, 2, 128), r'k must have shape \(3, 4, 128\)'),  # branches
        (1, (3, 4, 64), r'k must have shape \(3, 4, 128\)'),  # hidden
        (2, (4, 128), r'v must have shape \(3, 128\)'),
        (2, (3, 64), r'v must have shape \(3, 128\)'),
        (3, (2, 128), r'weight_fused must have shape \(4, 128\)'),
        (3, (4, 192), r'weight_fused must have shape \(4, 128\)'),
    ],
)
def test_engram_gate_fwd_rejects_shape_mismatch(index, shape, expected):
    args = list(_inputs(3, 4, 128, 'cpu'))
    args[index] = torch.zeros(shape, dtype=args[index].dtype)
    with pytest.raises(ValueError, match=expected):
        _call(*args)


@pytest.mark.parametrize(
    ('hc', 'hidden', 'match'),
    [
        (0, 128, 'hc .* must be in 1..8'),
        (9, 128, 'hc .* must be in 1..8'),
        (4, 96, 'multiple of 64'),
        (4, 100, 'multiple of 64'),
        (1, 16384 + 64, 'multiple of 64 up to 16384'),
    ],
)
def test_engram_gate_fwd_rejects_hc_hidden(hc, hidden, match):
    with pytest.raises(ValueError, match=match):
        _call(*_inputs(2, hc, hidden, 'cpu'))


def test_engram_gate_fwd_rejects_layouts():
    x, k, v, w = _inputs(3, 4, 128, 'cpu')
    with pytest.raises(ValueError, match='hidden_states must be contiguous'):
        _call(torch.zeros(3, 4, 256, dtype=torch.bfloat16)[..., :128], k, v, w)
    with pytest.raises(ValueError, match='hidden_states must be contiguous'):
        _call(torch.zeros(4, 3, 128, dtype=torch.bfloat16).transpose(0, 1), k, v, w)
    with pytest.raises(ValueError, match='k must have a contiguous last dimension'):
        _call(x, torch.zeros(3, 4, 256, dtype=torch.bfloat16)[..., ::2], v, w)
    with pytest.raises(ValueError, match='k must have a contiguous last dimension'):
        _call(x, torch.zeros(3, 128, 4, dtype=torch.bfloat16).transpose(1, 2), v, w)
    with pytest.raises(ValueError, match='v must have a contiguous last dimension'):
        _call(x, k, torch.zeros(128, 3, dtype=torch.bfloat16).t(), w)
    with pytest.raises(ValueError, match='weight_fused must be contiguous'):
        _call(x, k, v, torch.zeros(4, 256)[:, :128])
    # Free outer strides of k and v are accepted: the call reaches the device check.
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x, torch.zeros(4, 3, 192, dtype=torch.bfloat16).transpose(0, 1)[..., :128], v[:, :], w)
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x, k, torch.zeros(3, 256, dtype=torch.bfloat16)[:, 64:192], w)


def test_engram_gate_fwd_rejects_out():
    x, k, v, w = _inputs(3, 4, 128, 'cpu')
    with pytest.raises(TypeError, match='out must be a torch.Tensor'):
        _call(x, k, v, w, out=x.float().numpy())
    with pytest.raises(TypeError, match='out must have dtype torch.bfloat16'):
        _call(x, k, v, w, out=torch.empty(3, 4, 128))
    with pytest.raises(ValueError, match=r'out must have shape \(3, 4, 128\)'):
        _call(x, k, v, w, out=torch.empty(3, 4, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r'out must have shape \(3, 4, 128\)'):
        _call(x, k, v, w, out=torch.empty(3 * 4 * 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match='out must be contiguous'):
        _call(x, k, v, w, out=torch.empty(3, 4, 256, dtype=torch.bfloat16)[..., :128])
    with pytest.raises(ValueError, match='out must not alias the input hidden_states'):
        _call(x, k, v, w, out=x)
    with pytest.raises(ValueError, match='out must not alias the input k'):
        _call(x, k, v, w, out=k)
    big = torch.zeros(3 * 4 * 128 * 2, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match='out must not alias the input v'):
        _call(x, k, big[: 3 * 128].view(3, 128), w, out=big[100 : 100 + 3 * 4 * 128].view(3, 4, 128))
    w_bytes = torch.zeros(4 * 128 * 2)
    with pytest.raises(ValueError, match='out must not alias the input weight_fused'):
        _call(x, k, v, w_bytes[: 4 * 128].view(4, 128), out=w_bytes.view(torch.bfloat16)[: 3 * 4 * 128].view(3, 4, 128))
    # Disjoint halves of one buffer are fine: the call reaches the device check.
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x, k, big[: 3 * 128].view(3, 128), w, out=big[-3 * 4 * 128 :].view(3, 4, 128))
    with pytest.raises(RuntimeError, match='out must be on cpu, got meta'):
        _call(x, k, v, w, out=torch.empty(3, 4, 128, dtype=torch.bfloat16, device='meta'))


@pytest.mark.parametrize('value', [1, 0, None, 'yes', torch.tensor(True)])
def test_engram_gate_fwd_rejects_non_bool_save(value):
    with pytest.raises(TypeError, match='save_for_backward must be a bool'):
        _call(*_inputs(3, 4, 128, 'cpu'), save_for_backward=value)


@pytest.mark.parametrize('name', ['eps', 'clamp_value'])
def test_engram_gate_fwd_rejects_scalars(name):
    args = _inputs(3, 4, 128, 'cpu')
    for value in ('1e-6', None, True, torch.tensor(1e-6)):
        with pytest.raises(TypeError, match=f'{name} must be a float'):
            _call(*args, **{name: value})
    for value in (0.0, -1e-6, float('inf'), float('nan')):
        with pytest.raises(ValueError, match=f'{name} must be a finite number > 0'):
            _call(*args, **{name: value})


def test_engram_gate_fwd_rejects_devices():
    x, k, v, w = _inputs(3, 4, 128, 'cpu')
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors.*no CPU fallback"):
        _call(x, k, v, w)
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x[:0], k[:0], v[:0], w)  # T = 0 is validated before the empty return
    with pytest.raises(RuntimeError, match='one device'):
        _call(x, k, v.to('meta'), w)
    with pytest.raises(RuntimeError, match='one device'):
        _call(x, k, v, w.to('meta'))


def test_engram_gate_fwd_exported():
    assert 'engram_gate_fwd' in cann_ops_tilelang.__all__
    assert cann_ops_tilelang.engram_gate_fwd is cann_ops_tilelang.engram.engram_gate_fwd
    assert EngramGateFwdResult._fields == ('output', 'dot', 'gate_score', 'rstd_x', 'rstd_k')


# ---------------------------------------------------------------- device tier


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """One bf16 unit in the last place at |t| (8 significand bits; floored at the smallest normal)."""
    mag = t.abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


def _assert_matches_reference(res, x, k, v, w, *, eps=1e-6, clamp_value=1e-6) -> None:
    """Check every output of engram_gate_fwd against the fp32 reference, with derived tolerances.

    - rstd_x / rstd_k: fp32 sums of H squares in another order + rsqrt: relative 1e-5 (observed <= 2e-7).
    - dot: a sum of H signed terms in another order; fp32 reassociation moves it by at most about
      H * 2**-24 * sum|x*w*k| and in practice by sqrt(H) * 2**-24 of it: bound 1e-5 * sum|x*w*k| + 1e-30
      (observed <= 1e-7 of the scale).
    - gate_score: first against the gate recomputed in fp64 from the kernel's own dot / rstd (1e-6: the
      fp32 sqrt / exp / divide); then against the reference with the error of d propagated through the
      signed square root: |dg| <= g(1-g) * |dd| / (2 sqrt(max(|d|, clamp))), large only where |d| ~ 0.
    - output: out = bf16(x + g*v). Against the same formula with the kernel's own g in fp32: within one bf16
      ulp (one rounding of the fp32 value) plus 2**-22 * |g*v| (that fp32 value may differ by the rounding
      of the product: fused multiply-add vs separate multiply and add). Against the reference: the same
      plus |v| * |g - g_ref|; and, from 10 000 elements on, at least 99.9 % of them bit-identical to the
      reference (observed >= 99.99 % on an H200; a tiny output can miss it by one element).
    """
    num_tokens, hc, hidden = x.shape
    ref = engram_gate_fwd_ref(x, k, v, w, eps=eps, clamp_value=clamp_value)
    out = res.output
    assert (out.dtype, tuple(out.shape), out.device) == (torch.bfloat16, (num_tokens, hc, hidden), x.device)
    assert out.is_contiguous()
    xf, kf, vf = x.double(), k.double(), v.double()
    for name in ('dot', 'gate_score', 'rstd_x', 'rstd_k'):
        t = getattr(res, name)
        assert (t.dtype, tuple(t.shape), t.device) == (torch.float32, (num_tokens, hc), x.device), name
    assert_close(res.rstd_x, ref.rstd_x, rtol=1e-5, atol=0)
    assert_close(res.rstd_k, ref.rstd_k, rtol=1e-5, atol=0)
    dot_scale = (xf * w.double() * kf).abs().sum(-1)
    dot_err = (res.dot.double() - ref.dot.double()).abs()
    assert bool((dot_err <= 1e-5 * dot_scale + 1e-30).all()), f'dot off by {float((dot_err / dot_scale).max()):.3g}'

    # The gate from the kernel's own dot and rstd, in fp64.
    d = res.dot.double() * res.rstd_x.double() * res.rstd_k.double() * hidden**-0.5
    g64 = torch.sigmoid(torch.sign(d) * torch.sqrt(d.abs().clamp_min(clamp_value)))
    assert_close(res.gate_score.double(), g64, rtol=0, atol=1e-6)
    d_ref = ref.dot.double() * ref.rstd_x.double() * ref.rstd_k.double() * hidden**-0.5
    dd = (1e-5 * dot_scale) * ref.rstd_x.double() * ref.rstd_k.double() * hidden**-0.5 + 3e-5 * d_ref.abs()
    g_tol = 0.25 * dd / (2 * d_ref.abs().clamp_min(clamp_value).sqrt()) + 1e-6
    g_err = (res.gate_score.double() - ref.gate_score.double()).abs()
    assert bool((g_err <= g_tol).all()), f'gate_score off by {float(g_err.max()):.3g}'

    # The output from the kernel's gate, then against the reference. 2**-22 * |g*v| covers the fp32 roundings
    # of g*v and of the sum (fused or not), which matter only where x + g*v cancels to far below |g*v|.
    gv = res.gate_score.double().unsqueeze(-1) * vf.unsqueeze(-2)
    own = (x.float() + res.gate_score.unsqueeze(-1) * v.float().unsqueeze(-2)).double()
    out64 = out.double()
    bad = (out64 - own).abs() > _bf16_ulp(own) + 2.0**-22 * gv.abs()
    assert not bool(bad.any()), f'{int(bad.sum())} outputs differ from bf16(x + g*v) by more than 1 ulp'
    ref64 = ref.output.double()
    tol = _bf16_ulp(ref64) + vf.abs().unsqueeze(-2) * g_err.unsqueeze(-1) + 2.0**-22 * gv.abs()
    assert bool(((out64 - ref64).abs() <= tol).all()), 'output differs from the reference beyond its bound'
    if out.numel() >= 10_000:  # below that, 0.1 % is less than one element
        same = float((out.view(torch.int16) == ref.output.view(torch.int16)).double().mean())
        assert same >= 0.999, f'only {same:.5f} of the outputs are bit-identical to the reference'


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_gate_fwd_values(params, device):
    x, k, v, w = _inputs(params['num_tokens'], params['hc'], params['hidden'], device)
    res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w)
    assert isinstance(res, EngramGateFwdResult)
    _assert_matches_reference(res, x, k, v, w)


@pytest.mark.npu
@pytest.mark.parametrize('save_for_backward', [True, False])
def test_engram_gate_fwd_empty(device, save_for_backward):
    x, k, v, w = _inputs(0, 4, 256, device)
    out = torch.empty(0, 4, 256, dtype=torch.bfloat16, device=device)
    res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w, save_for_backward=save_for_backward, out=out)
    assert res.output is out
    for t in res[1:]:
        if save_for_backward:
            assert (t.shape, t.dtype, t.device) == ((0, 4), torch.float32, x.device)
        else:
            assert t is None


def _layouts(num_tokens: int, hc: int, hidden: int, device):
    """k / v views of bigger tensors, as engram produces them: padded rows, branch-major k, offsets."""
    kb = torch.randn(num_tokens, hc, hidden + 64, device=device).to(torch.bfloat16)
    yield 'k_padded_rows', kb[..., :hidden], torch.randn(num_tokens, 2 * hidden, device=device).bfloat16()[:, hidden:]
    kt = torch.randn(hc, num_tokens, hidden, device=device).to(torch.bfloat16).transpose(0, 1)
    yield 'k_branch_major', kt, torch.randn(num_tokens, hidden, device=device).bfloat16()
    # 8 and 2 bytes off a 16-byte boundary: the CUDA kernel takes 8- and 2-byte accesses.
    yield 'k_offset_4', kb[..., 4 : 4 + hidden], torch.randn(num_tokens, hidden + 8, device=device).bfloat16()[:, 4:-4]
    yield 'k_offset_1', kb[..., 1 : 1 + hidden], torch.randn(num_tokens, hidden + 8, device=device).bfloat16()[:, 1:-7]


@pytest.mark.npu
@pytest.mark.parametrize(('num_tokens', 'hc', 'hidden'), [(130, 4, 4096), (257, 3, 1088), (7, 8, 192)])
def test_engram_gate_fwd_noncontiguous_k_v(device, num_tokens, hc, hidden):
    x, _, _, w = _inputs(num_tokens, hc, hidden, device)
    for name, k, v in _layouts(num_tokens, hc, hidden, device):
        res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w)
        try:
            _assert_matches_reference(res, x, k, v, w)
        except AssertionError as exc:
            raise AssertionError(f'{name}: {exc}') from exc
        # Same values as with contiguous copies, bit for bit.
        same = cann_ops_tilelang.engram_gate_fwd(x, k.contiguous(), v.contiguous(), w)
        for a, b in zip(res, same, strict=True):
            assert_equal(a, b)


@pytest.mark.npu
def test_engram_gate_fwd_out_and_no_save(device):
    x, k, v, w = _inputs(1000, 4, 1088, device)
    full = cann_ops_tilelang.engram_gate_fwd(x, k, v, w, eps=1e-5, clamp_value=1e-4)
    _assert_matches_reference(full, x, k, v, w, eps=1e-5, clamp_value=1e-4)
    out = torch.full((1000, 4, 1088), float('nan'), dtype=torch.bfloat16, device=device)  # poisoned
    res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w, eps=1e-5, clamp_value=1e-4, out=out)
    assert res.output is out
    assert_equal(out, full.output)
    out.fill_(float('nan'))
    res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w, eps=1e-5, clamp_value=1e-4, save_for_backward=False, out=out)
    assert res.output is out
    assert res[1:] == (None, None, None, None)
    assert_equal(out, full.output)
    res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w, eps=1e-5, clamp_value=1e-4, save_for_backward=False)
    assert_equal(res.output, full.output)


@pytest.mark.npu
def test_engram_gate_fwd_zero_rows(device):
    """dot = 0 (zero k): sign(0) = 0, so the gate is exactly sigmoid(0) = 0.5, as in torch."""
    x, k, v, w = _inputs(5, 2, 256, device)
    k[1] = 0
    res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w)
    assert bool((res.gate_score[1] == 0.5).all())
    assert bool((res.dot[1] == 0).all())
    _assert_matches_reference(res, x, k, v, w)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', gen_benchmark_shapes(), ids=make_param_id)
def test_engram_gate_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    x, k, v, w = _inputs(params['num_tokens'], params['hc'], params['hidden'], device)
    res = cann_ops_tilelang.engram_gate_fwd(x, k, v, w)
    out = torch.empty_like(x)
    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_gate_fwd(x, k, v, w, out=out))
    num_bytes = count_bytes(x, k, v, res.output, res.dot, res.gate_score, res.rstd_x, res.rstd_k)
    benchmark_record(
        kernel='engram_gate_fwd',
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=num_bytes / time_us / 1e3,
        extras=config_extras(engram_gate_fwd_config(x, k, v, w, out=out)),
    )
