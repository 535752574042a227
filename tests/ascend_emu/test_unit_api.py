"""Unit tests of the emulated C API against its documented semantics, on hand-made inputs.

Each snippet (tests/ascend_emu/snippets.py) is compiled once; the expected values are computed here from the
asc-devkit documentation's rules (cited per check), not from the emulator.
"""

from __future__ import annotations

import functools
import re

import cann_ops_ascend_emu as emu
import numpy as np
import pytest
import torch

from tests.ascend_emu import snippets


@functools.cache
def kernel(name: str, grid: int = 1) -> emu.SourceKernel:
    return emu.SourceKernel(getattr(snippets, name), grid=grid)


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def tree_sum(x: np.ndarray) -> np.float32:
    """asc_reduce_sum.md: adjacent pairs, then pairs of those, in fp32."""
    t = f32(x)
    while len(t) > 1:
        t = (t[0::2] + t[1::2]).astype(np.float32)
    return t[0]


TAIL = 37


@functools.cache
def vector_run(saturate: bool = False):
    rng = np.random.default_rng(1234)
    vin = np.zeros((9, 64), dtype=np.float32)
    vin[0] = rng.standard_normal(64)
    vin[1] = rng.standard_normal(64)
    vin[2] = rng.standard_normal(64)
    vin[0, 0] = vin[1, 0] = 1 + 2.0**-12  # a * b = 1 + 2^-11 + 2^-24: the fused result keeps the 2^-24
    vin[2, 0] = -1.0
    vin[3] = np.tile(f32([1e8, 1.0, -1e8, 1.0]), 16)  # pairwise and sequential sums differ
    ties = [
        1 + 2.0**-8,
        1 + 3 * 2.0**-8,
        -(1 + 2.0**-8),
        1 + 2.0**-8 + 2.0**-20,
        np.inf,
        -np.inf,
        np.nan,
        3.4e38,
        1e-40,
    ]
    vin[4, : len(ties)] = ties
    vin[4, len(ties) :] = rng.standard_normal(64 - len(ties))
    vin[6] = rng.standard_normal(64)
    vin[7] = rng.standard_normal(64)
    vin[6, :4] = [np.nan, 1.0, np.inf, -np.inf]
    vin[7, :4] = [2.0, np.nan, 5.0, 7.0]
    vin[6, 16:20] = [1.0, -1.0, 0.0, np.inf]
    vin[7, 16:20] = [0.0, 0.0, 0.0, np.inf]
    vin[6, 4:8] = [-np.inf, 0.0, 89.0, -104.0]  # exp lanes
    tin = torch.from_numpy(vin.reshape(-1).copy())
    out = torch.zeros(9 * 64)
    bf = torch.zeros(64 + 128, dtype=torch.uint16)
    emu.set_saturation(saturate)
    try:
        kernel('VECTOR_SEMANTICS')(tin, out, bf, TAIL)
    finally:
        emu.set_saturation(False)
    return vin, out.numpy().reshape(9, 64), bf.numpy()


def test_vmula_is_fused_multiply_add():
    vin, out, _ = vector_run()
    a, b, c = vin[0].astype(np.float64), vin[1].astype(np.float64), vin[2].astype(np.float64)
    expected = f32(a * b + c)  # exact in fp64 for these inputs, then one rounding
    np.testing.assert_array_equal(out[0], expected)
    assert out[0, 0] == np.float32(2.0**-11 + 2.0**-24)
    assert out[0, 0] != f32(f32(vin[0, 0] * vin[1, 0]) + vin[2, 0])  # two roundings would lose 2^-24


def test_update_mask_tail_zeroing_and_merging():
    vin, out, _ = vector_run()
    lanes = np.arange(64)
    np.testing.assert_array_equal(out[1], np.where(lanes < TAIL, vin[0] + vin[1], 0.0).astype(np.float32))
    np.testing.assert_array_equal(out[2], np.where(lanes < TAIL, vin[0] + vin[2], vin[1]).astype(np.float32))


def test_reduce_sum_is_a_pairwise_tree():
    vin, out, _ = vector_run()
    expected = tree_sum(vin[3])
    sequential = np.float32(0)
    for x in vin[3]:
        sequential = np.float32(sequential + x)
    assert expected != sequential  # the input separates the two orders
    assert out[3, 0] == expected
    np.testing.assert_array_equal(out[3, 1:], 0.0)  # other lanes zeroed
    masked = np.where(np.arange(64) < TAIL, vin[3], 0.0)
    assert out[4, 0] == tree_sum(masked)


def test_pattern_mask_every_third_lane():
    vin, out, _ = vector_run()
    lanes = np.arange(64)
    np.testing.assert_array_equal(out[5], np.where(lanes % 3 == 0, 2 * vin[0], 0.0).astype(np.float32))


