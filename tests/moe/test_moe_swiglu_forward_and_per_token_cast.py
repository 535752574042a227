"""Tests of moe_swiglu_forward_and_per_token_cast.

CPU tier: the Ascend 950 and CUDA kernels lower for every configuration of the level; the argument contract on CPU
tensors (each wrong argument its typed error, the cast's options among them); the torch.library forms on fake
tensors. Device tier (`npu`; the Ascend kernel on the emulator with --ascend-emulator): the fused result equals
per_token_cast(moe_swiglu_forward(x, 'fp32', ...)) bit for bit, data and scales (padding rows included), the clamp
counts equal moe_swiglu_forward's; the values against the float64 reference within the e4m3 rounding; T = 0 and 1;
out= buffers; the benchmark (`benchmark`, the peer's shapes).
"""

import dataclasses
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config, operator
from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.moe import moe_swiglu_forward, moe_swiglu_forward_and_per_token_cast
from cann_ops_tilelang.moe.moe_swiglu_forward_kernel import (
    choose_moe_swiglu_forward_config,
    get_moe_swiglu_forward_kernel,
    make_moe_swiglu_forward_kernel,
)
from cann_ops_tilelang.quant import QuantTensor, per_token_cast
from cann_ops_tilelang.quant.per_token_cast_kernel import choose_per_token_cast_config
from tests.quant.cast_ref import (
    SCALE_ROWS_2880,
    assert_col_major_buffer_written,
    assert_peer_layout,
    logical_sf_bytes,
    per_token_cast_ref,
    tma_col_major_sf,
    ue8m0_to_fp32,
)
from tests.testing.bench import config_extras, make_param_id
from tests.testing.generator import by_level, get_test_level
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)
from tests.testing.numeric import assert_equal, count_bytes
from tests.testing.timing import record_name

from .moe_swiglu_forward_ref import moe_swiglu_forward_ref
from .test_moe_swiglu_forward import EVERY, has, make_inputs

LEVEL = get_test_level()
KERNEL_NAME = 'moe_swiglu_forward_kernel'
_SF = {'fp32': (False, False), 'pow2': (True, False), 'ue8m0': (True, True)}  # round_sf, use_packed_ue8m0
# Level 0: the peer's two blocks, the plain kernel with fp32 scales and the every-option one with packed UE8M0 scales
# whose rows end in padding (34 blocks of 32), each compiled once (the second with its moe_swiglu_forward and
# per_token_cast kernels for the bit-for-bit comparison).
VARIANTS = by_level(
    LEVEL,
    core=[
        dict(dtype='bfloat16', hidden=256, block=128, sf='fp32', options=''),
        dict(dtype='float32', hidden=1088, block=32, sf='ue8m0', options=EVERY),
    ],
    default=[
        dict(dtype='bfloat16', hidden=4096, block=128, sf='pow2', options='weights+scaling'),
        dict(dtype='bfloat16', hidden=1088, block=16, sf='fp32', options='layout+clamp+count'),
        dict(dtype='float32', hidden=640, block=64, sf='ue8m0', options='clamp'),
        dict(dtype='bfloat16', hidden=7168, block=32, sf='ue8m0', options=EVERY),
    ],
    full=[dict(dtype='bfloat16', hidden=16384, block=128, sf='ue8m0', options=EVERY)],
)
NUM_TOKENS = by_level(LEVEL, core=(1, 300), default=(161,), full=(4001,))
# use_tma_aligned_col_major_sf: level 0's two configurations column-major (one without, one with the expert layout),
# T = 0, 1 and 37 (not a multiple of 4; with the layout rows 5..36 are padding); level 1 adds more.
COL_MAJOR_VARIANTS = by_level(
    LEVEL,
    core=VARIANTS[:2],
    default=[
        dict(dtype='bfloat16', hidden=1088, block=16, sf='pow2', options='layout+clamp+count'),
        dict(dtype='bfloat16', hidden=4608, block=128, sf='ue8m0', options='layout+weights'),  # 36 blocks: one task
    ],
)
COL_MAJOR_TOKENS = by_level(LEVEL, core=(0, 1, 37), default=(0, 1, 37, 300))
PARAMS = [dict(variant, num_tokens=num_tokens) for variant in VARIANTS for num_tokens in NUM_TOKENS]
X = torch.zeros(4, 256, dtype=torch.bfloat16)
BENCHMARK_PARAMS = [
    dict(num_tokens=num_tokens, hidden=hidden, block=block)
    for num_tokens in (4001, 8192)
    for hidden in (2048, 4096, 7168)
    for block in (32, 128)
]


def make_config(backend: str, variant: dict, **kwargs):
    round_sf, packed = _SF[variant['sf']]
    return choose_moe_swiglu_forward_config(
        backend=backend,
        num_cores=ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS,
        hidden=variant['hidden'],
        in_dtype=variant['dtype'],
        fmt='e4m3',
        block_size=variant['block'],
        round_sf=round_sf,
        packed_ue8m0=packed,
        with_layout=has(variant, 'layout'),
        with_weight=has(variant, 'weights'),
        clamp=has(variant, 'clamp'),
        count_clamp=has(variant, 'count'),
        **kwargs,
    )


