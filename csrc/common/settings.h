// The settings the C++ core reads, defined once: name (the Python argument), RS_* variable, kind,
// default, bounds, where it applies, and a one-line meaning. Every reader goes through this table:
// the worker client's options (client/client_settings.h), the NCCL plugin (nccl_plugin/
// plugin_env.cc), the reducer node (server/server.h ServerOptions starts from the same
// common/defaults.h constants; reducer.ReducerServer and `reduction-server serve` read these rows),
// and reducer/config.py, which builds its rows for these settings from the bound copy
// (reducer._core.SETTINGS) and parses their text with the same parse_setting(); serve's --help
// and docs/configuration.md show these defaults (tests/config/test_reducer_settings.py checks them all).
//
// Text rules, one per kind: blank (empty or only whitespace) = unset; surrounding whitespace is
// ignored; Bool: 1/true/yes/on, 0/false/no/off (any case); Int: a decimal integer within
// [lo, hi] and a multiple of `step`; Size: bytes with an optional K/M/G/T suffix (powers of 1024, "B"/"iB" allowed),
// within [lo, hi], a multiple of `step`; Seconds: a finite number > 0 (>= 0 with zero_ok) and at most kMaxSeconds
// (common/defaults.h: 1e9, about 31 years); Enum: one of `choices` (any case, returned lower
// case); Text: as given (trimmed). A malformed value is an Error(Config) "VAR='text' is not
// valid: why" naming the variable (or the argument the text came from).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "common/defaults.h"

