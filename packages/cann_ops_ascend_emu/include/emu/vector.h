// Ascend C emulated on CPU: the register (SIMD VF) C API beneath TileLang's simd_inst.h, and the CCE builtins
// simd_inst.h calls directly (vmula, vmadd, vcvt). Document paths are relative to
// asc-devkit docs/zh/api/SIMD-API/C-API/reg/.
#pragma once
#include <limits>

#include "emu/sync_dma.h"
#include "emu/types.h"

namespace emu {
inline void vec_load(const void *p, uint64_t n, const char *what, bool aligned) {
  int64_t off = ub_offset(p, n, T_V, what);
  if (aligned) check_align32(off, T_V, what, "load");
  else if (off % 32) st.ctr->unaligned_single++;
  ub_touch(off, n, T_V, false, what);
  if (st.in_simd_vf && st.vf_membar)
    for (uint64_t i = 0; i < n; ++i)
      if (st.vst_gen[off + i] == st.vf_gen)
        fail("PIPE_V",
             "%s: vector load of UB byte offset %lld stored earlier in the same SIMD VF with no asc_mem_bar(VST_VLD) "
             "between (reg/sync_control/asc_mem_bar.md)",
             what, (long long)(off + i));
}
inline void vec_store_bytes(int64_t off, uint64_t n, const char *what) {
  ub_touch(off, n, T_V, true, what);
  if (st.in_simd_vf)
    for (uint64_t i = 0; i < n; ++i) st.vst_gen[off + i] = st.vf_gen;
}

// asc_create_mask (reg_data_types/asc_create_mask.md): lane i of a b8/b16/b32 mask is bit i*w, w = 1/2/4.
inline vector_bool make_mask(int w, emu_pattern p) {
  vector_bool m;
  std::memset(m.b, 0, 256);
  int lanes = 256 / w;
  for (int i = 0; i < lanes; ++i) {
    bool a;
    switch (p) {
      case PAT_ALL: a = true; break;
      case PAT_VL1: a = i < 1; break;
      case PAT_VL2: a = i < 2; break;
      case PAT_VL3: a = i < 3; break;
      case PAT_VL4: a = i < 4; break;
      case PAT_VL8: a = i < 8; break;
      case PAT_VL16: a = i < 16; break;
      case PAT_VL32: a = i < 32; break;
      case PAT_VL64: a = i < 64; break;
      case PAT_VL128: a = i < 128; break;
      case PAT_M3: a = i % 3 == 0; break;
      case PAT_M4: a = i % 4 == 0; break;
      case PAT_H: a = i < lanes / 2; break;
      case PAT_Q: a = i < lanes / 4; break;
      case PAT_ALLF: a = false; break;
      default: fail("PIPE_V", "asc_create_mask: pattern %d not emulated", (int)p);
    }
    m.b[i * w] = a;
  }
  return m;
}
// asc_update_mask (reg_data_types/asc_update_mask.md): the lowest min(value, lanes) lanes; value -= lanes (floor 0).
inline vector_bool update_mask(int w, uint32_t &value) {
  vector_bool m;
  std::memset(m.b, 0, 256);
  uint32_t lanes = 256 / w, n = value < lanes ? value : lanes;
  for (uint32_t i = 0; i < n; ++i) m.b[i * w] = 1;
  value = value < lanes ? 0 : value - lanes;
  return m;
}
}  // namespace emu

inline vector_bool asc_create_mask_b8(emu_pattern p) { return emu::make_mask(1, p); }
inline vector_bool asc_create_mask_b16(emu_pattern p) { return emu::make_mask(2, p); }
inline vector_bool asc_create_mask_b32(emu_pattern p) { return emu::make_mask(4, p); }
inline vector_bool asc_update_mask_b8(uint32_t &v) { return emu::update_mask(1, v); }
inline vector_bool asc_update_mask_b16(uint32_t &v) { return emu::update_mask(2, v); }
inline vector_bool asc_update_mask_b32(uint32_t &v) { return emu::update_mask(4, v); }

// ---------------------------------------------------------------- loads (reg_load/*.md); offsets count elements
// asc_loadalign: VL bytes from a 32-byte aligned UB address.
template <emu::vreg V, class T> inline void asc_loadalign(V &dst, T *src, int32_t offset = 0) {
  emu::count_vec();
  const T *p = src + offset;
  emu::vec_load(p, 256, "asc_loadalign", true);
  std::memcpy(dst.v, p, 256);
}
// Predicate load: 32 bytes, one bit per predicate position (data_type_definition.md: offsets in bytes).
inline void asc_loadalign(vector_bool &dst, uint32_t *src, int32_t offset = 0) {
  emu::count_vec();
  const uint8_t *p = (const uint8_t *)src + offset;
  emu::vec_load(p, 32, "asc_loadalign(vector_bool)", true);
  for (int i = 0; i < 256; ++i) dst.b[i] = (p[i / 8] >> (i % 8)) & 1;
}
// asc_loadalign_brc_elem: one element broadcast to every lane (single-element accesses at 4-byte UB offsets
// occur in working kernels: counted, not rejected).
template <emu::vreg V, class T> inline void asc_loadalign_brc_elem(V &dst, T *src, int32_t offset = 0) {
  emu::count_vec();
  static_assert(sizeof(T) == V::lane_bytes, "asc_loadalign_brc_elem: element and lane width differ");
  const T *p = src + offset;
  emu::vec_load(p, sizeof(T), "asc_loadalign_brc_elem", false);
  for (int i = 0; i < V::lanes; ++i) std::memcpy(&dst.v[i], p, sizeof(T));
}
// asc_loadalign_unpack: VL/2 bytes of unsigned elements, each zero-extended into a lane of twice the width
// ("中间位置补0": element k lands in lane 2k, lane 2k+1 is 0).
template <emu::vreg V, class T> inline void asc_loadalign_unpack(V &dst, T *src, int32_t offset = 0) {
  emu::count_vec();
  static_assert(sizeof(T) == V::lane_bytes, "asc_loadalign_unpack: element and lane width differ");
  const T *p = src + offset;
  emu::vec_load(p, 128, "asc_loadalign_unpack", true);
  std::memset(dst.v, 0, 256);
  for (int k = 0; k < V::lanes / 2; ++k) std::memcpy(&dst.v[2 * k], p + k, sizeof(T));
}
// asc_loadalign_unpack4: VL/4 bytes, element k in lane 4k, the three lanes above it 0.
template <emu::vreg V, class T> inline void asc_loadalign_unpack4(V &dst, T *src, int32_t offset = 0) {
  emu::count_vec();
  static_assert(sizeof(T) == V::lane_bytes, "asc_loadalign_unpack4: element and lane width differ");
  const T *p = src + offset;
  emu::vec_load(p, 64, "asc_loadalign_unpack4", true);
  std::memset(dst.v, 0, 256);
  for (int k = 0; k < V::lanes / 4; ++k) std::memcpy(&dst.v[4 * k], p + k, sizeof(T));
}

