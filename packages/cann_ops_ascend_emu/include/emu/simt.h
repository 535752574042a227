// Ascend C emulated on CPU: SIMT VFs (asc_vf_call, threadIdx, asc_syncthreads, warp collectives) and the
// scalar UB accessors the driver's rewrite puts in place of `((__ubuf__ T *)buf)[i]` (README "Rewrites").
//
// SIMT threads are coroutines on one OS thread (runtime.cpp): each runs until asc_syncthreads or a warp
// collective, then the next one; a barrier opens when every live thread of its scope has reached it.
#pragma once
#include <tuple>
#include <utility>

#include "emu/types.h"
#include "emu/vector.h"

namespace emu {
void simt_run(cce::dim3 d, void (*body)(void *), void *ctx);
void simt_syncthreads();
// Deposit this thread's value and wait for every live thread of its warp; returns the warp's 32 slots.
const uint64_t *simt_warp_collect(uint64_t v, uint32_t *live_mask);
uint32_t simt_lane();

// A scalar (kernel body: PIPE_S) or SIMT (PIPE_V) access of one UB element.
template <class T> struct UbRef {
  T *p;
  T load() const {
    ub_access(p, sizeof(T), st.cur, false, st.in_simt ? "SIMT UB load" : "scalar UB load");
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  void store(const T &v) const {
    ub_access(p, sizeof(T), st.cur, true, st.in_simt ? "SIMT UB store" : "scalar UB store");
    std::memcpy(p, &v, sizeof(T));
  }
  operator T() const { return load(); }
  // bf16 / half elements also read as float (the one conversion generated code then relies on)
  template <class U = T, std::enable_if_t<std::is_class_v<U> && std::is_convertible_v<U, float>, int> = 0>
  operator float() const { return float(load()); }
  const UbRef &operator=(const T &v) const { store(v); return *this; }
  const UbRef &operator=(const UbRef &o) const { store(o.load()); return *this; }
  template <class U, std::enable_if_t<!std::is_same_v<std::decay_t<U>, T> && !std::is_same_v<std::decay_t<U>, UbRef>, int> = 0>
  const UbRef &operator=(U &&v) const { store(T(v)); return *this; }
  // &ref gives the raw pointer (bounds checked; the access itself is checked by whoever uses it).
  T *operator&() const {
    ub_offset(p, 0, st.cur, "UB address");
    return p;
  }
#define EMU_UBREF_OP(OP) \
  template <class U> const UbRef &operator OP##=(const U &v) const { store(T(load() OP v)); return *this; }
  EMU_UBREF_OP(+) EMU_UBREF_OP(-) EMU_UBREF_OP(*) EMU_UBREF_OP(/) EMU_UBREF_OP(%) EMU_UBREF_OP(&)
  EMU_UBREF_OP(|) EMU_UBREF_OP(^) EMU_UBREF_OP(<<) EMU_UBREF_OP(>>)
#undef EMU_UBREF_OP
  const UbRef &operator++() const { store(T(load() + 1)); return *this; }
  const UbRef &operator--() const { store(T(load() - 1)); return *this; }
};
template <class T> struct UbView {
  T *base;
  UbRef<T> operator[](int64_t i) const { return UbRef<T>{base + i}; }
};
// A UB pointer inside a SIMT VF (the driver rewrites `__ubuf__ T *` there): dereferences are checked and recorded.
template <class T> struct UbPtr {
  T *p = nullptr;
  UbPtr() = default;
  UbPtr(T *q) : p(q) {}
  template <class U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0> explicit UbPtr(U *q) : p((T *)(void *)q) {}
  template <class U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0> explicit UbPtr(UbPtr<U> q) : p((T *)(void *)q.p) {}
  UbRef<T> operator*() const { return UbRef<T>{p}; }
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0> UbRef<T> operator[](I i) const {
    return UbRef<T>{p + i};
  }
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0> UbPtr operator+(I i) const { return UbPtr{p + i}; }
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0> UbPtr operator-(I i) const { return UbPtr{p - i}; }
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0> UbPtr &operator+=(I i) { p += i; return *this; }
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0> UbPtr &operator-=(I i) { p -= i; return *this; }
  UbPtr &operator++() { ++p; return *this; }
  operator T *() const { return p; }  // raw: passed on to code that takes a plain pointer (untracked there)
};
template <class T, class P> inline UbView<T> ub_view(P *base) { return UbView<T>{(T *)(void *)base}; }
}  // namespace emu

// asc_vf_call<F>(dim3, args...): start SIMT VF F on d.x*d.y*d.z threads (PIPE_V); each thread gets its own copy
// of the arguments.
template <auto F, class... A> inline void asc_vf_call(cce::dim3 d, A... a) {
  std::tuple<A...> args(a...);
  auto body = [](void *p) {
    auto &t = *static_cast<std::tuple<A...> *>(p);
    std::apply([](auto... x) { F(x...); }, t);
  };
  emu::simt_run(d, +body, &args);
}
inline void asc_syncthreads() { emu::simt_syncthreads(); }
inline void asc_threadfence() {}

namespace emu {
template <class T> inline uint64_t to_slot(T v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T> inline T from_slot(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
// Warp reduction: binary tree over the 32 lanes (lane 2k + 2k+1, ...), threads that have left contribute the
// identity; the order of the hardware's warp reduction is not documented.
template <class T, class Op> inline T warp_tree(T v, T identity, Op op) {
  uint32_t live;
  const uint64_t *s = simt_warp_collect(to_slot(v), &live);
  T t[32];
  for (int i = 0; i < 32; ++i) t[i] = (live >> i) & 1 ? from_slot<T>(s[i]) : identity;
  for (int n = 32; n > 1; n /= 2)
    for (int i = 0; i < n / 2; ++i) t[i] = op(t[2 * i], t[2 * i + 1]);
  return t[0];
}
}  // namespace emu
template <class T> inline T asc_shfl_xor(T v, int lane_mask) {
  uint32_t live;
  const uint64_t *s = emu::simt_warp_collect(emu::to_slot(v), &live);
  uint32_t src = (emu::simt_lane() ^ (uint32_t)lane_mask) & 31;
  if (!((live >> src) & 1)) emu::fail("PIPE_V", "asc_shfl_xor: source lane %u has left the SIMT VF", src);
  return emu::from_slot<T>(s[src]);
}
template <class T> inline T asc_reduce_add(T v) {
  return emu::warp_tree<T>(v, T(0), [](T a, T b) { return emu::wrap_add(a, b); });
}
inline float asc_reduce_max(float v) { return emu::warp_tree<float>(v, -INFINITY, [](float a, float b) { return emu::fnan_max(a, b); }); }
inline int32_t asc_reduce_max(int32_t v) { return emu::warp_tree<int32_t>(v, INT32_MIN, [](int32_t a, int32_t b) { return a < b ? b : a; }); }
inline uint32_t asc_reduce_max(uint32_t v) { return emu::warp_tree<uint32_t>(v, 0u, [](uint32_t a, uint32_t b) { return a < b ? b : a; }); }
inline float asc_reduce_min(float v) { return emu::warp_tree<float>(v, INFINITY, [](float a, float b) { return emu::fnan_min(a, b); }); }
inline int32_t asc_reduce_min(int32_t v) { return emu::warp_tree<int32_t>(v, INT32_MAX, [](int32_t a, int32_t b) { return b < a ? b : a; }); }
inline uint32_t asc_reduce_min(uint32_t v) { return emu::warp_tree<uint32_t>(v, UINT32_MAX, [](uint32_t a, uint32_t b) { return b < a ? b : a; }); }

#define EMU_UNEMULATED_SIMT(NAME) \
  template <class... A> inline auto NAME(A &&...) { emu::unemulated(#NAME); return 0; }
EMU_UNEMULATED_SIMT(asc_ballot)
EMU_UNEMULATED_SIMT(asc_activemask)
EMU_UNEMULATED_SIMT(asc_atomic_add)
EMU_UNEMULATED_SIMT(asc_atomic_max)
EMU_UNEMULATED_SIMT(asc_atomic_min)
EMU_UNEMULATED_SIMT(asc_atomic_cas)
EMU_UNEMULATED_SIMT(asc_atomic_exch)
#undef EMU_UNEMULATED_SIMT

// fp8 / paired conversions named by TileLang's ascend_fp8.h: declared, not emulated.
#define __ASC_SATFINITE 1
#define __ASC_NOSAT 0
#define __ASC_E4M3 0
#define __ASC_E5M2 1
inline __asc_fp8x2_storage_t __asc_cvt_float2_to_fp8x2(float2, int, int) { emu::unemulated("__asc_cvt_float2_to_fp8x2"); }
inline float2 __e4m3x22float2(float8_e4m3x2_t) { emu::unemulated("__e4m3x22float2"); }
inline float2 __e5m2x22float2(float8_e5m2x2_t) { emu::unemulated("__e5m2x22float2"); }
inline float2 __half22float2(half2 h) { return float2{float(h.x), float(h.y)}; }
inline float2 __bfloat1622float2(bfloat16x2_t h) { return float2{float(h.x), float(h.y)}; }
inline half2 __float22half2_rn(float2 f) { return half2{half(f.x), half(f.y)}; }
inline bfloat16x2_t __float22bfloat162_rn(float2 f) { return bfloat16x2_t{bfloat16_t(f.x), bfloat16_t(f.y)}; }

// Short vector types of the SIMT API (element-wise arithmetic on the pairs the code generator vectorises).
struct uint1 { uint32_t x; };
struct int1 { int32_t x; };
struct float1 { float x; };
struct uint2 { uint32_t x, y; };
struct int2 { int32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
struct int4 { int32_t x, y, z, w; };
struct float4 { float x, y, z, w; };
#define EMU_PAIR_OP(T, OP) \
  inline T operator OP(T a, T b) { return T{decltype(a.x)(float(a.x) OP float(b.x)), decltype(a.y)(float(a.y) OP float(b.y))}; }
#define EMU_PAIR_OPS(T) EMU_PAIR_OP(T, +) EMU_PAIR_OP(T, -) EMU_PAIR_OP(T, *) EMU_PAIR_OP(T, /)
EMU_PAIR_OPS(float2)
EMU_PAIR_OPS(half2)
EMU_PAIR_OPS(bfloat16x2_t)
#undef EMU_PAIR_OPS
#undef EMU_PAIR_OP

// Scalar math the SIMT code generator can emit (IEEE / libm on the CPU).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
