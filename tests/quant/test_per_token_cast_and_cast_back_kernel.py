"""per_token_cast_and_cast_back, kernel level (no public interface yet): configuration and lowering (CPU tier),
the kernel called directly on x (updated in place) against the reference, bit-exact (device tier: an
accelerator, or the Ascend kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.per_token_cast_and_cast_back_kernel import (
    choose_per_token_cast_and_cast_back_config,
    get_per_token_cast_and_cast_back_kernel,
    make_per_token_cast_and_cast_back_kernel,
)
from tests.quant.cast_ref import scaled_rows
from tests.quant.per_token_cast_and_cast_back_ref import per_token_cast_and_cast_back_ref
from tests.testing.bench import make_param_id
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)

KERNEL_NAME = 'per_token_cast_and_cast_back_kernel'
LEVEL = get_test_level()

# Level 0: every dtype, block size and scale format once, in three kernels; level 1 the full product.
_CORE_VARIANTS = [
    dict(in_dtype='bfloat16', block_size=32, round_sf=False),
    dict(in_dtype='float32', block_size=64, round_sf=True),
    dict(in_dtype='bfloat16', block_size=128, round_sf=True),
]
_ALL_VARIANTS = generate_samples(in_dtype=['bfloat16', 'float32'], block_size=[32, 64, 128], round_sf=[False, True])
VARIANTS = by_level(LEVEL, core=_CORE_VARIANTS, default=_ALL_VARIANTS)
# Hidden sizes: the minimum, an odd number of 64-column registers (no whole warp of 16-byte bf16 vectors on
# CUDA), several column tiles, production sizes. The device tests at level 0 use 1152 only: three Ascend kernels.
HIDDEN = by_level(LEVEL, core=(256, 1152), default=(128, 192, 7168), full=(4096, 5120, 16384))
VALUE_HIDDEN = 1152
NEW_HIDDEN = [h for h in HIDDEN if h != VALUE_HIDDEN and LEVEL > 0]
NUM_TOKENS = by_level(LEVEL, core=(1, 37), default=(3, 300), full=(4001,))


def _config(backend: str, num_cores: int, variant: dict, hidden: int, **kwargs):
    return choose_per_token_cast_and_cast_back_config(
        backend=backend, num_cores=num_cores, hidden=hidden, **variant, **kwargs
    )


def _lowering_cases() -> list[dict]:
    cases = generate_samples(variant=VARIANTS, hidden=HIDDEN)
    return [c for c in cases if c['hidden'] % max(64, c['variant']['block_size']) == 0]


def _case_id(case: dict) -> str:
    return make_param_id({**case['variant'], 'hidden': case['hidden']})


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)


# ---------------------------------------------------------------- CPU tier: configuration


def test_config_is_pure_and_hashable():
    a = choose_per_token_cast_and_cast_back_config(backend='ascend', num_cores=64, hidden=7168, in_dtype=torch.bfloat16)
    b = choose_per_token_cast_and_cast_back_config(backend='ascend', num_cores=64, hidden=7168, in_dtype='bfloat16')
    assert a == b
    assert hash(a) == hash(b)
    assert (a.block_size, a.round_sf, a.num_stages) == (32, False, 2)
    assert 7168 % a.block_k == 0
    assert a.block_k % 64 == 0
    assert a.block_k <= 4096
    c = choose_per_token_cast_and_cast_back_config(
        backend='cuda', num_cores=132, hidden=7168, in_dtype=torch.float32, block_size=128, round_sf=True
    )
    assert c.vec == 4  # 16 bytes of fp32
    assert c.block_k % 128 == 0
    assert c.threads % 32 == 0
    d = choose_per_token_cast_and_cast_back_config(
        backend='cuda', num_cores=132, hidden=256, in_dtype='bfloat16', vec=2
    )  # a caller's narrower access for a less aligned x
    assert d.vec == 2


@pytest.mark.parametrize(
    ('kwargs', 'match'),
    [
        (dict(backend='cpu'), 'backend'),
        (dict(in_dtype=torch.float16), 'in_dtype'),
        (dict(block_size=8), 'block_size'),
        (dict(fmt='e5m2'), 'fmt must be one of'),
        (dict(round_sf=True, e4m3_sf=True), 'e4m3_sf excludes round_sf'),
        (dict(hidden=96), 'multiple of 64'),
        (dict(hidden=192, block_size=128), 'multiple of 128'),
        (dict(hidden=0), 'positive multiple'),
        (dict(backend='cuda', vec=16), 'vec must be'),
        (dict(backend='cuda', vec=3), 'vec must be'),
    ],
)
def test_config_rejects(kwargs, match):
    args = dict(backend='ascend', num_cores=64, hidden=256, in_dtype=torch.bfloat16) | kwargs
    with pytest.raises(ValueError, match=match):
        choose_per_token_cast_and_cast_back_config(**args)


def test_reference_hand_values():
    """448 round-trips exactly (scale 1); 1.0625 in a block of maximum 448 is an e4m3 tie, to 1.0 (even); an inf
    makes its block NaN; -0.0 stays -0.0; round_sf keeps a block with maximum 2 ** k exact."""
    x = torch.zeros(3, 64)
    x[0, :32] = 1.0625
    x[0, 0] = 448.0
    x[0, 32:] = -0.0
    x[1, :32] = 1.0
    x[1, 3] = float('inf')
    x[1, 32:] = 3.0
    x[2, :] = torch.arange(64.0) / 32
    out = per_token_cast_and_cast_back_ref(x, 32)
    assert out[0, 0].item() == 448.0
    assert out[0, 1:32].eq(1.0).all()
    assert _bits(out[0, 32:]).eq(torch.tensor(-0.0).view(torch.int32)).all()
    assert out[1, :32].isnan().all()
    assert out[1, 32:].eq(3.0).all()
    pow2 = per_token_cast_and_cast_back_ref(x[2:].to(torch.bfloat16), 32, round_sf=True)
    assert pow2.dtype == torch.bfloat16
    assert torch.equal(pow2[0, :16].float(), x[2, :16])  # small dyadic values are e4m3-exact under a pow2 scale


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_ascend_lowers(case):
    cfg = _config('ascend', ASCEND_950_VECTOR_CORES, case['variant'], case['hidden'])
    lowered = assert_ascend_kernel_lowers(
        lambda: make_per_token_cast_and_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'x_stride' in lowered.source  # the row stride is the kernel's dynamic argument


@pytest.mark.parametrize('case', _lowering_cases(), ids=_case_id)
def test_cuda_lowers(case):
    cfg = _config('cuda', H200_SMS, case['variant'], case['hidden'])
    source = assert_cuda_kernel_lowers(
        lambda: make_per_token_cast_and_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    ).source
    assert '__NV_SATFINITE' in source  # the fp8 narrowing saturates at +-448, as the reference clamps
    assert 'x_stride' in source
    # x is read once and written once, in cfg.vec-element vectors: 16 bytes where H has a whole warp of them.
    vector = {('bfloat16', 8): 'uint4', ('bfloat16', 4): 'uint2', ('bfloat16', 2): 'uint1'}
    vector |= {('float32', 4): 'float4', ('float32', 2): 'float2'}
    assert source.count(f'*({vector[cfg.in_dtype, cfg.vec]}*)(x + ') == 2, source
    if case['hidden'] % 256 == 0:
        assert cfg.vec * (2 if cfg.in_dtype == 'bfloat16' else 4) == 16


_FORMAT_LOWERING = [  # (in_dtype, block_size, fmt, round_sf, e4m3_sf): NVFP4, MXFP4, e4m3 with E4M3 scales
    ('bfloat16', 16, 'e2m1', False, True),
    ('float32', 32, 'e2m1', True, False),
    ('bfloat16', 64, 'e4m3', False, True),
]


@pytest.mark.parametrize(('in_dtype', 'block_size', 'fmt', 'round_sf', 'e4m3_sf'), _FORMAT_LOWERING)
def test_cuda_lowers_every_format(in_dtype, block_size, fmt, round_sf, e4m3_sf):
    """FP4 data and E4M3 scales on CUDA (their values run on a GPU or, for the Ascend kernel, the emulator): x in
    16-byte vectors, read once and written once (a store of the e2m1 selects does not vectorize: the round trip goes
    through registers); the fp8 conversion only for e4m3 data; E4M3 scales' IEEE reciprocal."""
    cfg = choose_per_token_cast_and_cast_back_config(
        backend='cuda', num_cores=H200_SMS, hidden=4096, in_dtype=in_dtype, block_size=block_size,
        round_sf=round_sf, fmt=fmt, e4m3_sf=e4m3_sf,
    )  # fmt: skip
    source = assert_cuda_kernel_lowers(
        lambda: make_per_token_cast_and_cast_back_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    ).source
    assert source.count(f'*({"uint4" if in_dtype == "bfloat16" else "float4"}*)(x + ') == 2
    assert ('__NV_SATFINITE' in source) == (fmt == 'e4m3')
    assert ('__frcp_rn' in source) == e4m3_sf


