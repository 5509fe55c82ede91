// AVX-512 (F + BW + VL) kernels (512-bit). Compiled for that target with GCC's
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#define RS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace rs {
namespace kernels {
namespace detail {
namespace {

// ---- accumulator registers -------------------------------------------------
struct VF {
  using A = float;
  using R = __m512;
  static constexpr size_t L = 16;
  static R ld(const A* p) { return _mm512_loadu_ps(p); }
  static void st(A* p, R v) { _mm512_storeu_ps(p, v); }
  static R set1(A a) { return _mm512_set1_ps(a); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
};
struct VD {
  using A = double;
  using R = __m512d;
  static constexpr size_t L = 8;
  static R ld(const A* p) { return _mm512_loadu_pd(p); }
  static void st(A* p, R v) { _mm512_storeu_pd(p, v); }
  static R set1(A a) { return _mm512_set1_pd(a); }
  static R div(R a, R b) { return _mm512_div_pd(a, b); }
};
template <class T>
struct VI {
  using A = T;
  using R = __m512i;
  static constexpr size_t L = 64 / sizeof(T);
  static R ld(const A* p) { return _mm512_loadu_si512(p); }
  static void st(A* p, R v) { _mm512_storeu_si512(p, v); }
};

// ---- operations ------------------------------------------------------------
// min/max: where a is ordered vminps(a, b) = a < b ? a : b (b if b is NaN); else a.
struct SumF {
  static __m512 v(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static float s(float a, float b) { return a + b; }
};
struct MinF {
  static __m512 v(__m512 a, __m512 b) { return _mm512_mask_min_ps(a, _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q), a, b); }
  static float s(float a, float b) { return fmin_nan(a, b); }
};
struct MaxF {
  static __m512 v(__m512 a, __m512 b) { return _mm512_mask_max_ps(a, _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q), a, b); }
  static float s(float a, float b) { return fmax_nan(a, b); }
};
struct SumD {
  static __m512d v(__m512d a, __m512d b) { return _mm512_add_pd(a, b); }
  static double s(double a, double b) { return a + b; }
};
struct MinD {
  static __m512d v(__m512d a, __m512d b) { return _mm512_mask_min_pd(a, _mm512_cmp_pd_mask(a, a, _CMP_ORD_Q), a, b); }
  static double s(double a, double b) { return fmin_nan(a, b); }
};
struct MaxD {
  static __m512d v(__m512d a, __m512d b) { return _mm512_mask_max_pd(a, _mm512_cmp_pd_mask(a, a, _CMP_ORD_Q), a, b); }
  static double s(double a, double b) { return fmax_nan(a, b); }
};
struct SumI32 {
  static __m512i v(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  static int32_t s(int32_t a, int32_t b) { return wrap_add(a, b); }
};
struct MinI32 {
  static __m512i v(__m512i a, __m512i b) { return _mm512_min_epi32(a, b); }
  static int32_t s(int32_t a, int32_t b) { return a < b ? a : b; }
};
struct MaxI32 {
  static __m512i v(__m512i a, __m512i b) { return _mm512_max_epi32(a, b); }
  static int32_t s(int32_t a, int32_t b) { return a > b ? a : b; }
};
struct SumI64 {
  static __m512i v(__m512i a, __m512i b) { return _mm512_add_epi64(a, b); }
  static int64_t s(int64_t a, int64_t b) { return wrap_add(a, b); }
};
struct MinI64 {
  static __m512i v(__m512i a, __m512i b) { return _mm512_min_epi64(a, b); }
  static int64_t s(int64_t a, int64_t b) { return a < b ? a : b; }
};
struct MaxI64 {
  static __m512i v(__m512i a, __m512i b) { return _mm512_max_epi64(a, b); }
  static int64_t s(int64_t a, int64_t b) { return a > b ? a : b; }
};

// ---- float16 / bfloat16 conversions -------------------------------------------
struct SrcF16 {
  using V = VF;
  using W = uint16_t;
  static __m512 load(const W* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static float s(W w) { return half_to_float(w); }
};
struct SrcBF16 {
  using V = VF;
  using W = uint16_t;
  static __m512 load(const W* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static float s(W w) { return bf16_to_float(w); }
};
struct NarF16 {
  using V = VF;
  using W = uint16_t;
  static void store(W* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store2(W* p, __m512 a, __m512 b) {
    store(p, a);
    store(p + 16, b);
  }
  static W s(float a) { return float_to_half(a); }
};
struct NarBF16 {
  using V = VF;
  using W = uint16_t;
  static void store(W* p, __m512 v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i qnan = _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, qnan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static void store2(W* p, __m512 a, __m512 b) {
    store(p, a);
    store(p + 16, b);
  }
  static W s(float a) { return float_to_bf16(a); }
};

#include "kernels/simd_loops.inc"

// int32 avg: trunc((double)s / count) is exact for |s| < 2^31 (see avg_i32).
void avg_i32_avx512(void* outp, const void* accp, size_t n, uint32_t count) {
  const int32_t* acc = static_cast<const int32_t*>(accp);
  int32_t* out = static_cast<int32_t*>(outp);
  const __m512d c = _mm512_set1_pd(static_cast<double>(count));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i));
    __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i + 8));
    __m256i qlo = _mm512_cvttpd_epi32(_mm512_div_pd(_mm512_cvtepi32_pd(lo), c));
    __m256i qhi = _mm512_cvttpd_epi32(_mm512_div_pd(_mm512_cvtepi32_pd(hi), c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), qlo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 8), qhi);
  }
  for (; i < n; ++i) out[i] = avg_i32(acc[i], count);
}

}  // namespace

RS_AVX512 bool fill_avx512(Table* t) {
  fill_table(t, "avx512", &avg_i32_avx512);
  return true;
}

// ---- AVX512_BF16: the avx512 table, with VCVTNEPS2BF16 doing the bfloat16 rounding ----------
// The instruction rounds to nearest even with the same `x + 0x7fff + lsb` rule as NarBF16
// (overflow -> inf included), but flushes float32 denormal inputs to +-0 and keeps a NaN's
// payload. A vector holding either goes through NarBF16's integer rounding instead (one
// compare per vector and a branch that is never taken on normal data), so the results are
// the same bits on every ISA. (AVX512_FP16 adds nothing here: VCVTPS2PH of AVX-512F already
// converts float32 -> float16 with the same rounding, and VCVTPH2PS widens exactly.)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#define RS_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
namespace {
using NarBF16Int = NarBF16;
namespace bf16 {
struct NarBF16 {
  using V = VF;
  using W = uint16_t;
  static void store(W* p, __m512 v) {
    const __m512i mag = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
    // denormal: 0 < mag < 0x00800000 (unsigned mag - 1 < 0x007fffff); NaN: mag > 0x7f800000
    const __mmask16 redo =
        _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x007fffff)) |
        _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    if (__builtin_expect(redo != 0, 0)) {
      NarBF16Int::store(p, v);
      return;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
  }
  static void store2(W* p, __m512 a, __m512 b) {
    store(p, a);
    store(p + 16, b);
  }
  static W s(float a) { return float_to_bf16(a); }
};
// The generic loops again, for this target; only narrow_loop is instantiated (below), with
// the NarBF16 above.
#include "kernels/simd_loops.inc"
}  // namespace bf16
}  // namespace

// *t is a copy of the avx512 table: only the bfloat16 rounding (finalize, hence narrow) changes.
RS_AVX512BF16 bool fill_avx512bf16(Table* t) {
  t->name = "avx512bf16";
  const int d = di(DType::BF16);
  t->fin[d][oi(Op::Sum)] = &bf16::narrow_loop<bf16::NarBF16, false>;
  t->fin[d][oi(Op::Avg)] = &bf16::narrow_loop<bf16::NarBF16, true>;
  t->fin[d][oi(Op::Min)] = &bf16::narrow_loop<bf16::NarBF16, false>;
  t->fin[d][oi(Op::Max)] = &bf16::narrow_loop<bf16::NarBF16, false>;
  return true;
}
#pragma GCC pop_options

}  // namespace detail
}  // namespace kernels
}  // namespace rs

#pragma GCC diagnostic pop
#pragma GCC pop_options

#else  // not x86-64: the scalar table is all there is

namespace rs {
namespace kernels {
namespace detail {
bool fill_avx512(Table*) { return false; }
bool fill_avx512bf16(Table*) { return false; }
}  // namespace detail
}  // namespace kernels
}  // namespace rs

#endif
