// AVX2 + FMA + F16C kernels (256-bit). Compiled for that target with GCC's
// target pragma/attribute only: nothing here runs unless dispatch.cc saw the
// CPU flags via __builtin_cpu_supports.
#include "kernels/impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include <cstdint>

// Every header is included above: only this file's own code gets the target.
#pragma GCC push_options
// GCC 12 false positive on the self-initialised _mm*_undefined_*() in intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx2,fma,f16c")
#define RS_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace rs {
namespace kernels {
namespace detail {
namespace {

// ---- accumulator registers -------------------------------------------------
struct VF {
  using A = float;
  using R = __m256;
  static constexpr size_t L = 8;
  static R ld(const A* p) { return _mm256_loadu_ps(p); }
  static void st(A* p, R v) { _mm256_storeu_ps(p, v); }
  static R set1(A a) { return _mm256_set1_ps(a); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
};
struct VD {
  using A = double;
  using R = __m256d;
  static constexpr size_t L = 4;
  static R ld(const A* p) { return _mm256_loadu_pd(p); }
  static void st(A* p, R v) { _mm256_storeu_pd(p, v); }
  static R set1(A a) { return _mm256_set1_pd(a); }
  static R div(R a, R b) { return _mm256_div_pd(a, b); }
};
template <class T>
struct VI {
  using A = T;
  using R = __m256i;
  static constexpr size_t L = 32 / sizeof(T);
  static R ld(const A* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void st(A* p, R v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};

// ---- operations ------------------------------------------------------------
// min/max: vminps(a, b) = a < b ? a : b (b if either is NaN); then a NaN in a wins.
struct SumF {
  static __m256 v(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static float s(float a, float b) { return a + b; }
};
struct MinF {
  static __m256 v(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static float s(float a, float b) { return fmin_nan(a, b); }
};
struct MaxF {
  static __m256 v(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static float s(float a, float b) { return fmax_nan(a, b); }
};
struct SumD {
  static __m256d v(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
  static double s(double a, double b) { return a + b; }
};
struct MinD {
  static __m256d v(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static double s(double a, double b) { return fmin_nan(a, b); }
};
struct MaxD {
  static __m256d v(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static double s(double a, double b) { return fmax_nan(a, b); }
};
struct SumI32 {
  static __m256i v(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  static int32_t s(int32_t a, int32_t b) { return wrap_add(a, b); }
};
struct MinI32 {
  static __m256i v(__m256i a, __m256i b) { return _mm256_min_epi32(a, b); }
  static int32_t s(int32_t a, int32_t b) { return a < b ? a : b; }
};
struct MaxI32 {
  static __m256i v(__m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
  static int32_t s(int32_t a, int32_t b) { return a > b ? a : b; }
};
struct SumI64 {
  static __m256i v(__m256i a, __m256i b) { return _mm256_add_epi64(a, b); }
  static int64_t s(int64_t a, int64_t b) { return wrap_add(a, b); }
};
struct MinI64 {
  static __m256i v(__m256i a, __m256i b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  static int64_t s(int64_t a, int64_t b) { return a < b ? a : b; }
};
struct MaxI64 {
  static __m256i v(__m256i a, __m256i b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
  static int64_t s(int64_t a, int64_t b) { return a > b ? a : b; }
};

// ---- float16 / bfloat16 conversions -------------------------------------------
struct SrcF16 {
  using V = VF;
  using W = uint16_t;
  static __m256 load(const W* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float s(W w) { return half_to_float(w); }
};
struct SrcBF16 {
  using V = VF;
  using W = uint16_t;
  static __m256 load(const W* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static float s(W w) { return bf16_to_float(w); }
};
struct NarF16 {
  using V = VF;
  using W = uint16_t;
  static void store(W* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static void store2(W* p, __m256 a, __m256 b) {
    store(p, a);
    store(p + 8, b);
  }
  static W s(float a) { return float_to_half(a); }
};
struct NarBF16 {
  using V = VF;
  using W = uint16_t;
  // (x + 0x7fff + lsb) >> 16 per lane: round to nearest even (a carry into the exponent gives
  // the next binade or inf); wrong only for NaN lanes.
  static __m256i round(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  }
  static void store(W* p, __m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i qnan = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x8000)),
                                         _mm256_set1_epi32(0x7fc0));
    __m256i r = _mm256_blendv_epi8(round(v), qnan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    // 8 x u32 (each <= 0xffff) -> 8 x u16
    __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), p16);
  }
  // 16 elements: one unordered compare finds a NaN in either vector (then the blending path
  // above), otherwise one pack (per 128-bit lane) and a cross-lane permute put them in order.
  static void store2(W* p, __m256 a, __m256 b) {
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q)) != 0, 0)) {
      store(p, a);
      store(p + 8, b);
      return;
    }
    const __m256i r = _mm256_permute4x64_epi64(_mm256_packus_epi32(round(a), round(b)), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), r);
  }
  static W s(float a) { return float_to_bf16(a); }
};

#include "kernels/simd_loops.inc"

// int32 avg: trunc((double)s / count) is exact for |s| < 2^31 (see avg_i32).
void avg_i32_avx2(void* outp, const void* accp, size_t n, uint32_t count) {
  const int32_t* acc = static_cast<const int32_t*>(accp);
  int32_t* out = static_cast<int32_t*>(outp);
  const __m256d c = _mm256_set1_pd(static_cast<double>(count));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + i));
    __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + i + 4));
    __m128i qlo = _mm256_cvttpd_epi32(_mm256_div_pd(_mm256_cvtepi32_pd(lo), c));
    __m128i qhi = _mm256_cvttpd_epi32(_mm256_div_pd(_mm256_cvtepi32_pd(hi), c));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), qlo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), qhi);
  }
  for (; i < n; ++i) out[i] = avg_i32(acc[i], count);
}

}  // namespace

RS_AVX2 bool fill_avx2(Table* t) {
  fill_table(t, "avx2", &avg_i32_avx2);
  return true;
}

}  // namespace detail
}  // namespace kernels
}  // namespace rs

#pragma GCC diagnostic pop
#pragma GCC pop_options

#else  // not x86-64: the scalar table is all there is

namespace rs {
namespace kernels {
namespace detail {
bool fill_avx2(Table*) { return false; }
}  // namespace detail
}  // namespace kernels
}  // namespace rs

#endif
