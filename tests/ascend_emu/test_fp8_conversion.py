"""Unit tests of the emulated fp32 -> fp8_e4m3fn conversion (vcvt with PART_P0..P3) and of
asc_storealign_pack_quarter, on a hand-written kernel.

Expected values follow asc-devkit reg_vector/asc_float2e4m3.md (RINT; saturating: beyond 448 and +-inf -> +-448,
NaN -> 0; non-saturating: overflow and +-inf -> the NaN encoding, NaN -> NaN) and
reg_store/asc_storealign_pack_quarter.md (low byte of each active 32-bit lane, lane i -> byte i, inactive bytes
kept). Non-saturating results are compared with torch's fp32 -> float8_e4m3fn, which rounds the same way.
"""

from __future__ import annotations

import functools

import cann_ops_ascend_emu as emu
import numpy as np
import torch

from tests.ascend_emu.snippets import PRELUDE

TAIL = 37

# in: 4 vectors of 64 floats. out bytes: [0, 256) the four vectors packed (PART_P0 + pack_quarter), [256, 512) the
# raw register of vector 0 converted with PART_P2, [512, 576) vector 1 packed under a tail mask over 0xA5 bytes.
FP8_SNIPPET = (
    PRELUDE
    + r"""
#define UBU8(off) ((__ubuf__ uint8_t *)(&(((__ubuf__ uint8_t *)buf_dyn_shmem)[(off)])))
__simd_vf__ inline void vf(__ubuf__ uint8_t *buf_dyn_shmem, int32_t tail) {
  vector_bool all8 = asc_create_mask_b8(PAT_ALL);
  vector_bool all32 = asc_create_mask_b32(PAT_ALL);
  for (int k = 0; k < 4; ++k) {
    auto v = simd_inst::vlds_norm<float>(UBF(64 * k), 0);
    simd_inst::vsts_pack_quarter(simd_inst::vcvt<fp8_e4_t>(v, all8, ROUND_R, RS_ENABLE, PART_P0, MODE_ZEROING),
                                 (__ubuf__ fp8_e4_t *)UBU8(1024 + 64 * k), 0, all8);
  }
  auto v0 = simd_inst::vlds_norm<float>(UBF(0), 0);
  vector_f8e4m3 raw;
  ::vcvt(raw, v0, all8, ROUND_R, RS_ENABLE, PART_P2, MODE_ZEROING);
  simd_inst::vsts_norm((vector_u8 &)raw, UBU8(1280), 0, all8);
  auto v1 = simd_inst::vlds_norm<float>(UBF(64), 0);
  uint32_t n = (uint32_t)tail;
  vector_bool m = simd_inst::update_mask_b32(n);
  simd_inst::vsts_pack_quarter(simd_inst::vcvt<fp8_e4_t>(v1, all8, ROUND_R, RS_ENABLE, PART_P0, MODE_ZEROING),
                               (__ubuf__ fp8_e4_t *)UBU8(1536), 0, m);
  (void)all32;
}

extern "C" __global__ __vector__ void unit_fp8(__gm__ float *in, __gm__ uint8_t *out, int32_t tail) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_copy_gm2ub_align((__ubuf__ uint8_t *)UBF(0), (__gm__ uint8_t *)in, 1, 4 * 256, 0, 0, 0,
                       static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  // the tail-masked store's destination starts as the caller's bytes (out[512:576])
  asc_copy_gm2ub_align(UBU8(1536), (__gm__ uint8_t *)(out + 512), 1, 64, 0, 0, 0,
                       static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  vf(buf_dyn_shmem, tail);
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_copy_ub2gm_align((__gm__ uint8_t *)out, UBU8(1024), 1, 576, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
}
"""
)

SPECIAL = [
    1.0,
    1.0625,  # tie between 1 and 1.125: to even (1)
    1.1875,  # tie between 1.125 and 1.25: to even (1.25)
    -1.0625,
    448.0,
    464.0,  # tie between 448 and the non-finite 480: to even (448)
    470.0,  # past the tie: overflow
    -1000.0,
    np.inf,
    -np.inf,
    np.nan,
    -0.0,
    0.0,
    1.5 * 2.0**-9,  # subnormal tie: to even (2 * 2**-9)
    2.0**-10,  # half the smallest subnormal: to even (0)
    0.75 * 2.0**-9,
    2.0**-6 * (1 - 2.0**-5),  # rounds up into the smallest normal
    1e-40,  # an fp32 subnormal
    240.0,
    -0.017578125,
]


