// The reducer (see server.h, docs/protocol.md, docs/security.md): options, start and stop,
// and the stats. The event loops are in server/loop.h.
//
// Threads: `threads` epoll loops. Loop 0 owns the listening socket and runs every handshake; a
// validated connection is handed to the loop that owns its group (hash of job, group, stream),
// so all state of a group is touched by one thread and needs no locks. Ownership of a
// connection moves with it (server/conn.h): after the hand-off loop 0 never touches it again.
// The stream index is part of the key: a worker's several streams to one reducer spread over
// loops.
#include "server/server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "net/socket.h"
#include "server/group_table.h"
#include "server/limits.h"
#include "server/loop.h"
#include "server/server_impl.h"

namespace rs::server {

using net::Clock;

const std::vector<double> kLatencyBounds = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
                                            0.2,    0.5,   1.0,   2.0,   5.0,  10.0, 30.0};

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.compare(0, 4, "127.") == 0;
}

}  // namespace

Server::Server(ServerOptions opts) : impl_(std::make_unique<Impl>()) { impl_->opts = std::move(opts); }

Server::~Server() {
  try {
    stop(0.0);
  } catch (...) {
  }
}

void Server::start() {
  Impl& s = *impl_;
  if (s.running) throw Error(ErrorKind::Config, "reducer already started");
  int threads = s.opts.threads;
  if (threads <= 0) threads = int(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  if (threads > kMaxReducerThreads)
    throw Error(ErrorKind::Config, "threads must be at most " + std::to_string(kMaxReducerThreads));
  if (s.opts.integrity == IntegrityMode::Auto)
    s.opts.integrity = s.opts.auth_token.empty() ? IntegrityMode::Off : IntegrityMode::On;
  if (s.opts.integrity != IntegrityMode::Off && s.opts.auth_token.empty())
    throw Error(ErrorKind::Config, std::string("frame integrity '") + integrity_mode_name(s.opts.integrity) +
                                       "' needs authentication: give the reducer a shared secret (--auth-token-file, "
                                       "RS_AUTH_TOKEN) or set integrity off");
  resolve_limits(s.opts);                               // server/limits.cc
  const net::Keepalive ka = net::keepalive_settings();  // a malformed RS_KEEPALIVE_*: Error(Config) here
  s.budget.set_limit(s.opts.max_memory_bytes);
  s.budget.set_shares(s.opts.max_memory_per_job, s.opts.max_memory_per_peer);
  s.listener = net::listen_on(s.opts.host, s.opts.port, &s.port);
  net::set_nonblocking(s.listener.get(), true);
  s.loops.clear();
  GroupLimits gl;
  gl.slots = s.opts.group_slots;
  gl.max_group_bytes = s.opts.max_group_bytes;
  gl.max_groups_per_peer = s.opts.max_groups_per_peer;
  for (int i = 0; i < threads; ++i) {
    auto l = std::make_unique<Loop>();
    l->srv = &s;
    l->index = i;
    l->table = std::make_unique<GroupTable>(gl, &s.budget, &s.peers, &s.groups);
    l->ep.reset(epoll_create1(EPOLL_CLOEXEC));
    l->ev.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!l->ep.valid() || !l->ev.valid()) throw Error(ErrorKind::Internal, "epoll/eventfd: " + errno_text(errno));
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = l->ev.get();
    epoll_ctl(l->ep.get(), EPOLL_CTL_ADD, l->ev.get(), &e);
    s.loops.push_back(std::move(l));
  }
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = s.listener.get();
  epoll_ctl(s.loops[0]->ep.get(), EPOLL_CTL_ADD, s.listener.get(), &e);
  s.accepting = true;
  s.running = true;
  for (auto& l : s.loops) {
    Loop* lp = l.get();
    lp->thread = std::thread([lp] { lp->run(); });
  }
  log_info("reducer listening on " + s.opts.host + ":" + std::to_string(s.port) + " with " +
           count_of(uint64_t(threads), "thread") + (s.opts.auth_token.empty() ? "" : ", authentication required") +
           (s.opts.integrity == IntegrityMode::Required ? ", frame integrity required"
            : s.opts.integrity == IntegrityMode::On     ? ", frame integrity offered"
                                                        : "") +
           "; limits: memory " + std::to_string(s.opts.max_memory_bytes >> 20) + " MiB (" +
           std::to_string(s.opts.max_memory_per_job >> 20) + " MiB per job, " +
           std::to_string(s.opts.max_memory_per_peer >> 20) + " MiB per address), " +
           std::to_string(s.opts.max_connections) + " connections (" + std::to_string(s.opts.max_connections_per_peer) +
           " per address); a silent dead peer is dropped after about " + std::to_string(ka.dead_after()) +
           " s (RS_KEEPALIVE_*, RS_TCP_USER_TIMEOUT)");
  if (s.opts.auth_token.empty() && !is_loopback(s.opts.host))
    log_warn("reducer on " + s.opts.host + ":" + std::to_string(s.port) +
             " has NO authentication: anyone who can reach this port can join any job's group, inject data into its "
             "sums and read them; set a shared secret (RS_AUTH_TOKEN or --auth-token-file) on reducers and workers, "
             "see docs/security.md");
}