def test_nan_inf_max_exp_div():
    vin, out, _ = vector_run()
    x, y = vin[6], vin[7]
    assert np.isnan(out[6, 0])
    assert np.isnan(out[6, 1])
    assert out[6, 2] == np.inf
    assert out[6, 3] == 7.0
    np.testing.assert_array_equal(out[6, 4:], np.maximum(x[4:], y[4:]))
    # asc_exp: libm expf on the CPU, within 1 ulp of the correctly rounded value (hardware ulps undocumented)
    with np.errstate(over='ignore'):
        np.testing.assert_allclose(out[7, :16], f32(np.exp(x[:16].astype(np.float64))), rtol=2.0**-23, atol=0)
    assert out[7, 4] == 0.0
    assert out[7, 5] == 1.0
    assert out[7, 6] == np.inf
    with np.errstate(divide='ignore', invalid='ignore'):
        np.testing.assert_array_equal(out[7, 16:], f32(x[16:] / y[16:]))
    assert out[7, 16] == np.inf
    assert out[7, 17] == -np.inf
    assert np.isnan(out[7, 18])
    assert np.isnan(out[7, 19])


def test_compare_select_and_broadcast_lanes():
    vin, out, _ = vector_run()
    a = vin[0]
    np.testing.assert_array_equal(out[8], np.where(a > 0, a[0], a[63]).astype(np.float32))


def _bf16_bits(values) -> np.ndarray:
    return (
        torch.tensor(np.asarray(values, dtype=np.float32))
        .to(torch.bfloat16)
        .view(torch.int16)
        .numpy()
        .astype(np.uint16)
    )


def test_bf16_round_to_nearest_even_without_saturation():
    vin, _, bf = vector_run()
    got = bf[:64]
    expected = _bf16_bits(vin[4])  # torch's fp32 -> bf16 is round-to-nearest-even
    finite = ~np.isnan(vin[4])
    np.testing.assert_array_equal(got[finite], expected[finite])
    assert got[0] == 0x3F80
    assert got[1] == 0x3F82
    assert got[2] == 0xBF80
    assert got[3] == 0x3F81
    assert got[4] == 0x7F80
    assert got[5] == 0xFF80
    assert got[7] == 0x7F80
    assert (got[6] & 0x7F80) == 0x7F80
    assert (got[6] & 0x7F) != 0


def test_bf16_saturation_switch():
    _vin, _, bf = vector_run(saturate=True)
    got = bf[:64]
    assert got[4] == 0x7F7F
    assert got[5] == 0xFF7F
    assert got[7] == 0x7F7F
    assert got[6] == 0  # NaN -> 0
    assert got[0] == 0x3F80
    assert got[3] == 0x3F81


def test_b32_mask_on_16_bit_lanes_governs_even_lanes():
    vin, _, bf = vector_run()
    u = vin.reshape(-1).view(np.uint16)[512:640]  # the 16-bit lanes the snippet loaded (UB uint16 [512, 640))
    expected = np.where(np.arange(128) % 2 == 0, (2 * u.astype(np.uint32)) & 0xFFFF, 0).astype(np.uint16)
    np.testing.assert_array_equal(bf[64:], expected)


# ---------------------------------------------------------------- DMA


def _dma(mode: int, *, strict: bool = False):
    vin = torch.arange(1, 129, dtype=torch.float32) * 0.5
    out = torch.full((96,), -3.0)
    emu.set_strict_dma_pad(strict)
    try:
        k = kernel('DMA')
        k(vin, out, mode)
    finally:
        emu.set_strict_dma_pad(False)
    return vin.numpy(), out.numpy(), k.last_report


def test_dma_padding_strides_and_exact_lengths():
    vin, out, rep = _dma(0)
    expected = []
    for base in (0, 16, 32):  # asc_copy_gm2ub_align: pad with the burst's first value when not constant
        burst = vin[base : base + 10]
        expected += [burst[0]] * 2 + list(burst) + [burst[0]] * 3
    np.testing.assert_array_equal(out[:45], f32(expected))
    np.testing.assert_array_equal(out[45:53], f32([7.0, *vin[50:55], 7.0, 7.0]))  # asc_set_copy_pad_val
    np.testing.assert_array_equal(out[53:62], vin[100:109])  # 36 bytes copied exactly
    np.testing.assert_array_equal(out[62:71], vin[100:109] + 1)  # computed on a whole register, 9 lanes stored
    np.testing.assert_array_equal(out[71:], -3.0)  # untouched
    assert rep.total('gm2ub_bytes') == 3 * 40 + 20 + 36
    assert rep.total('ub2gm_bytes') == 3 * 60 + 32 + 36 + 36
    assert rep.total('pad_reads') == 28  # the vector load saw the 28 undefined bytes after the 36-byte DMA


