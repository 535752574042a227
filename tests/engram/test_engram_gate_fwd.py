"""engram_gate_fwd: lowering (CPU tier), argument contract (CPU tier), values, layouts and benchmark (device)."""

from __future__ import annotations

import inspect

import pytest
import torch

import cann_ops_tilelang
from cann_ops_tilelang import config, engram_gate_fwd, operator
from cann_ops_tilelang.engram import EngramGateFwdResult
from cann_ops_tilelang.engram.engram_gate_fwd_kernel import (
    ASCEND_UB_BUDGET,
    _ascend_ub_bytes,
    choose_engram_gate_fwd_config,
    make_engram_gate_fwd_kernel,
)
from tests.engram.engram_gate_fwd_ref import engram_gate_fwd_ref
from tests.testing.bench import config_extras, make_param_id
from tests.testing.contract import assert_rejects_extra_dimension, assert_rejects_non_tensor_and_dtype
from tests.testing.generator import (
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
from tests.testing.numeric import assert_close, assert_equal, count_bytes

KERNEL_NAME = 'engram_gate_fwd_kernel'
engram_gate_fwd_config = engram_gate_fwd.operator.config  # the configuration a call launches (no launch)
EPS = 1e-6
CLAMP = 1e-6

LEVEL = get_test_level()
VALUE_PARAMS = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden, num_tokens=gen_num_tokens)
# The token count is a runtime size (T.dynamic): the kernels of a level are those of its (hc, hidden) pairs.
SHAPES = generate_samples(LEVEL, hc=gen_hc, hidden=gen_hidden)


def _inputs(num_tokens: int, hc: int, hidden: int, device) -> tuple[torch.Tensor, ...]:
    """hidden_states (T, hc, H), the packed kv (T, hc + 1, H) and weight_fused (hc, H)."""
    # Drawn on the device, in the final dtype: the CPU generator would take seconds at benchmark shapes.
    x = torch.randn(num_tokens, hc, hidden, dtype=torch.bfloat16, device=device)
    kv = torch.randn(num_tokens, hc + 1, hidden, dtype=torch.bfloat16, device=device)
    w = 1.0 + 0.5 * torch.randn(hc, hidden, device=device)  # a product of two RMSNorm weights around 1
    return x, kv, w


def _mask(num_tokens: int, device, *, fraction: float = 0.3) -> torch.Tensor:
    """An image_token_mask with about `fraction` image tokens, the first and last token among them."""
    mask = torch.rand(num_tokens, device=device) < fraction
    if num_tokens:
        mask[0] = mask[-1] = True
    return mask


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
    assert 'kv_stride_t' in lowered.source  # keys and value addressed through kv's own strides
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
    assert 'kv_stride_t' in lowered.source
    assert 'num_tokens' in lowered.source


