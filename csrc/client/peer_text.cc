#include "client/peer_text.h"

#include "common/text.h"

namespace rs::client {

namespace {

// How one byte of peer text is quoted.
std::string escaped(unsigned char ch) {
  switch (ch) {
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (ch >= 0x20 && ch < 0x7f) return std::string(1, char(ch));
  return "\\x" + rs::hex_byte(ch);
}

}  // namespace

std::string peer_text(const std::string& raw, size_t max_chars) {
  std::string out;
  out.reserve(raw.size() < max_chars ? raw.size() : max_chars);
  for (const char c : raw) {
    const std::string piece = escaped(static_cast<unsigned char>(c));
    if (out.size() + piece.size() > max_chars) return out + "... (" + std::to_string(raw.size()) + " bytes)";
    out += piece;
  }
  return out;
}

}  // namespace rs::client
