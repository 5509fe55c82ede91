#include "common/compression.h"

#include "common/text.h"

namespace rs {

bool parse_wire_compression(const std::string& s, WireCompression* out) {
  const std::string t = to_lower(trim(s));
  for (const CompressionName& n : kCompressionNames)
    if (t == n.name) {
      *out = n.value;
      return true;
    }
  return false;
}

const char* wire_compression_name(WireCompression c) {
  switch (c) {
    case WireCompression::BF16: return "bf16";
    case WireCompression::F16: return "fp16";
    case WireCompression::None: break;
  }
  return "none";
}

DType wire_compression_dtype(WireCompression c) {
  switch (c) {
    case WireCompression::BF16: return DType::BF16;
    case WireCompression::F16: return DType::F16;
    case WireCompression::None: break;
  }
  return DType::F32;
}

}  // namespace rs
