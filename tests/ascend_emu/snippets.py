"""Hand-written Ascend C kernels for the emulator's unit tests (each one source: one compile for many checks).

They use TileLang's `simd_inst::` wrappers and the C API the way lowered kernels do: UB at `(__ubuf__ uint8_t *)0`,
element accesses `((__ubuf__ T *)buf_dyn_shmem)[i]`, `__simd_vf__` functions called from the entry.
"""

import shutil

import cann_ops_ascend_emu as emu

PRELUDE = """
#include <tl_templates/ascend/common.h>
#include <tl_templates/ascend/debug.h>
#include <tl_templates/ascend/simd_inst.h>
#define UBF(off) ((__ubuf__ float *)(&(((__ubuf__ float *)buf_dyn_shmem)[(off)])))
#define UBU16(off) ((__ubuf__ uint16_t *)(&(((__ubuf__ uint16_t *)buf_dyn_shmem)[(off)])))
#define UBU8(off) ((__ubuf__ uint8_t *)(&(((__ubuf__ uint8_t *)buf_dyn_shmem)[(off)])))
"""


def use_mutated_header(monkeypatch, tmp_path, header: str, old: str, new: str) -> None:
    """Build from here on against a copy of the emulator's headers in which include/emu/<header> has its one `old`
    replaced by `new` (a mutation test: the unit test of the broken behaviour must then fail)."""
    include = tmp_path / 'include'
    shutil.copytree(emu.driver.INCLUDE_DIR, include)
    path = include / 'emu' / header
    source = path.read_text()
    assert source.count(old) == 1, f'mutation site {old!r} not found once'
    path.write_text(source.replace(old, new))
    monkeypatch.setattr(emu.driver, 'INCLUDE_DIR', include)
    monkeypatch.setattr(emu.driver, '_EMU_HASH', None)  # a new build-cache key for the mutated headers