# ---------------------------------------------------------------- device tier


def _run(x: torch.Tensor, variant: dict, device) -> None:
    cfg = _config(backend_of(device), get_num_cores(device), variant, x.shape[1])
    launch_kernel(get_per_token_cast_and_cast_back_kernel, cfg, device, x)


def _check(x: torch.Tensor, variant: dict, device) -> None:
    want = per_token_cast_and_cast_back_ref(x.cpu(), variant['block_size'], round_sf=variant['round_sf'])
    _run(x, variant, device)
    assert torch.equal(_bits(x.cpu()), _bits(want))


@pytest.mark.npu
@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('num_tokens', NUM_TOKENS)
def test_kernel_values(variant, num_tokens, device):
    _check(scaled_rows(num_tokens, VALUE_HIDDEN, variant['in_dtype'], device), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('hidden', NEW_HIDDEN)
def test_kernel_hidden_sizes(hidden, device):
    variant = _CORE_VARIANTS[0]  # a level-0 kernel configuration class, new hidden sizes
    _check(scaled_rows(5, hidden, variant['in_dtype'], device), variant, device)


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS[:2], ids=make_param_id)
def test_kernel_strided_rows(variant, device):
    """Rows of a wider tensor (stride(0) > H, a multiple of 16 bytes): the columns past H are untouched."""
    hidden, width = VALUE_HIDDEN, VALUE_HIDDEN + 64
    full = scaled_rows(7, width, variant['in_dtype'], device)
    before = full.cpu().clone()
    x = full[:, :hidden]
    assert x.stride(0) == width
    want = per_token_cast_and_cast_back_ref(before[:, :hidden], variant['block_size'], round_sf=variant['round_sf'])
    _run(x, variant, device)
    got = full.cpu()
    assert torch.equal(_bits(got[:, :hidden]), _bits(want))
    assert torch.equal(_bits(got[:, hidden:]), _bits(before[:, hidden:]))


