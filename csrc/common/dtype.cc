#include "common/dtype.h"

namespace rs {

bool valid_dtype(uint8_t v) { return v < kNumDTypes; }
bool valid_op(uint8_t v) { return v < kNumOps; }

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

size_t acc_elem_size(DType t) {
  switch (t) {
    case DType::F16:
    case DType::BF16: return 4;
    default: return dtype_size(t);
  }
}

bool acc_is_wire_type(DType t) { return t != DType::F16 && t != DType::BF16 && valid_dtype(static_cast<uint8_t>(t)); }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}

const char* op_name(Op o) {
  switch (o) {
    case Op::Sum: return "sum";
    case Op::Avg: return "avg";
    case Op::Min: return "min";
    case Op::Max: return "max";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  static const struct {
    const char* name;
    DType t;
  } kNames[] = {
      {"float32", DType::F32}, {"f32", DType::F32},   {"fp32", DType::F32},   {"float", DType::F32},
      {"float64", DType::F64}, {"f64", DType::F64},   {"double", DType::F64}, {"float16", DType::F16},
      {"fp16", DType::F16},    {"f16", DType::F16},   {"half", DType::F16},   {"bfloat16", DType::BF16},
      {"bf16", DType::BF16},   {"int32", DType::I32}, {"i32", DType::I32},    {"int", DType::I32},
      {"int64", DType::I64},   {"i64", DType::I64},   {"long", DType::I64},
  };
  for (const auto& e : kNames) {
    if (s == e.name) {
      if (out) *out = e.t;
      return true;
    }
  }
  return false;
}

bool parse_op(const std::string& s, Op* out) {
  for (int i = 0; i < kNumOps; ++i) {
    if (s == op_name(static_cast<Op>(i))) {
      if (out) *out = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

}  // namespace rs
