// The 16-bit wire compression of float32 rounds, and every name it is asked by: one home for the
// worker client (csrc/client), the bindings, and the Python library (reducer._core.COMPRESSIONS,
// read by reducer.config.compression_wire). Names are matched trimmed and in any case.
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace rs {

enum class WireCompression : uint8_t { None = 0, BF16 = 1, F16 = 2 };

struct CompressionName {
  const char* name;
  WireCompression value;
};

// Every accepted name (lower case): "" and none/off/no/0/false -> None, bf16/bfloat16 -> BF16,
// fp16/float16/half -> F16.
inline constexpr CompressionName kCompressionNames[] = {
    {"", WireCompression::None},       {"none", WireCompression::None},     {"off", WireCompression::None},
    {"no", WireCompression::None},     {"0", WireCompression::None},        {"false", WireCompression::None},
    {"bf16", WireCompression::BF16},   {"bfloat16", WireCompression::BF16}, {"fp16", WireCompression::F16},
    {"float16", WireCompression::F16}, {"half", WireCompression::F16},
};
constexpr const char* kCompressionChoices = "'bf16', 'fp16' or none";

// False if `s` (trimmed, any case) is not a name above.
bool parse_wire_compression(const std::string& s, WireCompression* out);
const char* wire_compression_name(WireCompression c);  // "none", "bf16", "fp16"
// The wire dtype of a compressed float32 round (BF16 or F16); F32 for None.
DType wire_compression_dtype(WireCompression c);

}  // namespace rs
