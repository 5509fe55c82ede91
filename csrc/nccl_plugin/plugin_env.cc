#include "nccl_plugin/plugin_env.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "client/client_settings.h"
#include "cluster/job.h"
#include "cluster/repr.h"
#include "cluster/spec.h"
#include "common/error.h"
#include "common/settings.h"
#include "common/text.h"
#include "net/address.h"
#include "protocol/plan.h"
#include "protocol/wire.h"

namespace rs::nccl {

std::optional<std::string> getenv_str(const char* name) {
  std::optional<std::string> v = settings::process_env()(name);
  if (v && trim(*v).empty()) return std::nullopt;
  return v;
}

namespace {

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
  if (const std::optional<cluster::Spec> spec = cluster::spec_from_env(settings::process_env())) {
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
  pool.job_id = cluster::resolve_job_id(settings::process_env());
  return pool;
}

client::ClientOptions client_options_from_env() {
  const settings::EnvLookup env = settings::process_env();
  client::ClientOptions o = client::read_client_options(env);
  // Process-wide, as in the worker library: every data connection the plugin opens from now on.
  const std::string cc = settings::read_text(settings::spec("tcp_congestion"), env).value_or("");
  try {
    net::set_tcp_congestion(cc);
  } catch (const Error& e) {
    bad("RS_TCP_CONGESTION", cc, e.what());
  }
  return o;
}

namespace {

// NCCL's own socket-net variables, read by the same integer rule as the RS_* settings.
constexpr settings::Spec kNcclThreads{"",
                                      "NCCL_SOCKET_NTHREADS",
                                      settings::Kind::Int,
                                      true,
                                      1,
                                      nullptr,
                                      1,
                                      16,
                                      nullptr,
                                      settings::kPlugin,
                                      "NCCL: progress threads per socket comm",
                                      0};
constexpr settings::Spec kNcclSocksPerThread{"",
                                             "NCCL_NSOCKS_PERTHREAD",
                                             settings::Kind::Int,
                                             true,
                                             1,
                                             nullptr,
                                             1,
                                             16,
                                             nullptr,
                                             settings::kPlugin,
                                             "NCCL: sockets per progress thread",
                                             0};

}  // namespace

int p2p_threads_from_env() { return int(settings::read_int(kNcclThreads, settings::process_env())); }

int p2p_sockets_from_env() {
  const settings::EnvLookup env = settings::process_env();
  if (settings::read(settings::spec("nccl_nsocks"), env))
    return int(settings::read_int(settings::spec("nccl_nsocks"), env));
  const bool per_thread = settings::read(kNcclSocksPerThread, env).has_value();
  if (!per_thread && !settings::read(kNcclThreads, env)) return kDefaultP2pSockets;
  const int n = int(settings::read_int(kNcclSocksPerThread, env));
  return std::min(kMaxP2pSockets, n * p2p_threads_from_env());  // NCCL's product, capped at the handle's 16
}

double hello_timeout_from_env() {
  return settings::read_seconds(settings::spec("handshake_timeout"), settings::process_env());
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
  else inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, host, sizeof host);
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
  const settings::Spec& own = settings::spec("nccl_socket_ifname");
  std::optional<std::string> filter = settings::read_text(own, settings::process_env());
  const char* var = own.env;
  if (!filter) {
    filter = getenv_str("NCCL_SOCKET_IFNAME");
    var = "NCCL_SOCKET_IFNAME";
  }
  IfAddrs ifs;
  if (getifaddrs(&ifs.list) != 0)
    throw Error(ErrorKind::Config, "cannot list network interfaces: " + errno_text(errno));
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
    throw Error(ErrorKind::Config,
                filter ? std::string(var) + "='" + *filter + "' matches no usable interface (found:" + seen + ")"
                       : std::string("no network interface with an IPv4/IPv6 address is up"));
  return describe(best);
}

}  // namespace rs::nccl
