#include "common/settings.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/text.h"

namespace rs::settings {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& raw, const std::string& why) {
  throw Error(ErrorKind::Config, what + "='" + raw + "' is not valid: " + why);
}

std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e18) return std::to_string(int64_t(v));
  return std::to_string(v);
}

void check_range(const Spec& s, double v, const std::string& what, const std::string& raw) {
  if (v < s.lo || v > s.hi) bad(what, raw, "out of range " + number_text(s.lo) + ".." + number_text(s.hi));
  if (s.step > 0 && std::fmod(v, s.step) != 0) bad(what, raw, "not a multiple of " + number_text(s.step));
}

// Text strtod may read as a decimal number: not empty, no hexadecimal float ("0x10", "1p3").
bool decimal(const std::string& t) { return !t.empty() && t.find_first_of("xXpP") == std::string::npos; }

bool parse_bool(const std::string& t, const std::string& what, const std::string& raw) {
  const std::string v = to_lower(t);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad(what, raw, "expected true or false (1/0, yes/no, on/off)");
}

int64_t parse_int(const Spec& s, const std::string& t, const std::string& what, const std::string& raw) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) bad(what, raw, "expected an integer");
  check_range(s, double(v), what, raw);
  return int64_t(v);
}

int64_t parse_size(const Spec& s, const std::string& t, const std::string& what, const std::string& raw) {
  std::string u = t;
  for (char& c : u) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (!u.empty() && u.back() == 'B') u.pop_back();
  if (!u.empty() && u.back() == 'I') u.pop_back();
  double mult = 1;
  if (!u.empty() && std::strchr("KMGT", u.back())) {
    mult = std::pow(1024.0, double(std::strchr("KMGT", u.back()) - "KMGT" + 1));
    u.pop_back();
  }
  char* end = nullptr;
  const double v = decimal(u) ? std::strtod(u.c_str(), &end) : NAN;
  if (!decimal(u) || *end != '\0' || !std::isfinite(v) || v < 0) bad(what, raw, "expected a size in bytes such as 4M");
  const double bytes = v * mult;
  if (bytes != std::floor(bytes) || bytes > kNoLimit) bad(what, raw, "expected a whole number of bytes");
  check_range(s, bytes, what, raw);
  return int64_t(bytes);
}

// Why `v` is not a valid seconds value (nullptr when it is): one rule for text and arguments.
const char* seconds_problem(double v, bool zero_ok = false) {
  if (zero_ok && v == 0) return nullptr;
  if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok))
    return zero_ok ? "expected a finite number of seconds >= 0" : "expected a positive number of seconds";
  if (v > kMaxSeconds) return "more than 1e9 seconds (about 31 years), the largest time limit";
  return nullptr;
}

double parse_seconds(const std::string& t, const std::string& what, const std::string& raw, bool zero_ok) {
  char* end = nullptr;
  const double v = decimal(t) ? std::strtod(t.c_str(), &end) : NAN;
  if (!decimal(t) || *end != '\0')
    bad(what, raw, zero_ok ? "expected a finite number of seconds >= 0" : "expected a positive number of seconds");
  if (const char* why = seconds_problem(v, zero_ok)) bad(what, raw, why);
  return v;
}

std::string parse_enum(const Spec& s, const std::string& t, const std::string& what, const std::string& raw) {
  const std::string v = to_lower(t);
  const std::string choices = s.choices ? s.choices : "";
  size_t at = 0;
  while (at <= choices.size()) {
    const size_t comma = std::min(choices.find(',', at), choices.size());
    if (choices.compare(at, comma - at, v) == 0 && comma - at == v.size()) return v;
    at = comma + 1;
  }
  std::string list = choices;
  for (char& c : list)
    if (c == ',') c = '/';
  bad(what, raw, "must be one of " + list);
}

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Size: return "size";
    case Kind::Seconds: return "seconds";
    case Kind::Enum: return "enum";
    case Kind::Text: return "text";
  }
  return "?";
}

std::optional<Value> parse(const Spec& s, const std::string& text, const std::string& what_arg) {
  const std::string t = trim(text);
  if (t.empty()) return std::nullopt;
  const std::string what = what_arg.empty() ? std::string(s.env) : what_arg;
  switch (s.kind) {
    case Kind::Bool: return Value(parse_bool(t, what, text));
    case Kind::Int: return Value(parse_int(s, t, what, text));
    case Kind::Size: return Value(parse_size(s, t, what, text));
    case Kind::Seconds: return Value(parse_seconds(t, what, text, s.zero_ok));
    case Kind::Enum: return Value(parse_enum(s, t, what, text));
    case Kind::Text: return Value(t);
  }
  return std::nullopt;
}

std::optional<Value> default_value(const Spec& s) {
  if (!s.has_default) return std::nullopt;
  switch (s.kind) {
    case Kind::Bool: return Value(s.number != 0);
    case Kind::Int:
    case Kind::Size: return Value(int64_t(s.number));
    case Kind::Seconds: return Value(s.number);
    case Kind::Enum:
    case Kind::Text: return Value(std::string(s.text ? s.text : ""));
  }
  return std::nullopt;
}

double check_seconds(double seconds, const std::string& what, bool zero_ok) {
  if (const char* why = seconds_problem(seconds, zero_ok)) {
    char text[32];
    std::snprintf(text, sizeof text, "%.15g", seconds);
    throw Error(ErrorKind::Config, what + "=" + text + " is not valid: " + why);
  }
  return seconds;
}

std::string secret_file_warning(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return "";
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
  return "the secret file '" + path + "' is open to its group or others (mode " + mode +
         "): anyone who can read it can authenticate as any worker, reducer and job; make it private "
         "(chmod 600)";
}

EnvLookup process_env() {
  return [](const char* var) -> std::optional<std::string> {
    const char* v = std::getenv(var);
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

std::optional<Value> read(const Spec& s, const EnvLookup& env) {
  const std::optional<std::string> raw = env(s.env);
  return raw ? parse(s, *raw) : std::nullopt;
}

namespace {

Value value_or_default(const Spec& s, const EnvLookup& env) {
  if (auto v = read(s, env)) return *v;
  if (auto d = default_value(s)) return *d;
  throw Error(ErrorKind::Internal, std::string("setting ") + s.name + " has no default");
}

}  // namespace

bool read_bool(const Spec& s, const EnvLookup& env) { return std::get<bool>(value_or_default(s, env)); }

int64_t read_int(const Spec& s, const EnvLookup& env) { return std::get<int64_t>(value_or_default(s, env)); }

double read_seconds(const Spec& s, const EnvLookup& env) { return std::get<double>(value_or_default(s, env)); }

std::optional<std::string> read_text(const Spec& s, const EnvLookup& env) {
  if (auto v = read(s, env)) return std::get<std::string>(*v);
  if (auto d = default_value(s)) return std::get<std::string>(*d);
  return std::nullopt;
}

}  // namespace rs::settings
