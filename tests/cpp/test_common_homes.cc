// csrc/common's one-home helpers: the settings parser (one rule per kind), the compression names
// and the hexadecimal helpers. Built and run by tests/config/test_config_homes.py.
#include <cmath>
#include <string>

#include "check.h"
#include "common/compression.h"
#include "common/error.h"
#include "common/settings.h"
#include "common/text.h"
#include "net/deadline.h"

namespace {

using rs::settings::spec;

// The message of the Config error `text` gives for setting `name`, "" if it parsed.
std::string refusal(const char* name, const std::string& text) {
  try {
    rs::settings::parse(spec(name), text);
  } catch (const rs::Error& e) {
    return e.kind() == rs::ErrorKind::Config ? e.what() : "wrong kind";
  }
  return "";
}

void settings_kinds() {
  using V = rs::settings::Value;
  CHECK(!rs::settings::parse(spec("timeout"), " \t"));  // blank = unset
  CHECK(*rs::settings::parse(spec("failover"), " OFF ") == V(false));
  CHECK(*rs::settings::parse(spec("failover"), "Yes") == V(true));
  CHECK(*rs::settings::parse(spec("chunk_bytes"), "64KiB") == V(int64_t(65536)));
  CHECK(*rs::settings::parse(spec("socket_buffer"), "1.5K") == V(int64_t(1536)));
  CHECK(*rs::settings::parse(spec("integrity"), "REQUIRED") == V(std::string("required")));
  CHECK(*rs::settings::parse(spec("timeout"), "2.5") == V(2.5));
  CHECK(refusal("timeout", "0") == "RS_TIMEOUT='0' is not valid: expected a positive number of seconds");
  CHECK(refusal("timeout", "inf").rfind("RS_TIMEOUT='inf'", 0) == 0);
  CHECK(refusal("window", "1025") == "RS_WINDOW='1025' is not valid: out of range 1..1024");
  CHECK(refusal("streams", "1x") == "RS_STREAMS='1x' is not valid: expected an integer");
  CHECK(refusal("chunk_bytes", "1001") == "RS_CHUNK_BYTES='1001' is not valid: not a multiple of 8");
  CHECK(refusal("chunk_bytes", "128M").rfind("RS_CHUNK_BYTES='128M' is not valid: out of range", 0) == 0);
  CHECK(refusal("socket_buffer", "-1").rfind("RS_SOCKET_BUFFER='-1'", 0) == 0);
  CHECK(refusal("integrity", "maybe") == "RS_INTEGRITY='maybe' is not valid: must be one of off/on/required");
  CHECK(refusal("failover", "2") != "");
  CHECK(refusal("timeout", "0x10") != "" && refusal("chunk_bytes", "0x400") != "");  // decimal only
  CHECK(refusal("streams", "99999999999999999999") != "");  // out of int64: refused, not wrapped
  // A map stands in for the environment; unset and blank take the default.
  const rs::settings::EnvLookup env = [](const char* var) -> std::optional<std::string> {
    if (std::string(var) == "RS_WINDOW") return std::string(" ");
    if (std::string(var) == "RS_STREAMS") return std::string("3");
    return std::nullopt;
  };
  CHECK(rs::settings::read_int(spec("window"), env) == rs::kDefaultWindow);
  CHECK(rs::settings::read_int(spec("streams"), env) == 3);
  CHECK(!rs::settings::read_text(spec("auth_token"), env));
  CHECK(*rs::settings::read_text(spec("tcp_congestion"), env) == "auto");
}

// One bound for every seconds value (issue 28.4): text and arguments refuse more than kMaxSeconds,
// and every conversion saturates there, so no value overflows the clock arithmetic.
void seconds_bound() {
  using rs::net::duration_of;
  CHECK(refusal("timeout", "1e10") ==
        "RS_TIMEOUT='1e10' is not valid: more than 1e9 seconds (about 31 years), the largest time limit");
  CHECK(refusal("handshake_timeout", "1e9").empty());
  CHECK(rs::settings::check_seconds(1e9, "timeout") == 1e9);
  CHECK(rs::settings::check_seconds(0, "x", true) == 0);
  for (double bad : {1e10, 0.0, -1.0, double(NAN), double(INFINITY)}) {
    bool refused = false;
    try {
      rs::settings::check_seconds(bad, "timeout");
    } catch (const rs::Error& e) {
      refused = e.kind() == rs::ErrorKind::Config && std::string(e.what()).rfind("timeout=", 0) == 0;
    }
    CHECK(refused);
  }
  const auto most = duration_of(rs::kMaxSeconds);
  CHECK(std::chrono::duration<double>(most).count() == 1e9);
  CHECK(duration_of(1e300) == most && duration_of(INFINITY) == most);
  CHECK(duration_of(NAN).count() == 0 && duration_of(-1e300).count() == 0 && duration_of(-INFINITY).count() == 0);
  CHECK(rs::net::deadline_after(1e300) > rs::net::Clock::now() + std::chrono::hours(24 * 365));
  CHECK(rs::net::ProgressTimer(1e300).seconds() == 1e9 && !rs::net::ProgressTimer(1e300).expired());
  CHECK(rs::net::ms_until(rs::net::deadline_after(1e300)) == 1 << 30);
}

void compression_names() {
  rs::WireCompression c = rs::WireCompression::F16;
  CHECK(rs::parse_wire_compression(" BF16 ", &c) && c == rs::WireCompression::BF16);
  CHECK(rs::parse_wire_compression("Half", &c) && c == rs::WireCompression::F16);
  CHECK(rs::parse_wire_compression("", &c) && c == rs::WireCompression::None);
  CHECK(rs::parse_wire_compression("off", &c) && c == rs::WireCompression::None);
  CHECK(!rs::parse_wire_compression("fp8", &c));
  CHECK(rs::wire_compression_dtype(rs::WireCompression::BF16) == rs::DType::BF16);
  CHECK(rs::wire_compression_dtype(rs::WireCompression::F16) == rs::DType::F16);
  CHECK(std::string(rs::wire_compression_name(rs::WireCompression::F16)) == "fp16");
}

void hex() {
  const uint8_t bytes[] = {0x00, 0x9f, 0xa0, 0xff};
  CHECK(rs::hex_bytes(bytes, 4) == "009fa0ff");
  CHECK(rs::hex_bytes(bytes, 0).empty());
  CHECK(rs::hex_byte(0x0c) == "0c");
  CHECK(rs::hex_u64(0x0123456789abcdefull) == "0123456789abcdef");
  CHECK(rs::hex_u64(0) == "0000000000000000");
  CHECK(rs::hex_value('7') == 7 && rs::hex_value('b') == 11 && rs::hex_value('F') == 15);
  CHECK(rs::hex_value('g') == -1 && rs::hex_value(':') == -1);
  CHECK(rs::trim(" \t a b\r\n") == "a b" && rs::trim("   ").empty() && rs::to_lower("AbC") == "abc");
}

}  // namespace

int main() {
  settings_kinds();
  seconds_bound();
  compression_names();
  hex();
  return finish("test_common_homes");
}
