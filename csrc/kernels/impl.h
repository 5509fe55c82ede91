// Internal to csrc/kernels: the dispatch table and the scalar element operations
// shared by every ISA (the SIMD kernels use them for their tails, so a tail
// element is computed exactly like a vector lane).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/kernels.h"

namespace rs {
namespace kernels {
namespace detail {

using InitFn = void (*)(void* acc, const void* x, size_t n);
using AccFn = void (*)(void* acc, const void* x, size_t n);
using FinFn = void (*)(void* out, const void* acc, size_t n, uint32_t count);

struct Table {
  const char* name;
  InitFn init[kNumDTypes];
  AccFn acc[kNumDTypes][kNumOps];
  FinFn fin[kNumDTypes][kNumOps];
};

// Each fills/overrides entries of *t; the SIMD ones return false when not compiled in.
void fill_scalar(Table* t);
bool fill_avx2(Table* t);
bool fill_avx512(Table* t);
bool fill_avx512bf16(Table* t);  // over a copy of the avx512 table: VCVTNEPS2BF16 for the bfloat16 rounding

constexpr int di(DType t) { return static_cast<int>(t); }
constexpr int oi(Op o) { return static_cast<int>(o); }

// ---------------------------------------------------------------- bit casts
inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------- float16
// Bit-exact with F16C VCVTPH2PS: signalling NaNs come out quiet, payload kept.
inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
  if (e == 0) {
    float v = static_cast<float>(m) * 0x1p-24f;  // exact (subnormal half or zero)
    return u2f(sign | f2u(v));
  }
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

// Round to nearest even; bit-exact with F16C VCVTPS2PH(_MM_FROUND_TO_NEAREST_INT)
// and, for every non-NaN input, with numpy's float32 -> float16 astype.
// NaN -> quiet NaN (sign and top payload bits kept), overflow -> inf.
inline uint16_t float_to_half(float f) {
  uint32_t x = f2u(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf / NaN
    if (x == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {                        // half subnormal / zero: let the FPU round
    float v = u2f(x) + 0.5f;                    // aligns bit 0 of the sum to 2^-24
    return static_cast<uint16_t>(sign | (f2u(v) - 0x3f000000u));
  }
  uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000000u + 0xfffu + odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (x >> 13));
}

// ---------------------------------------------------------------- bfloat16
inline float bf16_to_float(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }

// Round to nearest even, bit-exact with ml_dtypes: NaN -> 0x7fc0 | sign.
inline uint16_t float_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// ---------------------------------------------------------------- element ops
// Float min/max propagate NaN like np.minimum/np.maximum and equal the lane
// semantics of the SIMD code: min(a, b) = isnan(a) ? a : (a < b ? a : b).
template <class T>
inline T fmin_nan(T a, T b) {
  return (a != a) ? a : (a < b ? a : b);
}
template <class T>
inline T fmax_nan(T a, T b) {
  return (a != a) ? a : (a > b ? a : b);
}

// Wrapping integer add (no signed-overflow UB).
inline int32_t wrap_add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// Truncating signed division of an int64 by a run-time invariant 1 <= d < 2^32,
// by multiplication (Granlund & Montgomery 1994, fig. 4.1), exact for every int64.
struct DivI64 {
  uint64_t m = 0;
  int sh = 0;
  bool one = true;
  explicit DivI64(uint32_t d) {
    if (d <= 1) return;
    one = false;
    int l = 0;
    while ((uint64_t{1} << l) < d) ++l;  // l = ceil(log2 d), 1..32
    unsigned __int128 num = static_cast<unsigned __int128>((uint64_t{1} << l) - d) << 64;
    m = static_cast<uint64_t>(num / d) + 1;
    sh = l - 1;
  }
  int64_t operator()(int64_t s) const {
    if (one) return s;
    uint64_t n = s < 0 ? 0 - static_cast<uint64_t>(s) : static_cast<uint64_t>(s);
    uint64_t t1 = static_cast<uint64_t>((static_cast<unsigned __int128>(m) * n) >> 64);
    uint64_t q = (t1 + ((n - t1) >> 1)) >> sh;
    return s < 0 ? static_cast<int64_t>(0 - q) : static_cast<int64_t>(q);
  }
};

// int32 average: exact trunc(s / d) through double (|s| < 2^31 => the double
// quotient never rounds across an integer), same as the SIMD lanes.
inline int32_t avg_i32(int32_t s, uint32_t d) {
  return static_cast<int32_t>(static_cast<double>(s) / static_cast<double>(d));
}

}  // namespace detail
}  // namespace kernels
}  // namespace rs
