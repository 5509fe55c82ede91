#include "common/json.h"

#include <cstdint>
#include <cstdlib>

#include "common/error.h"

namespace rs::json {

const Value* Value::get(const std::string& key) const {
  if (type != Type::Object) return nullptr;
  auto it = members.find(key);
  return it == members.end() ? nullptr : &it->second;
}

const char* Value::type_name() const {
  switch (type) {
    case Type::Null: return "null";
    case Type::Bool: return "boolean";
    case Type::Number: return "number";
    case Type::String: return "string";
    case Type::Array: return "array";
    case Type::Object: return "object";
  }
  return "?";
}

namespace {

constexpr int kMaxDepth = 64;
constexpr size_t kMaxText = 1 << 20;

class Parser {
 public:
  Parser(const std::string& s, const std::string& what) : s_(s), what_(what) {}

  Value document() {
    if (s_.size() > kMaxText) fail("document larger than 1 MiB");
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw Error(ErrorKind::Config, what_ + " is not valid JSON (" + why + " at offset " + std::to_string(pos_) + ")");
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  // The items of an object or array, the opening bracket at pos_: item() reads one, then ',' or `close`.
  template <typename ReadItem>
  void sequence(char close, const ReadItem& item) {
    ++pos_;
    if (peek() == close) {
      ++pos_;
      return;
    }
    for (;;) {
      item();
      const char d = peek();
      ++pos_;
      if (d == close) return;
      if (d != ',') fail(std::string("expected ',' or '") + close + "'");
    }
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    Value v;
    char c = peek();
    if (c == '{') {
      v.type = Value::Type::Object;
      sequence('}', [&] {
        if (peek() != '"') fail("expected a member name");
        std::string key = string();
        expect(':');
        Value item = value(depth + 1);
        auto placed = v.members.insert_or_assign(std::move(key), std::move(item));
        if (placed.second) v.keys.push_back(placed.first->first);
      });
      return v;
    }
    if (c == '[') {
      v.type = Value::Type::Array;
      sequence(']', [&] { v.items.push_back(value(depth + 1)); });
      return v;
    }
    if (c == '"') {
      v.type = Value::Type::String;
      v.text = string();
      return v;
    }
    if (literal("true")) {
      v.type = Value::Type::Bool;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.type = Value::Type::Bool;
      return v;
    }
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = pos_;
      if (s_[pos_] == '-') ++pos_;
      if (pos_ + 1 < s_.size() && s_[pos_] == '0' && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '9')
        fail("leading zero in a number");
      auto digits = [&] {
        size_t b = pos_;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        if (pos_ == b) fail("malformed number");
      };
      digits();
      if (pos_ < s_.size() && s_[pos_] == '.') {
        ++pos_;
        digits();
      }
      if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
        ++pos_;
        if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
        digits();
      }
      v.type = Value::Type::Number;
      v.text = s_.substr(start, pos_ - start);
      v.number = std::strtod(v.text.c_str(), nullptr);
      return v;
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  static void put_utf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(char(cp));
    } else if (cp < 0x800) {
      out->push_back(char(0xC0 | (cp >> 6)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(char(0xE0 | (cp >> 12)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(char(0xF0 | (cp >> 18)));
      out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(char(0x80 | (cp & 0x3F)));
    }
  }

  // One multi-byte character whose lead byte was just read, checked, so that every string handed
  // out is valid UTF-8.
  void utf8_sequence(std::string* out) {
    const size_t n = utf8_char_len(s_, --pos_);
    if (n < 2) fail("invalid UTF-8 in a string");  // at the offset of the byte
    out->append(s_, pos_, n);
    pos_ += n;
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        utf8_sequence(&out);
        continue;
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xD800 && cp < 0xE000) {
            fail("lone surrogate in a \\u escape");
          }
          put_utf8(&out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  const std::string& s_;
  const std::string& what_;
  size_t pos_ = 0;
};

}  // namespace

Value parse(const std::string& text, const std::string& what) { return Parser(text, what).document(); }

size_t utf8_char_len(const std::string& s, size_t at) {
  if (at >= s.size()) return 0;
  const auto lead = static_cast<unsigned char>(s[at]);
  if (lead < 0x80) return 1;
  const size_t extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
  if (extra == 0 || lead > 0xF4 || at + extra >= s.size()) return 0;
  uint32_t cp = lead & (0x3Fu >> extra);
  for (size_t i = 1; i <= extra; ++i) {
    const auto b = static_cast<unsigned char>(s[at + i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return 0;
  return extra + 1;
}

}  // namespace rs::json
