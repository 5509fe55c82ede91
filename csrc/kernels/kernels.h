// Reduction kernels: the arithmetic of the reducer, nothing else.
//
// A chunk is reduced in a fixed order of contributions (rank 0, 1, ..., W-1):
//   init(acc, x0); accumulate(acc, x1); ...; accumulate(acc, x_{W-1}); finalize(out, acc, W)
// so results are bit-identical whatever order the contributions arrived in.
//
// The accumulator has the element type acc_type(dtype): float32 for float16 and
// bfloat16 (rounded once, to nearest even, in finalize), the dtype itself otherwise.
// For dtypes whose accumulator is the dtype itself, acc may alias x0 (init is then
// skipped by the caller) and finalize may run in place (out == acc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace rs {

namespace kernels {

// acc[i] = (acc type) x[i]        n elements
void init(DType t, void* acc, const void* x, size_t n);
// acc[i] = op(acc[i], x[i])       (Sum and Avg both add here)
void accumulate(DType t, Op op, void* acc, const void* x, size_t n);
// out[i] = (dtype) finalize(acc[i]); Avg divides by count (integers: truncating division).
// out may equal acc when acc_is_wire_type(t).
void finalize(DType t, Op op, void* out, const void* acc, size_t n, uint32_t count);

// float32 <-> 16-bit wire conversion (the compressed all-reduce's client side), wire = F16 or BF16.
// narrow: out[i] = (wire) in[i], rounded to nearest even exactly like finalize (it IS finalize's
// rounding): NaN stays NaN (quiet; bfloat16 NaN = 0x7fc0 | sign), overflow -> inf, subnormals
// rounded; bit-identical on every ISA and to numpy/ml_dtypes astype for every non-NaN input.
// widen: out[i] = (float) in[i], exact. Both return false (doing nothing) for any other dtype.
bool narrow(DType wire, void* out, const float* in, size_t n);
bool widen(DType wire, float* out, const void* in, size_t n);

// Name of the instruction set chosen at run time for the hot kernels
// ("avx512bf16", "avx512", "avx2", "scalar").
const char* isa_name();
// Force an ISA (for tests/benchmarks): "scalar", "avx2", "avx512", "avx512bf16" or "auto".
// Returns false if unsupported here.
bool set_isa(const std::string& name);

}  // namespace kernels
}  // namespace rs
