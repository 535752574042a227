"""Unit and mutation tests of the emulated data-block reductions and gathers / scatter, on a hand-written kernel
that calls them as TileLang's simd_inst.h does (vcgadd / vcgmax / vcgmin, vgather2, vscatter, vselr) and, for the
forms simd_inst.h has no wrapper for, through the C API.

Expected values follow asc-devkit reg_vector/asc_reduce_{sum,max,min}_datablock.md (one result per 32-byte data
block, in order in the lowest lanes, the rest 0; lanes outside the mask take no part), reg_load/asc_gather.md (by
element: dst[i] = src[index[i]] from UB under a mask, a b8 source zero-extended into 16-bit lanes; from a register,
dst[i] = src[index[i] % lanes]) and reg_store/asc_scatter.md (dst[index[i]] = src[i], indices unique).
"""

from __future__ import annotations

import functools

import cann_ops_ascend_emu as emu
import numpy as np
import pytest
import torch

from tests.ascend_emu.snippets import PRELUDE, use_mutated_header

IN_BYTES, OUT_BYTES = 1792, 2304
# Input bytes: [0, 256) A: 64 floats; [256, 512) B: 128 int16; [512, 768) IDX: 64 uint32 (a permutation);
# [768, 1024) C: 256 uint8; [1024, 1280) IDX16: 128 uint16; [1280, 1536) D: 64 floats with NaN and +-0;
# [1536, 1792) U: 128 uint16. Output bytes: OUTPUT below.
SNIPPET = (
    PRELUDE
    + r"""
#define UBS16(off) ((__ubuf__ int16_t *)(&(((__ubuf__ int16_t *)buf_dyn_shmem)[(off)])))
#define UBU32(off) ((__ubuf__ uint32_t *)(&(((__ubuf__ uint32_t *)buf_dyn_shmem)[(off)])))
#define OUT 2048
__simd_vf__ inline void vf(__ubuf__ uint8_t *buf_dyn_shmem) {
  vector_bool all32 = asc_create_mask_b32(PAT_ALL);
  vector_bool all16 = asc_create_mask_b16(PAT_ALL);
  vector_bool first16 = asc_create_mask_b32(PAT_VL16);
  vector_bool half32 = asc_create_mask_b32(PAT_H);
  auto a = simd_inst::vlds_norm<float>(UBF(0), 0);
  auto b = simd_inst::vlds_norm<int16_t>(UBS16(128), 0);
  auto idx = simd_inst::vlds_norm<uint32_t>(UBU32(128), 0);
  auto idx16 = simd_inst::vlds_norm<uint16_t>(UBU16(512), 0);
  auto d = simd_inst::vlds_norm<float>(UBF(320), 0);
  auto u = simd_inst::vlds_norm<uint16_t>(UBU16(768), 0);
  // sums per data block: every lane; the first 16 lanes only
  simd_inst::vsts_norm(simd_inst::vcgadd(a, all32, MODE_ZEROING), UBF(OUT / 4), 0, all32);
  simd_inst::vsts_norm(simd_inst::vcgadd(a, first16, MODE_ZEROING), UBF(OUT / 4 + 64), 0, all32);
  // the widening sum, u16 -> u32 (the C API: simd_inst has no wrapper for it)
  vector_u32 wide;
  asc_reduce_sum_datablock(wide, u, all16);
  simd_inst::vsts_norm(wide, UBU32(OUT / 4 + 128), 0, all32);
  // max (NaN and +-0 in D), min of int16
  simd_inst::vsts_norm(simd_inst::vcgmax(d, all32, MODE_ZEROING), UBF(OUT / 4 + 192), 0, all32);
  simd_inst::vsts_norm(simd_inst::vcgmin(b, all16, MODE_ZEROING), UBS16(OUT / 2 + 512), 0, all16);
  // gathers: from a register (indices past 64 wrap), from UB under a mask, bytes from UB into 16-bit lanes
  auto wrapped = simd_inst::vadds(idx, (uint32_t)64, all32, MODE_ZEROING);
  simd_inst::vsts_norm(simd_inst::vselr(a, wrapped), UBF(OUT / 4 + 320), 0, all32);
  simd_inst::vsts_norm(simd_inst::vgather2(UBF(0), idx, half32), UBF(OUT / 4 + 384), 0, all32);
  simd_inst::vsts_norm(simd_inst::vgather2(UBU8(768), idx16, all16), UBU16(OUT / 2 + 896), 0, all16);
  // scatter: a through the permutation
  simd_inst::vscatter(a, UBF(OUT / 4 + 512), idx, all32);
}

extern "C" __global__ __vector__ void unit_gather_reduce(__gm__ uint8_t *in, __gm__ uint8_t *out) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_copy_gm2ub_align(UBU8(0), (__gm__ uint8_t *)in, 1, 1792, 0, 0, 0, static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  vf(buf_dyn_shmem);
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_copy_ub2gm_align((__gm__ uint8_t *)out, UBU8(OUT), 1, 2304, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
}
"""
)
# name -> (first output byte, end, dtype)
OUTPUT = {
    'sum_f32': (0, 256, np.float32),
    'sum_f32_first16': (256, 512, np.float32),
    'sum_u16_to_u32': (512, 768, np.uint32),
    'max_f32': (768, 1024, np.float32),
    'min_s16': (1024, 1280, np.int16),
    'gather_register': (1280, 1536, np.float32),
    'gather_ub_f32': (1536, 1792, np.float32),
    'gather_ub_u8': (1792, 2048, np.uint16),
    'scatter_f32': (2048, 2304, np.float32),
}
NAN_BITS = 0x7FC01234  # a NaN with a payload: the max must carry it through