# in: 9 vectors of 64 floats; out: 9 vectors of 64 floats; bf: 64 + 128 uint16.
VECTOR_SEMANTICS = (
    PRELUDE
    + r"""
__simd_vf__ inline void vf(__ubuf__ uint8_t *buf_dyn_shmem, int32_t tail) {
  vector_bool all = asc_create_mask_b32(PAT_ALL);
  auto a = simd_inst::vlds_norm<float>(UBF(0), 0);
  auto b = simd_inst::vlds_norm<float>(UBF(64), 0);
  auto c = simd_inst::vlds_norm<float>(UBF(128), 0);
  // 0: vmula = fused multiply-add
  auto acc = c;
  simd_inst::vmula(&acc, a, b, all, MODE_ZEROING);
  simd_inst::vsts_norm(acc, UBF(1024), 0, all);
  // 1: update_mask tail, MODE_ZEROING; 2: the same mask, MODE_MERGING into b
  uint32_t n = (uint32_t)tail;
  vector_bool m = simd_inst::update_mask_b32(n);
  simd_inst::vsts_norm(simd_inst::vadd(a, b, m, MODE_ZEROING), UBF(1088), 0, all);
  auto merged = b;
  simd_inst::vadd(merged, a, c, m, MODE_MERGING);
  simd_inst::vsts_norm(merged, UBF(1152), 0, all);
  // 3: horizontal sum (all lanes), 4: horizontal sum under the tail mask
  auto s = simd_inst::vlds_norm<float>(UBF(192), 0);
  simd_inst::vsts_norm(simd_inst::vcadd(s, all, MODE_ZEROING), UBF(1216), 0, all);
  simd_inst::vsts_norm(simd_inst::vcadd(s, m, MODE_ZEROING), UBF(1280), 0, all);
  // 5: PAT_M3 mask (every third lane), zeroing
  vector_bool m3 = asc_create_mask_b32(PAT_M3);
  simd_inst::vsts_norm(simd_inst::vmuls(a, 2.0f, m3, MODE_ZEROING), UBF(1344), 0, all);
  // 6: max with NaN / inf lanes; 7: exp, sqrt, division of special values
  auto x = simd_inst::vlds_norm<float>(UBF(384), 0);
  auto y = simd_inst::vlds_norm<float>(UBF(448), 0);
  simd_inst::vsts_norm(simd_inst::vmax(x, y, all, MODE_ZEROING), UBF(1408), 0, all);
  vector_bool first16 = asc_create_mask_b32(PAT_VL16);
  auto e = simd_inst::vexp(x, first16, MODE_ZEROING);
  vector_bool second = simd_inst::pnot(first16, all);
  auto q = simd_inst::vdiv(x, y, second, MODE_ZEROING);
  simd_inst::vsts_norm(simd_inst::vsel(e, q, first16), UBF(1472), 0, all);
  // 8: compare + select, broadcast of the lowest / highest lane
  vector_bool gt = simd_inst::vcmps_gt(a, 0.0f, all);
  auto lo = simd_inst::vdupv(a, all, POS_LOWEST, MODE_ZEROING);
  auto hi = simd_inst::vdupv(a, all, POS_HIGHEST, MODE_ZEROING);
  simd_inst::vsts_norm(simd_inst::vsel(lo, hi, gt), UBF(1536), 0, all);
  // bf16 narrowing (RNE, RS_ENABLE) into even 16-bit lanes, packed store of the low halves
  vector_bool all16 = asc_create_mask_b16(PAT_ALL);
  auto r = simd_inst::vlds_norm<float>(UBF(256), 0);
  simd_inst::vsts_pack_b32(simd_inst::vcvt<bfloat16_t>(r, all16, ROUND_R, RS_ENABLE, PART_EVEN, MODE_ZEROING),
                           (__ubuf__ bfloat16_t *)UBU16(4096), 0, all16);
  // a b32 mask on a 16-bit operation: only the even 16-bit lanes are active
  auto u = simd_inst::vlds_norm<uint16_t>(UBU16(512), 0);
  simd_inst::vsts_norm(simd_inst::vadd(u, u, all, MODE_ZEROING), UBU16(4224), 0, all16);
}

extern "C" __global__ __vector__ void unit_vec(__gm__ float *in, __gm__ float *out, __gm__ uint16_t *bf,
                                               int32_t tail) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_copy_gm2ub_align((__ubuf__ uint8_t *)UBF(0), (__gm__ uint8_t *)in, 1, 9 * 256, 0, 0, 0,
                       static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  vf(buf_dyn_shmem, tail);
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_copy_ub2gm_align((__gm__ uint8_t *)out, (__ubuf__ uint8_t *)UBF(1024), 1, 9 * 256,
                       static_cast<asc_store_l2_cache_mode>(4), 0, 0);
  asc_copy_ub2gm_align((__gm__ uint8_t *)bf, (__ubuf__ uint8_t *)UBU16(4096), 1, 128,
                       static_cast<asc_store_l2_cache_mode>(4), 0, 0);
  asc_copy_ub2gm_align((__gm__ uint8_t *)(bf + 64), (__ubuf__ uint8_t *)UBU16(4224), 1, 256,
                       static_cast<asc_store_l2_cache_mode>(4), 0, 0);
}
"""
)

