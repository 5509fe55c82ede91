#include "cluster/repr.h"

#include "common/text.h"

namespace rs::cluster {

namespace {

void quote(std::string* out, const std::string& s) {
  // Python's choice: single quotes unless the text has a single quote and no double quote.
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  out->push_back(q);
  for (size_t i = 0; i < s.size() && out->size() <= kReprMax;) {
    const char c = s[i];
    const size_t n = json::utf8_char_len(s, i);
    if (c == q || c == '\\') {
      *out += '\\';
      *out += c;
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (n == 0 || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      *out += "\\x" + rs::hex_byte(static_cast<uint8_t>(c));
    } else {
      out->append(s, i, n);
      i += n;
      continue;
    }
    ++i;
  }
  out->push_back(q);
}

void write(std::string* out, const json::Value& v) {
  if (out->size() > kReprMax) return;
  using T = json::Value::Type;
  switch (v.type) {
    case T::Null: *out += "None"; return;
    case T::Bool: *out += v.boolean ? "True" : "False"; return;
    case T::Number: *out += v.text; return;
    case T::String: quote(out, v.text); return;
    case T::Array:
      *out += '[';
      for (size_t i = 0; i < v.items.size() && out->size() <= kReprMax; ++i) {
        if (i) *out += ", ";
        write(out, v.items[i]);
      }
      *out += ']';
      return;
    case T::Object:
      *out += '{';
      for (size_t i = 0; i < v.keys.size() && out->size() <= kReprMax; ++i) {
        if (i) *out += ", ";
        quote(out, v.keys[i]);
        *out += ": ";
        write(out, v.members.at(v.keys[i]));
      }
      *out += '}';
      return;
  }
}

std::string bounded(std::string s) {
  if (s.size() > kReprMax) {
    size_t cut = kReprMax;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    s.resize(cut);
    s += "...";
  }
  return s;
}

}  // namespace

std::string py_repr(const std::string& text) {
  std::string out;
  quote(&out, text);
  return bounded(std::move(out));
}

std::string py_repr(const json::Value& v) {
  std::string out;
  write(&out, v);
  return bounded(std::move(out));
}

const char* py_type_name(const json::Value& v) {
  using T = json::Value::Type;
  switch (v.type) {
    case T::Null: return "NoneType";
    case T::Bool: return "bool";
    case T::Number: return v.text.find_first_of(".eE") == std::string::npos ? "int" : "float";
    case T::String: return "str";
    case T::Array: return "list";
    case T::Object: return "dict";
  }
  return "?";
}

}  // namespace rs::cluster