@pytest.mark.npu
@pytest.mark.parametrize('variant', _CORE_VARIANTS, ids=make_param_id)
def test_kernel_special_values(variant, device):
    """Signed zeros, all-zero blocks (the amax floor), bf16/fp32 subnormals, e4m3 ties, values at +-448 after
    scaling, and infinities: the block of an inf gets scale inf and inverse 0, so the whole block is NaN."""
    bs = variant['block_size']
    hidden = VALUE_HIDDEN
    dtype = getattr(torch, variant['in_dtype'])
    tiny = torch.finfo(dtype).tiny
    pool = torch.tensor([0.0, -0.0, tiny, -tiny / 4, 1.0, -1.0625, 1.1875, 3.0, -448.0, 1e-30, 1e30])
    x = pool[torch.randint(len(pool), (6, hidden))].to(dtype)
    x[0, :bs] = -0.0
    x[1, bs : 2 * bs] = 0.0
    x[2, :bs] = tiny * torch.arange(bs)  # subnormal-sized block, floored
    x[3, 5] = float('inf')
    x[4, 2 * bs + 1] = -float('inf')
    want = per_token_cast_and_cast_back_ref(x, bs, round_sf=variant['round_sf'])
    got = x.to(device)
    _run(got, variant, device)
    got = got.cpu()
    # NaN is NaN whatever its sign and payload (inf * 0 gives the platform's default NaN); the rest bit-exact.
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert int(nan.sum()) == 2 * bs  # the two blocks with an infinity
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan])
    assert _bits(want[0, :bs]).eq(_bits(torch.tensor(-0.0, dtype=dtype))).all()