@functools.cache
def inputs() -> dict[str, np.ndarray]:
    """Distinct, exactly summable values (so a lane taken from the wrong place or a wrong tree shows)."""
    rng = np.random.default_rng(7)
    signs = np.where(np.arange(64) % 3, 1, -1).astype(np.float32)
    a = (rng.permutation(64).astype(np.float32) + 1) * np.float32(0.25) * signs
    b = rng.integers(-30000, 30000, 128).astype(np.int16)
    idx = rng.permutation(64).astype(np.uint32)
    c = rng.permutation(256).astype(np.uint8)
    idx16 = rng.integers(0, 256, 128).astype(np.uint16)
    d = (rng.permutation(64).astype(np.float32) - 32) * np.float32(0.5)
    d[24 + 5] = np.array([NAN_BITS], dtype=np.uint32).view(np.float32)[0]  # block 3
    d[40:48] = -np.abs(d[40:48]) - 1  # block 5: negatives ...
    d[42], d[45] = np.float32(-0.0), np.float32(0.0)  # ... with -0 first, then +0: the max is +0
    u = rng.integers(40000, 65536, 128).astype(np.uint16)  # block sums past 2**16
    return {'a': a, 'b': b, 'idx': idx, 'c': c, 'idx16': idx16, 'd': d, 'u': u}


def raw_input() -> torch.Tensor:
    parts = inputs()
    raw = np.concatenate([parts[k].view(np.uint8) for k in ('a', 'b', 'idx', 'c', 'idx16', 'd', 'u')])
    assert raw.size == IN_BYTES
    return torch.from_numpy(raw.copy())


def run(kernel: emu.SourceKernel) -> np.ndarray:
    out = torch.full((OUT_BYTES,), 0xA5, dtype=torch.uint8)
    kernel(raw_input(), out)
    return out.numpy()


@functools.cache
def result() -> np.ndarray:
    return run(emu.SourceKernel(SNIPPET, grid=1))


def part(out: np.ndarray, name: str) -> np.ndarray:
    start, end, dtype = OUTPUT[name]
    return out[start:end].view(dtype)


