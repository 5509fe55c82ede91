#include "net/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdint>

#include "cluster/repr.h"
#include "common/error.h"
#include "common/json.h"

namespace rs::net {

namespace {

// The code point of the valid UTF-8 character of `n` bytes at s[at].
uint32_t code_point(const std::string& s, size_t at, size_t n) {
  const auto b = [&](size_t i) { return uint32_t(static_cast<unsigned char>(s[at + i])); };
  if (n == 1) return b(0);
  uint32_t cp = b(0) & (0xFFu >> (n + 1));
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (b(i) & 0x3Fu);
  return cp;
}

// Python's str.isspace for one code point.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The length of the whitespace character at s[at], 0 if there is none there.
size_t space_at(const std::string& s, size_t at) {
  const size_t n = json::utf8_char_len(s, at);
  return n != 0 && py_space(code_point(s, at, n)) ? n : 0;
}

// The whitespace characters that end s[0, end): their length.
size_t space_before(const std::string& s, size_t end) {
  size_t start = end;
  while (start > 0 && (static_cast<unsigned char>(s[start - 1]) & 0xC0) == 0x80 && end - start < 3) --start;
  if (start > 0) --start;
  return space_at(s, start) == end - start ? end - start : 0;
}

// `text` without the whitespace around it (Python's str.strip()).
std::string strip(const std::string& text) {
  size_t begin = 0, end = text.size();
  for (size_t n; begin < end && (n = space_at(text, begin)) != 0;) begin += n;
  for (size_t n; end > begin && (n = space_before(text, end)) != 0;) end -= n;
  return text.substr(begin, end - begin);
}

bool has_space(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (space_at(text, i)) return true;
  return false;
}

bool is_ipv6(const std::string& host) {
  in6_addr a;
  return inet_pton(AF_INET6, host.substr(0, host.find('%')).c_str(), &a) == 1;
}

// The port of "host:port" text once its host is known; `say` builds the message of a refusal.
template <typename Say>
uint16_t parse_port(const std::string& port_text, const Say& say) {
  if (port_text.empty()) throw Error(ErrorKind::Config, say(" has no port: expected 'host:port'"));
  if (port_text.find_first_not_of("0123456789") != std::string::npos)
    throw Error(ErrorKind::Config, say(": port " + cluster::py_repr(port_text) + " is not a number"));
  const size_t first = port_text.find_first_not_of('0');
  const std::string digits = first == std::string::npos ? "0" : port_text.substr(first);  // as int() prints it
  const long port = digits.size() <= 5 ? std::stol(digits) : 0;
  if (port < 1 || port > 65535) throw Error(ErrorKind::Config, say(": port " + digits + " is out of range 1-65535"));
  return uint16_t(port);
}

}  // namespace

HostPort parse_host_port(const std::string& addr) {
  const std::string text = strip(addr);
  if (text.empty()) throw Error(ErrorKind::Config, "empty address: expected 'host:port' (IPv6 as '[addr]:port')");
  const auto say = [&](const std::string& why) { return "address " + cluster::py_repr(addr) + why; };
  if (has_space(text)) throw Error(ErrorKind::Config, say(" contains whitespace: expected 'host:port'"));
  HostPort hp;
  std::string port_text;
  if (text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) throw Error(ErrorKind::Config, say(" has '[' without ']': expected '[ipv6]:port'"));
    hp.host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':')
      throw Error(ErrorKind::Config, say(" has no port: expected '[" + hp.host + "]:port'"));
    port_text = text.substr(close + 2);
    if (!is_ipv6(hp.host))
      throw Error(ErrorKind::Config, say(": " + cluster::py_repr(hp.host) + " inside [] is not an IPv6 address"));
  } else {
    if (std::count(text.begin(), text.end(), ':') > 1)
      throw Error(ErrorKind::Config, say(" looks like an unbracketed IPv6 address: write it as '[ipv6]:port'"));
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) throw Error(ErrorKind::Config, say(" has no port: expected 'host:port'"));
    hp.host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (hp.host.find_first_of("[]") != std::string::npos)
      throw Error(ErrorKind::Config, say(" is malformed: expected 'host:port' or '[ipv6]:port'"));
  }
  if (hp.host.empty()) throw Error(ErrorKind::Config, say(" has no host: expected 'host:port'"));
  hp.port = parse_port(port_text, say);
  return hp;
}

}  // namespace rs::net
