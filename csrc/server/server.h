// The reducer node: accepts worker connections, reduces the chunks of every group it serves and
// streams the results back. Knows nothing of Python. Limits: docs/security.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/defaults.h"

namespace rs::server {

// Frame integrity (docs/security.md): Off refuses hellos that ask for it; On accepts hellos with
// and without; Required refuses hellos without. Auto: On with a shared secret, else Off. On and
// Required need a shared secret.
enum class IntegrityMode : uint8_t { Auto, Off, On, Required };
// "auto" / "" / "off" / "on" / "required"; false if unknown.
bool parse_integrity_mode(const std::string& s, IntegrityMode* out);
const char* integrity_mode_name(IntegrityMode m);

// The defaults are common/defaults.h's, which the settings table (common/settings.h: RS_HOST,
// RS_THREADS, RS_GROUP_SLOTS, ...) states too; reducer._core.SERVER_DEFAULTS is a default-made copy
// (tests/config/test_reducer_settings.py checks the two agree).
struct ServerOptions {
  std::string host = kDefaultReducerHost;
  uint16_t port = 0;                     // 0: any free port (the API's default; serve's: docs/deploy.md)
  int threads = kDefaultReducerThreads;  // event loops; 0: number of CPUs, at most 8
  std::string auth_token;                // the shared secret; empty: no authentication
  int group_slots = kDefaultGroupSlots;  // chunk slots per group stream (memory bound, see docs/protocol.md)
  double handshake_timeout = kDefaultHandshakeTimeout;  // seconds for a connection to complete its hello
  double group_timeout = kDefaultGroupTimeout;          // seconds for a group stream to gather all its ranks
  int socket_buffer = kDefaultSocketBuffer;
  uint64_t max_group_bytes = kDefaultMaxGroupBytes;  // reduction buffers per group stream
  uint64_t max_memory_bytes = 0;                     // all groups together; 0: half of the physical memory
  uint64_t max_memory_per_job = 0;                   // the groups of one job id; 0: half of max_memory_bytes
  uint64_t max_memory_per_peer = 0;                  // one IP address's part of the groups; 0: half of max_memory_bytes
  double memory_idle_timeout = kDefaultMemoryIdleTimeout;  // seconds idle before a group frees its memory; 0: never
  uint32_t max_connections = kDefaultMaxConnections;       // open connections; capped to the descriptor limit - 64
  uint32_t max_connections_per_peer = kDefaultMaxConnectionsPerPeer;  // per peer IP address, any state
  uint32_t max_groups_per_peer = kDefaultMaxGroupsPerPeer;  // live group streams created from one peer IP address
  IntegrityMode integrity = IntegrityMode::Auto;            // resolved by start()
};

struct ServerStats {
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t rounds_completed = 0;
  uint64_t chunks_reduced = 0;
  uint64_t connections = 0;         // open data connections (after handshake)
  uint64_t connected_workers = 0;   // open stream-0 connections: one per worker process
  uint64_t groups = 0;              // live groups (job, group) with members
  uint64_t handshakes = 0;          // connections still sending their hello
  uint64_t waiting = 0;             // connections in a group that is still gathering its ranks
  uint64_t errors = 0;              // connections closed because of an error
  uint64_t rejected = 0;            // handshakes refused (auth, version, conflicts, garbage, limits)
  uint64_t refused_over_limit = 0;  // connections or groups refused by a limit
  uint64_t memory_bytes = 0;        // reduction buffers reserved by groups
  uint64_t chunks_in_flight = 0;    // chunk slots claimed and not yet released (all groups)
  bool draining = false;            // drain(): no new groups
  // Round latency on the reducer (stream 0: first chunk claimed -> last result written), a
  // cumulative-free histogram: round_latency_counts[i] rounds took <= kLatencyBounds[i] seconds
  // (and more than the bound before); the last count is above the last bound.
  std::vector<uint64_t> round_latency_counts;
  double round_latency_sum = 0;  // seconds
};

// Upper bounds (seconds) of the round latency histogram's buckets.
extern const std::vector<double> kLatencyBounds;

// One group stream as the operators see it (a snapshot, refreshed by the loops every 250 ms).
struct GroupStat {
  std::string job;
  std::string group;
  uint16_t stream = 0;
  uint32_t world_size = 0;
  uint32_t connected = 0;
  bool complete = false;
  uint64_t rounds = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  std::string last_error;
  double age_s = 0;
  bool ended = false;  // one of the last groups that ended (no round can run in it any more)
};

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();           // binds and starts the event loops; throws Error(Config)
  uint16_t port() const;  // the bound port (valid after start)
  // Stop accepting, wait up to drain_timeout seconds for rounds in flight, then close everything.
  void stop(double drain_timeout = 0.0);
  // Stop creating groups: a hello for a group this reducer does not have gets ShuttingDown;
  // groups already here keep running (and may still gather their ranks). Idempotent.
  void drain();
  bool running() const;
  ServerStats stats() const;
  std::vector<GroupStat> group_stats() const;  // live groups and the last few that ended
  const ServerOptions& limits() const;         // the options in force (defaults resolved by start())

  struct Impl;  // opaque; public only so the event loops in server.cc can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace rs::server
