// Ascend C emulated on CPU: inter-pipe synchronisation and the GM <-> UB DMAs.
#pragma once
#include "emu/types.h"

namespace emu {
// Notify/wait: a FIFO per (src, dst, event) of the src pipe's knowledge vectors (runtime.cpp).
void sync_notify(int src, int dst, int ev);
void sync_wait(int src, int dst, int ev);
void sync_all();
void pipe_fence(int p);
void mem_bar(int kind);
}  // namespace emu

inline void asc_init() {}
// asc_sync_notify (sync/asc_sync_notify.md): set a flag from pipe `pipe` to pipe `tpipe`.
inline void asc_sync_notify(pipe_t pipe, pipe_t tpipe, event_t id) { emu::sync_notify(pipe, tpipe, id); }
// asc_sync_wait (sync/asc_sync_wait.md): block `tpipe` until the flag is set; a wait with no set flag never
// returns on hardware, so it is an error here.
inline void asc_sync_wait(pipe_t pipe, pipe_t tpipe, event_t id) { emu::sync_wait(pipe, tpipe, id); }
inline void set_flag(pipe_t pipe, pipe_t tpipe, event_t id) { emu::sync_notify(pipe, tpipe, id); }
inline void wait_flag(pipe_t pipe, pipe_t tpipe, event_t id) { emu::sync_wait(pipe, tpipe, id); }
// asc_sync (sync/asc_sync.md): wait until every pipeline has completed all issued operations.
inline void asc_sync() { emu::sync_all(); }
// pipe_barrier(PIPE_ALL) is asc_sync; pipe_barrier(p) / asc_sync_pipe(p) orders the operations of pipe p.
inline void pipe_barrier(pipe_t p) {
  if (p == PIPE_ALL) emu::sync_all();
  else emu::pipe_fence(p);
}
inline void asc_sync_pipe(pipe_t p) { pipe_barrier(p); }
inline void asc_mem_bar(MEM_TYPE t) { emu::mem_bar(t); }

// asc_set_copy_pad_val: the constant used by asc_copy_gm2ub_align when enable_constant_pad is true.
template <class T> inline void asc_set_copy_pad_val(T v) {
  static_assert(sizeof(T) <= 8);
  std::memset(emu::st.copy_pad_val, 0, 8);
  std::memcpy(emu::st.copy_pad_val, &v, sizeof(T));
}