// ---------------------------------------------------------------- stores (reg_store/*.md)
// asc_storealign: the active lanes (by mask) to a 32-byte aligned address; inactive lanes leave UB as it was.
template <emu::vreg V, class T> inline void asc_storealign(T *base, V src, int32_t offset, vector_bool mask) {
  emu::count_vec();
  static_assert(sizeof(T) == V::lane_bytes, "asc_storealign: element and lane width differ");
  T *p = base + offset;
  int64_t off = emu::ub_offset(p, 256, emu::T_V, "asc_storealign");
  emu::check_align32(off, emu::T_V, "asc_storealign", "store");
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) {
      emu::vec_store_bytes(off + i * (int64_t)sizeof(T), sizeof(T), "asc_storealign");
      std::memcpy(p + i, &src.v[i], sizeof(T));
    }
}
template <emu::vreg V, class T> inline void asc_storealign(T *base, V src, vector_bool mask) {
  asc_storealign(base, src, 0, mask);
}
inline void asc_storealign(uint32_t *base, vector_bool src, int32_t offset = 0) {
  emu::count_vec();
  uint8_t *p = (uint8_t *)base + offset;
  int64_t off = emu::ub_offset(p, 32, emu::T_V, "asc_storealign(vector_bool)");
  emu::check_align32(off, emu::T_V, "asc_storealign(vector_bool)", "store");
  emu::vec_store_bytes(off, 32, "asc_storealign(vector_bool)");
  for (int k = 0; k < 32; ++k) {
    uint8_t byte = 0;
    for (int j = 0; j < 8; ++j) byte |= uint8_t((src.b[8 * k + j] ? 1 : 0) << j);
    p[k] = byte;
  }
}
// asc_storealign_1st: lane 0 only, mask ignored.
template <emu::vreg V, class T> inline void asc_storealign_1st(T *base, V src, int32_t offset = 0) {
  emu::count_vec();
  static_assert(sizeof(T) == V::lane_bytes, "asc_storealign_1st: element and lane width differ");
  T *p = base + offset;
  int64_t off = emu::ub_offset(p, sizeof(T), emu::T_V, "asc_storealign_1st");
  if (off % 32) emu::st.ctr->unaligned_single++;
  emu::vec_store_bytes(off, sizeof(T), "asc_storealign_1st");
  std::memcpy(p, &src.v[0], sizeof(T));
}
// asc_storealign_pack: the low half of every active lane, stored one after another (lane i -> half-width slot i);
// the offset counts half-width slots.
template <emu::vreg V, class T> inline void asc_storealign_pack(T *base, V src, int32_t offset, vector_bool mask) {
  emu::count_vec();
  constexpr int hb = V::lane_bytes / 2;
  static_assert(hb >= 1 && V::lane_bytes >= 2, "asc_storealign_pack: b16/b32/b64 only");
  uint8_t *p = (uint8_t *)base + (int64_t)offset * hb;
  int64_t off = emu::ub_offset(p, 128, emu::T_V, "asc_storealign_pack");
  emu::check_align32(off, emu::T_V, "asc_storealign_pack", "store");
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) {
      emu::vec_store_bytes(off + i * hb, hb, "asc_storealign_pack");
      std::memcpy(p + i * hb, &src.v[i], hb);  // little endian: the low half comes first
    }
}
template <emu::vreg V, class T> inline void asc_storealign_pack(T *base, V src, vector_bool mask) {
  asc_storealign_pack(base, src, 0, mask);
}
// asc_storealign_pack_quarter (reg_store/asc_storealign_pack_quarter.md): the low 8 bits of every active 32-bit
// lane, stored one after another (lane i -> byte i); bytes of inactive lanes keep their value. The offset counts
// byte slots, as asc_storealign_pack's counts half-width slots; the address must be 32-byte aligned.
template <emu::vreg V, class T> inline void asc_storealign_pack_quarter(T *base, V src, int32_t offset, vector_bool mask) {
  emu::count_vec();
  static_assert(V::lane_bytes == 4, "asc_storealign_pack_quarter: b32 registers only");
  uint8_t *p = (uint8_t *)base + offset;
  int64_t off = emu::ub_offset(p, 64, emu::T_V, "asc_storealign_pack_quarter");
  emu::check_align32(off, emu::T_V, "asc_storealign_pack_quarter", "store");
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) {
      emu::vec_store_bytes(off + i, 1, "asc_storealign_pack_quarter");
      std::memcpy(p + i, &src.v[i], 1);  // little endian: the low byte comes first
    }
}
template <emu::vreg V, class T> inline void asc_storealign_pack_quarter(T *base, V src, vector_bool mask) {
  asc_storealign_pack_quarter(base, src, 0, mask);
}