def test_engram_gate_fwd_variants_lower():
    """No saved tensors, the image-token mask, and the narrower accesses taken for misaligned tensors."""
    for backend, cores in (('ascend', ASCEND_950_VECTOR_CORES), ('cuda', H200_SMS)):
        lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
        cfg = choose_engram_gate_fwd_config(
            backend=backend, hc=4, hidden=4096, num_cores=cores, save_for_backward=False
        )
        lowered = lower(lambda cfg=cfg: make_engram_gate_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
        assert 'dot_o' not in lowered.source
        assert 'image_token_mask' not in lowered.source  # mask=None: no mask argument, no test of it
        for save in (True, False):
            cfg = choose_engram_gate_fwd_config(
                backend=backend, hc=4, hidden=4096, num_cores=cores, save_for_backward=save, has_mask=True
            )
            assert cfg.has_mask
            lowered = lower(lambda cfg=cfg: make_engram_gate_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
            assert 'image_token_mask' in lowered.source
            assert ('dot_o' in lowered.source) == save
    for vec in (4, 1):
        cfg = choose_engram_gate_fwd_config(backend='cuda', hc=3, hidden=192, num_cores=H200_SMS, vec=vec)
        lowered = assert_cuda_kernel_lowers(
            lambda cfg=cfg: make_engram_gate_fwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
        )
        assert 'uint4' not in lowered.source


def _kernel_params(prim_func) -> list[str]:
    """The prim_func's parameters in launch order: buffer names for tensors, variable names for scalars."""
    return [prim_func.buffer_map[p].name if p in prim_func.buffer_map else p.name for p in prim_func.params]


@pytest.mark.parametrize('backend', ['cuda', 'ascend'])
def test_engram_gate_fwd_kernels_take_kv_whole(backend):
    """Every variant takes kv (T, hc + 1, H) as one argument with runtime outer strides and a unit last stride,
    not key and value views (one tensor fewer to convert per launch)."""
    cores = H200_SMS if backend == 'cuda' else ASCEND_950_VECTOR_CORES
    for save in (True, False):
        for has_mask in (False, True):
            cfg = choose_engram_gate_fwd_config(
                backend=backend, hc=3, hidden=192, num_cores=cores, save_for_backward=save, has_mask=has_mask
            )
            prim_func = make_engram_gate_fwd_kernel(cfg)
            expected = ['x', 'kv', 'w', *(['image_token_mask'] if has_mask else []), 'out']
            expected += ['dot_o', 'g_o', 'rx_o', 'rk_o'] if save else []
            assert _kernel_params(prim_func) == [*expected, 'eps', 'clamp_value']
            kv = next(b for b in prim_func.buffer_map.values() if b.name == 'kv')
            assert [str(d) for d in kv.shape] == ['num_tokens', '4', '192']
            assert [str(s) for s in kv.strides] == ['kv_stride_t', 'kv_stride_h', '1']


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


def _args(num_tokens=3, hc=4, hidden=128) -> list:
    """The positional arguments (hidden_states, kv, weight_fused, eps, clamp_value) on the CPU."""
    return [*_inputs(num_tokens, hc, hidden, 'cpu'), EPS, CLAMP]


_ARG_NAMES = ('hidden_states', 'kv', 'weight_fused')
_ARG_DTYPES = (torch.bfloat16, torch.bfloat16, torch.float32)


def test_engram_gate_fwd_signature():
    """TileKernels 2.1.0's parameter names, order and defaults, plus keyword-only out=."""
    params = inspect.signature(cann_ops_tilelang.engram_gate_fwd).parameters
    assert list(params) == [
        'hidden_states',
        'kv',
        'weight_fused',
        'eps',
        'clamp_value',
        'save_for_backward',
        'image_token_mask',
        'inplace',
        'out',
    ]
    assert [p.default for p in params.values()][3:8] == [inspect.Parameter.empty] * 2 + [True, None, False]
    assert params['out'].kind is inspect.Parameter.KEYWORD_ONLY
    assert params['inplace'].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


@pytest.mark.parametrize('index', range(3), ids=_ARG_NAMES)
def test_engram_gate_fwd_rejects_non_tensors_and_dtypes(index):
    args = _args()
    assert_rejects_non_tensor_and_dtype(
        _call,
        args,
        index,
        name=_ARG_NAMES[index],
        dtype=_ARG_DTYPES[index],
        non_tensors=(args[index].float().numpy(), None),
        wrong_dtype=torch.float16,
    )


@pytest.mark.parametrize('index', range(3), ids=_ARG_NAMES)
def test_engram_gate_fwd_rejects_ndim(index):
    assert_rejects_extra_dimension(_call, _args(), index, name=_ARG_NAMES[index])


@pytest.mark.parametrize(
    ('index', 'shape', 'expected'),
    [
        (1, (2, 5, 128), r'kv must have shape \(3, 5, 128\)'),  # token count
        (1, (3, 4, 128), r'kv must have shape \(3, 5, 128\)'),  # middle size hc, not hc + 1
        (1, (3, 6, 128), r'kv must have shape \(3, 5, 128\)'),  # middle size hc + 2
        (1, (3, 5, 64), r'kv must have shape \(3, 5, 128\)'),  # hidden
        (2, (2, 128), r'weight_fused must have shape \(4, 128\)'),
        (2, (4, 192), r'weight_fused must have shape \(4, 128\)'),
    ],
)
def test_engram_gate_fwd_rejects_shape_mismatch(index, shape, expected):
    args = _args()
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
        _call(*_args(2, hc, hidden))


def test_engram_gate_fwd_rejects_layouts():
    x, kv, w, eps, clamp = _args()
    with pytest.raises(ValueError, match='hidden_states must be contiguous'):
        _call(torch.zeros(3, 4, 256, dtype=torch.bfloat16)[..., :128], kv, w, eps, clamp)
    with pytest.raises(ValueError, match='hidden_states must be contiguous'):
        _call(torch.zeros(4, 3, 128, dtype=torch.bfloat16).transpose(0, 1), kv, w, eps, clamp)
    with pytest.raises(ValueError, match='kv must have a contiguous last dimension'):
        _call(x, torch.zeros(3, 5, 256, dtype=torch.bfloat16)[..., ::2], w, eps, clamp)
    with pytest.raises(ValueError, match='kv must have a contiguous last dimension'):
        _call(x, torch.zeros(3, 128, 5, dtype=torch.bfloat16).transpose(1, 2), w, eps, clamp)
    with pytest.raises(ValueError, match='weight_fused must be contiguous'):
        _call(x, kv, torch.zeros(4, 256)[:, :128], eps, clamp)
    # Free outer strides of kv are accepted: the call reaches the device check.
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x, torch.zeros(5, 3, 192, dtype=torch.bfloat16).transpose(0, 1)[..., :128], w, eps, clamp)
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x, torch.zeros(3, 5, 256, dtype=torch.bfloat16)[..., 64:192], w, eps, clamp)