def fused(inputs: dict, variant: dict, **kwargs) -> QuantTensor:
    round_sf, packed = _SF[variant['sf']]
    return moe_swiglu_forward_and_per_token_cast(
        **inputs, fmt='e4m3', num_per_channels=variant['block'], round_sf=round_sf, use_packed_ue8m0=packed, **kwargs
    )


def scales_fp32(sf: torch.Tensor, variant: dict) -> torch.Tensor:
    """The scale of each block as fp32 (UE8M0 bytes decoded)."""
    if not _SF[variant['sf']][1]:
        return sf.cpu()
    blocks = -(-variant['hidden'] // variant['block'])  # a short last block has its scale
    return ue8m0_to_fp32(sf.cpu().view(torch.uint8)[:, :blocks])  # byte k of a row: block k, then zero padding


# ---------------------------------------------------------------- CPU tier: lowering and contract


@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_moe_swiglu_forward_and_per_token_cast_ascend_kernel_lowers(variant):
    cfg = make_config('ascend', variant)
    assert cfg.fp8
    assert cfg.block_size == variant['block']
    assert_ascend_kernel_lowers(lambda: make_moe_swiglu_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize('variant', VARIANTS, ids=make_param_id)
def test_moe_swiglu_forward_and_per_token_cast_cuda_kernel_lowers(variant):
    cfg = make_config('cuda', variant)
    assert_cuda_kernel_lowers(lambda: make_moe_swiglu_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)


@pytest.mark.parametrize(
    ('args', 'kwargs', 'error', 'match'),
    [
        ((X.half(), 'e4m3', 128), {}, TypeError, 'x must have dtype torch.bfloat16 or torch.float32'),
        ((X, 'bf16', 128), {}, ValueError, "fmt must be 'e4m3'"),
        ((X, 'e4m3', 48), {}, ValueError, r'num_per_channels must be one of \(16, 32, 64, 128\)'),
        ((X, 'e4m3', 128), {'use_tma_aligned_col_major_sf': True}, RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, 'e4m3', 64), {'use_tma_aligned_col_major_sf': True,
                           'out': (torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 2))}, ValueError,
         r'out\[1\] must have strides \(1, 4\) for shape \(4, 2\) .* got \(2, 1\)'),
        ((X, 'e4m3', 64), {'out': (torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(2, 4).T)}, ValueError,
         r'out\[1\] must be contiguous'),
        ((X, 'e4m3', 64), {'use_tma_aligned_col_major_sf': True,
                           'out': (torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(2, 8).T[:4])},
         ValueError, r'out\[1\] must have strides \(1, 4\) for shape \(4, 2\) .* got \(1, 8\)'),
        ((X, 'e4m3', 64), {'use_tma_aligned_col_major_sf': True,
                           'out': (torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(2, 4).T)},
         RuntimeError, "no kernels for 'cpu' tensors"),
        ((X, 'e4m3', 128), {'use_packed_ue8m0': True}, ValueError, 'use_packed_ue8m0=True needs round_sf=True'),
        ((X[:, :192].clone(), 'e4m3', 32), {}, ValueError, 'I a positive multiple of 64'),
        ((X[:, :128].clone(), 'e4m3', 128), {}, RuntimeError, "no kernels for 'cpu' tensors"),  # a short block
        ((X, 'e4m3', 128), {'routed_scaling_factor': 2.0}, ValueError, 'routed_scaling_factor needs topk_weights'),
        ((X, 'e4m3', 128), {'clamped_count': torch.zeros(4, dtype=torch.int64)}, ValueError,
         'clamped_count needs clamp_value'),
        ((X, 'e4m3', 128), {'out': (torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 2))}, ValueError,
         r'out\[1\] must have shape \(4, 1\)'),
        ((X, 'e4m3', 32), {'round_sf': True, 'use_packed_ue8m0': True,
                           'out': (torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 1))}, TypeError,
         r'out\[1\] must have dtype torch.int32'),
        ((X, 'e4m3', 128), {}, RuntimeError, "no kernels for 'cpu' tensors"),
    ],
)  # fmt: skip
def test_moe_swiglu_forward_and_per_token_cast_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_swiglu_forward_and_per_token_cast(*args, **kwargs)


FORMS = moe_swiglu_forward_and_per_token_cast.operator.forms