@functools.cache
def fp8_kernel() -> emu.SourceKernel:
    return emu.SourceKernel(FP8_SNIPPET, grid=1)


@functools.cache
def fp8_run(saturate: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    vin = (rng.standard_normal((4, 64)) * np.float32(60.0)).astype(np.float32)
    vin[0, : len(SPECIAL)] = SPECIAL
    vin[2] *= np.float32(2.0**-8)  # near and in e4m3's subnormal range
    vin[3] = np.ldexp(rng.uniform(1.0, 2.0, 64), rng.integers(-12, 9, 64)).astype(np.float32)
    out = torch.full((576,), 0xA5, dtype=torch.uint8)
    emu.set_saturation(saturate)
    try:
        fp8_kernel()(torch.from_numpy(vin.reshape(-1).copy()), out, TAIL)
    finally:
        emu.set_saturation(False)
    return vin, out.numpy()


def torch_e4m3_bits(values: np.ndarray) -> np.ndarray:
    """torch's fp32 -> float8_e4m3fn: nearest even, NaN -> 0x7f; it saturates overflow and inf, so compare it
    with the emulator only where the value rounds to a finite e4m3 value (|v| <= 464) or is NaN."""
    return torch.from_numpy(np.asarray(values, dtype=np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def in_range(values: np.ndarray) -> np.ndarray:
    return ~(np.abs(values) > 464)  # NaN compares False: kept


def test_fp8_e4m3_nearest_even_matches_torch_without_saturation():
    vin, out = fp8_run(False)
    packed = out[:256].reshape(4, 64)
    for k in range(4):
        keep = in_range(vin[k])
        assert keep.sum() >= 60
        np.testing.assert_array_equal(packed[k][keep], torch_e4m3_bits(vin[k])[keep], err_msg=f'vector {k}')
    got = packed[0, : len(SPECIAL)]
    # overflow and +-inf -> the NaN encoding with the sign (e4m3fn has no inf), NaN -> NaN
    expected = [0x38, 0x38, 0x3A, 0xB8, 0x7E, 0x7E, 0x7F, 0xFF, 0x7F, 0xFF, 0x7F, 0x80, 0x00]
    expected += [0x02, 0x00, 0x01, 0x08, 0x00, 0x77, 0x89]
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.uint8))


def test_fp8_e4m3_saturation_switch():
    vin, out = fp8_run(True)
    got = out[: len(SPECIAL)]
    assert got[SPECIAL.index(470.0)] == 0x7E
    assert got[SPECIAL.index(-1000.0)] == 0xFE
    assert got[SPECIAL.index(np.inf)] == 0x7E
    assert got[SPECIAL.index(-np.inf)] == 0xFE
    assert got[10] == 0x00  # NaN -> 0
    finite = np.abs(vin[0]) <= 464
    np.testing.assert_array_equal(out[:64][finite], torch_e4m3_bits(vin[0])[finite])
    np.testing.assert_array_equal(out[64:256], fp8_run(False)[1][64:256])  # in range: saturation changes nothing


def test_fp8_part_selects_the_byte_of_each_group():
    _, out = fp8_run(False)
    raw = out[256:512].reshape(64, 4)
    np.testing.assert_array_equal(raw[:, 2], out[:64])  # the same conversion as PART_P0's, in byte 2
    np.testing.assert_array_equal(raw[:, [0, 1, 3]], 0)  # zeroing: the other bytes of each group are 0


def test_pack_quarter_keeps_the_bytes_of_inactive_lanes():
    _, out = fp8_run(False)
    tail = out[512:576]
    np.testing.assert_array_equal(tail[:TAIL], out[64 : 64 + TAIL])
    np.testing.assert_array_equal(tail[TAIL:], 0xA5)
