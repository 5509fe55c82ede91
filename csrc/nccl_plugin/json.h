// A small JSON reader for the cluster descriptions (CLUSTER_SPEC, TF_CONFIG) the plugin reads
// from its environment. Strict RFC 8259 syntax; depth and size bounded; errors say where.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rs::nccl::json {

struct Value {
  enum class Type { Null, Bool, Number, String, Array, Object };
  Type type = Type::Null;
  bool boolean = false;
  double number = 0;
  std::string text;  // String; for Number the literal as written
  std::vector<Value> items;
  std::map<std::string, Value> members;

  const Value* get(const std::string& key) const;  // Object member or nullptr
  const char* type_name() const;
};

// Parses `text`; throws rs::Error(Config) "<what> is not valid JSON (<reason> at offset N)".
Value parse(const std::string& text, const std::string& what);

}  // namespace rs::nccl::json
