// The element types and reduction operations every part speaks of: the wire format
// (protocol/), the worker client, the reducer, the ring, the NCCL plugin and the kernels.
// Their numeric values are wire values (docs/protocol.md): never renumber.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rs {

enum class DType : uint8_t { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I32 = 4, I64 = 5 };
enum class Op : uint8_t { Sum = 0, Avg = 1, Min = 2, Max = 3 };

constexpr int kNumDTypes = 6;
constexpr int kNumOps = 4;

bool valid_dtype(uint8_t v);
bool valid_op(uint8_t v);
size_t dtype_size(DType t);       // bytes per element on the wire
size_t acc_elem_size(DType t);    // bytes per accumulator element
bool acc_is_wire_type(DType t);   // acc_elem_size == dtype_size and same representation
const char* dtype_name(DType t);  // "float32", "float64", "float16", "bfloat16", "int32", "int64"
const char* op_name(Op o);        // "sum", "avg", "min", "max"
bool parse_dtype(const std::string& s, DType* out);
bool parse_op(const std::string& s, Op* out);

}  // namespace rs
