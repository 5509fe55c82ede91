// The run-time ISA dispatch of the kernels (the dtype/op vocabulary is common/dtype.cc).
//
// Four tables of function pointers (scalar, avx2, avx512, avx512bf16) are built
// once, on first use (thread-safe static init); the active one is an atomic pointer
// so set_isa() can switch it (tests/benchmarks) while other threads keep running.
#include <atomic>
#include <cstring>

#include "kernels/impl.h"

namespace rs {

namespace kernels {
namespace {

using detail::Table;

struct Tables {
  Table scalar{}, avx2{}, avx512{}, avx512bf16{};
  bool has_avx2 = false, has_avx512 = false, has_avx512bf16 = false;

  Tables() {
    detail::fill_scalar(&scalar);
    avx2 = scalar;
    has_avx2 = cpu_avx2() && detail::fill_avx2(&avx2);
    avx512 = avx2;
    has_avx512 = has_avx2 && cpu_avx512() && detail::fill_avx512(&avx512);
    avx512bf16 = avx512;
    has_avx512bf16 = has_avx512 && cpu_avx512bf16() && detail::fill_avx512bf16(&avx512bf16);
  }

  static bool cpu_avx2() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
  }
  static bool cpu_avx512() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
  }

  static bool cpu_avx512bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
  }

  const Table* best() const { return has_avx512bf16 ? &avx512bf16 : has_avx512 ? &avx512 : has_avx2 ? &avx2 : &scalar; }
};

const Tables& tables() {
  static const Tables t;  // C++11 magic static: built once, thread-safe
  return t;
}

std::atomic<const Table*> g_active{nullptr};

inline const Table& active() {
  const Table* t = g_active.load(std::memory_order_acquire);
  if (__builtin_expect(t == nullptr, 0)) {
    const Table* expected = nullptr;
    g_active.compare_exchange_strong(expected, tables().best(), std::memory_order_acq_rel);
    t = g_active.load(std::memory_order_acquire);
  }
  return *t;
}

}  // namespace

void init(DType t, void* acc, const void* x, size_t n) {
  if (n == 0 || !valid_dtype(static_cast<uint8_t>(t))) return;
  active().init[detail::di(t)](acc, x, n);
}

void accumulate(DType t, Op op, void* acc, const void* x, size_t n) {
  if (n == 0 || !valid_dtype(static_cast<uint8_t>(t)) || !valid_op(static_cast<uint8_t>(op))) return;
  active().acc[detail::di(t)][detail::oi(op)](acc, x, n);
}

void finalize(DType t, Op op, void* out, const void* acc, size_t n, uint32_t count) {
  if (n == 0 || !valid_dtype(static_cast<uint8_t>(t)) || !valid_op(static_cast<uint8_t>(op))) return;
  if (count == 0) count = 1;  // no contribution: avg degenerates to the accumulator itself
  active().fin[detail::di(t)][detail::oi(op)](out, acc, n, count);
}

// The conversions are the accumulator's own widening (init) and its one rounding
// (finalize of a sum of one contribution), so a client converts exactly like the reducer.
static bool is_wire16(DType t) { return t == DType::F16 || t == DType::BF16; }

bool narrow(DType wire, void* out, const float* in, size_t n) {
  if (!is_wire16(wire)) return false;
  if (n) active().fin[detail::di(wire)][detail::oi(Op::Sum)](out, in, n, 1);
  return true;
}

bool widen(DType wire, float* out, const void* in, size_t n) {
  if (!is_wire16(wire)) return false;
  if (n) active().init[detail::di(wire)](out, in, n);
  return true;
}

const char* isa_name() { return active().name; }

bool set_isa(const std::string& name) {
  const Tables& ts = tables();
  const Table* t = nullptr;
  if (name == "auto") t = ts.best();
  else if (name == "scalar") t = &ts.scalar;
  else if (name == "avx2" && ts.has_avx2) t = &ts.avx2;
  else if (name == "avx512" && ts.has_avx512) t = &ts.avx512;
  else if (name == "avx512bf16" && ts.has_avx512bf16) t = &ts.avx512bf16;
  if (!t) return false;
  g_active.store(t, std::memory_order_release);
  return true;
}

}  // namespace kernels
}  // namespace rs
