// What the plugin reads from its environment (NCCL gives a plugin no other configuration):
// the reducers (the same discovery as reducer.init(): CLUSTER_SPEC, TF_CONFIG, RS_REDUCERS; the
// first two read by csrc/cluster/spec.h, the reader reducer.cluster uses too),
// the worker-client settings (RS_TIMEOUT, RS_STREAMS, ...), and the point-to-point net's
// interface and sockets per connection. Every malformed value is an rs::Error(Config) that
// names the variable.
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>
#include <vector>

#include "client/client.h"

namespace rs::nccl {

std::optional<std::string> getenv_str(const char* name);  // unset or blank: nullopt

struct ReducerPool {
  std::vector<std::string> reducers;  // "host:port"
  std::string job_id;
  std::string source;  // "CLUSTER_SPEC", "TF_CONFIG" or "RS_REDUCERS"
};
// nullopt when no source is set at all (CollNet then offers no device); throws on a malformed one.
std::optional<ReducerPool> discover_reducers();

// ClientOptions from the RS_* worker settings through the one reader (client/client_settings.h:
// read_client_options over the process environment; reducers, rank, world and group are the
// caller's); also applies RS_TCP_CONGESTION (default auto) process-wide (net::set_tcp_congestion).
client::ClientOptions client_options_from_env();

// Sockets per point-to-point connection: RS_NCCL_NSOCKS (1..16); else, when NCCL's own
// NCCL_NSOCKS_PERTHREAD or NCCL_SOCKET_NTHREADS is set, their product (NCCL's socket net
// semantics, capped at 16); else 2. The listening side's count is the connection's.
int p2p_sockets_from_env();
// Progress threads per point-to-point comm (each side its own): NCCL_SOCKET_NTHREADS (1..16),
// default 1, at most one per socket; socket s is moved by thread s % threads.
int p2p_threads_from_env();

// Seconds an accepted point-to-point connection has to send its hello: RS_HANDSHAKE_TIMEOUT
// (the reducer's setting of the same meaning), default 10 (common/settings.h).
double hello_timeout_from_env();

struct NetInterface {
  std::string name;  // "eth0"
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::string ip;        // text form
  std::string pci_path;  // /sys/devices/... or "" for virtual interfaces
  int speed_mbps = 0;
};
// The interface of the point-to-point net: RS_NCCL_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME
// (NCCL's syntax: comma-separated name prefixes, "=name" exact, "^..." excludes), else the
// first non-loopback interface that is up, else loopback. Throws Config if nothing matches.
NetInterface pick_interface();

}  // namespace rs::nccl
