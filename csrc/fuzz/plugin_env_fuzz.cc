// libFuzzer target: everything the NCCL plugin parses from its environment (csrc/nccl_plugin/
// plugin_env.cc, with csrc/cluster/ and csrc/common/json.cc, the reader the worker library shares).
// NCCL gives a plugin no other configuration, and a cluster description comes from whoever wrote
// the job's CLUSTER_SPEC / TF_CONFIG: every malformed value must be an rs::Error(Config), never
// another exception, a crash or a sanitizer report.
//
// Byte 0 picks what runs on the rest of the input:
//   0  json::parse (+ py_repr)           3  RS_REDUCERS (+ RS_JOB_ID) through discover_reducers
//   1  CLUSTER_SPEC through discover_reducers   4  the worker settings (client_options_from_env)
//   2  TF_CONFIG through discover_reducers      5  the point-to-point settings
//                                               6  a seconds argument (8 bytes: a double)
// For 4 and 5 the rest is split at NUL bytes into the variables' values, in order; every seconds
// value read is also converted as the core uses it (net/deadline.h): no overflow (UBSan).
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cluster/repr.h"
#include "common/error.h"
#include "common/json.h"
#include "common/settings.h"
#include "fuzz/fuzz_input.h"
#include "nccl_plugin/plugin_env.h"
#include "net/deadline.h"

namespace {

const char* const kDiscovery[] = {"CLUSTER_SPEC", "TF_CONFIG", "RS_REDUCERS", "RS_JOB_ID", "CLOUD_ML_JOB_ID"};
// Never from the input: a file path (it would read any file) and the process-wide congestion control.
const char* const kWorker[] = {
    "RS_TIMEOUT",  "RS_CONNECT_TIMEOUT", "RS_STREAMS",    "RS_CHUNK_BYTES", "RS_WINDOW",
    "RS_FAILOVER", "RS_SOCKET_BUFFER",   "RS_AUTH_TOKEN", "RS_INTEGRITY",   "RS_MAX_ROUNDS_IN_FLIGHT"};
const char* const kP2p[] = {"RS_NCCL_NSOCKS", "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_NTHREADS", "RS_HANDSHAKE_TIMEOUT"};

// A seconds value as the core uses it: a deadline, a progress timer, poll()'s milliseconds.
void use_seconds(double s) {
  FUZZ_CHECK(s > 0 && s <= rs::kMaxSeconds);
  const rs::net::ProgressTimer stall(s);
  FUZZ_CHECK(stall.poll_ms() >= 1 && stall.seconds() <= rs::kMaxSeconds);
  FUZZ_CHECK(rs::net::ms_until(rs::net::deadline_after(s)) >= 0);
}

// Every string the reader hands out is valid UTF-8 (Python receives them as str).
bool all_utf8(const rs::json::Value& v) {
  auto valid = [](const std::string& s) {
    for (size_t i = 0; i < s.size();) {
      const size_t n = rs::json::utf8_char_len(s, i);
      if (n == 0) return false;
      i += n;
    }
    return true;
  };
  if (v.type == rs::json::Value::Type::String && !valid(v.text)) return false;
  for (const auto& item : v.items)
    if (!all_utf8(item)) return false;
  for (const auto& [key, member] : v.members)
    if (!valid(key) || !all_utf8(member)) return false;
  return v.keys.size() == v.members.size();
}

template <size_t N>
void clear(const char* const (&vars)[N]) {
  for (const char* v : vars) unsetenv(v);
}

template <size_t N>
void set_from(const char* const (&vars)[N], const std::string& rest) {
  size_t at = 0;
  for (const char* v : vars) {
    if (at > rest.size()) break;
    const size_t end = std::min(rest.find('\0', at), rest.size());
    setenv(v, rest.substr(at, end - at).c_str(), 1);
    at = end + 1;
  }
}

void run(uint8_t mode, const std::string& rest) {
  using namespace rs::nccl;
  switch (mode % 7) {
    case 0: {
      const rs::json::Value v = rs::json::parse(rest, "input");
      FUZZ_CHECK(v.type_name() != nullptr && all_utf8(v));
      FUZZ_CHECK(rs::cluster::py_repr(v).size() <= rs::cluster::kReprMax + 3);
      break;
    }
    case 1:
    case 2:
    case 3: {
      const char* var = mode % 7 == 1 ? "CLUSTER_SPEC" : mode % 7 == 2 ? "TF_CONFIG" : "RS_REDUCERS";
      if (rest.find('\0') != std::string::npos) return;  // an environment value has no NUL
      setenv(var, rest.c_str(), 1);
      if (mode % 7 == 3) setenv("RS_JOB_ID", "fuzz", 1);
      const auto pool = discover_reducers();
      FUZZ_CHECK(!pool || !pool->reducers.empty());
      break;
    }
    case 4: {
      set_from(kWorker, rest);
      const rs::client::ClientOptions o = client_options_from_env();
      FUZZ_CHECK(o.streams >= 1 && o.window >= 1 && o.max_rounds_in_flight >= 1);
      use_seconds(o.timeout);
      use_seconds(o.connect_timeout);
      break;
    }
    case 6: {
      double s = 0;
      if (rest.size() != sizeof s) return;
      std::memcpy(&s, rest.data(), sizeof s);
      const auto d = rs::net::duration_of(s);  // any double: saturated, never an overflow
      FUZZ_CHECK(d.count() >= 0 && d <= rs::net::duration_of(rs::kMaxSeconds));
      use_seconds(rs::settings::check_seconds(s, "fuzz"));  // a Config error, or a usable value
      break;
    }
    default: {
      set_from(kP2p, rest);
      const int socks = p2p_sockets_from_env(), threads = p2p_threads_from_env();
      FUZZ_CHECK(socks >= 1 && socks <= 16 && threads >= 1 && threads <= 16);
      use_seconds(hello_timeout_from_env());
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rs::fuzz::Input in{data, size};
  const uint8_t mode = in.byte();
  const std::string rest = in.bytes(size);
  clear(kDiscovery);
  clear(kWorker);
  clear(kP2p);
  unsetenv("RS_AUTH_TOKEN_FILE");
  setenv("RS_TCP_CONGESTION", "default", 1);
  try {
    run(mode, rest);
  } catch (const rs::Error&) {
    // A malformed value, said as a Config error: what the plugin turns into an NCCL error.
  } catch (...) {
    FUZZ_CHECK(false);  // anything else would be a parser bug
  }
  return 0;
}
