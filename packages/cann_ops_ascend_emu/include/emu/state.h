// Ascend C emulated on CPU: per-core state, fault reporting, UB/GM bounds, pipe-hazard model.
//
// One emulated core runs at a time inside a forked child process (see runtime.cpp): every fault
// is reported by emu::fail(), which writes the message to a shared status block and ends the child.
// Nothing here ever returns an error code to generated code.
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#define __NPU_ARCH__ 3510
// Qualifiers of the dav-3510 C API: address spaces and function kinds. On the CPU all memory is
// one address space; the driver's rewrites (see README) give UB its emulated base.
#define __global__
#define __vector__
#define __aicore__
#define __simd_vf__
#define __simd_callee__
#define __simt_vf__
#define __simt_callee__
#define __launch_bounds__(n)
#define __ubuf__
#define __gm__
#define __SIMT_DEVICE_FUNCTIONS_DECL__

// pipe_t: the pipelines named by asc_sync_notify / asc_sync_wait (asc-devkit sync/asc_sync_notify.md).
enum pipe_t : int {
  PIPE_S = 0,
  PIPE_V,
  PIPE_M,
  PIPE_MTE1,
  PIPE_MTE2,
  PIPE_MTE3,
  PIPE_ALL,
  PIPE_MTE4,
  PIPE_MTE5,
  PIPE_V2,
  PIPE_FIX,
  PIPE_NUM
};
typedef int event_t;
enum { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };

namespace emu {

// Pipes whose UB accesses are tracked by the hazard model.
enum Track : int { T_S = 0, T_V = 1, T_MTE2 = 2, T_MTE3 = 3, NT = 4 };

struct Counters {  // per core, copied into the shared report block at core end
  uint64_t gm2ub_bytes, ub2gm_bytes, vector_instrs, simd_vf_calls, simt_vf_calls, simt_threads, pad_reads,
      unaligned_single;
};

struct GmArg {
  const uint8_t *base;
  uint64_t size;
  const char *name;
};

struct State {
  const char *kernel = "?";
  int core = -1;
  int64_t grid = 1;
  uint8_t *ub = nullptr;
  uint32_t ub_limit = 0;
  // shadows, one entry per UB byte
  uint8_t *written = nullptr;  // 1: some pipe stored this byte during this core
  uint8_t *pad = nullptr;      // 1: rest of a 32-byte block after a DMA whose length is not a multiple of 32
  int8_t *wpipe = nullptr;     // tracked pipe of the last writer, -1 none
  uint32_t *wtime = nullptr;   // issue time of the last write on that pipe
  uint32_t *rtime[NT] = {};    // per pipe: issue time of the last read since the last write
  uint32_t *vst_gen = nullptr; // SIMD VF store generation (asc_mem_bar model)
  // happens-before: issue[p] counts UB-touching ops issued on p; know[q][p] is what q knows completed on p
  uint32_t issue[NT] = {};
  uint32_t know[NT][NT] = {};
  int cur = T_S;               // pipe of raw (scalar / SIMT) UB accesses: S in the kernel body, V in a VF
  uint32_t vf_gen = 1;
  bool in_simd_vf = false;
  bool in_simt = false;
  // switches (set by the driver)
  bool saturate = false;
  bool strict_pad = false;
  bool vf_membar = true;
  Counters *ctr = nullptr;
  int ngm = 0;
  GmArg gm[64];
  uint8_t copy_pad_val[8] = {};
};
extern State st;

[[noreturn]] void fail_v(const char *pipe, const char *fmt, va_list ap);
[[noreturn]] inline void fail(const char *pipe, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fail_v(pipe, fmt, ap);
}
// A declared-but-unemulated function was reached: fail naming it.
[[noreturn]] void unemulated(const char *name);

inline const char *track_name(int t) {
  static const char *n[NT] = {"PIPE_S", "PIPE_V", "PIPE_MTE2", "PIPE_MTE3"};
  return t >= 0 && t < NT ? n[t] : "PIPE_?";
}
inline const char *pipe_name(int p) {
  static const char *n[PIPE_NUM] = {"PIPE_S",    "PIPE_V",    "PIPE_M",    "PIPE_MTE1", "PIPE_MTE2", "PIPE_MTE3",
                                    "PIPE_ALL",  "PIPE_MTE4", "PIPE_MTE5", "PIPE_V2",   "PIPE_FIX"};
  return p >= 0 && p < PIPE_NUM ? n[p] : "PIPE_?";
}
inline int track_of(int p, const char *what) {
  switch (p) {
    case PIPE_S: return T_S;
    case PIPE_V: return T_V;
    case PIPE_MTE2: return T_MTE2;
    case PIPE_MTE3: return T_MTE3;
    default: fail(pipe_name(p), "%s on %s: only PIPE_S, PIPE_V, PIPE_MTE2, PIPE_MTE3 are emulated", what, pipe_name(p));
  }
}

// Offset of a UB pointer, checked to lie (with n bytes) inside this core's UB.
inline int64_t ub_offset(const void *p, uint64_t n, int pipe, const char *what) {
  int64_t off = (const uint8_t *)p - st.ub;
  if (off < 0 || (uint64_t)off + n > st.ub_limit)
    fail(track_name(pipe), "%s: UB access outside the UB: bytes [%lld, %lld) of a %u-byte UB", what, (long long)off,
         (long long)(off + (int64_t)n), st.ub_limit);
  return off;
}

// The hazard model (README "Pipe hazards"): an access by pipe q to a byte last written by pipe w at
// issue time t is ordered iff w == q (in-order pipe; not for MTE2 WAW, whose overlapping DMAs the
// asc_copy_gm2ub_align constraints require to be synchronised) or know[q][w] >= t. Writes also need
// every other pipe's last read of the byte to be known complete (write-after-read).
inline void ub_touch(int64_t off, uint64_t n, int q, bool is_write, const char *what) {
  uint32_t now = ++st.issue[q];
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t b = (uint64_t)off + i;
    int w = st.wpipe[b];
    if (w >= 0) {
      bool same_ordered = (w == q) && !(q == T_MTE2 && is_write);
      if (!same_ordered && st.know[q][w] < st.wtime[b])
        fail(track_name(q),
             "%s: pipe hazard: %s %s UB byte offset %llu last written by %s (its op #%u) with no "
             "asc_sync_notify/asc_sync_wait chain between them (a race on hardware)",
             what, track_name(q), is_write ? "writes" : "reads", (unsigned long long)b, track_name(w), st.wtime[b]);
    }
    if (is_write) {
      for (int r = 0; r < NT; ++r)
        if (r != q && st.rtime[r][b] > st.know[q][r])
          fail(track_name(q),
               "%s: pipe hazard: %s writes UB byte offset %llu read by %s (its op #%u) with no "
               "asc_sync_notify/asc_sync_wait chain between them (write-after-read race on hardware)",
               what, track_name(q), (unsigned long long)b, track_name(r), st.rtime[r][b]);
      st.wpipe[b] = (int8_t)q;
      st.wtime[b] = now;
      for (int r = 0; r < NT; ++r) st.rtime[r][b] = 0;
      st.written[b] = 1;
      st.pad[b] = 0;
    } else {
      st.rtime[q][b] = now;
      if (st.pad[b]) {
        st.ctr->pad_reads++;
        if (st.strict_pad)
          fail(track_name(q),
               "%s: reads UB byte offset %llu, the undefined rest of a 32-byte block after a DMA whose length "
               "is not a multiple of 32 bytes",
               what, (unsigned long long)b);
      }
    }
  }
}