# DMA: padding (first value and constant), strides, lengths that are not a multiple of 32 bytes.
# mode 0: clean; 1: store the undefined rest of a 32-byte block; 2: a scalar read of it.
DMA = (
    PRELUDE
    + r"""
__simd_vf__ inline void vf_tail(__ubuf__ uint8_t *buf_dyn_shmem) {
  // computes on a whole register of which only 9 lanes were loaded: legal, as only those 9 are stored
  vector_bool all = asc_create_mask_b32(PAT_ALL);
  auto t = simd_inst::vlds_norm<float>(UBF(128), 0);
  simd_inst::vsts_norm(simd_inst::vadds(t, 1.0f, all, MODE_ZEROING), UBF(256), 0, all);
}

extern "C" __global__ __vector__ void unit_dma(__gm__ float *in, __gm__ float *out, int32_t mode) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  // 3 bursts of 10 floats, 16 floats apart in GM, 2 + 3 pad elements (the burst's first value), 64 B apart in UB
  asc_copy_gm2ub_align(UBF(0), in, 3, 40, 2, 3, false, static_cast<asc_load_l2_cache_mode>(0), 64, 64);
  asc_set_copy_pad_val(7.0f);
  // one burst of 5 floats with 1 + 2 constant pad elements
  asc_copy_gm2ub_align(UBF(64), in + 50, 1, 20, 1, 2, true, static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  // 36 bytes: not a multiple of 32
  asc_copy_gm2ub_align(UBF(128), in + 100, 1, 36, 0, 0, false, static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  vf_tail(buf_dyn_shmem);
  asc_sync_notify(PIPE_MTE2, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  // the three padded bursts (60 B each) stored back to back, then the constant-padded one, then the 36 B one
  asc_copy_ub2gm_align(out, UBF(0), 3, 60, static_cast<asc_store_l2_cache_mode>(4), 60, 64);
  asc_copy_ub2gm_align(out + 45, UBF(64), 1, 32, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
  asc_copy_ub2gm_align(out + 53, UBF(128), 1, 36, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
  asc_copy_ub2gm_align(out + 62, UBF(256), 1, 36, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
  if (mode == 1)
    asc_copy_ub2gm_align(out + 71, UBF(128), 1, 40, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
  if (mode == 2) {
    asc_sync_notify(PIPE_MTE2, PIPE_S, static_cast<event_t>(0));
    asc_sync_wait(PIPE_MTE2, PIPE_S, static_cast<event_t>(0));
    float f = ((__ubuf__ float *)buf_dyn_shmem)[128 + 9];
    (void)f;
  }
}
"""
)

