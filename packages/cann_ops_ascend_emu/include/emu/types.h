// Ascend C emulated on CPU: scalar types (bf16, half, fp8 storage), control tags, vector and mask registers.
#pragma once
#include <bit>

#include "emu/state.h"

namespace emu {
inline float bits_to_f32(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t f32_to_bits(float f) { return std::bit_cast<uint32_t>(f); }

// bf16 <- fp32. Rounding modes of asc-devkit reg/data_type_convert/rounding_mode.md: 'r' RINT (to nearest,
// ties to even), 'a' ROUND (ties away), 'f' FLOOR, 'c' CEIL, 'z' TRUNC, 'o' ODD. Saturation (same page,
// "饱和模式"): out of range and +-inf -> +-max, NaN -> 0. Non-saturating: overflow -> +-inf, NaN -> NaN.
inline uint16_t f32_to_bf16(float f, char mode, bool sat) {
  uint32_t u = f32_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  if (std::isnan(f)) return sat ? 0 : uint16_t((u >> 16) | 0x0040);
  if (std::isinf(f)) return sat ? uint16_t(sign | 0x7f7f) : uint16_t(u >> 16);
  uint32_t hi = u >> 16, lo = u & 0xffff;
  bool neg = sign != 0;
  bool up = false;
  switch (mode) {
    case 'r': up = lo > 0x8000 || (lo == 0x8000 && (hi & 1)); break;
    case 'a': up = lo >= 0x8000; break;
    case 'f': up = neg && lo != 0; break;
    case 'c': up = !neg && lo != 0; break;
    case 'z': up = false; break;
    case 'o': if (lo != 0) hi |= 1; break;
    default: fail("PIPE_V", "bf16 conversion: rounding mode '%c' not emulated", mode);
  }
  uint32_t r = hi + (up ? 1 : 0);  // a carry into the exponent is the correct next binade / inf
  uint16_t h = uint16_t(r);
  if ((h & 0x7fff) == 0x7f80 && sat) h = uint16_t(sign | 0x7f7f);
  return h;
}
inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
// fp8 <- fp32 rounding shared by fp8_e4m3fn and fp8_e5m2 (M mantissa bits, exponent bias B): the magnitude code
// of a finite |f| rounded by RINT (to nearest, ties to even). Subnormals (steps of 2**(1-B-M)) are rounded, not
// flushed. The code can pass the format's largest finite one: overflow is the caller's to handle.
template <int M, int B> inline int fp8_rint_code(double a) {
  int e;
  std::frexp(a, &e);  // a = m * 2**e, m in [0.5, 1): the leading bit is 2**(e-1)
  int unbiased = std::max(e - 1, 1 - B);  // below the smallest normal the quantum stays 2**(1-B-M)
  double q = std::nearbyint(std::ldexp(a, M - unbiased));  // significand in steps of the quantum, ties to even
  if (q >= (2 << M)) {  // rounded up into the next binade
    q = 1 << M;
    unbiased += 1;
  }
  return q < (1 << M) ? int(q) : ((unbiased + B) << M) | (int(q) - (1 << M));  // q < 2**M only when subnormal
}
// fp8_e4m3fn <- fp32, RINT (the only mode asc_float2e4m3 has), following asc-devkit
// data_type_convert/asc_float2e4m3_deprecated.md (was reg_vector/asc_float2e4m3.md) and rounding_mode.md.
// Saturating: beyond the largest finite value (448) and +-inf -> +-448, NaN -> 0. Non-saturating: beyond 448 and
// +-inf -> NaN, S.1111.111 (basic-API Cast.md: e4m3fn has no inf, so the output is NaN); NaN -> NaN.
inline uint8_t f32_to_e4m3(float f, bool sat) {
  uint8_t sign = uint8_t((f32_to_bits(f) >> 24) & 0x80);
  if (std::isnan(f)) return sat ? 0 : uint8_t(sign | 0x7f);
  if (std::isinf(f)) return uint8_t(sign | (sat ? 0x7e : 0x7f));
  int code = fp8_rint_code<3, 7>(std::fabs((double)f));
  if (code > 0x7e) return uint8_t(sign | (sat ? 0x7e : 0x7f));
  return uint8_t(sign | code);
}
// fp8_e5m2 <- fp32 (data_type_convert/asc_float2e5m2_deprecated.md: RINT only; rounding_mode.md, Cast.md):
// saturating: beyond the largest finite value (57344) and +-inf -> +-57344, NaN -> 0 (Cast.md's default; its
// CTRL[50] NaN-keeping option is not emulated). Non-saturating: beyond 57344 -> +-inf, +-inf -> +-inf, NaN -> NaN;
// which NaN encoding is not documented: S.11111.11 here (tests check NaN-ness, not bits).
inline uint8_t f32_to_e5m2(float f, bool sat) {
  uint8_t sign = uint8_t((f32_to_bits(f) >> 24) & 0x80);
  if (std::isnan(f)) return sat ? 0 : uint8_t(sign | 0x7f);
  if (std::isinf(f)) return uint8_t(sign | (sat ? 0x7b : 0x7c));
  int code = fp8_rint_code<2, 15>(std::fabs((double)f));
  if (code > 0x7b) return uint8_t(sign | (sat ? 0x7b : 0x7c));
  return uint8_t(sign | code);
}
// fp32 <- fp8 (data_type_convert/asc_e4m32float_deprecated.md, asc_e5m22float_deprecated.md): exact, as every
// e4m3fn / e5m2 value, subnormals included, is an fp32 value; Cast.md: fp32 output is non-saturating only, so
// +-inf -> +-inf and NaN -> NaN. The NaN's payload is not documented: a quiet NaN with the source's sign here.
inline float fp8_nan(uint8_t b) { return bits_to_f32(uint32_t(b & 0x80) << 24 | 0x7fc00000u); }
inline float e4m3_to_f32(uint8_t b) {
  int ex = (b >> 3) & 0xf, man = b & 7;
  if (ex == 0xf && man == 7) return fp8_nan(b);  // e4m3fn: S.1111.111 is its only non-finite encoding
  float mag = ex == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), ex - 10);
  return (b & 0x80) ? -mag : mag;
}
inline float e5m2_to_f32(uint8_t b) {
  int ex = (b >> 2) & 0x1f, man = b & 3;
  if (ex == 0x1f) return man ? fp8_nan(b) : ((b & 0x80) ? -INFINITY : INFINITY);
  float mag = ex == 0 ? std::ldexp(float(man), -16) : std::ldexp(float(4 + man), ex - 17);
  return (b & 0x80) ? -mag : mag;
}
inline uint16_t f32_to_f16_rn(float f) { return std::bit_cast<uint16_t>((_Float16)f); }  // IEEE RNE
inline float f16_to_f32(uint16_t h) { return (float)std::bit_cast<_Float16>(h); }
}  // namespace emu

struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  constexpr explicit bfloat16_t(uint16_t b, int) : bits(b) {}
  bfloat16_t(float f) : bits(emu::f32_to_bf16(f, 'r', false)) {}
  bfloat16_t(double f) : bfloat16_t(float(f)) {}
  bfloat16_t(int f) : bfloat16_t(float(f)) {}
  operator float() const { return emu::bf16_to_f32(bits); }
};
struct half {
  uint16_t bits;
  half() = default;
  half(float f) : bits(emu::f32_to_f16_rn(f)) {}
  half(double f) : half(float(f)) {}
  half(int f) : half(float(f)) {}
  operator float() const { return emu::f16_to_f32(bits); }
};
// fp8 / fp4 storage types named by TileLang's simd_inst.h and ascend_fp8.h; their arithmetic is not emulated.
struct float8_e4m3_t { uint8_t bits; };
struct float8_e5m2_t { uint8_t bits; };
struct float8_e8m0_t { uint8_t bits; };
struct float4_e2m1x2_t { uint8_t bits; };
struct float4_e1m2x2_t { uint8_t bits; };
struct float8_e4m3x2_t { uint16_t bits; };
struct float8_e5m2x2_t { uint16_t bits; };
struct hifloat8_t { uint8_t bits; };
typedef uint16_t __asc_fp8x2_storage_t;
struct float2 { float x, y; };
struct half2 { half x, y; };
struct bfloat16x2_t { bfloat16_t x, y; };
using bfloat162 = bfloat16x2_t;