def test_moe_swiglu_forward_and_per_token_cast_fake_tensors(monkeypatch):
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    assert list(FORMS) == ['moe_swiglu_forward_and_per_token_cast', 'moe_swiglu_forward_and_per_token_cast_out']
    with FakeTensorMode():
        x = torch.empty(161, 2176, dtype=torch.float32, device='cuda')
        result = moe_swiglu_forward_and_per_token_cast(x, 'e4m3', 32, round_sf=True, use_packed_ue8m0=True)
        assert isinstance(result, QuantTensor)
        assert (result.data.shape, result.data.dtype) == ((161, 1088), torch.float8_e4m3fn)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((161, 9), torch.int32)
        x = torch.empty(161, 1024, dtype=torch.bfloat16, device='cuda')
        result = moe_swiglu_forward_and_per_token_cast(x, 'e4m3', 128)
        assert (tuple(result.sf.shape), result.sf.dtype) == ((161, 4), torch.float32)
        with pytest.raises(ValueError, match='num_per_channels must be one of'):
            FORMS['moe_swiglu_forward_and_per_token_cast'](x, 'e4m3', 8, None, None, None, False, False, False, None,
                                                           None)  # fmt: skip


@pytest.mark.parametrize('num_tokens', [0, 1, 5, 37])
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_forward_and_per_token_cast_col_major_fake_strides(num_tokens, backend, monkeypatch):
    """While torch traces: column-major scales of per_token_cast's layout on each backend (TileKernels' strides:
    CUDA T rounded up to 16 bytes, Ascend T), fp32 and UE8M0 words, with and without the expert layout, the
    functional form and the out= form; the data row-major."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    device = 'cuda' if backend == 'cuda' else 'cpu'
    with FakeTensorMode():
        x = torch.empty(num_tokens, 2176, dtype=torch.bfloat16, device=device)
        psum = torch.empty(3, dtype=torch.int32, device=device)
        for variant, extra in ((dict(block=32, sf='fp32'), {}), (dict(block=64, sf='ue8m0'), {'psum': psum})):
            inputs = {'x': x}
            if extra:
                inputs['psum_num_tokens_per_expert'] = extra['psum']
            result = fused(inputs, variant, use_tma_aligned_col_major_sf=True)
            assert result.data.is_contiguous()
            assert_peer_layout(result.sf, num_tokens, variant['sf'], backend)
            peer = tma_col_major_sf(tuple(result.sf.shape), result.sf.dtype, backend)
            buffers = (
                torch.empty_like(result.data),
                torch.empty_strided(peer.shape, peer.stride(), dtype=peer.dtype, device=device),
            )
            again = fused(inputs, variant, use_tma_aligned_col_major_sf=True, out=buffers)
            assert again.data is buffers[0]
            assert again.sf is buffers[1]


def test_moe_swiglu_forward_and_per_token_cast_col_major_config():
    """The layout is a configuration field of its own (in the choice: a kernel of its own), of the FP8 output
    only; on Ascend column-major UE8M0 tasks hold whole words (the whole row where the row-major task splits one)."""
    variant = VARIANTS[0]
    rows = make_config('ascend', variant)
    cols = make_config('ascend', variant, col_major_sf=True)
    assert (cols.col_major_sf, rows.col_major_sf, cols != rows, hash(cols) != hash(rows)) == (True, False, True, True)
    with pytest.raises(ValueError, match='col_major_sf applies to fmt "e4m3" only'):
        choose_moe_swiglu_forward_config(backend='cuda', num_cores=H200_SMS, hidden=256, in_dtype='bfloat16',
                                         fmt='bf16', col_major_sf=True)  # fmt: skip
    with pytest.raises(TypeError, match='col_major_sf must be a bool'):
        make_config('cuda', variant, col_major_sf=1)
    words = dict(dtype='bfloat16', hidden=4608, block=128, sf='ue8m0', options='')  # 36 blocks, 18 per 2304 tile
    assert make_config('ascend', words).block_k == 2304
    assert make_config('ascend', words, col_major_sf=True).block_k == 4608
    with pytest.raises(ValueError, match='need whole int32 words per task'):
        dataclasses.replace(make_config('ascend', words, col_major_sf=True), block_k=2304)


_SF_DMA = re.compile(r'asc_copy_ub2gm_align\([^;]*out_sf[^;]*, (\d+), (\d+), ([^;]*sf_stride[^;]*), (\d+)\);')


@pytest.mark.parametrize('variant', COL_MAJOR_VARIANTS, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_forward_and_per_token_cast_col_major_lowers(backend, variant):
    """Both kernels write the column-major scales themselves, the row stride a launch argument: on CUDA one store
    per scale (UE8M0: per byte); on Ascend one DMA per task whose bursts are fp32 scales or UE8M0 words, a row
    stride apart."""
    cfg = make_config(backend, variant, col_major_sf=True)
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_moe_swiglu_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    assert 'sf_stride' in source
    if backend == 'ascend':
        ((n_burst, len_burst, _, ub_stride),) = _SF_DMA.findall(source)
        bursts = (cfg.groups_per_tile + cfg.sf_padding) // (4 if cfg.packed_ue8m0 else 1)
        assert (int(n_burst), int(len_burst), int(ub_stride)) == (bursts, 4, 4)


# ---------------------------------------------------------------- device tier


@pytest.mark.npu
@pytest.mark.parametrize('params', PARAMS, ids=make_param_id)
def test_moe_swiglu_forward_and_per_token_cast_values(params, device):
    _assert_values(params, params['num_tokens'], device)


def _assert_values(variant, num_tokens, device, inputs=None):
    round_sf, packed = _SF[variant['sf']]
    inputs = inputs or make_inputs(variant, num_tokens, device)
    counting = has(variant, 'count')
    clamped = torch.zeros(4, dtype=torch.int64, device=device) if counting else None
    result = fused(inputs, variant, clamped_count=clamped)
    # The fused bytes are per_token_cast's of moe_swiglu_forward's fp32 result (padding rows: y = 0).
    unfused_count = torch.zeros(4, dtype=torch.int64, device=device) if counting else None
    y = moe_swiglu_forward(**inputs, fmt='fp32', clamped_count=unfused_count)
    expected = per_token_cast(y, 'e4m3', variant['block'], round_sf=round_sf, use_packed_ue8m0=packed)
    assert_equal(result.data.view(torch.uint8), expected.data.view(torch.uint8))
    assert_equal(result.sf, expected.sf)
    if counting:
        assert_equal(clamped, unfused_count)
    # The values: within the e4m3 rounding of the float64 reference (half a step of 3 mantissa bits, or of the
    # subnormal step sf * 2**-9), the scales of fp32 rounding of the reference's block maxima.
    reference, counts = moe_swiglu_forward_ref(
        inputs['x'], inputs.get('psum_num_tokens_per_expert'), inputs.get('topk_weights'),
        inputs.get('routed_scaling_factor'), inputs.get('clamp_value'),
    )  # fmt: skip
    if counting:
        assert_equal(clamped.cpu(), counts)
    scale = scales_fp32(result.sf, variant).double().repeat_interleave(variant['block'], dim=1)
    scale = scale[:, : variant['hidden']]  # a short last block's scale covers its 64 channels
    decoded = result.data.cpu().double() * scale
    bound = 2.0**-4 * reference.abs() + 2.0**-10 * scale + 1e-6 * scale * 448
    assert bool(((decoded - reference).abs() <= bound).all())
    # out=, poisoned buffers: every byte written.
    buffers = (
        torch.full_like(result.data.view(torch.uint8), 0x7F).view(torch.float8_e4m3fn),
        torch.full_like(result.sf, -1),
    )
    again = fused(inputs, variant, out=buffers)
    assert again.data is buffers[0]
    assert again.sf is buffers[1]
    assert_equal(again.data.view(torch.uint8), result.data.view(torch.uint8))
    assert_equal(again.sf, result.sf)
    if not counting:  # twice more without out=: on CUDA the second takes the fast path
        for _ in range(2):
            repeat = fused(inputs, variant)
            assert_equal(repeat.data.view(torch.uint8), result.data.view(torch.uint8))
            assert_equal(repeat.sf, result.sf)


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', COL_MAJOR_TOKENS)
@pytest.mark.parametrize('variant', COL_MAJOR_VARIANTS, ids=make_param_id)
def test_moe_swiglu_forward_and_per_token_cast_col_major_values(variant, num_tokens, device):
    """use_tma_aligned_col_major_sf=True: the row-major call's data and scale values (padding rows' included), bit
    for bit, in per_token_cast's column-major layout of this backend, through the fast path's second call too,
    and into a given buffer (poisoned: every scale overwritten, CUDA's padding columns untouched); the same clamp
    counts."""
    _assert_col_major_values(variant, num_tokens, device)


def _assert_col_major_values(variant, num_tokens, device, inputs=None):
    inputs = inputs or make_inputs(variant, num_tokens, device)
    counting = has(variant, 'count')
    counts = [torch.zeros(4, dtype=torch.int64, device=device) if counting else None for _ in range(3)]
    rows = fused(inputs, variant, clamped_count=counts[0])
    for call in range(2):  # the second call (without clamped_count): the fast path's key
        count = counts[1] if call == 0 else None
        result = fused(inputs, variant, use_tma_aligned_col_major_sf=True, clamped_count=count)
        assert_equal(result.data.view(torch.uint8), rows.data.view(torch.uint8))
        assert_equal(logical_sf_bytes(result.sf), logical_sf_bytes(rows.sf))
        assert_peer_layout(result.sf, num_tokens, variant['sf'], backend_of(device))
    assert_col_major_buffer_written(
        lambda buffer: fused(inputs, variant, use_tma_aligned_col_major_sf=True, clamped_count=counts[2],
                             out=(torch.empty_like(rows.data), buffer)).sf,
        rows.sf, backend_of(device), device,
    )  # fmt: skip
    if counting:
        assert_equal(counts[1], counts[0])
        assert_equal(counts[2], counts[0])


@pytest.mark.npu
@pytest.mark.parametrize('variant', COL_MAJOR_VARIANTS[:2], ids=make_param_id)
def test_moe_swiglu_forward_kernel_col_major_row_stride(variant, device):
    """The kernel writes the transposed scales at any row stride >= T: TileKernels' CUDA padding on every backend
    (48 >= 37 rows, so on the emulator the Ascend kernel meets a padded stride too), each scale once (padding rows'
    as the row-major call writes them), the padding columns untouched; the data as the row-major call writes it."""
    num_tokens, stride = 37, 48
    inputs = make_inputs(variant, num_tokens, device)
    rows = fused(inputs, variant)
    cfg = dataclasses.replace(make_config(backend_of(device), variant, col_major_sf=True),
                              num_cores=get_num_cores(device))  # fmt: skip
    ref_bytes = rows.sf.cpu().contiguous().view(torch.uint8)  # (T, sf_cols) bytes
    width = 4  # bytes of a token in a row of the transposed scales: one fp32 scale or one UE8M0 word
    k = ref_bytes.shape[1] // width
    image = ref_bytes.reshape(num_tokens, k, width).permute(1, 0, 2).reshape(k, width * num_tokens).contiguous()
    buffer = torch.full((k, width * stride), 0xA5, dtype=torch.uint8, device=device)
    sf = buffer[:, : width * num_tokens]
    if not cfg.packed_ue8m0:
        sf = sf.view(torch.float32)
    out = torch.empty_like(rows.data)
    x = inputs['x']
    psum = inputs.get('psum_num_tokens_per_expert')
    weights = inputs.get('topk_weights')
    placeholder_i32 = torch.zeros(1, dtype=torch.int32, device=device)
    counts = (torch.zeros(cfg.count_slots(num_tokens), dtype=torch.int32, device=device) if cfg.count_clamp
              else placeholder_i32)  # fmt: skip
    launch_kernel(
        get_moe_swiglu_forward_kernel, cfg, device, x, out, sf, placeholder_i32 if psum is None else psum,
        torch.zeros(1, device=device) if weights is None else weights, counts,
        float(inputs.get('routed_scaling_factor') or 1.0), float(inputs.get('clamp_value') or 0.0),
    )  # fmt: skip
    assert_equal(buffer[:, : width * num_tokens].cpu().contiguous(), image)
    assert buffer[:, width * num_tokens :].eq(0xA5).all()
    assert_equal(out.view(torch.uint8), rows.data.view(torch.uint8))


@pytest.mark.npu
@pytest.mark.parametrize('col_major', [False, True], ids=['row-major', 'col-major'])
def test_moe_swiglu_forward_and_per_token_cast_opcheck(col_major, device):
    """torch.library.opcheck on real tensors (level 0's first configuration): the schema, the fake kernel's layouts
    (column-major scales: their strides) against the real one's."""
    variant = VARIANTS[0]
    x = make_inputs(variant, 5, device)['x']
    args = (x, 'e4m3', variant['block'], None, None, None, col_major, False, False, None, None)
    torch.library.opcheck(FORMS['moe_swiglu_forward_and_per_token_cast'], args,
                          test_utils=('test_schema', 'test_faketensor'))  # fmt: skip


@pytest.mark.npu
def test_moe_swiglu_forward_and_per_token_cast_empty(device):
    variant = VARIANTS[1]
    inputs = make_inputs(variant, 0, device)
    clamped = torch.zeros(4, dtype=torch.int64, device=device)
    result = fused(inputs, variant, clamped_count=clamped)
    assert result.data.shape == (0, variant['hidden'])
    assert result.sf.shape == (0, 9)
    assert_equal(clamped.cpu(), torch.zeros(4, dtype=torch.int64))


# ---------------------------------------------------------------- a short last block (I = 64 * odd, 128 channels)

# per_token_cast's short last block (tests/quant/test_per_token_cast.py): ceil(I / 128) scales, the last of its 64
# channels. Level 0: one kernel of its own (bf16, I 192: a block of 128 channels and one of 64, fp32 scales). Level 1:
# I 2880 (gpt-oss's: 22 whole blocks and a short one; on CUDA two tiles of 1536, the second reaching past I) in both
# dtypes, fp32 and packed UE8M0 scales, with every option (expert layout, weights and scaling, clamp and counts),
# row- and column-major.
SHORT_VARIANTS = by_level(
    LEVEL,
    core=[dict(dtype='bfloat16', hidden=192, block=128, sf='fp32', options='')],
    default=[dict(dtype=dtype, hidden=2880, block=128, sf=sf, options=EVERY)
             for dtype in ('bfloat16', 'float32') for sf in ('fp32', 'ue8m0')],
)  # fmt: skip
SHORT_PARAMS = [dict(variant, num_tokens=num_tokens) for variant in SHORT_VARIANTS for num_tokens in NUM_TOKENS]
_SHORT_LOWERED = [
    SHORT_VARIANTS[0],
    dict(dtype='float32', hidden=2880, block=128, sf='ue8m0', options=EVERY),
    dict(dtype='bfloat16', hidden=2880, block=128, sf='ue8m0', options='', col_major=True),
]


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_forward_and_per_token_cast_short_block_contract(backend, monkeypatch):
    """I = 64 * odd takes 128-channel blocks with per_token_cast's scale layouts of the (T, I) result (ceil(I / 128)
    scales, packed UE8M0 words of them, column-major alike); I off whole 64-lane registers is still refused."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: backend)
    device = 'cuda' if backend == 'cuda' else 'cpu'
    with FakeTensorMode():
        x = torch.empty(5, 2 * 2880, dtype=torch.bfloat16, device=device)
        y = torch.empty(5, 2880, dtype=torch.float32, device=device)
        for sf, shape, dtype in (('fp32', (5, 23), torch.float32), ('ue8m0', (5, 6), torch.int32)):
            round_sf, packed = _SF[sf]
            for col_major in (False, True):
                result = fused({'x': x}, dict(block=128, sf=sf), use_tma_aligned_col_major_sf=col_major)
                want = per_token_cast(y, 'e4m3', 128, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
                                      use_packed_ue8m0=packed).sf  # fmt: skip
                assert (tuple(result.data.shape), result.data.dtype) == ((5, 2880), torch.float8_e4m3fn)
                assert (tuple(result.sf.shape), result.sf.dtype, result.sf.stride()) == (shape, dtype, want.stride())
    with pytest.raises(ValueError, match='I a positive multiple of 64'):
        moe_swiglu_forward_and_per_token_cast(torch.zeros(4, 2 * 2912), 'e4m3', 128)


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_forward_and_per_token_cast_short_block_config(backend):
    """The scale row is per_token_cast's (RowScales): a short block only with 128 channels and I = 64 * odd; its
    tiles too (short_block_k: Ascend the blocked row in one task, I <= 8128; CUDA even tiles of whole blocks, the
    last reaching past I, whose block wholly past I has a clamp-count slot of zeros)."""
    v = dict(dtype='bfloat16', hidden=2880, block=128, sf='fp32', options='clamp+count')
    for (block, sf), want in SCALE_ROWS_2880.items():
        cfg = make_config(backend, v | dict(block=block, sf=sf))
        assert (cfg.short_block, cfg.num_blocks, cfg.sf_cols, cfg.sf_padding) == want, (block, sf)
    assert not make_config(backend, v | dict(hidden=2816)).short_block
    cfg = make_config(backend, v)
    if backend == 'ascend':
        assert (cfg.block_k, cfg.num_col_tiles, cfg.groups_per_tile) == (2944, 1, 23)
        with pytest.raises(ValueError, match='needs the row in one task: hidden <= 8128'):
            make_config(backend, v | dict(hidden=8256))
    else:
        assert (cfg.block_k, cfg.num_col_tiles, cfg.groups_per_tile, cfg.threads) == (1536, 2, 12, 64)
        assert cfg.count_slots(10) == 10 * 24
        assert make_config(backend, v | dict(hidden=8256)).short_block
    with pytest.raises(ValueError, match='short last block of hidden 2880'):
        dataclasses.replace(cfg, block_k=2880)


@pytest.mark.parametrize('variant', _SHORT_LOWERED, ids=make_param_id)
@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
def test_moe_swiglu_forward_and_per_token_cast_short_block_lowers(backend, variant):
    """Ascend: the row is one task whose copies move I elements (gate, up in; data out), the block maxima of I // 128
    register pairs and then the short block's one register (two vcmax where whole blocks have one); CUDA: the tiles'
    loads guarded (zeros past I), the packed row's padding after I // 128 + 1 bytes."""
    cfg = make_config(backend, variant, col_major_sf=variant.get('col_major', False))
    assert cfg.short_block
    lower = assert_ascend_kernel_lowers if backend == 'ascend' else assert_cuda_kernel_lowers
    source = lower(lambda: make_moe_swiglu_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME).source
    hidden, blocks = variant['hidden'], cfg.num_blocks
    if backend == 'ascend':
        x_bytes = hidden * (2 if variant['dtype'] == 'bfloat16' else 4)
        assert re.findall(r'asc_copy_gm2ub_align\([^;]*?&\(x\[[^;]*?, 1, (\d+), 0, 0, 0', source) == [str(x_bytes)] * 2
        assert re.findall(r'asc_copy_ub2gm_align\(\(__gm__ uint8_t\*\)\(\(&\(out\[[^;]*?, 1, (\d+), ', source) == [
            str(hidden)
        ]
        assert source.count('simd_inst::vcmax(') == 2
    else:
        assert 'condval' in source
        if cfg.packed_ue8m0 and not cfg.col_major_sf:
            assert f'(int64_t){cfg.sf_cols}) + (int64_t){blocks})] = (uchar)0' in source


def _short_inputs(variant, num_tokens, device):
    """make_inputs with the short block's gate and up 8 times smaller: its y then has a scale of its own, not its
    neighbour's."""
    inputs = make_inputs(variant, num_tokens, 'cpu')
    hidden, x = variant['hidden'], inputs['x']
    x[:, hidden - 64 : hidden] /= 8
    x[:, 2 * hidden - 64 :] /= 8
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}


@pytest.mark.npu
@pytest.mark.parametrize('params', SHORT_PARAMS, ids=make_param_id)
def test_moe_swiglu_forward_and_per_token_cast_short_block_values(params, device):
    """per_token_cast(moe_swiglu_forward(x, 'fp32')) bit for bit with a short last block, the clamp counts
    moe_swiglu_forward's, into poisoned buffers too (nothing past I, the packed words' padding zero), and the quant
    reference's bytes (it pads the short block with zeros: a check apart from the kernels' shared macros); from
    level 1 also column-major, the row-major call's values in per_token_cast's layout."""
    variant, num_tokens = params, params['num_tokens']
    inputs = _short_inputs(variant, num_tokens, device)
    _assert_values(variant, num_tokens, device, inputs)
    round_sf, packed = _SF[variant['sf']]
    y = moe_swiglu_forward(**inputs, fmt='fp32').cpu()
    data, sf = per_token_cast_ref(y, variant['block'], round_sf=round_sf, packed_ue8m0=packed)
    result = fused(inputs, variant)
    assert_equal(result.data.cpu().view(torch.uint8), data.view(torch.uint8))
    assert_equal(result.sf.cpu().view(torch.uint8) if packed else result.sf.cpu(), sf)
    if LEVEL > 0:  # the column-major kernel is one more of its own
        _assert_col_major_values(variant, num_tokens, device, inputs)


# ---------------------------------------------------------------- packed UE8M0 rows ending in padding, past one task

# per_token_cast's packed UE8M0 rows of 4 n + r blocks wider than one Ascend task (I > 8192): equal tasks, the row's
# last storing the zero padding after its scales (tests/quant/test_per_token_cast.py). Level 1 only, 3 tokens: I 8320
# = 65 blocks of 128 (Ascend 5 tasks of 13 blocks, 3 padding bytes), bf16, every option (the 3 rows an expert's);
# I 8256 = 258 blocks of 32 (3 tasks of 86 blocks, 2 padding bytes), fp32, no option.
PADDED_WIDE_VARIANTS = by_level(
    LEVEL,
    core=[],
    default=[
        dict(dtype='bfloat16', hidden=8320, block=128, sf='ue8m0', options=EVERY),
        dict(dtype='float32', hidden=8256, block=32, sf='ue8m0', options=''),
    ],
)
PADDED_WIDE_TOKENS = by_level(LEVEL, core=(), default=(3,))
_PADDED_WIDE_ROWS = [  # (I, block): its Ascend (block_k, tasks, blocks a task, padding bytes)
    ((8320, 128), (1664, 5, 13, 3)),
    ((8256, 32), (2752, 3, 86, 2)),  # 258 blocks of 32
    ((16320, 64), (3264, 5, 51, 1)),  # 255 blocks of 64
]
# The row-major scale stores of the Ascend kernel: one burst of N bytes (asc_copy_ub2gm_align(gm, ub, 1, N, ...)).
_SF_ROW_DMA = re.compile(
    r'asc_copy_ub2gm_align\(\(__gm__ uint8_t\*\)\(\(&\(out_sf\[[^;]*\]\)\)\), [^;]*?\)\)\), 1, (\d+), '
)


@pytest.mark.parametrize(('row', 'tiles'), _PADDED_WIDE_ROWS)
def test_moe_swiglu_forward_and_per_token_cast_padded_wide_row_config(row, tiles):
    """Past I = 8192 a packed UE8M0 row of 4 n + r blocks takes per_token_cast's tasks on Ascend (its chooser's
    rule, ascend_row_block_k), the last storing the padding; column-major words of such a row are refused with
    per_token_cast's reason (equal tasks cannot hold whole words)."""
    hidden, block = row
    variant = dict(dtype='bfloat16', hidden=hidden, block=block, sf='ue8m0', options=EVERY)
    cfg = make_config('ascend', variant)
    assert (cfg.block_k, cfg.num_col_tiles, cfg.groups_per_tile, cfg.sf_padding) == tiles
    # per_token_cast of moe_swiglu_forward's fp32 y: the same tasks and scale row.
    args = dict(backend='ascend', num_cores=ASCEND_950_VECTOR_CORES, in_dtype='float32', round_sf=True)
    cast = choose_per_token_cast_config(hidden=hidden, block_size=block, packed_ue8m0=True, **args)
    assert (cast.block_k, cast.sf_cols) == (cfg.block_k, cfg.sf_cols)
    blocks = -(-hidden // block)
    with pytest.raises(ValueError, match=f'column-major packed UE8M0 scales .* need hidden <= 8192, got {blocks} '):
        make_config('ascend', variant, col_major_sf=True)
    with pytest.raises(ValueError, match='need whole int32 words per task'):
        dataclasses.replace(cfg, col_major_sf=True)
    assert make_config('ascend', variant | dict(hidden=8192 + 512, block=128)).sf_padding == 0  # 68 blocks


def test_moe_swiglu_forward_and_per_token_cast_padded_wide_row_contract(monkeypatch):
    """The operator takes I = 8320 with packed UE8M0 scales of 128 channels on Ascend (5 tasks of 13 blocks, a row of
    17 words); column-major scales of it are refused by name."""
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'ascend')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    x = torch.zeros(5, 2 * 8320, dtype=torch.bfloat16)
    packed = dict(round_sf=True, use_packed_ue8m0=True)
    cfg = moe_swiglu_forward_and_per_token_cast.operator.config(x, 'e4m3', 128, **packed)
    assert (cfg.block_k, cfg.num_col_tiles, cfg.sf_cols, cfg.sf_padding) == (1664, 5, 68, 3)
    with pytest.raises(ValueError, match='column-major packed UE8M0 scales .* need hidden <= 8192, got 65 blocks'):
        moe_swiglu_forward_and_per_token_cast.operator.config(x, 'e4m3', 128, **packed,
                                                               use_tma_aligned_col_major_sf=True)  # fmt: skip


@pytest.mark.parametrize(('row', 'tiles'), _PADDED_WIDE_ROWS[:2])
def test_moe_swiglu_forward_and_per_token_cast_padded_wide_row_lowers(row, tiles):
    """A padded UE8M0 row of several Ascend tasks: two scale stores, a task's scale bytes and the row's last task's
    with the padding (13 and 16 bytes at I 8320; 86 and 88 at 8256)."""
    hidden, block = row
    cfg = make_config('ascend', dict(dtype='bfloat16', hidden=hidden, block=block, sf='ue8m0', options=EVERY))
    source = assert_ascend_kernel_lowers(lambda: make_moe_swiglu_forward_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    lengths = sorted(int(n) for n in _SF_ROW_DMA.findall(source.source))
    assert lengths == [cfg.groups_per_tile, cfg.groups_per_tile + cfg.sf_padding] == [tiles[2], tiles[2] + tiles[3]]


@pytest.mark.npu
@pytest.mark.parametrize('num_tokens', PADDED_WIDE_TOKENS)
@pytest.mark.parametrize('variant', PADDED_WIDE_VARIANTS, ids=make_param_id)
def test_moe_swiglu_forward_and_per_token_cast_padded_wide_row_values(variant, num_tokens, device):
    """Rows of several tasks ending in padding: per_token_cast(moe_swiglu_forward(x, 'fp32')) bit for bit, the clamp
    counts moe_swiglu_forward's, into poisoned buffers too (the padding bytes written as zeros), and the quant
    reference's bytes (no kernel macro shared)."""
    inputs = make_inputs(variant, num_tokens, device)
    _assert_values(variant, num_tokens, device, inputs)
    y = moe_swiglu_forward(**inputs, fmt='fp32').cpu()
    data, sf = per_token_cast_ref(y, variant['block'], round_sf=True, packed_ue8m0=True)
    result = fused(inputs, variant)
    assert_equal(result.data.cpu().view(torch.uint8), data.view(torch.uint8))
    assert_equal(result.sf.cpu().view(torch.uint8), sf)


@pytest.mark.npu
@pytest.mark.benchmark
@pytest.mark.parametrize('params', BENCHMARK_PARAMS, ids=make_param_id)
def test_moe_swiglu_forward_and_per_token_cast_benchmark(params, device, benchmark_timer, benchmark_record):
    x = torch.randn(params['num_tokens'], 2 * params['hidden'], device=device).bfloat16()
    packed = params['block'] == 32  # DeepSeek's UE8M0 32-channel scales; fp32 scales for 128
    result = moe_swiglu_forward_and_per_token_cast(x, 'e4m3', params['block'], round_sf=packed, use_packed_ue8m0=packed)
    time_us = benchmark_timer(
        lambda: moe_swiglu_forward_and_per_token_cast(
            x, 'e4m3', params['block'], round_sf=packed, use_packed_ue8m0=packed, out=result
        )
    )
    cfg = moe_swiglu_forward_and_per_token_cast.operator.config(
        x, 'e4m3', params['block'], round_sf=packed, use_packed_ue8m0=packed
    )
    benchmark_record(
        kernel=record_name('moe', 'moe_swiglu_forward_and_per_token_cast'),
        operation='fwd',
        params=params,
        time_us=time_us,
        bandwidth_gbs=count_bytes(x, *result) / time_us / 1e3,
        extras=config_extras(cfg),
    )