// ---------------------------------------------------------------- element-wise (arithmetic_compute/*.md etc.)
// The C API zeroes the lanes a mask leaves out (asc_madd.md / asc_axpy.md: "mask未筛选的元素在输出中置零";
// simd_inst.h merges for MODE_MERGING itself).
namespace emu {
template <class T> inline T fnan_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return a < b ? b : a;
}
template <class T> inline T fnan_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b < a ? b : a;
}
template <class T> inline T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) return T(std::make_unsigned_t<T>(a) + std::make_unsigned_t<T>(b));
  else return a + b;
}
template <class T> inline T wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) return T(std::make_unsigned_t<T>(a) - std::make_unsigned_t<T>(b));
  else return a - b;
}
template <class T> inline T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) return T(std::make_unsigned_t<T>(a) * std::make_unsigned_t<T>(b));
  else return a * b;
}
template <class T> inline T checked_div(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) fail("PIPE_V", "asc_div: integer division by zero (not documented)");
    if constexpr (std::is_signed_v<T>)
      if (b == T(-1)) return wrap_sub(T(0), a);
  }
  return a / b;
}
template <class T> inline T shl(T a, int64_t s) {
  if (s < 0 || s >= (int64_t)(8 * sizeof(T))) return T(0);
  return T(std::make_unsigned_t<T>(a) << s);
}
template <class T> inline T shr(T a, int64_t s) {
  if (s < 0 || s >= (int64_t)(8 * sizeof(T))) return std::is_signed_v<T> && a < 0 ? T(-1) : T(0);
  return T(a >> s);  // arithmetic for signed lanes
}
template <class T> inline T fabs_(T a) {
  if constexpr (std::is_floating_point_v<T>) return std::fabs(a);
  else if constexpr (std::is_signed_v<T>) return a < 0 ? wrap_sub(T(0), a) : a;
  else return a;
}
template <class T> inline T neg_(T a) {
  if constexpr (std::is_floating_point_v<T>) return -a;
  else return wrap_sub(T(0), a);
}
template <class T> inline T bit_not(T a) {
  if constexpr (std::is_integral_v<T>) return T(~a);
  else { fail("PIPE_V", "asc_not on a floating-point register"); }
}
template <class T> inline T bit_and(T a, T b) {
  if constexpr (std::is_integral_v<T>) return T(a & b);
  else { fail("PIPE_V", "asc_and on a floating-point register"); }
}
template <class T> inline T bit_or(T a, T b) {
  if constexpr (std::is_integral_v<T>) return T(a | b);
  else { fail("PIPE_V", "asc_or on a floating-point register"); }
}
template <class T> inline T bit_xor(T a, T b) {
  if constexpr (std::is_integral_v<T>) return T(a ^ b);
  else { fail("PIPE_V", "asc_xor on a floating-point register"); }
}
}  // namespace emu

#define EMU_BINARY(NAME, EXPR)                                                                   \
  template <emu::calc_vreg V> inline void NAME(V &dst, V a, V b, vector_bool mask) {             \
    emu::count_vec();                                                                          \
    V r = emu::zero<V>();                                                                      \
    for (int i = 0; i < V::lanes; ++i)                                                         \
      if (emu::on<V>(mask, i)) {                                                               \
        using C = typename V::calc;                                                            \
        C x = emu::get(a, i), y = emu::get(b, i);                                              \
        emu::set(r, i, C(EXPR));                                                               \
      }                                                                                        \
    dst = r;                                                                                   \
  }
#define EMU_SCALAR(NAME, EXPR)                                                                   \
  template <emu::calc_vreg V, class S> inline void NAME(V &dst, V a, S s, vector_bool mask) {    \
    emu::count_vec();                                                                          \
    V r = emu::zero<V>();                                                                      \
    using C = typename V::calc;                                                                \
    C y = C(s);                                                                                \
    for (int i = 0; i < V::lanes; ++i)                                                         \
      if (emu::on<V>(mask, i)) {                                                               \
        C x = emu::get(a, i);                                                                  \
        emu::set(r, i, C(EXPR));                                                               \
      }                                                                                        \
    dst = r;                                                                                   \
  }
#define EMU_UNARY(NAME, EXPR)                                                                    \
  template <emu::calc_vreg V> inline void NAME(V &dst, V a, vector_bool mask) {                  \
    emu::count_vec();                                                                          \
    V r = emu::zero<V>();                                                                      \
    using C = typename V::calc;                                                                \
    for (int i = 0; i < V::lanes; ++i)                                                         \
      if (emu::on<V>(mask, i)) {                                                               \
        C x = emu::get(a, i);                                                                  \
        emu::set(r, i, C(EXPR));                                                               \
      }                                                                                        \
    dst = r;                                                                                   \
  }
// arithmetic_compute/asc_add.md, asc_sub.md, asc_mul.md, asc_div.md: IEEE fp32 (one rounding per op);
// integers wrap. asc_max/asc_min propagate NaN (the documents say nothing on NaN).
EMU_BINARY(asc_add, emu::wrap_add(x, y))
EMU_BINARY(asc_sub, emu::wrap_sub(x, y))
EMU_BINARY(asc_mul, emu::wrap_mul(x, y))
EMU_BINARY(asc_div, emu::checked_div(x, y))
EMU_BINARY(asc_max, emu::fnan_max(x, y))
EMU_BINARY(asc_min, emu::fnan_min(x, y))
EMU_BINARY(asc_and, emu::bit_and(x, y))
EMU_BINARY(asc_or, emu::bit_or(x, y))
EMU_BINARY(asc_xor, emu::bit_xor(x, y))
EMU_BINARY(asc_shiftleft, emu::shl(x, (int64_t)y))
EMU_BINARY(asc_shiftright, emu::shr(x, (int64_t)y))
EMU_BINARY(asc_abs_sub, emu::fabs_(emu::wrap_sub(x, y)))
EMU_BINARY(asc_prelu, (x >= C(0) ? x : emu::wrap_mul(x, y)))
EMU_SCALAR(asc_add_scalar, emu::wrap_add(x, y))
EMU_SCALAR(asc_mul_scalar, emu::wrap_mul(x, y))
EMU_SCALAR(asc_max_scalar, emu::fnan_max(x, y))
EMU_SCALAR(asc_min_scalar, emu::fnan_min(x, y))
EMU_SCALAR(asc_shiftleft_scalar, emu::shl(x, (int64_t)y))
EMU_SCALAR(asc_shiftright_scalar, emu::shr(x, (int64_t)y))
EMU_SCALAR(asc_leakyrelu, (x >= C(0) ? x : emu::wrap_mul(x, y)))
// asc_abs/asc_neg/asc_sqrt/asc_exp/asc_ln/asc_relu/asc_not: IEEE fp32 / libm (hardware ulps of exp, ln, sqrt
// are not documented to the bit: see README).
EMU_UNARY(asc_abs, emu::fabs_(x))
EMU_UNARY(asc_neg, emu::neg_(x))
EMU_UNARY(asc_sqrt, std::sqrt(x))
EMU_UNARY(asc_exp, std::exp(x))
EMU_UNARY(asc_ln, std::log(x))
EMU_UNARY(asc_relu, (x > C(0) ? x : C(0)))
EMU_UNARY(asc_not, emu::bit_not(x))
#undef EMU_BINARY
#undef EMU_SCALAR
#undef EMU_UNARY

