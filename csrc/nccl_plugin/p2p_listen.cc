#include "nccl_plugin/p2p_listen.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "common/error.h"
#include "nccl_plugin/plugin_log.h"
#include "protocol/wire.h"

namespace rs::nccl::p2p {

using proto::get_u16;
using proto::get_u32;
using proto::get_u64;

namespace {

constexpr uint32_t kHelloMagic = 0x484e5352u;  // "RSNH"
constexpr uint16_t kHelloVersion = 1;

// One limiter for every listener of the process: a flood spread over listeners stays quiet too.
LogLimiter& drop_log() {
  static LogLimiter limiter(5, std::chrono::seconds(10));
  return limiter;
}

void drop(const std::string& peer, const std::string& why) {
  drop_log().warn("accept: dropping a connection from " + peer + ": " + why);
}

}  // namespace

Hello make_hello(uint16_t index, uint16_t nsocks, uint64_t listen_nonce, uint64_t conn_id) {
  Hello h{};
  proto::put_u32(h.data(), kHelloMagic);
  proto::put_u16(h.data() + 4, kHelloVersion);
  proto::put_u16(h.data() + 6, index);
  proto::put_u16(h.data() + 8, nsocks);
  proto::put_u64(h.data() + 16, listen_nonce);
  proto::put_u64(h.data() + 24, conn_id);
  return h;
}

Listener::Listener(net::Fd fd, uint64_t nonce, int nsocks, Clock::duration hello_timeout)
    : fd_(std::move(fd)), nonce_(nonce), nsocks_(nsocks), timeout_(hello_timeout) {}

std::string Listener::timeout_text() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", std::chrono::duration<double>(timeout_).count());
  return buf;
}

std::optional<Accepted> Listener::poll() {
  const Clock::time_point now = Clock::now();
  expire(now);
  accept_queued(now);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (step(*it, now)) it = pending_.erase(it);
    else ++it;
  }
  return take_complete();
}

void Listener::expire(Clock::time_point now) {
  while (!pending_.empty() && now - pending_.front().since >= timeout_) {
    drop(pending_.front().peer, "no hello within " + timeout_text() + " (RS_HANDSHAKE_TIMEOUT)");
    pending_.pop_front();
  }
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (now - it->second.since < timeout_) {
      ++it;
      continue;
    }
    const auto in =
        std::count_if(it->second.socks.begin(), it->second.socks.end(), [](const net::Fd& f) { return f.valid(); });
    drop(it->second.peer, std::to_string(in) + " of " + std::to_string(it->second.socks.size()) +
                              " sockets sent their hello within " + timeout_text());
    it = groups_.erase(it);
  }
}

void Listener::accept_queued(Clock::time_point now) {
  for (size_t n = 0; n < kMaxAcceptsPerPoll; ++n) {
    int fd = ::accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      throw Error(ErrorKind::Internal, "accept: " + errno_text(errno));
    }
    Pending p{net::Fd(fd), net::peer_name(fd), {}, now};
    p.source = p.peer.substr(0, p.peer.rfind(':'));
    if (step(p, now)) continue;  // its hello was already there (or it was dropped)
    pending_.push_back(std::move(p));
    if (pending_.size() > kMaxPending) evict_one();
  }
}

void Listener::evict_one() {
  // The source holding the most places (of equals, the first to reach that count, oldest first).
  std::map<std::string_view, size_t> share;
  std::string_view top;
  size_t most = 0;
  for (const Pending& q : pending_) {
    const size_t n = ++share[q.source];
    if (n > most) most = n, top = q.source;
  }
  auto victim = pending_.end();
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->source != top) continue;
    if (victim == pending_.end()) victim = it;  // its oldest, if all of them are in progress
    if (it->got == 0) {
      victim = it;  // its oldest that has sent nothing
      break;
    }
  }
  drop(victim->peer, std::to_string(kMaxPending) + " connections wait for their hello, " + std::to_string(most) +
                         " of them from " + victim->source + ": closing one");
  pending_.erase(victim);
}

bool Listener::step(Pending& p, Clock::time_point now) {
  try {
    ssize_t got = net::recv_some(p.fd.get(), p.hello.data() + p.got, kHelloBytes - p.got, p.peer);
    if (got > 0) p.got += size_t(got);
  } catch (const Error& e) {
    drop(p.peer, e.what());
    return true;
  }
  if (p.got < kHelloBytes) return false;
  file(p, now);
  return true;
}

void Listener::file(Pending& p, Clock::time_point now) {
  const uint8_t* h = p.hello.data();
  const uint16_t index = get_u16(h + 6), n = get_u16(h + 8);
  if (get_u32(h) != kHelloMagic || get_u16(h + 4) != kHelloVersion) return drop(p.peer, "not a hello of this plugin");
  if (get_u64(h + 16) != nonce_) return drop(p.peer, "hello for another listener");
  if (n != nsocks_ || index >= n)
    return drop(p.peer, "bad socket index " + std::to_string(index) + "/" + std::to_string(n));
  const uint64_t id = get_u64(h + 24);
  auto it = groups_.find(id);
  if (it == groups_.end()) {
    if (groups_.size() >= kMaxGroups) {
      auto oldest = std::min_element(groups_.begin(), groups_.end(),
                                     [](const auto& a, const auto& b) { return a.second.since < b.second.since; });
      drop(oldest->second.peer, std::to_string(kMaxGroups) + " connections are incomplete: closing the oldest");
      groups_.erase(oldest);
    }
    it = groups_.emplace(id, Group{std::vector<net::Fd>(n), p.peer, now}).first;
  }
  if (it->second.socks[index].valid()) return drop(p.peer, "socket index " + std::to_string(index) + " sent twice");
  it->second.socks[index] = std::move(p.fd);
}

std::optional<Accepted> Listener::take_complete() {
  for (auto it = groups_.begin(); it != groups_.end(); ++it) {
    auto& socks = it->second.socks;
    if (!std::all_of(socks.begin(), socks.end(), [](const net::Fd& f) { return f.valid(); })) continue;
    Accepted a;
    a.socks = std::move(socks);
    a.peer = net::peer_name(a.socks[0].get());
    groups_.erase(it);
    return a;
  }
  return std::nullopt;
}

}  // namespace rs::nccl::p2p
