"""Mutations of real lowered kernels that the emulator must catch, one per test, with the message it gives.

Each test first runs the unmutated source cleanly (so a failure is the mutation's), then the mutated one.
"""

from __future__ import annotations

import functools
import re
import shutil

import cann_ops_ascend_emu as emu
import pytest
import torch

from cann_ops_tilelang.engram import engram_fused_weight_kernel as fw_k
from cann_ops_tilelang.engram import engram_grad_w_reduce_kernel as gw_k
from cann_ops_tilelang.engram import engram_hash_kernel as hk_k
from tests.ascend_emu import test_fp8_conversion as fp8

HC, HIDDEN = 4, 256  # fused_weight: one 256-element row per core, 4 cores


@functools.cache
def fused_weight():
    cfg = fw_k.choose_engram_fused_weight_config(backend='ascend', hc=HC, hidden=HIDDEN, num_cores=64)
    kernel = emu.compile_prim_func(fw_k.make_engram_fused_weight_kernel(cfg))
    return kernel.prim_func, kernel.get_kernel_source()


@functools.cache
def grad_w_reduce():
    cfg = gw_k.choose_engram_grad_w_reduce_config(backend='ascend', hc=HC, hidden=HIDDEN, num_cores=64)
    kernel = emu.compile_prim_func(gw_k.make_engram_grad_w_reduce_kernel(cfg))
    return kernel.prim_func, kernel.get_kernel_source()


@functools.cache
def engram_hash():
    cfg = hk_k.choose_engram_hash_config(backend='ascend', num_layers=2, max_ngram=3, num_tables=8, num_cores=64)
    kernel = emu.compile_prim_func(hk_k.make_engram_hash_kernel(cfg))
    return kernel.prim_func, kernel.get_kernel_source()


def _mutate(source: str, old: str, new: str, count: int = 1) -> str:
    assert source.count(old) >= count, f'mutation site {old!r} not found'
    return source.replace(old, new, count)


def _run_fused_weight(source: str) -> torch.Tensor:
    prim_func, _ = fused_weight()
    wh = torch.randn(HC, HIDDEN).to(torch.bfloat16)
    we = torch.randn(HC, HIDDEN).to(torch.bfloat16)
    out = torch.full((HC, HIDDEN), float('nan'))
    emu.EmulatedKernel(prim_func, source=source)(wh, we, out)
    return out


def _run_grad_w_reduce(source: str, num_partials: int = 70) -> None:
    prim_func, _ = grad_w_reduce()
    partial = torch.randn(num_partials, HC, HIDDEN)
    wh = torch.randn(HC, HIDDEN).to(torch.bfloat16)
    we = torch.randn(HC, HIDDEN).to(torch.bfloat16)
    emu.EmulatedKernel(prim_func, source=source)(partial, wh, we, torch.randn(HC, HIDDEN), torch.randn(HC, HIDDEN))


def _run_hash(source: str, num_tokens: int = 130) -> None:
    prim_func, _ = engram_hash()
    ids = torch.randint(0, 2**31 - 1, (num_tokens, 3), dtype=torch.int32)
    mult = torch.randint(-(2**63), 2**63 - 1, (2, 3), dtype=torch.int64)
    vocab = torch.randint(1, 2**31 - 1, (2, 2, 8), dtype=torch.int32)
    offsets = torch.randint(-(2**31), 2**31 - 1, (2, 16), dtype=torch.int32)
    out = torch.zeros(2, num_tokens, 16, dtype=torch.int32)
    emu.EmulatedKernel(prim_func, source=source)(ids, mult, vocab, offsets, out)


MTE2_V_WAIT = 'asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));'
MTE2_V_NOTIFY = 'asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));'


def test_unmutated_sources_run_clean():
    _run_fused_weight(fused_weight()[1])
    _run_grad_w_reduce(grad_w_reduce()[1])
    _run_hash(engram_hash()[1])