// asc_exp_sub (compound_compute/asc_exp_sub_deprecated.md): exp(src0 - src1), the difference rounded first.
template <emu::calc_vreg V> inline void asc_exp_sub(V &dst, V a, V b, vector_bool mask) {
  emu::count_vec();
  V r = emu::zero<V>();
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) {
      float d = float(emu::get(a, i)) - float(emu::get(b, i));
      emu::set(r, i, std::exp(d));
    }
  dst = r;
}
// asc_madd (compound_compute/asc_madd.md): dst = dst * src0 + src1, fused multiply-add (one rounding).
template <emu::calc_vreg V> inline void asc_madd(V &dst, V src0, V src1, vector_bool mask) {
  emu::count_vec();
  V r = emu::zero<V>();
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) {
      if constexpr (std::is_floating_point_v<typename V::calc>)
        emu::set(r, i, std::fma(emu::get(dst, i), emu::get(src0, i), emu::get(src1, i)));
      else emu::set(r, i, emu::wrap_add(emu::wrap_mul(emu::get(dst, i), emu::get(src0, i)), emu::get(src1, i)));
    }
  dst = r;
}
// asc_axpy (compound_compute/asc_axpy.md): dst = src * value + dst, fused (one rounding).
template <emu::calc_vreg V, class S> inline void asc_axpy(V &dst, V src, S value, vector_bool mask) {
  emu::count_vec();
  V r = emu::zero<V>();
  using C = typename V::calc;
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) emu::set(r, i, std::fma(emu::get(src, i), C(value), emu::get(dst, i)));
  dst = r;
}

// ---------------------------------------------------------------- compares -> predicates (compare_and_select/*.md)
#define EMU_CMP(NAME, OP)                                                                          \
  template <emu::calc_vreg V> inline void NAME(vector_bool &dst, V a, V b, vector_bool mask) {     \
    emu::count_vec();                                                                            \
    vector_bool r;                                                                               \
    std::memset(r.b, 0, 256);                                                                    \
    for (int i = 0; i < V::lanes; ++i)                                                           \
      r.b[i * V::lane_bytes] = emu::on<V>(mask, i) && (emu::get(a, i) OP emu::get(b, i));        \
    dst = r;                                                                                     \
  }                                                                                              \
  template <emu::calc_vreg V, class S>                                                           \
  inline void NAME##_scalar(vector_bool &dst, V a, S s, vector_bool mask) {                      \
    emu::count_vec();                                                                            \
    vector_bool r;                                                                               \
    std::memset(r.b, 0, 256);                                                                    \
    using C = typename V::calc;                                                                  \
    C y = C(s);                                                                                  \
    for (int i = 0; i < V::lanes; ++i) r.b[i * V::lane_bytes] = emu::on<V>(mask, i) && (emu::get(a, i) OP y); \
    dst = r;                                                                                     \
  }
EMU_CMP(asc_eq, ==)
EMU_CMP(asc_ne, !=)
EMU_CMP(asc_gt, >)
EMU_CMP(asc_ge, >=)
EMU_CMP(asc_lt, <)
EMU_CMP(asc_le, <=)
#undef EMU_CMP

// asc_select (compare_and_select/asc_select.md): mask bit set -> src0, else src1; every lane written.
template <emu::vreg V> inline void asc_select(V &dst, V a, V b, vector_bool mask) {
  emu::count_vec();
  V r;
  for (int i = 0; i < V::lanes; ++i) r.v[i] = emu::on<V>(mask, i) ? a.v[i] : b.v[i];
  dst = r;
}
// Predicate logic: bitwise under the mask.
inline void asc_select(vector_bool &dst, vector_bool a, vector_bool b, vector_bool mask) {
  emu::count_vec();
  vector_bool r;
  for (int i = 0; i < 256; ++i) r.b[i] = mask.b[i] ? a.b[i] : b.b[i];
  dst = r;
}
#define EMU_PLOGIC(NAME, EXPR)                                                                 \
  inline void NAME(vector_bool &dst, vector_bool a, vector_bool b, vector_bool mask) {         \
    emu::count_vec();                                                                        \
    vector_bool r;                                                                           \
    for (int i = 0; i < 256; ++i) r.b[i] = mask.b[i] && (EXPR);                              \
    dst = r;                                                                                 \
  }
EMU_PLOGIC(asc_and, a.b[i] && b.b[i])
EMU_PLOGIC(asc_or, a.b[i] || b.b[i])
EMU_PLOGIC(asc_xor, (a.b[i] != 0) != (b.b[i] != 0))
#undef EMU_PLOGIC
inline void asc_not(vector_bool &dst, vector_bool a, vector_bool mask) {
  emu::count_vec();
  vector_bool r;
  for (int i = 0; i < 256; ++i) r.b[i] = mask.b[i] && !a.b[i];
  dst = r;
}