namespace rs::settings {

enum class Kind : uint8_t { Bool, Int, Size, Seconds, Enum, Text };
const char* kind_name(Kind k);  // "bool", "int", "size", "seconds", "enum", "text"

// Where a setting applies (a bit set).
enum Scope : uint8_t {
  kWorker = 1,   // Communicator(...) / reducer.init(...) argument (and its variable)
  kProcess = 2,  // the worker library's process, through its variable only (no argument)
  kPlugin = 4,   // the NCCL plugin reads the variable
  kReducer = 8,  // the reducer node
};

struct Spec {
  const char* name;  // the Python argument name
  const char* env;   // the environment variable
  Kind kind;
  bool has_default;
  double number;        // the default of Bool (0/1), Int, Size, Seconds
  const char* text;     // the default of Enum / Text; Enum: its choices follow in `choices`
  double lo, hi;        // Int and Size bounds (inclusive)
  const char* choices;  // Enum: comma-separated, lower case
  uint8_t scope;
  const char* doc;
  double step = 0;       // Int and Size: the value must be a multiple of it (0: any)
  bool zero_ok = false;  // Seconds: 0 is valid too (it means "never")
};

constexpr double kNoLimit = 9.0e18;  // below 2^63: every Size/Int fits an int64

// clang-format off
inline constexpr Spec kTable[] = {
  {"timeout", "RS_TIMEOUT", Kind::Seconds, true, kDefaultTimeout, nullptr, 0, 0, nullptr, kWorker | kPlugin,
   "Seconds without progress before an operation fails (also bounds connect retries)."},
  {"connect_timeout", "RS_CONNECT_TIMEOUT", Kind::Seconds, true, kDefaultConnectTimeout, nullptr, 0, 0, nullptr,
   kWorker | kPlugin,
   "Seconds to wait for the reducers to accept and for every worker of the group to connect."},
  {"streams", "RS_STREAMS", Kind::Int, true, kDefaultStreams, nullptr, 1, 64, nullptr, kWorker | kPlugin,
   "TCP connections per reducer per worker (1-64)."},
  {"chunk_bytes", "RS_CHUNK_BYTES", Kind::Size, true, kDefaultChunkBytes, nullptr, 64, 64 << 20, nullptr,
   kWorker | kPlugin,
   "Largest pipeline chunk in bytes, a multiple of 8 in 64 B..64 MiB (all workers of a group must agree).", 8},
  {"window", "RS_WINDOW", Kind::Int, true, kDefaultWindow, nullptr, 1, kMaxWindow, nullptr, kWorker | kPlugin,
   "Chunks a worker keeps in flight per reducer connection (1-1024; the plugin's default is its own)."},
  {"max_rounds_in_flight", "RS_MAX_ROUNDS_IN_FLIGHT", Kind::Int, true, kDefaultMaxRoundsInFlight, nullptr, 1,
   kMaxClientRoundsInFlight, nullptr, kWorker,
   "Unfinished all-reduce rounds a worker keeps in flight before starting another waits (1-4096)."},
  {"failover", "RS_FAILOVER", Kind::Bool, true, kDefaultFailover ? 1.0 : 0.0, nullptr, 0, 0, nullptr,
   kWorker | kPlugin,
   "Finish rounds on the surviving reducers when one is lost (every worker of a group must agree)."},
  {"socket_buffer", "RS_SOCKET_BUFFER", Kind::Size, true, kDefaultSocketBuffer, nullptr, 0, 2147483647.0, nullptr,
   kWorker | kPlugin | kReducer,
   "SO_SNDBUF/SO_RCVBUF of data connections in bytes (0: leave to the kernel's autotuning)."},
  {"tcp_congestion", "RS_TCP_CONGESTION", Kind::Text, true, 0, "auto", 0, 0, nullptr, kProcess | kPlugin | kReducer,
   "TCP congestion control of every data connection of the process ('auto', 'default' or a name)."},
  {"auth_token", "RS_AUTH_TOKEN", Kind::Text, false, 0, nullptr, 0, 0, nullptr, kWorker | kPlugin | kReducer,
   "Shared secret for HMAC-SHA256 authentication (workers and reducers)."},
  {"auth_token_file", "RS_AUTH_TOKEN_FILE", Kind::Text, false, 0, nullptr, 0, 0, nullptr,
   kProcess | kPlugin | kReducer, "File holding the shared secret (alternative to RS_AUTH_TOKEN)."},
  {"integrity", "RS_INTEGRITY", Kind::Enum, false, 0, nullptr, 0, 0, "off,on,required", kWorker | kPlugin | kReducer,
   "Frame integrity (AES-GMAC tags on every frame; needs the auth token): 'off', 'on' or 'required'."},
  {"handshake_timeout", "RS_HANDSHAKE_TIMEOUT", Kind::Seconds, true, kDefaultHandshakeTimeout, nullptr, 0, 0, nullptr,
   kPlugin | kReducer,
   "Reducer and the NCCL plugin's point-to-point listener: seconds a new connection has to send its hello."},
  {"keepalive_idle", "RS_KEEPALIVE_IDLE", Kind::Int, true, 5, nullptr, 1, 32767, nullptr,
   kProcess | kPlugin | kReducer,
   "Seconds a data connection may stay silent before TCP keepalive probes start (TCP_KEEPIDLE)."},
  {"keepalive_interval", "RS_KEEPALIVE_INTERVAL", Kind::Int, true, 2, nullptr, 1, 32767, nullptr,
   kProcess | kPlugin | kReducer, "Seconds between unanswered TCP keepalive probes (TCP_KEEPINTVL)."},
  {"keepalive_count", "RS_KEEPALIVE_COUNT", Kind::Int, true, 5, nullptr, 1, 127, nullptr,
   kProcess | kPlugin | kReducer, "Unanswered TCP keepalive probes before a silent peer is dead (TCP_KEEPCNT)."},
  {"tcp_user_timeout", "RS_TCP_USER_TIMEOUT", Kind::Int, true, 15, nullptr, 0, 86400, nullptr,
   kProcess | kPlugin | kReducer,
   "Seconds sent data or keepalive probes may go unacknowledged before a peer is dead (TCP_USER_TIMEOUT; 0: "
   "the kernel's)."},
  // -- the reducer node (ServerOptions; reducer.ReducerServer, `reduction-server serve`) ---------
  {"host", "RS_HOST", Kind::Text, true, 0, kDefaultReducerHost, 0, 0, nullptr, kReducer,
   "Address the reducer binds (0.0.0.0: all interfaces)."},
  {"port", "RS_PORT", Kind::Int, false, 0, nullptr, 0, 65535, nullptr, kProcess | kPlugin | kReducer,
   "Port the reducer binds, 0 = any free port (unset: its CLUSTER_SPEC/TF_CONFIG entry, else 2222)."},
  {"threads", "RS_THREADS", Kind::Int, true, kDefaultReducerThreads, nullptr, 0, kMaxReducerThreads, nullptr,
   kReducer, "Reducer event-loop threads, at most 256 (0: the number of CPUs, at most 8)."},
  {"group_slots", "RS_GROUP_SLOTS", Kind::Int, true, kDefaultGroupSlots, nullptr, 1, kMaxGroupSlots, nullptr,
   kReducer, "Reducer: chunk slots per group stream, 1-64; memory per group stream = slots x (world + 2) x chunk."},
  {"group_timeout", "RS_GROUP_TIMEOUT", Kind::Seconds, true, kDefaultGroupTimeout, nullptr, 0, 0, nullptr, kReducer,
   "Reducer: seconds a group may wait for all its ranks before its members are refused."},
  {"max_group_bytes", "RS_MAX_GROUP_BYTES", Kind::Size, true, double(kDefaultMaxGroupBytes), nullptr, 0, kNoLimit,
   nullptr, kReducer, "Reducer: largest reduction-buffer memory per group stream; a group asking more is refused."},
  {"max_memory_bytes", "RS_MAX_MEMORY", Kind::Size, true, 0, nullptr, 0, kNoLimit, nullptr, kReducer,
   "Reducer: reduction-buffer memory of all groups together (0: half of the physical memory)."},
  {"max_memory_per_job", "RS_MAX_MEMORY_PER_JOB", Kind::Size, true, 0, nullptr, 0, kNoLimit, nullptr, kReducer,
   "Reducer: reduction-buffer memory of one job id's groups together (0: half of max_memory_bytes)."},
  {"max_memory_per_peer", "RS_MAX_MEMORY_PER_PEER", Kind::Size, true, 0, nullptr, 0, kNoLimit, nullptr, kReducer,
   "Reducer: reduction-buffer memory charged to one IP address: slots x chunk per rank it connected, plus the "
   "accumulator of the groups where it is rank 0 (0: half of max_memory_bytes)."},
  {"memory_idle_timeout", "RS_MEMORY_IDLE_TIMEOUT", Kind::Seconds, true, kDefaultMemoryIdleTimeout, nullptr, 0, 0,
   nullptr, kReducer,
   "Reducer: seconds a complete group may receive nothing before it gives its memory back until its next chunk "
   "(0: never).",
   /*step=*/0, /*zero_ok=*/true},
  {"max_connections", "RS_MAX_CONNECTIONS", Kind::Int, true, kDefaultMaxConnections, nullptr, 1, 4294967295.0, nullptr,
   kReducer, "Reducer: open connections (at most the descriptor limit minus 64)."},
  {"max_connections_per_peer", "RS_MAX_CONNECTIONS_PER_PEER", Kind::Int, true, kDefaultMaxConnectionsPerPeer, nullptr,
   1, 4294967295.0, nullptr, kReducer, "Reducer: open connections from one IP address, in any state."},
  {"max_groups_per_peer", "RS_MAX_GROUPS_PER_PEER", Kind::Int, true, kDefaultMaxGroupsPerPeer, nullptr, 1,
   4294967295.0, nullptr, kReducer, "Reducer: live group streams created from one IP address."},
  {"nccl_socket_ifname", "RS_NCCL_SOCKET_IFNAME", Kind::Text, false, 0, nullptr, 0, 0, nullptr, kPlugin,
   "NCCL plugin: interface of its point-to-point TCP net (NCCL's syntax: prefixes, '=exact', '^exclude')."},
  {"nccl_nsocks", "RS_NCCL_NSOCKS", Kind::Int, true, kDefaultP2pSockets, nullptr, 1, kMaxP2pSockets, nullptr, kPlugin,
   "NCCL plugin: TCP sockets per point-to-point connection (1-16)."},
  {"nccl_p2p_plugin", "RS_NCCL_P2P_PLUGIN", Kind::Text, false, 0, nullptr, 0, 0, nullptr, kPlugin,
   "NCCL plugin: another NCCL net plugin that carries all point-to-point traffic."},
};
// clang-format on

// The row of a setting by its name; a name not in the table does not compile where constant.
constexpr const Spec& spec(std::string_view name) {
  for (const Spec& s : kTable)
    if (std::string_view(s.name) == name) return s;
  throw "no such setting";  // NOLINT: unreachable for the names used in the core
}

using Value = std::variant<bool, int64_t, double, std::string>;

// The value of `text` (nullopt when blank). `what` names the source in errors (default: the
// variable). Throws Error(Config) "WHAT='text' is not valid: why".
std::optional<Value> parse(const Spec& s, const std::string& text, const std::string& what = "");
// The default (nullopt when the setting has none).
std::optional<Value> default_value(const Spec& s);

// The text of a variable: nullopt when unset. Tests and bindings pass a map; the plugin getenv.
using EnvLookup = std::function<std::optional<std::string>(const char* var)>;
EnvLookup process_env();
// The variable's value parsed, else (unset or blank) nullopt.
std::optional<Value> read(const Spec& s, const EnvLookup& env);

// A seconds value given as a number (an argument, not text): `seconds` when it is finite, > 0 (or 0
// with zero_ok: "never" / "the default") and at most kMaxSeconds, else Error(Config)
// "WHAT=value is not valid: why" (the rule of Seconds text).
double check_seconds(double seconds, const std::string& what, bool zero_ok = false);

// The warning for a secret file (RS_AUTH_TOKEN_FILE, --auth-token-file) that its group or others
// may access (mode & 077, as ssh checks a private key), naming the file and its mode; "" when it
// is private to its owner or cannot be examined (reading it then says why). Every reader of a secret
// file logs it: the file is still used.
std::string secret_file_warning(const std::string& path);

// Typed helpers: the value of the variable, else the default.
bool read_bool(const Spec& s, const EnvLookup& env);
int64_t read_int(const Spec& s, const EnvLookup& env);  // Int and Size
double read_seconds(const Spec& s, const EnvLookup& env);
std::optional<std::string> read_text(const Spec& s, const EnvLookup& env);  // Text and Enum

}  // namespace rs::settings