def test_engram_gate_fwd_rejects_out():
    x, kv, w, eps, clamp = _args()
    args = (x, kv, w, eps, clamp)
    with pytest.raises(TypeError, match='out must be a torch.Tensor'):
        _call(*args, out=x.float().numpy())
    with pytest.raises(TypeError, match='out must have dtype torch.bfloat16'):
        _call(*args, out=torch.empty(3, 4, 128))
    with pytest.raises(ValueError, match=r'out must have shape \(3, 4, 128\)'):
        _call(*args, out=torch.empty(3, 4, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r'out must have shape \(3, 4, 128\)'):
        _call(*args, out=torch.empty(3 * 4 * 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match='out must be contiguous'):
        _call(*args, out=torch.empty(3, 4, 256, dtype=torch.bfloat16)[..., :128])
    with pytest.raises(ValueError, match='out must not alias the input hidden_states'):
        _call(*args, out=x)
    with pytest.raises(ValueError, match='out must not alias the input kv'):
        _call(*args, out=kv.view(-1)[: 3 * 4 * 128].view(3, 4, 128))
    big = torch.zeros(2 * 3 * 5 * 128, dtype=torch.bfloat16)
    kv_in_big = big[: 3 * 5 * 128].view(3, 5, 128)
    with pytest.raises(ValueError, match='out must not alias the input kv'):
        _call(x, kv_in_big, w, eps, clamp, out=big[100 : 100 + 3 * 4 * 128].view(3, 4, 128))
    w_bytes = torch.zeros(4 * 128 * 2)
    with pytest.raises(ValueError, match='out must not alias the input weight_fused'):
        _call(
            x,
            kv,
            w_bytes[: 4 * 128].view(4, 128),
            eps,
            clamp,
            out=w_bytes.view(torch.bfloat16)[: 3 * 4 * 128].view(3, 4, 128),
        )
    mask = torch.zeros(3 * 4 * 128 * 2, dtype=torch.bool)
    with pytest.raises(ValueError, match='out must not alias the input image_token_mask'):
        _call(*args, image_token_mask=mask[:3], out=mask.view(torch.bfloat16).view(3, 4, 128))
    # Disjoint halves of one buffer are fine: the call reaches the device check.
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x, kv_in_big, w, eps, clamp, out=big[-3 * 4 * 128 :].view(3, 4, 128))
    with pytest.raises(RuntimeError, match='out must be on cpu, got meta'):
        _call(*args, out=torch.empty(3, 4, 128, dtype=torch.bfloat16, device='meta'))


def test_engram_gate_fwd_rejects_mask():
    args = _args()
    with pytest.raises(TypeError, match='image_token_mask must be a torch.Tensor'):
        _call(*args, image_token_mask=[True, False, True])
    for dtype in (torch.uint8, torch.int32, torch.float32):
        with pytest.raises(TypeError, match='image_token_mask must have dtype torch.bool'):
            _call(*args, image_token_mask=torch.zeros(3, dtype=dtype))
    with pytest.raises(ValueError, match='image_token_mask must have 1 dimensions'):
        _call(*args, image_token_mask=torch.zeros(3, 1, dtype=torch.bool))
    for size in (2, 4, 0):
        with pytest.raises(ValueError, match=r'image_token_mask must have shape \(3,\)'):
            _call(*args, image_token_mask=torch.zeros(size, dtype=torch.bool))
    with pytest.raises(ValueError, match='image_token_mask must be contiguous'):
        _call(*args, image_token_mask=torch.zeros(6, dtype=torch.bool)[::2])
    with pytest.raises(RuntimeError, match='one device'):
        _call(*args, image_token_mask=torch.zeros(3, dtype=torch.bool, device='meta'))
    with pytest.raises(RuntimeError, match='no CPU fallback'):  # a valid mask reaches the device check
        _call(*args, image_token_mask=torch.zeros(3, dtype=torch.bool))


def test_engram_gate_fwd_rejects_inplace():
    x, kv, w, eps, clamp = _args()
    with pytest.raises(ValueError, match='inplace=True overwrites hidden_states.*save_for_backward=False'):
        _call(x, kv, w, eps, clamp, inplace=True)  # save_for_backward defaults to True
    with pytest.raises(ValueError, match='inplace=True writes the output into hidden_states.*out='):
        _call(x, kv, w, eps, clamp, False, None, True, out=torch.empty_like(x))
    for value in (1, None, 'yes', torch.tensor(True)):
        with pytest.raises(TypeError, match='inplace must be a bool'):
            _call(x, kv, w, eps, clamp, False, None, value)
    # hidden_states written in place must not overlap another input.
    buf = torch.zeros(3 * 4 * 128 + 3 * 5 * 128, dtype=torch.bfloat16)
    x_in, kv_in = buf[: 3 * 4 * 128].view(3, 4, 128), buf[3 * 4 * 128 - 64 :][: 3 * 5 * 128].view(3, 5, 128)
    with pytest.raises(ValueError, match=r'hidden_states \(written in place\) must not overlap the input kv'):
        _call(x_in, kv_in, w, eps, clamp, False, None, True)
    w_bytes = torch.zeros(4 * 128 * 2)
    x_w = w_bytes.view(torch.bfloat16)[: 3 * 4 * 128].view(3, 4, 128)
    with pytest.raises(ValueError, match=r'hidden_states \(written in place\) must not overlap the input weight_fused'):
        _call(x_w, kv, w_bytes[: 4 * 128].view(4, 128), eps, clamp, False, None, True)
    mask = torch.zeros(3 * 4 * 128 * 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r'must not overlap the input image_token_mask'):
        _call(mask.view(torch.bfloat16).view(3, 4, 128), kv, w, eps, clamp, False, mask[:3], True)
    # Disjoint inputs pass validation: the call reaches the device check.
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(buf[: 3 * 4 * 128].view(3, 4, 128), buf[3 * 4 * 128 :].view(3, 5, 128), w, eps, clamp, False, None, True)


@pytest.mark.parametrize('value', [1, 0, None, 'yes', torch.tensor(True)])
def test_engram_gate_fwd_rejects_non_bool_save(value):
    with pytest.raises(TypeError, match='save_for_backward must be a bool'):
        _call(*_args(), save_for_backward=value)


@pytest.mark.parametrize(('name', 'index'), [('eps', 3), ('clamp_value', 4)])
def test_engram_gate_fwd_rejects_scalars(name, index):
    args = _args()
    for value in ('1e-6', None, True, torch.tensor(1e-6)):
        bad = list(args)
        bad[index] = value
        with pytest.raises(TypeError, match=f'{name} must be a float'):
            _call(*bad)
    for value in (0.0, -1e-6, float('inf'), float('nan')):
        bad = list(args)
        bad[index] = value
        with pytest.raises(ValueError, match=f'{name} must be a finite number > 0'):
            _call(*bad)
    with pytest.raises(TypeError):
        _call(*args[:3])  # eps and clamp_value have no defaults (TileKernels' signature)


def test_engram_gate_fwd_rejects_devices():
    x, kv, w, eps, clamp = _args()
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors.*no CPU fallback"):
        _call(x, kv, w, eps, clamp)
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        _call(x[:0], kv[:0], w, eps, clamp)  # T = 0 is validated before the empty return
    with pytest.raises(RuntimeError, match='one device'):
        _call(x, kv.to('meta'), w, eps, clamp)
    with pytest.raises(RuntimeError, match='one device'):
        _call(x, kv, w.to('meta'), eps, clamp)


def test_engram_gate_fwd_exported():
    assert 'engram_gate_fwd' in cann_ops_tilelang.__all__
    assert cann_ops_tilelang.engram_gate_fwd is cann_ops_tilelang.engram.engram_gate_fwd
    assert EngramGateFwdResult._fields == ('output', 'dot', 'gate_score', 'rstd_x', 'rstd_k')


def _as_h200(monkeypatch) -> None:
    """CPU tensors planned as an H200's, without a device: the backend 'cuda' and the H200's SM count."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: H200_SMS)


def test_engram_gate_fwd_config_follows_arguments(monkeypatch):
    """engram_gate_fwd_config (what the benchmark records) is the config the operator launches: the mask
    variant only with a mask, the access width from the actual kv (CUDA device faked)."""
    _as_h200(monkeypatch)
    x, kv, w, eps, clamp = _args()
    cfg = engram_gate_fwd_config(x, kv, w, eps, clamp)
    assert (cfg.has_mask, cfg.save_for_backward, cfg.vec, cfg.num_cores) == (False, True, 8, H200_SMS)
    assert cfg == choose_engram_gate_fwd_config(backend='cuda', hc=4, hidden=128, num_cores=H200_SMS)
    mask = torch.zeros(3, dtype=torch.bool)
    cfg = engram_gate_fwd_config(x, kv, w, eps, clamp, False, mask, True)
    assert (cfg.has_mask, cfg.save_for_backward) == (True, False)
    shifted = torch.zeros(3, 5, 130, dtype=torch.bfloat16)[..., 2:]  # 4 bytes off, strides 650 and 130
    assert engram_gate_fwd_config(x, shifted, w, eps, clamp).vec == 2
    # The access width: the largest that every address and used outer stride allows.
    base = torch.zeros(3 * 5 * 136 + 8, dtype=torch.bfloat16)
    assert base.data_ptr() % 16 == 0

    def vec(kv, out=None, x=x):
        return engram_gate_fwd_config(x, kv, w, eps, clamp, out=out).vec

    assert vec(kv) == 8
    assert vec(kv[:, :1].expand(-1, 5, -1)) == 8  # stride 0 over keys and value
    assert vec(base[4 : 4 + 3 * 5 * 128].view(3, 5, 128)) == 4  # 8 bytes off
    assert vec(base[1 : 1 + 3 * 5 * 128].view(3, 5, 128)) == 1  # 2 bytes off
    assert vec(base[: 3 * 5 * 132].view(3, 5, 132)[..., :128]) == 4  # rows 264 bytes apart
    assert vec(base.as_strided((3, 5, 128), (642, 128, 1))) == 2  # tokens 1284 bytes apart
    single = base.as_strided((1, 5, 128), (641, 128, 1))  # one token: its odd stride is never used
    assert vec(single, x=x[:1]) == 8
    assert vec(kv, out=base[1 : 1 + 3 * 4 * 128].view(3, 4, 128)) == 1  # out 2 bytes off


def test_engram_gate_fwd_config_checks_as_the_call(monkeypatch):
    """The configuration query checks its arguments as the call does: valid calls (a parameter, kv's free outer
    strides, an int eps, inplace, out=) pass, and a call with a violation raises the contract's typed error
    (CUDA device faked)."""
    _as_h200(monkeypatch)
    x, kv, w, eps, clamp = _args()
    mask = torch.zeros(3, dtype=torch.bool)
    for args, kwargs in (
        ((x, kv, w, eps, clamp), {}),
        ((x, kv, torch.nn.Parameter(w), eps, clamp, False, mask, False), {}),
        ((x, kv[:, :1].expand(-1, 5, -1), w, eps, clamp), {}),  # kv's outer strides are free
        ((x, torch.zeros(3, 5, 136, dtype=torch.bfloat16)[..., 3:131], w, eps, clamp, True, None), {}),
        ((x, kv, w, 1, clamp), {}),  # an int eps: valid
        ((x, kv, w, eps, clamp, False, None, True), {}),  # inplace
        ((x, kv, w, eps, clamp), {'out': torch.empty_like(x)}),
    ):
        engram_gate_fwd_config(*args, **kwargs)
    for bad in (
        (x, kv, w, eps, clamp, 1),
        (x, kv, w, eps, float('nan')),
        (x, kv, w.double(), eps, clamp),
        (x, kv[:, :4], w, eps, clamp),
        (x, kv, w, eps, clamp, True, mask[:2]),
        (x, kv.transpose(-1, -2).contiguous().transpose(-1, -2), w, eps, clamp),
    ):
        with pytest.raises((TypeError, ValueError)):
            engram_gate_fwd_config(*bad)


# ---------------------------------------------------------------- device tier


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """One bf16 unit in the last place at |t| (8 significand bits; floored at the smallest normal)."""
    mag = t.abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


def _assert_matches_reference(res, x, k, v, w, *, eps=EPS, clamp_value=CLAMP, image_token_mask=None) -> None:
    """Check every output of engram_gate_fwd against the fp32 reference, with derived tolerances.

    - image tokens (image_token_mask True): output = x bit for bit, the four saved values exactly 0; the
      text tokens are then checked as below, on their own.

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
    out = res.output
    assert (out.dtype, tuple(out.shape), out.device) == (torch.bfloat16, (num_tokens, hc, hidden), x.device)
    assert out.is_contiguous()
    if image_token_mask is not None:
        img = image_token_mask
        assert torch.equal(out[img].view(torch.int16), x[img].view(torch.int16)), 'image tokens: output != x'
        for name in ('dot', 'gate_score', 'rstd_x', 'rstd_k'):
            t = getattr(res, name)
            assert bool((t[img].view(torch.int32) == 0).all()), f'image tokens: {name} is not +0'
        text = ~img
        res = EngramGateFwdResult(*(t[text] for t in res))
        x, k, v = x[text], k[text], v[text]
        num_tokens = x.shape[0]
        out = res.output
    ref = engram_gate_fwd_ref(x, k, v, w, eps=eps, clamp_value=clamp_value)
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


def _k_v(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hc = kv.shape[1] - 1
    return kv[:, :hc], kv[:, hc]


@pytest.mark.npu
@pytest.mark.parametrize('params', VALUE_PARAMS, ids=make_param_id)
def test_engram_gate_fwd_values(params, device):
    x, kv, w = _inputs(params['num_tokens'], params['hc'], params['hidden'], device)
    res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    assert isinstance(res, EngramGateFwdResult)
    _assert_matches_reference(res, x, *_k_v(kv), w)


def _ascend_config_classes() -> list[dict]:
    """The smallest (hc, hidden) of each kind of Ascend configuration the chooser picks (all branches in one
    group or not, buffer stages, weight resident in UB or streamed), over hc 1..8 and the tested hidden sizes."""
    chosen = {}
    for hc in range(1, 9):
        for hidden in (64, 192, 1088, 2560, 4096, 5120, 7168, 12288, 16384):
            cfg = choose_engram_gate_fwd_config(
                backend='ascend', hc=hc, hidden=hidden, num_cores=ASCEND_950_VECTOR_CORES
            )
            kind = (cfg.group == hc, cfg.stages, cfg.weight_resident)
            if kind not in chosen or hc * hidden < chosen[kind]['hc'] * chosen[kind]['hidden']:
                chosen[kind] = {'hc': hc, 'hidden': hidden}
    return sorted(chosen.values(), key=lambda p: (p['hc'], p['hidden']))


@pytest.mark.npu
@pytest.mark.parametrize('params', _ascend_config_classes(), ids=make_param_id)
def test_engram_gate_fwd_every_ascend_config(params, device):
    """Each kind of Ascend configuration once (on the emulator in the CPU tier), with one token more than the
    vector cores, so that the persistent loop has a tail; on CUDA (from level 1) the same shapes through its own
    configs."""
    skip_off_ascend_below(LEVEL, 1, device)
    x, kv, w = _inputs(ASCEND_950_VECTOR_CORES + 1, params['hc'], params['hidden'], device)
    _assert_matches_reference(cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP), x, *_k_v(kv), w)


@pytest.mark.npu
@pytest.mark.parametrize(
    'params',
    by_level(
        LEVEL,
        core=[
            {'num_tokens': 130, 'hc': 4, 'hidden': 4096},
            {'num_tokens': 257, 'hc': 3, 'hidden': 1088},
            {'num_tokens': 7, 'hc': 1, 'hidden': 64},
        ],
        default=[{'num_tokens': 1000, 'hc': 4, 'hidden': 7168}],
    ),
    ids=make_param_id,
)
@pytest.mark.parametrize('save_for_backward', [True, False])
def test_engram_gate_fwd_image_tokens(params, save_for_backward, device):
    """Image tokens: output = x bit for bit (also for -0.0 and inf in x), saved values 0; text tokens get
    exactly the bits of the call without a mask (their arithmetic does not depend on it)."""
    num_tokens, hc, hidden = params['num_tokens'], params['hc'], params['hidden']
    x, kv, w = _inputs(num_tokens, hc, hidden, device)
    mask = _mask(num_tokens, device)
    x[0, 0, :4] = torch.tensor([-0.0, float('inf'), -float('inf'), 0.0])  # token 0 is an image token
    kv[0, hc, :2] = torch.tensor([float('inf'), float('nan')])  # x + 0 * v would turn these into NaN
    res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP, save_for_backward, mask)
    plain = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP, save_for_backward)
    text = ~mask
    for a, b in zip(res, plain, strict=True):
        if a is None:
            assert b is None
        else:
            assert torch.equal(a[text], b[text])
    if save_for_backward:
        _assert_matches_reference(res, x, *_k_v(kv), w, image_token_mask=mask)
    else:
        assert res[1:] == (None, None, None, None)
        assert torch.equal(res.output[mask].view(torch.int16), x[mask].view(torch.int16))
    for all_image in (True, False):
        full = torch.full((num_tokens,), all_image, dtype=torch.bool, device=device)
        res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP, save_for_backward, full)
        if all_image:
            assert torch.equal(res.output.view(torch.int16), x.view(torch.int16))
        else:  # bitwise: token 0's inf and NaN make NaN outputs here
            assert torch.equal(res.output.view(torch.int16), plain.output.view(torch.int16))