// ---------------------------------------------------------------- fill (data_fill/*.md)
template <emu::vreg V, class S> inline void asc_duplicate_scalar(V &dst, S s, vector_bool mask) {
  emu::count_vec();
  V r = emu::zero<V>();
  typename V::storage x;
  if constexpr (std::is_same_v<V, vector_bf16>) x = emu::f32_to_bf16(float(s), 'r', false);
  else if constexpr (std::is_same_v<V, vector_f16>) x = emu::f32_to_f16_rn(float(s));
  else x = (typename V::storage)s;
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) r.v[i] = x;
  dst = r;
}
// asc_duplicate: the lowest lane of src to every active lane; asc_duplicate_highest: the highest lane.
template <emu::vreg V> inline void asc_duplicate(V &dst, V src, vector_bool mask) {
  emu::count_vec();
  V r = emu::zero<V>();
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) r.v[i] = src.v[0];
  dst = r;
}
template <emu::vreg V> inline void asc_duplicate_highest(V &dst, V src, vector_bool mask) {
  emu::count_vec();
  V r = emu::zero<V>();
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) r.v[i] = src.v[V::lanes - 1];
  dst = r;
}
// asc_arange / asc_arange_descend: lane i = index +/- i.
template <emu::calc_vreg V, class S> inline void asc_arange(V &dst, S index) {
  emu::count_vec();
  using C = typename V::calc;
  for (int i = 0; i < V::lanes; ++i) emu::set(dst, i, emu::wrap_add(C(index), C(i)));
}
template <emu::calc_vreg V, class S> inline void asc_arange_descend(V &dst, S index) {
  emu::count_vec();
  using C = typename V::calc;
  for (int i = 0; i < V::lanes; ++i) emu::set(dst, i, emu::wrap_sub(C(index), C(i)));
}

// ---------------------------------------------------------------- rearrangement (data_rearrange/*.md)
// asc_deintlv (data_rearrange/asc_deintlv.md): its lane order is given only by a figure, so this follows the text
// for the same operation elsewhere: src0 then src1 as one sequence of 2N elements, the even-indexed ones to dst0 and
// the odd-indexed ones to dst1 (reg_load/asc_loadalign_v1_deprecated.md, DEINTLV load mode; the example of basic-API
// 数据重排（ISASI）/DeInterleave.md: src0 1..512 and src1 513..1024 give dst0 1, 3, .., 1023 and dst1 2, 4, .., 1024).
// dst0 and dst1 may not be one register; sources may alias the destinations. Documented for 8/16/32-bit lanes only.
template <emu::vreg V> inline void asc_deintlv(V &dst0, V &dst1, V src0, V src1) {
  constexpr bool fp4 = std::is_same_v<V, vector_f4e2m1x2> || std::is_same_v<V, vector_f4e1m2x2>;
  if constexpr (fp4 || V::lane_bytes > 4) {
    emu::unemulated("asc_deintlv (fp4 / 64-bit lanes: not documented)");
  } else {
    if (&dst0 == &dst1) emu::fail("PIPE_V", "asc_deintlv: dst0 and dst1 are one register (asc_deintlv.md forbids it)");
    emu::count_vec();
    constexpr int half = V::lanes / 2;
    V even, odd;
    for (int k = 0; k < V::lanes; ++k) {
      const V &s = k < half ? src0 : src1;
      int j = 2 * (k % half);
      even.v[k] = s.v[j];
      odd.v[k] = s.v[j + 1];
    }
    dst0 = even;
    dst1 = odd;
  }
}

// asc_intlv (reg_vector/asc_intlv.md): the inverse of asc_deintlv above, as that document's figure draws it: the
// sequence src0[0], src1[0], src0[1], src1[1], .. of 2N elements, its first N to dst0 and the rest to dst1.
// Sources may alias the destinations. Vector registers of 8/16/32-bit lanes (the mask forms stay unemulated).
template <emu::vreg V> inline void asc_intlv(V &dst0, V &dst1, V src0, V src1) {
  constexpr bool fp4 = std::is_same_v<V, vector_f4e2m1x2> || std::is_same_v<V, vector_f4e1m2x2>;
  if constexpr (fp4 || V::lane_bytes > 4) {
    emu::unemulated("asc_intlv (fp4 / 64-bit lanes: not documented)");
  } else {
    if (&dst0 == &dst1) emu::fail("PIPE_V", "asc_intlv: dst0 and dst1 are one register");
    emu::count_vec();
    constexpr int half = V::lanes / 2;
    V low, high;
    for (int k = 0; k < V::lanes; ++k) {
      int j = k / 2;  // element k of each output half takes lane j of src0 (k even) or src1 (k odd)
      low.v[k] = (k % 2 ? src1 : src0).v[j];
      high.v[k] = (k % 2 ? src1 : src0).v[j + half];
    }
    dst0 = low;
    dst1 = high;
  }
}

// ---------------------------------------------------------------- reductions (reduce_compute/asc_reduce_sum.md)
// Binary tree over the register positions (lane 2k + lane 2k+1, then pairs of those, ...), lanes the mask
// leaves out contribute +0; the sum lands in lane 0, every other lane is 0. 16-bit integer sources widen
// to 32 bits. Half sums round to half after every addition (an fp16 adder).
template <emu::calc_vreg D, emu::calc_vreg S> inline void asc_reduce_sum(D &dst, S src, vector_bool mask) {
  emu::count_vec();
  using C = typename D::calc;
  C t[256];
  for (int i = 0; i < S::lanes; ++i) t[i] = emu::on<S>(mask, i) ? C(emu::get(src, i)) : C(0);
  for (int n = S::lanes; n > 1; n /= 2)
    for (int i = 0; i < n / 2; ++i) {
      C s = emu::wrap_add(t[2 * i], t[2 * i + 1]);
      if constexpr (std::is_same_v<D, vector_f16>) s = emu::f16_to_f32(emu::f32_to_f16_rn(s));
      t[i] = s;
    }
  D r = emu::zero<D>();
  emu::set(r, 0, t[0]);
  dst = r;
}