def test_drop_wait_is_a_race():
    src = _mutate(fused_weight()[1], MTE2_V_WAIT, '')
    with pytest.raises(
        emu.EmulatorError,
        match=r'kernel engram_fused_weight_kernel_kernel, core \d+ \(block_idx\), '
        r'PIPE_V: asc_loadalign_unpack: pipe hazard: PIPE_V reads UB byte offset 2048 last written by '
        r'PIPE_MTE2',
    ):
        _run_fused_weight(src)


def test_drop_wait_leaves_a_notify_pending():
    src = grad_w_reduce()[1]
    last_wait = 'asc_sync_wait(PIPE_V, PIPE_MTE2, static_cast<event_t>(1));\n}'
    src = _mutate(src, last_wait, '}')
    with pytest.raises(
        emu.EmulatorError,
        match=re.escape('1 asc_sync_notify still pending when the core ended: (PIPE_V, PIPE_MTE2, 1) x1'),
    ):
        _run_grad_w_reduce(src)


def test_drop_notify_is_a_deadlock():
    src = _mutate(fused_weight()[1], MTE2_V_NOTIFY, '')
    with pytest.raises(
        emu.EmulatorError,
        match=re.escape(
            'PIPE_V: asc_sync_wait(PIPE_MTE2, PIPE_V, 0) with no pending asc_sync_notify: a deadlock on hardware'
        ),
    ):
        _run_fused_weight(src)


def test_drop_notify_and_wait_is_a_race():
    # Program order still computes the right numbers here; only the hazard model sees the race.
    src = _mutate(_mutate(fused_weight()[1], MTE2_V_NOTIFY, ''), MTE2_V_WAIT, '')
    with pytest.raises(
        emu.EmulatorError,
        match=r'pipe hazard: PIPE_V reads UB byte offset 2048 last written by '
        r'PIPE_MTE2 \(its op #1\) with no asc_sync_notify/asc_sync_wait chain between them',
    ):
        _run_fused_weight(src)


def test_drop_v_to_mte3_sync_is_a_race():
    src = fused_weight()[1]
    for call in ('notify', 'wait'):
        src = _mutate(src, f'asc_sync_{call}(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));', '')
    with pytest.raises(
        emu.EmulatorError,
        match=r'PIPE_MTE3: asc_copy_ub2gm_align: pipe hazard: PIPE_MTE3 reads UB '
        r'byte offset 0 last written by PIPE_V',
    ):
        _run_fused_weight(src)


def test_ub_offset_past_the_limit():
    # the second input's UB buffer moved so that its 512-byte DMA ends 104 bytes past the 248 KB UB
    src = _mutate(
        fused_weight()[1],
        '((__ubuf__ bfloat16_t*)buf_dyn_shmem)[1536]',
        '((__ubuf__ bfloat16_t*)buf_dyn_shmem)[126784]',
    )
    with pytest.raises(
        emu.EmulatorError,
        match=re.escape(
            'PIPE_MTE2: asc_copy_gm2ub_align: UB access outside the UB: bytes [253568, 254080) of a 253952-byte UB'
        ),
    ):
        _run_fused_weight(src)


def test_write_one_element_past_a_gm_tensor():
    # every core stores its row one element further: the last core's row ends 4 bytes past `out`
    src = _mutate(fused_weight()[1], 'out[(((int32_t)block_idx) * 256)]', 'out[((((int32_t)block_idx) * 256) + 1)]')
    with pytest.raises(
        emu.EmulatorError,
        match=re.escape(
            "core 3 (block_idx), PIPE_MTE3: asc_copy_ub2gm_align: GM access outside the tensor argument 'out': "
            'bytes [3076, 4100) of a 4096-byte tensor'
        ),
    ):
        _run_fused_weight(src)