def _in_blocks(values: np.ndarray, fill) -> np.ndarray:
    """8 per-block results in the lowest lanes of a register of `values`' length, the rest `fill`."""
    lanes = np.full(256 // values.itemsize, fill, dtype=values.dtype)
    lanes[:8] = values
    return lanes


def check_sums(out: np.ndarray) -> None:
    a, u = inputs()['a'], inputs()['u']
    np.testing.assert_array_equal(part(out, 'sum_f32'), _in_blocks(a.reshape(8, 8).sum(1), 0))
    first16 = a.reshape(8, 8).sum(1)
    first16[2:] = 0
    np.testing.assert_array_equal(part(out, 'sum_f32_first16'), _in_blocks(first16, 0))
    wide = u.astype(np.uint32).reshape(8, 16).sum(1).astype(np.uint32)
    np.testing.assert_array_equal(part(out, 'sum_u16_to_u32'), _in_blocks(wide, 0))


def check_max_min(out: np.ndarray) -> None:
    d, b = inputs()['d'], inputs()['b']
    expected = d.reshape(8, 8).max(1)  # numpy's max propagates the NaN, and its bits
    expected[3] = d[29]
    expected[5] = np.float32(0.0)  # +0 over -0
    np.testing.assert_array_equal(part(out, 'max_f32').view(np.uint32), _in_blocks(expected, 0).view(np.uint32))
    np.testing.assert_array_equal(part(out, 'min_s16'), _in_blocks(b.reshape(8, 16).min(1), 0))


def check_gathers(out: np.ndarray) -> None:
    a, idx, c, idx16 = (inputs()[k] for k in ('a', 'idx', 'c', 'idx16'))
    np.testing.assert_array_equal(part(out, 'gather_register'), a[(idx + 64) % 64])
    under_mask = a[idx].copy()
    under_mask[32:] = 0
    np.testing.assert_array_equal(part(out, 'gather_ub_f32'), under_mask)
    np.testing.assert_array_equal(part(out, 'gather_ub_u8'), c[idx16].astype(np.uint16))


def check_scatter(out: np.ndarray) -> None:
    a, idx = inputs()['a'], inputs()['idx']
    expected = np.empty_like(a)
    expected[idx] = a
    np.testing.assert_array_equal(part(out, 'scatter_f32'), expected)


def test_datablock_sums_per_block_in_the_lowest_lanes():
    check_sums(result())


def test_datablock_max_and_min_with_nan_and_signed_zeros():
    check_max_min(result())


def test_gathers_from_a_register_and_from_ub():
    check_gathers(result())


def test_scatter_through_a_permutation():
    check_scatter(result())


@pytest.mark.parametrize(
    ('replace', 'match'),
    [
        ('simd_inst::vscatter(a, UBF(OUT / 4 + 512), idx, all32);',
         'asc_scatter: lanes 0 and 1 both write element'),
        ('simd_inst::vscatter(a, UBF(OUT / 4 + 512), idx, all32);',
         'asc_gather: UB access outside the UB'),
    ],
    ids=['scatter-duplicate-index', 'gather-past-the-ub'],
)  # fmt: skip
def test_refused_accesses(replace, match):
    """Two lanes scattering to one element (the hardware keeps an unspecified one) and a gather index past the UB
    end an emulated launch with an EmulatorError."""
    if 'scatter' in match:
        bad = 'simd_inst::vscatter(a, UBF(OUT / 4 + 512), simd_inst::vdup((uint32_t)3, all32, MODE_ZEROING), all32);'
    else:
        far = 'simd_inst::vdup((uint32_t)0x100000, all32, MODE_ZEROING)'
        bad = f'simd_inst::vsts_norm(simd_inst::vgather2(UBF(0), {far}, all32), UBF(OUT / 4 + 512), 0, all32);'
    assert SNIPPET.count(replace) == 1
    with pytest.raises(emu.EmulatorError, match=match):
        run(emu.SourceKernel(SNIPPET.replace(replace, bad), grid=1))


# Each mutation builds SNIPPET against a copy of the emulator's headers with one behaviour broken; the check of that
# behaviour must fail on the result.
MUTATIONS = {
    'masked-off lanes count in a block sum': (
        't[i] = on<S>(mask, b * per + i) ? C(get(src, b * per + i)) : C(0);',
        't[i] = C(get(src, b * per + i));',
        check_sums,
    ),
    'a block result lands in the wrong lane': ('set(r, b, t[0]);', 'set(r, (b + 1) % 8, t[0]);', check_sums),
    'max skips a NaN': ('best = x, found = true;\n          break;', 'continue;', check_max_min),
    'max of -0 and +0 is -0': ('best = IsMax ? C(0) : -C(0);', 'best = IsMax ? -C(0) : C(0);', check_max_min),
    'register gather off by one': (
        'r.v[i] = src.v[index.v[i] % V::lanes];',
        'r.v[i] = src.v[(index.v[i] + 1) % V::lanes];',
        check_gathers,
    ),
    'UB gather ignores the mask': (
        '      if (emu::on<V>(mask, i)) {\n        const T *p',
        '      {\n        const T *p',
        check_gathers,
    ),
    'a b8 gather sign-extends': (
        'r.v[i] = (typename V::storage)(*(const uint8_t *)p);',
        'r.v[i] = (typename V::storage)(*(const int8_t *)p);',
        check_gathers,
    ),
    'scatter writes lane order': ('T *p = dst + index.v[i];', 'T *p = dst + i;', check_scatter),
}  # fmt: skip


@pytest.mark.parametrize('name', list(MUTATIONS))
def test_broken_behaviour_fails_its_unit_test(name, monkeypatch, tmp_path):
    old, new, check = MUTATIONS[name]
    check(result())  # the emulator as it is passes
    use_mutated_header(monkeypatch, tmp_path, 'vector.h', old, new)
    with pytest.raises(AssertionError):
        check(run(emu.SourceKernel(SNIPPET, grid=1)))