@pytest.mark.npu
@pytest.mark.parametrize('with_mask', [False, True], ids=['mask=None', 'mask'])
def test_engram_gate_fwd_inplace(with_mask, device):
    """inplace=True writes into hidden_states and returns it; the same bits as out-of-place."""
    num_tokens, hc, hidden = 257, 4, 4096
    x, kv, w = _inputs(num_tokens, hc, hidden, device)
    mask = _mask(num_tokens, device) if with_mask else None
    expected = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP, False, mask)
    xi = x.clone()
    res = cann_ops_tilelang.engram_gate_fwd(xi, kv, w, EPS, CLAMP, False, mask, True)
    assert res.output is xi
    assert res[1:] == (None, None, None, None)
    assert_equal(xi, expected.output)
    # hidden_states and kv may be slices of one buffer when they do not overlap.
    buf = torch.empty(num_tokens * (2 * hc + 1) * hidden, dtype=torch.bfloat16, device=device)
    xb = buf[: num_tokens * hc * hidden].view(num_tokens, hc, hidden)
    kvb = buf[num_tokens * hc * hidden :].view(num_tokens, hc + 1, hidden)
    xb.copy_(x)
    kvb.copy_(kv)
    cann_ops_tilelang.engram_gate_fwd(
        xb, kvb, w, EPS, CLAMP, save_for_backward=False, image_token_mask=mask, inplace=True
    )
    assert_equal(xb, expected.output)
    assert_equal(kvb, kv)