def test_dma_store_of_the_undefined_rest_of_a_block_is_an_error():
    with pytest.raises(
        emu.EmulatorError,
        match=re.escape(
            'kernel unit_dma, core 0 (block_idx), PIPE_MTE3: asc_copy_ub2gm_align: UB byte offset 548 was never '
            'written by this core: poisoned UB would reach GM'
        ),
    ):
        _dma(1)


def test_dma_scalar_read_of_the_undefined_rest_counted_or_strict():
    _, _, rep = _dma(2)
    assert rep.total('pad_reads') == 28 + 4
    # strict: the first read of those bytes, the VF's whole-register load, is already an error
    with pytest.raises(
        emu.EmulatorError,
        match=r'PIPE_V: asc_loadalign: reads UB byte offset 548, the undefined rest of a 32-byte block after a DMA '
        r'whose length is not a multiple of 32 bytes',
    ):
        _dma(2, strict=True)


# ---------------------------------------------------------------- faults

FAULTS = [
    (1, r'PIPE_V: asc_sync_wait\(PIPE_MTE2, PIPE_V, 3\) with no pending asc_sync_notify: a deadlock on hardware'),
    (2, re.escape('PIPE_S: 1 asc_sync_notify still pending when the core ended: (PIPE_MTE2, PIPE_V, 5) x1')),
    (
        3,
        r'PIPE_MTE2: asc_copy_gm2ub_align: pipe hazard: PIPE_MTE2 writes UB byte offset 2048 read by PIPE_V '
        r'\(its op #\d+\) .*write-after-read',
    ),
    (5, r'pipe hazard: PIPE_MTE2 writes UB byte offset 0 last written by PIPE_MTE2 \(its op #1\)'),
    (
        7,
        r'asc_loadalign: vector load of UB byte offset 256 stored earlier in the same SIMD VF with no '
        r'asc_mem_bar\(VST_VLD\)',
    ),
    (9, r'PIPE_V: asc_mull is declared by the emulator but not emulated \(it was reached\)'),
    (10, re.escape('PIPE_S: scalar UB store: UB access outside the UB: bytes [280000, 280004) of a 253952-byte UB')),
    (11, re.escape('UB access outside the UB: raw access at byte offset 254052 of a 253952-byte UB (guard page)')),
    (12, re.escape("GM access outside the tensor argument 'out': raw access at byte offset 268 of a 256-byte tensor")),
    (13, r'PIPE_S: scalar UB load: pipe hazard: PIPE_S reads UB byte offset 1024 last written by PIPE_MTE2'),
    (15, r'asc_copy_gm2ub_align: destination UB offset 4 is not 32-byte aligned'),
    (16, r'PIPE_MTE3: asc_copy_ub2gm_align: UB byte offset 2048 was never written by this core'),
    (17, re.escape("GM access outside the tensor argument 'in': bytes [240, 272) of a 256-byte tensor")),
]


def _faults(mode: int) -> torch.Tensor:
    vin = torch.randn(64)
    out = torch.zeros(64)
    kernel('FAULTS')(vin, out, mode)
    return vin, out


@pytest.mark.parametrize('mode', [0, 4, 6, 8, 14])
def test_ordered_variants_run_clean(mode):
    vin, out = _faults(mode)
    assert torch.equal(out, vin)


@pytest.mark.parametrize(('mode', 'message'), FAULTS, ids=[str(m) for m, _ in FAULTS])
def test_fault_is_reported_and_python_survives(mode, message):
    with pytest.raises(emu.EmulatorError, match=message):
        _faults(mode)


def test_endless_loop_ends_with_a_timeout(monkeypatch):
    monkeypatch.setenv('OPS_TILELANG_EMU_TIMEOUT_S', '1')
    with pytest.raises(emu.EmulatorError, match=r'the launch did not finish within 1 s'):
        _faults(18)


# ---------------------------------------------------------------- SIMT


def test_simt_threads_barriers_and_warp_collectives():
    vin = torch.randn(64)
    out = torch.zeros(2 * 256, dtype=torch.int32)
    k = kernel('SIMT', grid=2)
    k(vin, out, 3)
    t = np.arange(64)
    v = vin.numpy()
    for core in range(2):
        o = out.numpy()[256 * core : 256 * (core + 1)]
        np.testing.assert_array_equal(o[:64], 3 * t)
        np.testing.assert_array_equal(o[64:128], 3 * ((t + 1) % 64))  # read after asc_syncthreads
        sums = np.concatenate([np.full(32, tree_sum(v[:32])), np.full(32, tree_sum(v[32:]))])
        np.testing.assert_array_equal(o[128:192].view(np.float32), sums)  # per-warp asc_reduce_add
        np.testing.assert_array_equal(o[192:256].view(np.float32), v[t ^ 5])  # asc_shfl_xor
    rep = k.last_report
    assert rep.total('simt_vf_calls') == 2
    assert rep.total('simt_threads') == 128