// Compile-time control tags (MODE_*, PART_*, ROUND_*, RS_*, POS_*, ...). simd_inst.h compares them in
// `if constexpr (mode == MODE_ZEROING)`, so each value is its own empty type.
template <int Kind, int V> struct emu_tag {
  static constexpr int kind = Kind, value = V;
  constexpr operator int() const { return V; }
};
template <int K, int A, int B> constexpr bool operator==(emu_tag<K, A>, emu_tag<K, B>) { return A == B; }
enum : int { K_MODE = 1, K_PART, K_ROUND, K_RS, K_POS, K_HL, K_BIN, K_ORDER, K_POST };
inline constexpr emu_tag<K_MODE, 0> MODE_ZEROING{};
inline constexpr emu_tag<K_MODE, 1> MODE_MERGING{};
inline constexpr emu_tag<K_MODE, 2> MODE_UNKNOWN{};
inline constexpr emu_tag<K_PART, 0> PART_EVEN{};
inline constexpr emu_tag<K_PART, 1> PART_ODD{};
// The 4:1 conversions write (fp32 -> fp8) or read (fp8 -> fp32) byte `part` of each 4-byte group (basic-API
// RegLayout.md: cast_b32_to_b8 / cast_b8_to_b32, dst[layout:256:4] / src[layout:256:4]).
inline constexpr emu_tag<K_PART, 0> PART_P0{};
inline constexpr emu_tag<K_PART, 1> PART_P1{};
inline constexpr emu_tag<K_PART, 2> PART_P2{};
inline constexpr emu_tag<K_PART, 3> PART_P3{};
inline constexpr emu_tag<K_ROUND, 'r'> ROUND_R{};
inline constexpr emu_tag<K_ROUND, 'a'> ROUND_A{};
inline constexpr emu_tag<K_ROUND, 'f'> ROUND_F{};
inline constexpr emu_tag<K_ROUND, 'c'> ROUND_C{};
inline constexpr emu_tag<K_ROUND, 'z'> ROUND_Z{};
inline constexpr emu_tag<K_ROUND, 'o'> ROUND_O{};
inline constexpr emu_tag<K_RS, 1> RS_ENABLE{};
inline constexpr emu_tag<K_RS, 0> RS_DISABLE{};
inline constexpr emu_tag<K_POS, 0> POS_LOWEST{};
inline constexpr emu_tag<K_POS, 1> POS_HIGHEST{};
inline constexpr emu_tag<K_HL, 0> LOWER{};
inline constexpr emu_tag<K_HL, 1> HIGHER{};
inline constexpr emu_tag<K_BIN, 0> Bin_N0{};
inline constexpr emu_tag<K_BIN, 1> Bin_N1{};
inline constexpr emu_tag<K_ORDER, 0> INC_ORDER{};
inline constexpr emu_tag<K_ORDER, 1> DEC_ORDER{};
inline constexpr emu_tag<K_POST, 1> POST_UPDATE{};

