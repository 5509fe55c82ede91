// A small JSON reader for the cluster descriptions (CLUSTER_SPEC, TF_CONFIG; csrc/cluster/) that
// the worker library and the NCCL plugin read from their environment. Strict RFC 8259 syntax,
// strings valid UTF-8 (no lone surrogates); depth and size bounded; errors say where.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rs::json {

struct Value {
  enum class Type { Null, Bool, Number, String, Array, Object };
  Type type = Type::Null;
  bool boolean = false;
  double number = 0;
  std::string text;  // String; for Number the literal as written
  std::vector<Value> items;
  std::map<std::string, Value> members;
  std::vector<std::string> keys;  // Object member names in document order (a repeated name: its first place)

  const Value* get(const std::string& key) const;  // Object member or nullptr
  const char* type_name() const;
};

// Parses `text`; throws rs::Error(Config) "<what> is not valid JSON (<reason> at offset N)".
// A repeated member name keeps its last value (as Python's json module does).
Value parse(const std::string& text, const std::string& what);

// The length of the valid UTF-8 character that starts at s[at] (1 for ASCII; no overlong form,
// surrogate or code point above U+10FFFF), or 0 when the bytes there are not one.
size_t utf8_char_len(const std::string& s, size_t at);

}  // namespace rs::json
