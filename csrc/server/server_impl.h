// The state the reducer's event loops share (server.h's Server::Impl): options, the listening
// socket, the limits shared by every loop and the counters behind Server::stats(). Each loop
// (server/loop.h) owns its own connections and groups; only what is here crosses loops.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "net/deadline.h"
#include "net/socket.h"
#include "server/limits.h"
#include "server/server.h"

namespace rs::server {

struct Loop;

// `seconds` in milliseconds, saturated (net::duration_of: never an overflow, whatever the value).
inline std::chrono::milliseconds ms(double seconds) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(net::duration_of(seconds));
}

struct Server::Impl {
  ServerOptions opts;
  std::vector<std::unique_ptr<Loop>> loops;
  mutable std::mutex loops_mu;  // group_stats() (any thread) against stop() clearing `loops`
  net::Fd listener;
  uint16_t port = 0;
  std::atomic<bool> running{false};
  std::atomic<bool> accepting{false};
  MemoryBudget budget;
  PeerTable peers;
  LogLimiter accept_log, refuse_log, reject_log;
  // stats
  std::atomic<uint64_t> bytes_received{0}, bytes_sent{0}, rounds_completed{0}, chunks_reduced{0};
  std::atomic<uint64_t> connections{0}, workers{0}, groups{0}, errors{0}, rejected{0}, over_limit{0};
  std::atomic<uint64_t> open_conns{0}, handshakes{0}, waiting{0};
  std::atomic<int64_t> busy_slots{0};
  std::atomic<bool> draining{false};
  std::vector<std::atomic<uint64_t>> latency_counts = std::vector<std::atomic<uint64_t>>(kLatencyBounds.size() + 1);
  std::atomic<uint64_t> latency_sum_us{0};

  void record_latency(double seconds) {
    size_t i = 0;
    while (i < kLatencyBounds.size() && seconds > kLatencyBounds[i]) ++i;
    latency_counts[i]++;
    latency_sum_us += uint64_t(seconds * 1e6);
  }

  // A log line that an attacker could repeat: let through a few per period, count the rest.
  static void log_limited(LogLimiter& lim, LogLevel level, const std::string& msg) {
    uint64_t dropped = 0;
    if (!lim.allow(&dropped)) return;
    log(level, dropped ? msg + " (" + std::to_string(dropped) + " similar lines suppressed)" : msg);
  }
};

}  // namespace rs::server