namespace emu {
inline void check_align32(int64_t off, int pipe, const char *what, const char *which) {
  if (off % 32) fail(track_name(pipe), "%s: %s UB offset %lld is not 32-byte aligned", what, which, (long long)off);
}

// asc_copy_gm2ub_align, 10-argument form (vector_datamove/asc_copy_gm2ub_align_arch_3510.md): n_burst blocks of
// len_burst bytes; src_stride / dst_stride are head-to-head distances in bytes; left/right padding counts
// elements (at most 32 bytes each) filled with the asc_set_copy_pad_val constant or else the block's first
// element; dst_stride != len_burst must be 32-byte aligned. A block whose padded end is not 32-byte aligned
// copies exactly; the rest of its 32-byte block is left undefined (poisoned, unwritten, flagged on read).
template <class T>
inline void gm2ub(T *dst, const T *src, uint16_t n_burst, uint32_t len_burst, uint8_t lpad, uint8_t rpad,
                  bool const_pad, uint64_t src_stride, uint32_t dst_stride) {
  const char *what = "asc_copy_gm2ub_align";
  constexpr uint32_t es = sizeof(T);
  if (n_burst < 1 || n_burst > 4095) fail("PIPE_MTE2", "%s: n_burst %u outside [1, 4095]", what, n_burst);
  if (len_burst < 1 || len_burst > 2097151) fail("PIPE_MTE2", "%s: len_burst %u outside [1, 2097151]", what, len_burst);
  if (lpad * es > 32 || rpad * es > 32) fail("PIPE_MTE2", "%s: padding of more than 32 bytes", what);
  uint64_t blk = lpad * es + len_burst + rpad * es;
  uint64_t dstep = n_burst > 1 ? dst_stride : blk;
  uint64_t sstep = n_burst > 1 ? src_stride : len_burst;
  uint64_t span = (n_burst - 1) * dstep + blk;
  int64_t off = ub_offset(dst, span, T_MTE2, what);
  check_align32(off, T_MTE2, what, "destination");
  if (n_burst > 1 && dst_stride != len_burst && dst_stride % 32)
    fail("PIPE_MTE2", "%s: dst_stride %u != len_burst and not 32-byte aligned", what, dst_stride);
  gm_check(src, n_burst, len_burst, sstep, T_MTE2, what);
  for (uint32_t i = 0; i < n_burst; ++i) {
    int64_t o = off + (int64_t)(i * dstep);
    ub_touch(o, blk, T_MTE2, true, what);
    uint8_t *d = st.ub + o;
    const uint8_t *s = (const uint8_t *)src + i * sstep;
    uint8_t padv[8];
    std::memcpy(padv, const_pad ? st.copy_pad_val : s, es);
    for (uint32_t k = 0; k < lpad; ++k) std::memcpy(d + k * es, padv, es);
    std::memcpy(d + lpad * es, s, len_burst);
    for (uint32_t k = 0; k < rpad; ++k) std::memcpy(d + lpad * es + len_burst + k * es, padv, es);
    st.ctr->gm2ub_bytes += len_burst;
  }
  // undefined rest of each 32-byte block not covered by some burst
  for (uint32_t i = 0; i < n_burst; ++i) {
    uint64_t end = (uint64_t)off + i * dstep + blk;
    uint64_t next = (i + 1 < n_burst) ? (uint64_t)off + (i + 1) * dstep : UINT64_MAX;
    uint64_t lim = (end + 31) / 32 * 32;
    if (lim > st.ub_limit) lim = st.ub_limit;
    for (uint64_t b = end; b < lim && b < next; ++b) {
      st.written[b] = 0;
      st.pad[b] = 1;
      st.wpipe[b] = T_MTE2;
      st.wtime[b] = st.issue[T_MTE2];
      st.ub[b] = poison_byte(b);
    }
  }
}
// asc_copy_ub2gm_align, 7-argument form (asc_copy_ub2gm_align_arch_3510.md): UB source 32-byte aligned;
// src_stride != len_burst must be 32-byte aligned. Bytes never written in this core's UB must not reach GM.
template <class T>
inline void ub2gm(T *dst, const T *src, uint16_t n_burst, uint32_t len_burst, uint64_t dst_stride, uint32_t src_stride) {
  const char *what = "asc_copy_ub2gm_align";
  if (n_burst < 1 || n_burst > 4095) fail("PIPE_MTE3", "%s: n_burst %u outside [1, 4095]", what, n_burst);
  if (len_burst < 1 || len_burst > 2097151) fail("PIPE_MTE3", "%s: len_burst %u outside [1, 2097151]", what, len_burst);
  uint64_t sstep = n_burst > 1 ? src_stride : len_burst;
  uint64_t dstep = n_burst > 1 ? dst_stride : len_burst;
  int64_t off = ub_offset(src, (n_burst - 1) * sstep + len_burst, T_MTE3, what);
  check_align32(off, T_MTE3, what, "source");
  if (n_burst > 1 && src_stride != len_burst && src_stride % 32)
    fail("PIPE_MTE3", "%s: src_stride %u != len_burst and not 32-byte aligned", what, src_stride);
  gm_check(dst, n_burst, len_burst, dstep, T_MTE3, what);
  for (uint32_t i = 0; i < n_burst; ++i) {
    int64_t o = off + (int64_t)(i * sstep);
    for (uint32_t k = 0; k < len_burst; ++k)
      if (!st.written[o + k])
        fail("PIPE_MTE3",
             "%s: UB byte offset %lld was never written by this core: poisoned UB would reach GM "
             "(burst %u, byte %u of %u)",
             what, (long long)(o + k), i, k, len_burst);
    ub_touch(o, len_burst, T_MTE3, false, what);
    std::memcpy((uint8_t *)dst + i * dstep, st.ub + o, len_burst);
    st.ctr->ub2gm_bytes += len_burst;
  }
}
}  // namespace emu

template <class D, class S, class L2>
inline void asc_copy_gm2ub_align(D *dst, S *src, uint16_t n_burst, uint32_t len_burst, uint8_t left_padding_num,
                                 uint8_t right_padding_num, bool enable_constant_pad, L2, uint64_t src_stride,
                                 uint32_t dst_stride) {
  static_assert(sizeof(D) == sizeof(S), "asc_copy_gm2ub_align: element types of different width");
  emu::gm2ub<D>(dst, (const D *)src, n_burst, len_burst, left_padding_num, right_padding_num, enable_constant_pad,
                src_stride, dst_stride);
}
// "first n bytes" form: size must be 32-byte aligned (same page, constraints).
template <class D, class S> inline void asc_copy_gm2ub_align(D *dst, S *src, uint32_t size) {
  if (size % 32) emu::fail("PIPE_MTE2", "asc_copy_gm2ub_align(dst, src, size): size %u not 32-byte aligned", size);
  emu::gm2ub<D>(dst, (const D *)src, 1, size, 0, 0, false, size, size);
}
template <class D, class S, class L2>
inline void asc_copy_ub2gm_align(D *dst, S *src, uint16_t n_burst, uint32_t len_burst, L2, uint64_t dst_stride,
                                 uint32_t src_stride) {
  static_assert(sizeof(D) == sizeof(S), "asc_copy_ub2gm_align: element types of different width");
  emu::ub2gm<D>(dst, (const D *)src, n_burst, len_burst, dst_stride, src_stride);
}
template <class D, class S> inline void asc_copy_ub2gm_align(D *dst, S *src, uint32_t size) {
  if (size % 32) emu::fail("PIPE_MTE3", "asc_copy_ub2gm_align(dst, src, size): size %u not 32-byte aligned", size);
  emu::ub2gm<D>(dst, (const D *)src, 1, size, size, size);
}