# Faults, one per mode; mode 0 runs clean. `out` has 64 floats.
FAULTS = (
    PRELUDE
    + r"""
__simd_vf__ inline void vf_read(__ubuf__ uint8_t *buf_dyn_shmem) {
  vector_bool all = asc_create_mask_b32(PAT_ALL);
  auto t = simd_inst::vlds_norm<float>(UBF(512), 0);  // never-written UB: legal to read
  simd_inst::vsts_norm(t, UBF(64), 0, all);
}
__simd_vf__ inline void vf_store_load(__ubuf__ uint8_t *buf_dyn_shmem, int32_t bar) {
  vector_bool all = asc_create_mask_b32(PAT_ALL);
  auto t = simd_inst::vlds_norm<float>(UBF(0), 0);
  simd_inst::vsts_norm(t, UBF(64), 0, all);
  if (bar) simd_inst::mem_bar(VST_VLD);
  auto u = simd_inst::vlds_norm<float>(UBF(64), 0);
  simd_inst::vsts_norm(u, UBF(128), 0, all);
}
__simd_vf__ inline void vf_unemulated(__ubuf__ uint8_t *buf_dyn_shmem) {
  vector_bool all = asc_create_mask_b32(PAT_ALL);
  auto t = simd_inst::vlds_norm<float>(UBF(0), 0);
  asc_mull(t, t, t, t, all);  // declared for kernels that name it, not emulated
}

extern "C" __global__ __vector__ void unit_faults(__gm__ float *in, __gm__ float *out, int32_t mode) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  auto load = [&](int off) {
    asc_copy_gm2ub_align(UBF(off), in, 1, 256, 0, 0, false, static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  };
  load(0);
  if (mode == 1) asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(3));  // no notify
  if (mode == 2) asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(5));  // never waited for
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  if (mode == 3 || mode == 4) {
    vf_read(buf_dyn_shmem);
    if (mode == 4) {  // the reader's completion reaches MTE2 first
      asc_sync_notify(PIPE_V, PIPE_MTE2, static_cast<event_t>(0));
      asc_sync_wait(PIPE_V, PIPE_MTE2, static_cast<event_t>(0));
    }
    load(512);  // overwrites what PIPE_V read
  }
  if (mode == 5) load(0);  // a second DMA into the same bytes, unordered
  if (mode == 6) {
    pipe_barrier(PIPE_MTE2);
    load(0);
  }
  if (mode == 7) vf_store_load(buf_dyn_shmem, 0);
  if (mode == 8) vf_store_load(buf_dyn_shmem, 1);
  if (mode == 9) vf_unemulated(buf_dyn_shmem);
  if (mode == 10) ((__ubuf__ int32_t *)buf_dyn_shmem)[70000] = 1;
  if (mode == 11) {
    volatile uint8_t *raw = buf_dyn_shmem;
    raw[253952 + 100] = 1;
  }
  if (mode == 12) {
    volatile float *raw = out;
    raw[64 + 3] = 1.0f;
  }
  if (mode == 13) {
    load(256);
    float f = ((__ubuf__ float *)buf_dyn_shmem)[256];  // scalar read of MTE2's bytes, no MTE2 -> S sync
    (void)f;
  }
  if (mode == 14) {
    load(256);
    asc_sync();  // every pipe waits for everything issued: the scalar read is ordered
    float f = ((__ubuf__ float *)buf_dyn_shmem)[256];
    (void)f;
  }
  if (mode == 15)
    asc_copy_gm2ub_align(UBF(1), in, 1, 32, 0, 0, false, static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  if (mode == 16) asc_copy_ub2gm_align(out, UBF(512), 1, 32, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
  if (mode == 17)
    asc_copy_gm2ub_align(UBF(0), in + 60, 1, 32, 0, 0, false, static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  if (mode == 18) {
    volatile int spin = 1;
    while (spin) {
    }
  }
  asc_sync_notify(PIPE_MTE2, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_copy_ub2gm_align(out, UBF(0), 1, 256, static_cast<asc_store_l2_cache_mode>(4), 0, 0);
}
"""
)

# SIMT: UB stores and loads across asc_syncthreads, warp collectives; 64 threads; out: 4 x 64 int32/float.
SIMT = (
    PRELUDE
    + r"""
__simt_vf__ __launch_bounds__(64) inline void simt_body(__ubuf__ uint8_t *buf_dyn_shmem, int32_t scale) {
  int32_t t = (int32_t)threadIdx.x;
  ((__ubuf__ int32_t *)buf_dyn_shmem)[t] = t * scale;
  asc_syncthreads();
  ((__ubuf__ int32_t *)buf_dyn_shmem)[64 + t] = ((__ubuf__ int32_t *)buf_dyn_shmem)[(t + 1) % 64];
  float v = ((__ubuf__ float *)buf_dyn_shmem)[256 + t];
  ((__ubuf__ float *)buf_dyn_shmem)[128 + t] = asc_reduce_add(v);
  ((__ubuf__ float *)buf_dyn_shmem)[192 + t] = asc_shfl_xor(v, 5);
}

extern "C" __global__ __vector__ void unit_simt(__gm__ float *in, __gm__ int32_t *out, int32_t scale) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_copy_gm2ub_align((__ubuf__ uint8_t *)UBF(256), (__gm__ uint8_t *)in, 1, 256, 0, 0, 0,
                       static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_vf_call<simt_body>(cce::dim3(64), buf_dyn_shmem, scale);
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_copy_ub2gm_align((__gm__ uint8_t *)(out + 256 * block_idx), (__ubuf__ uint8_t *)buf_dyn_shmem, 1, 1024,
                       static_cast<asc_store_l2_cache_mode>(4), 0, 0);
}
"""
)

