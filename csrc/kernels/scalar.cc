// Portable kernels (any CPU): the reference semantics and the fallback of the
// dispatch table. The SIMD tables start from this one and override entries.
#include <type_traits>

#include "kernels/impl.h"

namespace rs {
namespace kernels {
namespace detail {
namespace {

// ---- per-dtype element traits: wire type W, accumulator type A ------------
struct F32 {
  using W = float;
  using A = float;
  static A to_acc(W w) { return w; }
  static W from_acc(A a) { return a; }
};
struct F64 {
  using W = double;
  using A = double;
  static A to_acc(W w) { return w; }
  static W from_acc(A a) { return a; }
};
struct F16 {
  using W = uint16_t;
  using A = float;
  static A to_acc(W w) { return half_to_float(w); }
  static W from_acc(A a) { return float_to_half(a); }
};
struct BF16 {
  using W = uint16_t;
  using A = float;
  static A to_acc(W w) { return bf16_to_float(w); }
  static W from_acc(A a) { return float_to_bf16(a); }
};
struct I32 {
  using W = int32_t;
  using A = int32_t;
  static A to_acc(W w) { return w; }
  static W from_acc(A a) { return a; }
};
struct I64 {
  using W = int64_t;
  using A = int64_t;
  static A to_acc(W w) { return w; }
  static W from_acc(A a) { return a; }
};

template <class T>
struct IsInt {
  static constexpr bool value = false;
};
template <>
struct IsInt<I32> {
  static constexpr bool value = true;
};
template <>
struct IsInt<I64> {
  static constexpr bool value = true;
};

template <class A>
inline A apply_int(Op op, A a, A b) {
  switch (op) {
    case Op::Min: return a < b ? a : b;
    case Op::Max: return a > b ? a : b;
    default: return wrap_add(a, b);
  }
}

template <class T>
void init_k(void* acc, const void* x, size_t n) {
  auto* a = static_cast<typename T::A*>(acc);
  auto* w = static_cast<const typename T::W*>(x);
  if constexpr (std::is_same<typename T::A, typename T::W>::value) {
    if (static_cast<const void*>(a) != x) std::memcpy(a, w, n * sizeof(*w));
  } else {
    for (size_t i = 0; i < n; ++i) a[i] = T::to_acc(w[i]);
  }
}

template <class T, Op O>
void acc_k(void* acc, const void* x, size_t n) {
  using A = typename T::A;
  auto* a = static_cast<A*>(acc);
  auto* w = static_cast<const typename T::W*>(x);
  for (size_t i = 0; i < n; ++i) {
    A v = T::to_acc(w[i]);
    if constexpr (IsInt<T>::value) {
      a[i] = apply_int(O, a[i], v);
    } else if constexpr (O == Op::Min) {
      a[i] = fmin_nan(a[i], v);
    } else if constexpr (O == Op::Max) {
      a[i] = fmax_nan(a[i], v);
    } else {
      a[i] = a[i] + v;
    }
  }
}

template <class T, Op O>
void fin_k(void* out, const void* acc, size_t n, uint32_t count) {
  using A = typename T::A;
  using W = typename T::W;
  auto* a = static_cast<const A*>(acc);
  auto* o = static_cast<W*>(out);
  if constexpr (O == Op::Avg) {
    if constexpr (std::is_same<T, I32>::value) {
      for (size_t i = 0; i < n; ++i) o[i] = avg_i32(a[i], count);
    } else if constexpr (std::is_same<T, I64>::value) {
      DivI64 div(count);
      for (size_t i = 0; i < n; ++i) o[i] = div(a[i]);
    } else {
      const A c = static_cast<A>(count);
      for (size_t i = 0; i < n; ++i) o[i] = T::from_acc(a[i] / c);
    }
  } else {
    if constexpr (std::is_same<A, W>::value) {
      if (static_cast<const void*>(o) != acc) std::memcpy(o, a, n * sizeof(W));
    } else {
      for (size_t i = 0; i < n; ++i) o[i] = T::from_acc(a[i]);
    }
  }
}

template <class T>
void fill_dtype(Table* t, DType d) {
  t->init[di(d)] = &init_k<T>;
  t->acc[di(d)][oi(Op::Sum)] = &acc_k<T, Op::Sum>;
  t->acc[di(d)][oi(Op::Avg)] = &acc_k<T, Op::Sum>;  // Avg adds; divides in finalize
  t->acc[di(d)][oi(Op::Min)] = &acc_k<T, Op::Min>;
  t->acc[di(d)][oi(Op::Max)] = &acc_k<T, Op::Max>;
  t->fin[di(d)][oi(Op::Sum)] = &fin_k<T, Op::Sum>;
  t->fin[di(d)][oi(Op::Avg)] = &fin_k<T, Op::Avg>;
  t->fin[di(d)][oi(Op::Min)] = &fin_k<T, Op::Min>;
  t->fin[di(d)][oi(Op::Max)] = &fin_k<T, Op::Max>;
}

}  // namespace

void fill_scalar(Table* t) {
  t->name = "scalar";
  fill_dtype<F32>(t, DType::F32);
  fill_dtype<F64>(t, DType::F64);
  fill_dtype<F16>(t, DType::F16);
  fill_dtype<BF16>(t, DType::BF16);
  fill_dtype<I32>(t, DType::I32);
  fill_dtype<I64>(t, DType::I64);
}

}  // namespace detail
}  // namespace kernels
}  // namespace rs