// Mask patterns of asc_create_mask (reg_data_types/asc_create_mask.md).
enum emu_pattern : int {
  PAT_ALL, PAT_VL1, PAT_VL2, PAT_VL3, PAT_VL4, PAT_VL8, PAT_VL16, PAT_VL32, PAT_VL64, PAT_VL128,
  PAT_M3, PAT_M4, PAT_H, PAT_Q, PAT_ALLF
};
// asc_mem_bar kinds (reg/sync_control/asc_mem_bar.md).
enum MEM_TYPE : int {
  VV_ALL, VST_VLD, VLD_VST, VST_VST, VS_ALL, VST_LD, VLD_ST, VST_ST,
  SV_ALL, ST_VLD, LD_VST, ST_VST, SS_ALL, ST_LD, LD_ST, ST_ST
};
enum class asc_load_l2_cache_mode : int { NORMAL_FIRST_VICTIM = 0 };
enum class asc_store_l2_cache_mode : int { NORMAL_FIRST_VICTIM = 0 };
namespace cce {
struct dim3 {
  uint32_t x, y, z;
  dim3(uint32_t a = 1, uint32_t b = 1, uint32_t c = 1) : x(a), y(b), z(c) {}
};
}  // namespace cce
struct emu_dim3 { uint32_t x, y, z; };
extern emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---------------------------------------------------------------- registers: VL = 256 bytes
// A register holds N lanes of storage type S; `calc` is the type lanes compute in (bf16/half compute
// in float and round back to nearest even, as an instruction result is rounded once).
template <class S, int N, class Calc, int Id> struct emu_vreg {
  using storage = S;
  using calc = Calc;
  static constexpr int lanes = N;
  static constexpr int lane_bytes = 256 / N;
  S v[N];
};
#define EMU_VREG(NAME, S, N, CALC, ID) struct NAME : emu_vreg<S, N, CALC, ID> {};
EMU_VREG(vector_f32, float, 64, float, 1)
EMU_VREG(vector_f16, uint16_t, 128, float, 2)
EMU_VREG(vector_bf16, uint16_t, 128, float, 3)
EMU_VREG(vector_u32, uint32_t, 64, uint32_t, 4)
EMU_VREG(vector_s32, int32_t, 64, int32_t, 5)
EMU_VREG(vector_u16, uint16_t, 128, uint16_t, 6)
EMU_VREG(vector_s16, int16_t, 128, int16_t, 7)
EMU_VREG(vector_u8, uint8_t, 256, uint8_t, 8)
EMU_VREG(vector_s8, int8_t, 256, int8_t, 9)
EMU_VREG(vector_u64, uint64_t, 32, uint64_t, 10)
EMU_VREG(vector_s64, int64_t, 32, int64_t, 11)
EMU_VREG(vector_f8e4m3, uint8_t, 256, void, 12)
EMU_VREG(vector_f8e5m2, uint8_t, 256, void, 13)
EMU_VREG(vector_f8e8m0, uint8_t, 256, void, 14)
EMU_VREG(vector_f4e2m1x2, uint8_t, 256, void, 15)
EMU_VREG(vector_f4e1m2x2, uint8_t, 256, void, 16)
EMU_VREG(vector_hif8, uint8_t, 256, void, 17)
#undef EMU_VREG
using vector_float = vector_f32;
using vector_half = vector_f16;
using vector_bfloat16_t = vector_bf16;
using vector_uint32_t = vector_u32;
using vector_int32_t = vector_s32;
using vector_uint16_t = vector_u16;
using vector_int16_t = vector_s16;
using vector_uint8_t = vector_u8;
using vector_int8_t = vector_s8;
using vector_uint64_t = vector_u64;
using vector_int64_t = vector_s64;
using vector_fp8_e4m3fn_t = vector_f8e4m3;
using vector_fp8_e5m2_t = vector_f8e5m2;
using vector_fp8_e8m0_t = vector_f8e8m0;
using vector_hifloat8_t = vector_hif8;

// Mask register: one predicate bit per register byte, kept one per byte here (data_type_definition.md:
// a b16 lane owns 2 bits, a b32 lane 4, and only the lowest of them counts).
struct vector_bool {
  uint8_t b[256];
};
struct vector_address { int64_t v; };
struct vector_align { int64_t v; };
struct addr_reg { int64_t v; };

namespace emu {
template <class V> concept vreg = requires { typename V::storage; V::lanes; };
template <class V> concept calc_vreg = vreg<V> && !std::is_void_v<typename V::calc>;
template <class V> inline bool on(const vector_bool &m, int i) { return m.b[i * V::lane_bytes] != 0; }

template <class V> inline typename V::calc get(const V &r, int i) {
  if constexpr (std::is_same_v<V, vector_bf16>) return bf16_to_f32(r.v[i]);
  else if constexpr (std::is_same_v<V, vector_f16>) return f16_to_f32(r.v[i]);
  else return r.v[i];
}
template <class V> inline void set(V &r, int i, typename V::calc x) {
  if constexpr (std::is_same_v<V, vector_bf16>) r.v[i] = f32_to_bf16(x, 'r', false);
  else if constexpr (std::is_same_v<V, vector_f16>) r.v[i] = f32_to_f16_rn(x);
  else r.v[i] = x;
}
template <class V> inline V zero() {
  V r;
  std::memset(&r, 0, sizeof r);
  return r;
}
inline void count_vec() { st.ctr->vector_instrs++; }
}  // namespace emu