def test_broken_tail_lets_poison_reach_gm():
    # the token-id tail DMA loads one token fewer: its hashes are computed from poisoned UB and stored
    src = engram_hash()[1]
    load_len = '(min(512, max(((num_tokens - (((int32_t)block_idx) * 512)) - (w * 32768)), 0)) * 12), 0, 0, 0'
    src = _mutate(src, load_len, load_len.replace('* 12), 0, 0, 0', '* 12) - 12, 0, 0, 0'))
    with pytest.raises(
        emu.EmulatorError,
        match=r"argument 'out' element \(\d+, 129, \d+\) differs between the two "
        r'runs .*a never-written UB value reached GM',
    ):
        _run_hash(src)


# ---------------------------------------------------------------- mutations of the emulator itself
# Each builds FP8_MORE_SNIPPET against a copy of the emulator's headers with one documented behaviour broken, and the
# unit test's own check of that behaviour (tests/ascend_emu/test_fp8_conversion.py) must fail on the result.
EMULATOR_MUTATIONS = {
    'fp8 widening reads byte 0 whatever the part': (
        'vector.h',
        'int b = 4 * i + c.part;',
        'int b = 4 * i;',
        fp8.check_e4m3_to_f32,
        False,
    ),
    'fp8 widening masked by the destination lane': (
        'vector.h',
        'if (emu::on<S>(mask, b))',
        'if (emu::on<vector_f32>(mask, i))',
        fp8.check_widening_mask_is_the_source_bytes,
        False,
    ),
    'e4m3 widening takes S.1111.xxx for NaN': (
        'types.h',
        'if (ex == 0xf && man == 7) return fp8_nan(b);',
        'if (ex == 0xf) return fp8_nan(b);',
        fp8.check_e4m3_to_f32,
        False,
    ),
    'e5m2 widening subnormals off by one binade': (
        'types.h',
        'std::ldexp(float(man), -16)',
        'std::ldexp(float(man), -17)',
        fp8.check_e5m2_to_f32,
        False,
    ),
    'fp32->fp8 rounding ties away from zero': (
        'types.h',
        'double q = std::nearbyint(',
        'double q = std::round(',
        fp8.check_e5m2_nearest_even,
        False,
    ),
    'fp32->e5m2 writes byte 0 whatever the part': (
        'vector.h',
        'else r.v[4 * i + c.part] = emu::f32_to_e5m2(src.v[i], sat);',
        'else r.v[4 * i] = emu::f32_to_e5m2(src.v[i], sat);',
        fp8.check_e5m2_nearest_even,
        False,
    ),
    'fp32->e5m2 saturation overflows to inf': (
        'types.h',
        'if (code > 0x7b) return uint8_t(sign | (sat ? 0x7b : 0x7c));',
        'if (code > 0x7b) return uint8_t(sign | 0x7c);',
        fp8.check_e5m2_saturation,
        True,
    ),
    'deintlv swaps dst0 and dst1': (
        'vector.h',
        'dst0 = even;\n    dst1 = odd;',
        'dst0 = odd;\n    dst1 = even;',
        fp8.check_deintlv,
        False,
    ),
    'deintlv reads src1 before src0': (
        'vector.h',
        'const V &s = k < half ? src0 : src1;',
        'const V &s = k < half ? src1 : src0;',
        fp8.check_deintlv,
        False,
    ),
}


@pytest.mark.parametrize('name', list(EMULATOR_MUTATIONS))
def test_broken_emulated_behaviour_fails_its_unit_test(name, monkeypatch, tmp_path):
    header, old, new, check, saturate = EMULATOR_MUTATIONS[name]
    check(fp8.fp8_more(saturate))  # the emulator as it is passes
    include = tmp_path / 'include'
    shutil.copytree(emu.driver.INCLUDE_DIR, include)
    path = include / 'emu' / header
    path.write_text(_mutate(path.read_text(), old, new))
    monkeypatch.setattr(emu.driver, 'INCLUDE_DIR', include)
    monkeypatch.setattr(emu.driver, '_EMU_HASH', None)  # a new build-cache key for the mutated headers
    run = fp8.fp8_more_run(emu.SourceKernel(fp8.FP8_MORE_SNIPPET, grid=1), saturate)
    with pytest.raises(AssertionError):
        check(run)
