"""Unit and mutation tests of the emulated asc_intlv (register form; apply_rotary's GPT-J pairs), on a hand-written
kernel.

Expected values follow asc-devkit reg_vector/asc_intlv.md: src0 and src1 interleaved element by element (src0[0],
src1[0], src0[1], src1[1], ..), the first half of that sequence to dst0 and the second to dst1; the inverse of
asc_deintlv (even-indexed elements of src0 ++ src1 to dst0, odd-indexed to dst1), so deintlv then intlv gives the
sources back.
"""

from __future__ import annotations

import functools

import cann_ops_ascend_emu as emu
import numpy as np
import pytest
import torch

from tests.ascend_emu.snippets import PRELUDE, use_mutated_header

OUT = 2048  # UB byte offset of the results
# in bytes: [0, 512) two b32 registers (floats), [512, 1024) two b16 registers. Out bytes: see INTLV_OUT.
INTLV_SNIPPET = (
    PRELUDE
    + r"""
#define OUT 2048
__simd_vf__ inline void vf(__ubuf__ uint8_t *buf_dyn_shmem) {
  vector_bool all16 = asc_create_mask_b16(PAT_ALL);
  vector_bool all32 = asc_create_mask_b32(PAT_ALL);
  // b32 through simd_inst's wrapper (what TileLang's S.vintlv lowers to)
  auto f0 = simd_inst::vlds_norm<float>(UBF(0), 0);
  auto f1 = simd_inst::vlds_norm<float>(UBF(64), 0);
  auto i32 = simd_inst::vintlv(f0, f1);
  simd_inst::vsts_norm(i32.v0, UBF(OUT / 4), 0, all32);
  simd_inst::vsts_norm(i32.v1, UBF(OUT / 4 + 64), 0, all32);
  // b16, the C API directly
  auto h0 = simd_inst::vlds_norm<uint16_t>(UBU16(512 / 2), 0);
  auto h1 = simd_inst::vlds_norm<uint16_t>(UBU16(768 / 2), 0);
  vector_u16 g0, g1;
  asc_intlv(g0, g1, h0, h1);
  simd_inst::vsts_norm(g0, UBU16((OUT + 512) / 2), 0, all16);
  simd_inst::vsts_norm(g1, UBU16((OUT + 768) / 2), 0, all16);
  // deintlv then intlv in place (sources are the destinations): the sources back
  vector_f32 s0 = f0, s1 = f1;
  asc_deintlv(s0, s1, s0, s1);
  asc_intlv(s0, s1, s0, s1);
  simd_inst::vsts_norm(s0, UBF((OUT + 1024) / 4), 0, all32);
  simd_inst::vsts_norm(s1, UBF((OUT + 1280) / 4), 0, all32);
}

extern "C" __global__ __vector__ void unit_intlv(__gm__ uint8_t *in, __gm__ uint8_t *out) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_copy_gm2ub_align(UBU8(0), (__gm__ uint8_t *)in, 1, 1024, 0, 0, 0, static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  vf(buf_dyn_shmem);
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_copy_ub2gm_align((__gm__ uint8_t *)out, UBU8(OUT), 1, 1536, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
}
"""
)
INTLV_OUT = {'intlv_b32': (0, 512), 'intlv_b16': (512, 1024), 'round_trip': (1024, 1536)}


def intlv_inputs() -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """(two registers of 64 floats, two of 128 uint16, the input bytes): distinct values, so a lane taken from the
    wrong place shows."""
    floats = (np.arange(128, dtype=np.float32) * np.float32(1.5) - np.float32(40.0)).reshape(2, 64)
    halves = (np.arange(256, dtype=np.uint16) * np.uint16(7) + np.uint16(3)).reshape(2, 128)
    raw = np.concatenate([floats.reshape(-1).view(np.uint8), halves.reshape(-1).view(np.uint8)])
    return floats, halves, torch.from_numpy(raw.copy())


def intlv_run(kernel: emu.SourceKernel) -> np.ndarray:
    """The output bytes of one run of `kernel` (INTLV_SNIPPET as built)."""
    _, _, raw = intlv_inputs()
    out = torch.full((1536,), 0xA5, dtype=torch.uint8)
    kernel(raw, out)
    return out.numpy()


@functools.cache
def intlv_result() -> np.ndarray:
    return intlv_run(emu.SourceKernel(INTLV_SNIPPET, grid=1))


def _part(out: np.ndarray, name: str, dtype) -> np.ndarray:
    start, end = INTLV_OUT[name]
    return out[start:end].view(dtype).reshape(2, -1)


def _interleaved(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a[0], b[0], a[1], b[1], .. as two registers (the sequence's halves)."""
    return np.stack([a, b], axis=-1).reshape(2, -1)


def check_intlv(out: np.ndarray) -> None:
    floats, halves, _ = intlv_inputs()
    np.testing.assert_array_equal(_part(out, 'intlv_b32', np.float32), _interleaved(floats[0], floats[1]))
    np.testing.assert_array_equal(_part(out, 'intlv_b16', np.uint16), _interleaved(halves[0], halves[1]))


def check_round_trip(out: np.ndarray) -> None:
    floats, _, _ = intlv_inputs()
    np.testing.assert_array_equal(_part(out, 'round_trip', np.float32), floats)


def test_intlv_interleaves_element_by_element():
    check_intlv(intlv_result())


def test_deintlv_then_intlv_gives_the_sources_in_place():
    check_round_trip(intlv_result())


# Each mutation builds INTLV_SNIPPET against a copy of the emulator's headers with asc_intlv broken; the check above
# of that behaviour must fail on the result.
INTLV_MUTATIONS = {
    'intlv swaps dst0 and dst1': ('dst0 = low;\n    dst1 = high;', 'dst0 = high;\n    dst1 = low;', check_intlv),
    'intlv takes src1 first': (
        'low.v[k] = (k % 2 ? src1 : src0).v[j];',
        'low.v[k] = (k % 2 ? src0 : src1).v[j];',
        check_intlv,
    ),
    'intlv fills the high half from the low lanes': (
        'high.v[k] = (k % 2 ? src1 : src0).v[j + half];',
        'high.v[k] = (k % 2 ? src1 : src0).v[j];',
        check_round_trip,
    ),
}


@pytest.mark.parametrize('name', list(INTLV_MUTATIONS))
def test_broken_intlv_fails_its_unit_test(name, monkeypatch, tmp_path):
    old, new, check = INTLV_MUTATIONS[name]
    check(intlv_result())  # the emulator as it is passes
    use_mutated_header(monkeypatch, tmp_path, 'vector.h', old, new)
    with pytest.raises(AssertionError):
        check(intlv_run(emu.SourceKernel(INTLV_SNIPPET, grid=1)))