inline int64_t ub_access(const void *p, uint64_t n, int q, bool is_write, const char *what) {
  int64_t off = ub_offset(p, n, q, what);
  ub_touch(off, n, q, is_write, what);
  return off;
}

// GM: every access must lie inside the tensor argument its base pointer falls into.
inline int gm_find(const void *p) {
  const uint8_t *a = (const uint8_t *)p;
  for (int i = 0; i < st.ngm; ++i)
    if (a >= st.gm[i].base && a < st.gm[i].base + st.gm[i].size) return i;
  return -1;
}
inline void gm_check(const void *p, uint64_t n_burst, uint64_t len, uint64_t stride, int pipe, const char *what) {
  int i = gm_find(p);
  const uint8_t *a = (const uint8_t *)p;
  if (i < 0) {
    // name the nearest argument below the address, so "one element past the end" reads as such
    int best = -1;
    for (int j = 0; j < st.ngm; ++j)
      if (st.gm[j].base <= a && (best < 0 || st.gm[j].base > st.gm[best].base)) best = j;
    if (best >= 0)
      fail(track_name(pipe), "%s: GM access outside the tensor argument '%s': starts at byte offset %lld of a %llu-byte tensor",
           what, st.gm[best].name, (long long)(a - st.gm[best].base), (unsigned long long)st.gm[best].size);
    fail(track_name(pipe), "%s: GM address %p lies in no tensor argument", what, p);
  }
  uint64_t start = (uint64_t)(a - st.gm[i].base);
  uint64_t last_end = n_burst ? start + (n_burst - 1) * stride + len : start;
  if (last_end > st.gm[i].size)
    fail(track_name(pipe),
         "%s: GM access outside the tensor argument '%s': bytes [%llu, %llu) of a %llu-byte tensor (%llu bursts of %llu "
         "bytes, stride %llu)",
         what, st.gm[i].name, (unsigned long long)start, (unsigned long long)last_end,
         (unsigned long long)st.gm[i].size, (unsigned long long)n_burst, (unsigned long long)len,
         (unsigned long long)stride);
}

// RAII marker placed by the driver at the start of every __simd_vf__ body: a SIMD VF runs on PIPE_V.
struct VfScope {
  int saved;
  bool saved_in;
  VfScope() : saved(st.cur), saved_in(st.in_simd_vf) {
    st.cur = T_V;
    st.in_simd_vf = true;
    st.vf_gen += 2;
    st.ctr->simd_vf_calls++;
  }
  ~VfScope() {
    st.cur = saved;
    st.in_simd_vf = saved_in;
  }
};

inline uint8_t *ub_base() { return st.ub; }
// The byte of this run's poison pattern at a UB offset (runtime.cpp).
uint8_t poison_byte(uint64_t off);

}  // namespace emu

// block_idx is a variable: generated vector functions take a parameter of that name.
extern int64_t block_idx;
extern int64_t block_num;