@pytest.mark.npu
@pytest.mark.parametrize('save_for_backward', [True, False])
def test_engram_gate_fwd_empty(device, save_for_backward):
    x, kv, w = _inputs(0, 4, 256, device)
    out = torch.empty(0, 4, 256, dtype=torch.bfloat16, device=device)
    mask = torch.zeros(0, dtype=torch.bool, device=device)
    for image_token_mask in (None, mask):
        res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP, save_for_backward, image_token_mask, out=out)
        assert res.output is out
        for t in res[1:]:
            if save_for_backward:
                assert (t.shape, t.dtype, t.device) == ((0, 4), torch.float32, x.device)
            else:
                assert t is None


def _layouts(num_tokens: int, hc: int, hidden: int, device, *, misaligned: bool = True):
    """kv views of bigger tensors, as engram produces them: padded rows, branch-major, offsets (`misaligned`)."""
    kb = torch.randn(num_tokens, hc + 1, hidden + 64, device=device).to(torch.bfloat16)
    yield 'kv_padded_rows', kb[..., :hidden]
    kt = torch.randn(hc + 1, num_tokens, hidden, device=device).to(torch.bfloat16)
    yield 'kv_branch_major', kt.transpose(0, 1)
    wide = torch.randn(num_tokens, 2 * (hc + 1) * hidden, device=device).to(torch.bfloat16)
    yield 'kv_token_stride_2x', wide.view(num_tokens, 2 * (hc + 1), hidden)[:, hc + 1 :]
    if not misaligned:
        return
    # 8 and 2 bytes off a 16-byte boundary: the CUDA kernel takes 8- and 2-byte accesses.
    yield 'kv_offset_4', kb[..., 4 : 4 + hidden]
    yield 'kv_offset_1', kb[..., 1 : 1 + hidden]