// asc_reduce_max / asc_reduce_min (reduce_compute/asc_reduce_max.md, asc_reduce_min.md): the extreme value in
// lane 0, its index (the smallest one on ties, the first NaN if any) in lane 1 stored as an integer of the lane's
// width, every other lane 0; lanes outside the mask count as -inf (max) / +inf (min); max(-0, +0) = +0.
template <emu::calc_vreg V, bool IsMax> inline void reduce_extreme(V &dst, V src, vector_bool mask) {
  emu::count_vec();
  using C = typename V::calc;
  constexpr bool fp = std::is_floating_point_v<C>;
  C best;
  if constexpr (fp) best = IsMax ? -INFINITY : INFINITY;
  else best = IsMax ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
  int at = 0;
  bool found = false, nan = false;
  for (int i = 0; i < V::lanes; ++i) {
    if (!emu::on<V>(mask, i)) continue;
    C x = emu::get(src, i);
    if constexpr (fp) {
      if (std::isnan(x)) {
        best = x, at = i, nan = true;
        break;
      }
    }
    if (!found || (IsMax ? x > best : x < best)) {
      best = x, at = i, found = true;
    } else if constexpr (fp) {
      if (x == C(0) && best == C(0) && std::signbit(best) != std::signbit(x) && std::signbit(x) != IsMax) best = x, at = i;
    }
  }
  V r = emu::zero<V>();
  emu::set(r, 0, best);
  if (found || nan) {
    using S = typename V::storage;
    if constexpr (sizeof(S) == 4) { uint32_t ix = (uint32_t)at; std::memcpy(&r.v[1], &ix, 4); }
    else if constexpr (sizeof(S) == 2) { uint16_t ix = (uint16_t)at; std::memcpy(&r.v[1], &ix, 2); }
    else if constexpr (sizeof(S) == 1) { uint8_t ix = (uint8_t)at; std::memcpy(&r.v[1], &ix, 1); }
    else { uint64_t ix = (uint64_t)at; std::memcpy(&r.v[1], &ix, 8); }
  }
  dst = r;
}
template <emu::calc_vreg V> inline void asc_reduce_max(V &dst, V src, vector_bool mask) { reduce_extreme<V, true>(dst, src, mask); }
template <emu::calc_vreg V> inline void asc_reduce_min(V &dst, V src, vector_bool mask) { reduce_extreme<V, false>(dst, src, mask); }

// asc_reduce_sum_datablock / asc_reduce_max_datablock / asc_reduce_min_datablock
// (reg_vector/asc_reduce_{sum,max,min}_datablock.md): one result per 32-byte data block of src, the 8 results in
// order in the lowest 8 lanes of dst, every other lane 0. Lanes the mask leaves out take no part (the document:
// "mask未筛选的元素在输出中置零"; read here as: they count +0 in a sum and are skipped by max / min, and a block
// with no active lane gives 0). Sums: a binary tree over the block's lanes, as asc_reduce_sum; 16-bit integer
// sources widen to 32-bit results (the u16 -> u32 and s16 -> s32 forms); half rounds after every addition.
// max / min: a NaN in the block is the result; max(-0, +0) = +0, min(-0, +0) = -0.
namespace emu {
constexpr int DATABLOCK_BYTES = 32;
template <class D, class S> inline void datablock_sum(D &dst, const S &src, const vector_bool &mask) {
  using C = typename D::calc;
  constexpr int per = DATABLOCK_BYTES / S::lane_bytes;
  D r = zero<D>();
  for (int b = 0; b < 256 / DATABLOCK_BYTES; ++b) {
    C t[32];
    for (int i = 0; i < per; ++i) t[i] = on<S>(mask, b * per + i) ? C(get(src, b * per + i)) : C(0);
    for (int n = per; n > 1; n /= 2)
      for (int i = 0; i < n / 2; ++i) {
        C x = wrap_add(t[2 * i], t[2 * i + 1]);
        if constexpr (std::is_same_v<D, vector_f16>) x = f16_to_f32(f32_to_f16_rn(x));
        t[i] = x;
      }
    set(r, b, t[0]);
  }
  dst = r;
}
template <class V, bool IsMax> inline void datablock_extreme(V &dst, const V &src, const vector_bool &mask) {
  using C = typename V::calc;
  constexpr int per = DATABLOCK_BYTES / V::lane_bytes;
  V r = zero<V>();
  for (int b = 0; b < 256 / DATABLOCK_BYTES; ++b) {
    bool found = false;
    C best = C(0);
    for (int i = 0; i < per; ++i) {
      if (!on<V>(mask, b * per + i)) continue;
      C x = get(src, b * per + i);
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(x)) {
          best = x, found = true;
          break;
        }
        if (found && x == best && x == C(0) && std::signbit(x) != std::signbit(best)) {
          best = IsMax ? C(0) : -C(0);
          continue;
        }
      }
      if (!found || (IsMax ? x > best : x < best)) best = x, found = true;
    }
    set(r, b, found ? best : C(0));
  }
  dst = r;
}
}  // namespace emu
template <emu::calc_vreg V> inline void asc_reduce_sum_datablock(V &dst, V src, vector_bool mask) {
  emu::count_vec();
  if constexpr (V::lane_bytes == 1 || V::lane_bytes == 8) emu::unemulated("asc_reduce_sum_datablock (8/64-bit lanes)");
  else emu::datablock_sum(dst, src, mask);
}
inline void asc_reduce_sum_datablock(vector_u32 &dst, vector_u16 src, vector_bool mask) {
  emu::count_vec();
  emu::datablock_sum(dst, src, mask);
}
inline void asc_reduce_sum_datablock(vector_s32 &dst, vector_s16 src, vector_bool mask) {
  emu::count_vec();
  emu::datablock_sum(dst, src, mask);
}
template <emu::calc_vreg V> inline void asc_reduce_max_datablock(V &dst, V src, vector_bool mask) {
  emu::count_vec();
  if constexpr (V::lane_bytes == 1 || V::lane_bytes == 8) emu::unemulated("asc_reduce_max_datablock (8/64-bit lanes)");
  else emu::datablock_extreme<V, true>(dst, src, mask);
}
template <emu::calc_vreg V> inline void asc_reduce_min_datablock(V &dst, V src, vector_bool mask) {
  emu::count_vec();
  if constexpr (V::lane_bytes == 1 || V::lane_bytes == 8) emu::unemulated("asc_reduce_min_datablock (8/64-bit lanes)");
  else emu::datablock_extreme<V, false>(dst, src, mask);
}

