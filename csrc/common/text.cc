#include "common/text.h"

#include <cctype>

namespace rs {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

}  // namespace

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string to_lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string hex_bytes(const void* p, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(p);
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHexDigits[bytes[i] >> 4]);
    out.push_back(kHexDigits[bytes[i] & 15]);
  }
  return out;
}

std::string hex_byte(uint8_t b) { return hex_bytes(&b, 1); }

std::string hex_u64(uint64_t v) {
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[size_t(i)] = kHexDigits[v & 15];
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace rs