_NONCONTIGUOUS_SHAPES = [(130, 4, 4096), (257, 3, 1088), (7, 8, 192)]


@pytest.mark.npu
@pytest.mark.parametrize(('num_tokens', 'hc', 'hidden'), _NONCONTIGUOUS_SHAPES)
def test_engram_gate_fwd_noncontiguous_kv(device, num_tokens, hc, hidden):
    x, _, w = _inputs(num_tokens, hc, hidden, device)
    # Each misalignment is a CUDA kernel of its own access width: level 0 compiles them for one shape.
    misaligned = LEVEL >= 1 or (num_tokens, hc, hidden) == _NONCONTIGUOUS_SHAPES[0]
    for name, kv in _layouts(num_tokens, hc, hidden, device, misaligned=misaligned):
        assert not kv.is_contiguous()
        res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP)
        try:
            _assert_matches_reference(res, x, *_k_v(kv), w)
        except AssertionError as exc:
            raise AssertionError(f'{name}: {exc}') from exc
        # Same values as with a contiguous copy, bit for bit.
        same = cann_ops_tilelang.engram_gate_fwd(x, kv.contiguous(), w, EPS, CLAMP)
        for a, b in zip(res, same, strict=True):
            assert_equal(a, b)


@pytest.mark.npu
def test_engram_gate_fwd_misaligned_weight(device):
    """A weight_fused 4 bytes past a 16-byte boundary (the kernels read it in 16-byte vectors) is copied first:
    the same bits as the aligned weight, on the full and on the fast path (second call)."""
    x, kv, w = _inputs(33, 4, 4096, device)  # hc and H of a level-0 values test: no kernel of its own
    storage = torch.empty(w.numel() + 1, device=device)
    shifted = storage[1:].view(w.shape)
    shifted.copy_(w)
    expected = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    for _ in range(2):
        for a, b in zip(cann_ops_tilelang.engram_gate_fwd(x, kv, shifted, EPS, CLAMP), expected, strict=True):
            assert_equal(a, b)