// ---------------------------------------------------------------- gather / scatter (reg_load/asc_gather.md,
// reg_store/asc_scatter.md). Indices count elements of the UB operand's type ("按元素收集": lane i of dst takes
// the element at src + index[i]).
// asc_gather from a register: dst[i] = src[index[i] % lanes] (the document's rule for indices past the register).
template <emu::vreg V, emu::vreg I> inline void asc_gather(V &dst, V src, I index) {
  emu::count_vec();
  static_assert(V::lane_bytes == I::lane_bytes, "asc_gather: index lanes must be as wide as the data lanes");
  V r;
  for (int i = 0; i < V::lanes; ++i) r.v[i] = src.v[index.v[i] % V::lanes];
  dst = r;
}
// asc_gather from UB: dst[i] = src[index[i]] for the lanes the mask selects, 0 elsewhere; a b8 source fills
// 16-bit lanes, zero-extended (the document's constraint). Each gathered element is a UB read of its own.
template <emu::vreg V, class T, emu::vreg I> inline void asc_gather(V &dst, T *src, I index, vector_bool mask) {
  emu::count_vec();
  if constexpr (I::lane_bytes != V::lane_bytes) {
    emu::unemulated("asc_gather (32-bit indices for 16-bit lanes)");
  } else {
    static_assert(sizeof(T) == V::lane_bytes || (sizeof(T) == 1 && V::lane_bytes == 2),
                  "asc_gather: element and lane width differ");
    V r = emu::zero<V>();
    for (int i = 0; i < V::lanes; ++i)
      if (emu::on<V>(mask, i)) {
        const T *p = src + index.v[i];
        emu::vec_load(p, sizeof(T), "asc_gather", false);
        if constexpr (sizeof(T) == 1) r.v[i] = (typename V::storage)(*(const uint8_t *)p);
        else std::memcpy(&r.v[i], p, sizeof(T));
      }
    dst = r;
  }
}
// asc_scatter to UB: dst[index[i]] = src[i] for the lanes the mask selects; dst 32-byte aligned. Two selected
// lanes with one index are refused: the hardware keeps one of them, which is not specified.
template <emu::vreg V, class T, emu::vreg I> inline void asc_scatter(T *dst, V src, I index, vector_bool mask) {
  emu::count_vec();
  if constexpr (V::lane_bytes == 1 || I::lane_bytes != V::lane_bytes) {
    emu::unemulated("asc_scatter (b8 data or index lanes of another width)");
  } else {
    static_assert(sizeof(T) == V::lane_bytes, "asc_scatter: element and lane width differ");
    int64_t base = emu::ub_offset(dst, sizeof(T), emu::T_V, "asc_scatter");
    emu::check_align32(base, emu::T_V, "asc_scatter", "store");
    for (int i = 0; i < V::lanes; ++i) {
      if (!emu::on<V>(mask, i)) continue;
      for (int j = 0; j < i; ++j)
        if (emu::on<V>(mask, j) && index.v[j] == index.v[i])
          emu::fail("PIPE_V", "asc_scatter: lanes %d and %d both write element %llu (indices must be unique)", j, i,
                    (unsigned long long)index.v[i]);
      T *p = dst + index.v[i];
      int64_t off = emu::ub_offset(p, sizeof(T), emu::T_V, "asc_scatter");
      std::memcpy(p, &src.v[i], sizeof(T));
      emu::vec_store_bytes(off, sizeof(T), "asc_scatter");
    }
  }
}

// ---------------------------------------------------------------- CCE builtins used by simd_inst.h
namespace emu {
template <class M> constexpr bool merging() { return M::value == 1; }
}
// vmula: dst = src0 * src1 + dst, fused (one rounding); lanes outside the mask: 0 (MODE_ZEROING) or kept
// (MODE_MERGING).
template <emu::calc_vreg V, class M> inline void vmula(V &dst, V a, V b, vector_bool mask, M) {
  emu::count_vec();
  V r = emu::merging<M>() ? dst : emu::zero<V>();
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) {
      if constexpr (std::is_floating_point_v<typename V::calc>)
        emu::set(r, i, std::fma(emu::get(a, i), emu::get(b, i), emu::get(dst, i)));
      else emu::set(r, i, emu::wrap_add(emu::wrap_mul(emu::get(a, i), emu::get(b, i)), emu::get(dst, i)));
    }
  dst = r;
}
// vmadd: dst = dst * src0 + src1, fused (asc_madd's instruction), with the mode of vmula.
template <emu::calc_vreg V, class M> inline void vmadd(V &dst, V a, V b, vector_bool mask, M) {
  emu::count_vec();
  V r = emu::merging<M>() ? dst : emu::zero<V>();
  for (int i = 0; i < V::lanes; ++i)
    if (emu::on<V>(mask, i)) {
      if constexpr (std::is_floating_point_v<typename V::calc>)
        emu::set(r, i, std::fma(emu::get(dst, i), emu::get(a, i), emu::get(b, i)));
      else emu::set(r, i, emu::wrap_add(emu::wrap_mul(emu::get(dst, i), emu::get(a, i)), emu::get(b, i)));
    }
  dst = r;
}