bool parse_integrity_mode(const std::string& s, IntegrityMode* out) {
  if (s.empty() || s == "auto") *out = IntegrityMode::Auto;
  else if (s == "off") *out = IntegrityMode::Off;
  else if (s == "on") *out = IntegrityMode::On;
  else if (s == "required") *out = IntegrityMode::Required;
  else return false;
  return true;
}

const char* integrity_mode_name(IntegrityMode m) {
  switch (m) {
    case IntegrityMode::Off: return "off";
    case IntegrityMode::On: return "on";
    case IntegrityMode::Required: return "required";
    default: return "auto";
  }
}

uint16_t Server::port() const { return impl_->port; }

bool Server::running() const { return impl_->running.load(); }

const ServerOptions& Server::limits() const { return impl_->opts; }

void Server::stop(double drain_timeout) {
  Impl& s = *impl_;
  if (!s.running.exchange(false)) return;
  s.accepting = false;
  // No new connections from here on (epoll_ctl is thread-safe; loop 0 stops seeing the listener).
  if (!s.loops.empty()) epoll_ctl(s.loops[0]->ep.get(), EPOLL_CTL_DEL, s.listener.get(), nullptr);
  if (drain_timeout > 0) {
    auto deadline = Clock::now() + ms(drain_timeout);
    while (s.busy_slots.load() > 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (s.busy_slots.load() > 0) log_warn("stopping with rounds still in flight after the drain timeout");
  }
  for (auto& l : s.loops) {
    l->stop = true;
    l->wake();
  }
  for (auto& l : s.loops)
    if (l->thread.joinable()) l->thread.join();
  {
    std::lock_guard<std::mutex> lock(s.loops_mu);
    s.loops.clear();
  }
  s.listener.reset();
  log_info("reducer on port " + std::to_string(s.port) + " stopped");
}

void Server::drain() {
  if (!impl_->draining.exchange(true)) log_info("reducer draining: serving the groups it has, taking no new one");
}

ServerStats Server::stats() const {
  const Impl& s = *impl_;
  ServerStats st;
  st.bytes_received = s.bytes_received;
  st.bytes_sent = s.bytes_sent;
  st.rounds_completed = s.rounds_completed;
  st.chunks_reduced = s.chunks_reduced;
  st.connections = s.connections;
  st.connected_workers = s.workers;
  st.groups = s.groups;
  st.handshakes = s.handshakes;
  st.waiting = s.waiting;
  st.errors = s.errors;
  st.rejected = s.rejected;
  st.refused_over_limit = s.over_limit;
  st.memory_bytes = s.budget.used();
  st.chunks_in_flight = uint64_t(std::max<int64_t>(0, s.busy_slots.load()));
  st.draining = s.draining.load();
  for (const auto& c : s.latency_counts) st.round_latency_counts.push_back(c.load());
  st.round_latency_sum = double(s.latency_sum_us.load()) / 1e6;
  return st;
}

std::vector<GroupStat> Server::group_stats() const {
  std::vector<GroupStat> out;
  std::lock_guard<std::mutex> lock(impl_->loops_mu);
  if (!impl_->running.load()) return out;
  for (const auto& l : impl_->loops) l->stats.fresh(&out, std::chrono::milliseconds(500), [&] { l->wake(); });
  return out;
}

}  // namespace rs::server