@pytest.mark.npu
def test_engram_gate_fwd_out_and_no_save(device):
    x, kv, w = _inputs(1000, 4, 1088, device)
    full = cann_ops_tilelang.engram_gate_fwd(x, kv, w, 1e-5, 1e-4)
    _assert_matches_reference(full, x, *_k_v(kv), w, eps=1e-5, clamp_value=1e-4)
    out = torch.full((1000, 4, 1088), float('nan'), dtype=torch.bfloat16, device=device)  # poisoned
    res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, 1e-5, 1e-4, out=out)
    assert res.output is out
    assert_equal(out, full.output)
    out.fill_(float('nan'))
    res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, 1e-5, 1e-4, save_for_backward=False, out=out)
    assert res.output is out
    assert res[1:] == (None, None, None, None)
    assert_equal(out, full.output)
    res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, 1e-5, 1e-4, False)
    assert_equal(res.output, full.output)


@pytest.mark.npu
def test_engram_gate_fwd_zero_rows(device):
    """dot = 0 (zero k): sign(0) = 0, so the gate is exactly sigmoid(0) = 0.5, as in torch."""
    x, kv, w = _inputs(5, 2, 256, device)
    kv[1, :2] = 0
    res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    assert bool((res.gate_score[1] == 0.5).all())
    assert bool((res.dot[1] == 0).all())
    _assert_matches_reference(res, x, *_k_v(kv), w)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', gen_benchmark_shapes(), ids=make_param_id)
def test_engram_gate_fwd_benchmark(params, device, benchmark_timer, benchmark_record):
    x, kv, w = _inputs(params['num_tokens'], params['hc'], params['hidden'], device)
    res = cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    out = torch.empty_like(x)
    time_us = benchmark_timer(lambda: cann_ops_tilelang.engram_gate_fwd(x, kv, w, EPS, CLAMP, out=out))
    num_bytes = count_bytes(x, kv, res.output, res.dot, res.gate_score, res.rstd_x, res.rstd_k)
    benchmark_record(
        kernel='engram_gate_fwd',
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=num_bytes / time_us / 1e3,
        extras=config_extras(engram_gate_fwd_config(x, kv, w, EPS, CLAMP, out=out)),
    )