// vcvt: conversion with trailing control tags (part, round, saturation, mode in any order) as simd_inst.h passes
// them. Emulated pairs: fp32 <- bf16/half (PART_EVEN/ODD picks the even/odd source lanes), bf16/half <- fp32
// (PART_* picks the even/odd destination lanes; asc-devkit data_type_convert/asc_float2bfloat16.md), fp32 <-> s32,
// fp8_e4m3fn / fp8_e5m2 <-> fp32 (PART_P0..P3 picks byte `part` of each 4-byte group, types.h).
// RS_ENABLE saturates only when emu.set_saturation(True) (README "Saturation").
namespace emu {
struct CvtCtl {
  int part = 0;
  char round = 'r';
  bool rs = false;
  bool merge = false;
  bool has_round = false, has_rs = false;  // given at all (the widening fp8 conversions take neither)
};
template <class V> concept fp8_vreg = std::is_same_v<V, vector_f8e4m3> || std::is_same_v<V, vector_f8e5m2>;
template <class T> inline void cvt_ctl(CvtCtl &c, T) {
  if constexpr (T::kind == K_PART) c.part = T::value;
  else if constexpr (T::kind == K_ROUND) c.round = (char)T::value, c.has_round = true;
  else if constexpr (T::kind == K_RS) c.rs = T::value != 0, c.has_rs = true;
  else if constexpr (T::kind == K_MODE) c.merge = T::value == 1;
  else static_assert(T::kind == K_PART, "vcvt: unknown control");
}
inline int32_t f32_to_s32(float x, char mode, bool sat) {
  if (std::isnan(x)) return 0;
  double r;
  switch (mode) {
    case 'r': r = std::nearbyint((double)x); break;
    case 'a': r = std::round((double)x); break;
    case 'f': r = std::floor((double)x); break;
    case 'c': r = std::ceil((double)x); break;
    case 'z': r = std::trunc((double)x); break;
    default: fail("PIPE_V", "vcvt fp32->s32: rounding mode '%c' not emulated", mode);
  }
  (void)sat;  // rounding_mode.md: float -> integer out of range saturates to the extremes either way for inf
  if (r >= 2147483647.0) return INT32_MAX;
  if (r <= -2147483648.0) return INT32_MIN;
  return (int32_t)r;
}
}  // namespace emu
template <emu::vreg D, emu::vreg S, class... C> inline void vcvt(D &dst, S src, vector_bool mask, C... controls) {
  emu::count_vec();
  emu::CvtCtl c;
  (emu::cvt_ctl(c, controls), ...);
  D r = c.merge ? dst : emu::zero<D>();
  constexpr bool widen16 = std::is_same_v<D, vector_f32> && (std::is_same_v<S, vector_bf16> || std::is_same_v<S, vector_f16>);
  constexpr bool narrow16 = std::is_same_v<S, vector_f32> && (std::is_same_v<D, vector_bf16> || std::is_same_v<D, vector_f16>);
  if constexpr (widen16) {
    for (int i = 0; i < 64; ++i)
      if (emu::on<vector_f32>(mask, i)) r.v[i] = emu::get(src, 2 * i + c.part);
  } else if constexpr (narrow16) {
    bool sat = c.rs && emu::st.saturate;
    for (int i = 0; i < 64; ++i)
      if (emu::on<vector_f32>(mask, i)) {
        uint16_t h;
        if constexpr (std::is_same_v<D, vector_bf16>) h = emu::f32_to_bf16(src.v[i], c.round, sat);
        else {
          if (c.round != 'r' || sat) emu::fail("PIPE_V", "vcvt fp32->half: only ROUND_R without saturation is emulated");
          h = emu::f32_to_f16_rn(src.v[i]);
        }
        r.v[2 * i + c.part] = h;
        if (!c.merge) r.v[2 * i + 1 - c.part] = 0;
      }
  } else if constexpr (std::is_same_v<D, vector_f32> && std::is_same_v<S, vector_s32>) {
    for (int i = 0; i < 64; ++i)
      if (emu::on<vector_f32>(mask, i)) {
        if (c.round != 'r') emu::fail("PIPE_V", "vcvt s32->fp32: only ROUND_R is emulated");
        r.v[i] = (float)src.v[i];  // the host rounds to nearest even
      }
  } else if constexpr (std::is_same_v<D, vector_s32> && std::is_same_v<S, vector_f32>) {
    for (int i = 0; i < 64; ++i)
      if (emu::on<vector_f32>(mask, i)) r.v[i] = emu::f32_to_s32(src.v[i], c.round, c.rs && emu::st.saturate);
  } else if constexpr (emu::fp8_vreg<D> && std::is_same_v<S, vector_f32>) {
    // asc_float2e4m3_deprecated.md / asc_float2e5m2_deprecated.md: fp32 lane i -> byte 4i + part (the lane's own
    // mask bit, 4i); the other bytes of a zeroing result are 0 (RegLayout.md cast_b32_to_b8).
    if (c.round != 'r') emu::fail("PIPE_V", "vcvt fp32->fp8: only ROUND_R (RINT) is documented");
    bool sat = c.rs && emu::st.saturate;
    for (int i = 0; i < 64; ++i)
      if (emu::on<vector_f32>(mask, i)) {
        if (!c.merge)
          for (int k = 0; k < 4; ++k) r.v[4 * i + k] = 0;
        if constexpr (std::is_same_v<D, vector_f8e4m3>) r.v[4 * i + c.part] = emu::f32_to_e4m3(src.v[i], sat);
        else r.v[4 * i + c.part] = emu::f32_to_e5m2(src.v[i], sat);
      }
  } else if constexpr (std::is_same_v<D, vector_f32> && emu::fp8_vreg<S>) {
    // asc_e4m32float_deprecated.md / asc_e5m22float_deprecated.md: lane i <- byte 4i + part (RegLayout.md
    // cast_b8_to_b32). The mask is the source operand's (RegLayout.md: one bit per b8 element), so lane i
    // converts when the bit of byte 4i + part is set; the other lanes are 0. Cast.md lists only zeroing, no
    // rounding or saturation for these pairs: anything else is left open, so it fails.
    if (c.merge || c.has_round || c.has_rs)
      emu::fail("PIPE_V", "vcvt fp8->fp32: only PART_P0..P3 with MODE_ZEROING is documented");
    for (int i = 0; i < 64; ++i) {
      int b = 4 * i + c.part;
      if (emu::on<S>(mask, b))
        r.v[i] = std::is_same_v<S, vector_f8e4m3> ? emu::e4m3_to_f32(src.v[b]) : emu::e5m2_to_f32(src.v[b]);
    }
  } else {
    emu::unemulated("vcvt (this pair of register types)");
  }
  dst = r;
}