# More register semantics: widening from odd lanes, narrowing with merging, reduce max/min (value, index),
# one-element broadcast load and one-element store at 4-byte offsets. in: 4 x 64 floats; out: 6 x 64 floats.
VECTOR_MORE = (
    PRELUDE
    + r"""
__simd_vf__ inline void vf(__ubuf__ uint8_t *buf_dyn_shmem) {
  vector_bool all = asc_create_mask_b32(PAT_ALL);
  vector_bool all16 = asc_create_mask_b16(PAT_ALL);
  // bf16 register from the raw bits of in[0] (128 bf16 lanes), widened from the odd lanes
  auto h = simd_inst::vlds_norm<bfloat16_t>((__ubuf__ bfloat16_t *)UBF(0), 0);
  simd_inst::vsts_norm(simd_inst::vcvt<float>(h, all16, PART_ODD, MODE_ZEROING), UBF(1024), 0, all);
  // narrowing in[1] into the odd lanes of a register that holds in[0]'s bits, merging: even lanes kept
  auto r = simd_inst::vlds_norm<float>(UBF(64), 0);
  vector_bf16 keep = h;
  ::vcvt(keep, r, all16, ROUND_R, RS_ENABLE, PART_ODD, MODE_MERGING);
  simd_inst::vsts_norm(keep, (__ubuf__ bfloat16_t *)UBF(1088), 0, all16);
  // reduce max / min of in[2] under a PAT_VL32 mask
  vector_bool vl32 = asc_create_mask_b32(PAT_VL32);
  auto x = simd_inst::vlds_norm<float>(UBF(128), 0);
  simd_inst::vsts_norm(simd_inst::vcmax(x, vl32, MODE_ZEROING), UBF(1152), 0, all);
  simd_inst::vsts_norm(simd_inst::vcmin(x, vl32, MODE_ZEROING), UBF(1216), 0, all);
  // broadcast of in[3][5] (a 4-byte UB offset), one-element stores at 4-byte offsets
  auto b = simd_inst::vlds_brc_elem<float>(UBF(192 + 5), 0);
  simd_inst::vsts_norm(b, UBF(1280), 0, all);
  simd_inst::vsts_norm(simd_inst::vdup<float>(0.0f, all, MODE_ZEROING), UBF(1344), 0, all);
  asc_mem_bar(VST_ST);
  simd_inst::vsts_1st(x, UBF(1344 + 3), 0, all);
  simd_inst::vsts_1st(b, UBF(1344 + 7), 0, all);
}

extern "C" __global__ __vector__ void unit_vec_more(__gm__ float *in, __gm__ float *out) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_copy_gm2ub_align((__ubuf__ uint8_t *)UBF(0), (__gm__ uint8_t *)in, 1, 4 * 256, 0, 0, 0,
                       static_cast<asc_load_l2_cache_mode>(0), 0, 0);
  asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>(0));
  vf(buf_dyn_shmem);
  asc_sync_notify(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_sync_wait(PIPE_V, PIPE_MTE3, static_cast<event_t>(0));
  asc_copy_ub2gm_align((__gm__ uint8_t *)out, (__ubuf__ uint8_t *)UBF(1024), 1, 6 * 256,
                       static_cast<asc_store_l2_cache_mode>(4), 0, 0);
}
"""
)

# SIMT warps that reach different collectives: threads 0..15 a shuffle, 16..31 a barrier.
SIMT_DEADLOCK = (
    PRELUDE
    + r"""
__simt_vf__ __launch_bounds__(32) inline void body(__ubuf__ uint8_t *buf_dyn_shmem) {
  int32_t t = (int32_t)threadIdx.x;
  if (t < 16) ((__ubuf__ float *)buf_dyn_shmem)[t] = asc_shfl_xor(1.0f, 1);
  else asc_syncthreads();
}

extern "C" __global__ __vector__ void unit_simt_deadlock(__gm__ float *out) {
  asc_init();
  __ubuf__ uint8_t *buf_dyn_shmem = (__ubuf__ uint8_t *)0;
  asc_vf_call<body>(cce::dim3(32), buf_dyn_shmem);
}
"""
)