def test_report_format_and_core_order():
    vin = torch.randn(64)
    out = torch.zeros(2 * 256, dtype=torch.int32)
    k = kernel('SIMT', grid=2)
    k.seed = 7
    try:
        k(vin, out, 1)
    finally:
        k.seed = None
    rep = k.last_report
    assert sorted(rep.order) == [0, 1]
    assert rep.seed == 7
    text = rep.format()
    assert 'unit_simt: 2 cores, seed 7' in text
    assert 'max/mean' in text
    assert rep.imbalance('gm2ub_bytes') == 1.0


def test_every_c_api_name_tilelang_calls_is_declared():
    """Every asc_* / CCE name called by TileLang's simd_inst.h, reduce.h and ascend_fp8.h has an emulator declaration
    (two-phase lookup would otherwise hide a missing one until a kernel instantiates it)."""
    tl = emu.driver.tilelang_src_dir() / 'tl_templates' / 'ascend'
    called = set()
    for header in ('simd_inst.h', 'reduce.h', 'ascend_fp8.h'):
        text = re.sub(r'//[^\n]*', '', (tl / header).read_text())
        called |= set(re.findall(r'\b(asc_\w+)\s*\(', text))
        called |= set(re.findall(r'::(v\w+)\s*\(', text))
        called |= set(re.findall(r'\b(__\w+2\w*)\s*\(', text))
    ours = '\n'.join(p.read_text() for p in (emu.driver.INCLUDE_DIR / 'emu').glob('*.h'))
    declared = set(re.findall(r'\b(asc_\w+|v\w+|__\w+)\s*\(', ours))
    declared |= set(re.findall(r'EMU_\w+\((\w+)', ours))
    declared |= {f'{n}_scalar' for n in re.findall(r'EMU_CMP\((\w+)', ours)}
    missing = sorted(called - declared - {'asc_intlv_', 'asc_deintlv_'})  # token-pasted in TL_SIMD_PINTLV_IMPL
    assert not missing, f'not declared by the emulator: {missing}'


def test_conversions_by_part_reduce_max_min_and_single_elements():
    rng = np.random.default_rng(7)
    vin = rng.standard_normal((4, 64)).astype(np.float32)
    vin[2, 10] = 9.0
    vin[2, 40] = 99.0  # outside PAT_VL32: ignored
    vin[2, 20] = -9.0
    vin[2, 21] = -9.0  # a tie: the smaller index
    out = torch.zeros(6 * 64)
    k = kernel('VECTOR_MORE')
    k(torch.from_numpy(vin.reshape(-1).copy()), out)
    o = out.numpy().reshape(6, 64)
    bits = vin[0].view(np.uint16)  # 128 bf16 lanes
    widened = (bits[1::2].astype(np.uint32) << 16).view(np.float32)  # PART_ODD: the odd source lanes
    np.testing.assert_array_equal(o[0], widened)
    keep = o[1].view(np.uint16)
    np.testing.assert_array_equal(keep[0::2], bits[0::2])  # MODE_MERGING keeps the even lanes
    np.testing.assert_array_equal(keep[1::2], _bf16_bits(vin[1]))  # PART_ODD writes the odd ones, nearest-even
    assert o[2, 0] == 9.0  # asc_reduce_max.md: value in lane 0 ...
    assert o[2, 1:2].view(np.uint32)[0] == 10  # ... its index in lane 1, as an integer
    np.testing.assert_array_equal(o[2, 2:], 0.0)
    assert o[3, 0] == -9.0
    assert o[3, 1:2].view(np.uint32)[0] == 20
    np.testing.assert_array_equal(o[4], np.full(64, vin[3, 5]))  # asc_loadalign_brc_elem
    expected = np.zeros(64, dtype=np.float32)
    expected[3], expected[7] = vin[2, 0], vin[3, 5]  # asc_storealign_1st: lane 0 only, at 4-byte offsets
    np.testing.assert_array_equal(o[5], expected)
    assert k.last_report.total('unaligned_single') == 3  # counted, not rejected


def test_simt_warp_reaching_different_collectives_is_reported():
    with pytest.raises(emu.EmulatorError, match=r'SIMT VF deadlock: 16 of 32 live threads wait in asc_syncthreads'):
        kernel('SIMT_DEADLOCK')(torch.zeros(8))
