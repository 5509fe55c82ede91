#include "nccl_plugin/plugin_env.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <climits>
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "cluster/repr.h"
#include "cluster/spec.h"
#include "common/error.h"
#include "net/socket.h"
#include "protocol/plan.h"
#include "protocol/wire.h"

namespace rs::nccl {

std::optional<std::string> getenv_str(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  std::string s(v);
  if (s.find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  return s;
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// As reducer/config.py reads booleans and modes: trimmed, case-insensitive.
std::string lower_trim(const std::string& s) {
  std::string t = trim(s);
  for (char& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

[[noreturn]] void bad(const char* var, const std::string& raw, const std::string& why) {
  throw Error(ErrorKind::Config, std::string(var) + "='" + raw + "' is not valid: " + why);
}

long long parse_int(const char* var, const std::string& raw, long long lo, long long hi) {
  std::string t = trim(raw);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || *end != '\0' || errno == ERANGE) bad(var, raw, "expected an integer");
  if (v < lo || v > hi) bad(var, raw, "out of range " + std::to_string(lo) + ".." + std::to_string(hi));
  return v;
}

double parse_seconds(const char* var, const std::string& raw) {
  std::string t = trim(raw);
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0' || !std::isfinite(v) || v <= 0) bad(var, raw, "expected a positive number of seconds");
  return v;
}

// Bytes with an optional K/M/G/T suffix (powers of 1024), as reducer/config.py reads sizes.
uint64_t parse_size(const char* var, const std::string& raw) {
  std::string t = trim(raw);
  for (auto& c : t) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (!t.empty() && t.back() == 'B') t.pop_back();
  if (!t.empty() && t.back() == 'I') t.pop_back();
  double mult = 1;
  if (!t.empty() && std::strchr("KMGT", t.back())) {
    mult = std::pow(1024.0, double(std::strchr("KMGT", t.back()) - "KMGT" + 1));
    t.pop_back();
  }
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0' || !std::isfinite(v) || v < 0) bad(var, raw, "expected a size in bytes such as 4M");
  double bytes = v * mult;
  if (bytes != std::floor(bytes) || bytes > 9.0e18) bad(var, raw, "expected a whole number of bytes");
  return uint64_t(bytes);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The reducer pool of a CLUSTER_SPEC / TF_CONFIG (read by csrc/cluster/, as reducer.cluster reads
// it), with RS_PORT replacing their ports.
std::vector<std::string> pool_addresses(const cluster::Spec& spec) {
  const std::vector<std::string>& entries = spec.pool(spec.reducer_pool);
  if (entries.empty()) throw Error(ErrorKind::Config, spec.missing_reducers());
  std::optional<uint16_t> port;
  if (auto p = getenv_str("RS_PORT")) port = uint16_t(parse_int("RS_PORT", *p, 1, 65535));
  std::vector<std::string> out;
  for (const auto& e : entries) {
    net::HostPort hp;
    try {
      hp = net::parse_host_port(trim(e));
    } catch (const Error& err) {
      throw Error(ErrorKind::Config, spec.source + ": bad reducer address: " + err.what());
    }
    if (port) hp.port = *port;
    out.push_back(hp.str());
  }
  return out;
}

}  // namespace

std::optional<ReducerPool> discover_reducers() {
  ReducerPool pool;
  const auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  if (const std::optional<cluster::Spec> spec = cluster::spec_from_env(env)) {
    pool.source = spec->source;
    pool.reducers = pool_addresses(*spec);
  } else if (auto list = getenv_str("RS_REDUCERS")) {
    pool.source = "RS_REDUCERS";
    for (const auto& a : split_list(*list)) {
      try {
        pool.reducers.push_back(net::parse_host_port(a).str());
      } catch (const Error& err) {
        throw Error(ErrorKind::Config, std::string("RS_REDUCERS: bad reducer address: ") + err.what());
      }
    }
    if (pool.reducers.empty())
      throw Error(ErrorKind::Config, "RS_REDUCERS: the reducer pool is empty; at least one reducer address is needed");
  } else {
    return std::nullopt;
  }
  std::set<std::string> seen;
  for (const auto& a : pool.reducers)
    if (!seen.insert(a).second)
      throw Error(ErrorKind::Config, pool.source + ": reducer address " + cluster::py_repr(a) + " is listed twice");
  if (auto job = getenv_str("RS_JOB_ID")) pool.job_id = trim(*job);
  else if (auto cloud = getenv_str("CLOUD_ML_JOB_ID")) pool.job_id = trim(*cloud);
  else pool.job_id = "local";
  return pool;
}

client::ClientOptions client_options_from_env() {
  client::ClientOptions o;
  if (auto v = getenv_str("RS_TIMEOUT")) o.timeout = parse_seconds("RS_TIMEOUT", *v);
  if (auto v = getenv_str("RS_CONNECT_TIMEOUT")) o.connect_timeout = parse_seconds("RS_CONNECT_TIMEOUT", *v);
  if (auto v = getenv_str("RS_STREAMS")) o.streams = int(parse_int("RS_STREAMS", *v, 1, proto::kMaxStreams));
  if (auto v = getenv_str("RS_CHUNK_BYTES")) {
    uint64_t c = parse_size("RS_CHUNK_BYTES", *v);
    std::string why = proto::check_chunk_bytes(c);  // the rule of the client, the ring and the hello check
    if (!why.empty()) bad("RS_CHUNK_BYTES", *v, why);
    o.chunk_bytes = uint32_t(c);
  }
  if (auto v = getenv_str("RS_WINDOW")) o.window = int(parse_int("RS_WINDOW", *v, 1, 1024));
  // Process-wide, as in the worker library: every data connection the plugin opens from now on.
  const std::string cc = trim(getenv_str("RS_TCP_CONGESTION").value_or("auto"));
  try {
    net::set_tcp_congestion(cc);
  } catch (const Error& e) {
    bad("RS_TCP_CONGESTION", cc, e.what());
  }
  if (auto v = getenv_str("RS_FAILOVER")) {
    const std::string t = lower_trim(*v);
    if (t == "1" || t == "true" || t == "yes" || t == "on") o.failover = true;
    else if (t == "0" || t == "false" || t == "no" || t == "off") o.failover = false;
    else if (!t.empty()) bad("RS_FAILOVER", *v, "expected true or false");
  }
  if (auto v = getenv_str("RS_SOCKET_BUFFER")) {
    uint64_t b = parse_size("RS_SOCKET_BUFFER", *v);
    if (b > uint64_t(INT_MAX)) bad("RS_SOCKET_BUFFER", *v, "larger than 2 GiB");
    o.socket_buffer = int(b);
  }
  if (auto v = getenv_str("RS_AUTH_TOKEN")) {
    o.auth_token = *v;
  } else if (auto f = getenv_str("RS_AUTH_TOKEN_FILE")) {
    std::string secret = trim(read_file(*f));
    if (secret.empty()) bad("RS_AUTH_TOKEN_FILE", *f, "the file cannot be read or is empty");
    o.auth_token = secret;
  }
  if (auto v = getenv_str("RS_INTEGRITY")) {
    const std::string mode = lower_trim(*v);
    if (mode != "off" && mode != "on" && mode != "required") bad("RS_INTEGRITY", *v, "must be off, on or required");
    o.integrity = mode != "off";  // a worker that asks for it never falls back
  }
  return o;
}

int p2p_threads_from_env() {
  if (auto v = getenv_str("NCCL_SOCKET_NTHREADS")) return int(parse_int("NCCL_SOCKET_NTHREADS", *v, 1, 16));
  return 1;
}

int p2p_sockets_from_env() {
  if (auto v = getenv_str("RS_NCCL_NSOCKS")) return int(parse_int("RS_NCCL_NSOCKS", *v, 1, 16));
  auto per_thread = getenv_str("NCCL_NSOCKS_PERTHREAD");
  if (!per_thread && !getenv_str("NCCL_SOCKET_NTHREADS")) return 2;
  const int n = per_thread ? int(parse_int("NCCL_NSOCKS_PERTHREAD", *per_thread, 1, 16)) : 1;
  return std::min(16, n * p2p_threads_from_env());  // NCCL's product, capped at the handle's 16
}

double hello_timeout_from_env() {
  if (auto v = getenv_str("RS_HANDSHAKE_TIMEOUT")) return parse_seconds("RS_HANDSHAKE_TIMEOUT", *v);
  return 10.0;
}

namespace {

struct IfAddrs {
  ifaddrs* list = nullptr;
  ~IfAddrs() {
    if (list) freeifaddrs(list);
  }
};

// NCCL's interface filter syntax: "^" excludes; "=" asks for exact names; else name prefixes.
bool matches(const std::string& filter, const std::string& name) {
  std::string f = filter;
  bool exclude = false, exact = false;
  if (!f.empty() && f[0] == '^') {
    exclude = true;
    f = f.substr(1);
  }
  if (!f.empty() && f[0] == '=') {
    exact = true;
    f = f.substr(1);
  }
  bool hit = false;
  for (const auto& p : split_list(f))
    if (exact ? name == p : name.compare(0, p.size(), p) == 0) hit = true;
  return exclude ? !hit : hit;
}

NetInterface describe(const ifaddrs* a) {
  NetInterface ni;
  ni.name = a->ifa_name;
  ni.addr_len = a->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(&ni.addr, a->ifa_addr, ni.addr_len);
  char host[INET6_ADDRSTRLEN] = "?";
  if (a->ifa_addr->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, host, sizeof host);
  else
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, host, sizeof host);
  ni.ip = host;
  char resolved[PATH_MAX];
  std::string dev = "/sys/class/net/" + ni.name + "/device";
  if (realpath(dev.c_str(), resolved)) ni.pci_path = resolved;
  std::string speed = trim(read_file("/sys/class/net/" + ni.name + "/speed"));
  int s = speed.empty() ? 0 : std::atoi(speed.c_str());
  ni.speed_mbps = s > 0 ? s : 10000;
  return ni;
}

}  // namespace

NetInterface pick_interface() {
  std::optional<std::string> filter = getenv_str("RS_NCCL_SOCKET_IFNAME");
  const char* var = "RS_NCCL_SOCKET_IFNAME";
  if (!filter) {
    filter = getenv_str("NCCL_SOCKET_IFNAME");
    var = "NCCL_SOCKET_IFNAME";
  }
  IfAddrs ifs;
  if (getifaddrs(&ifs.list) != 0) throw Error(ErrorKind::Config, "cannot list network interfaces: " + errno_text(errno));
  const ifaddrs* best = nullptr;
  int best_rank = INT_MAX;
  std::string seen;
  for (const ifaddrs* a = ifs.list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !(a->ifa_flags & IFF_UP)) continue;
    int fam = a->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (fam == AF_INET6) {
      const auto* s6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) continue;  // would need a scope id in the handle
    }
    std::string name = a->ifa_name;
    if (seen.find(" " + name + " ") == std::string::npos) seen += " " + name + " ";
    bool loop = (a->ifa_flags & IFF_LOOPBACK) != 0;
    if (filter && !matches(*filter, name)) continue;
    // Without a filter: any non-loopback interface before loopback; IPv4 before IPv6.
    int rank = (filter ? 0 : (loop ? 2 : 0)) + (fam == AF_INET ? 0 : 1);
    if (rank < best_rank) {
      best = a;
      best_rank = rank;
    }
  }
  if (!best)
    throw Error(ErrorKind::Config, filter ? std::string(var) + "='" + *filter + "' matches no usable interface (found:" +
                                                seen + ")"
                                          : std::string("no network interface with an IPv4/IPv6 address is up"));
  return describe(best);
}

}  // namespace rs::nccl
