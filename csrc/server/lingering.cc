#include "server/lingering.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>

#include "server/conn.h"
#include "server/loop.h"

namespace rs::server {

namespace {

// How long a connection closed after its last frame (an error, a refusal) keeps draining its
// input before it is closed anyway: time for the peer to read that frame and close (Conn::linger).
constexpr auto kLinger = std::chrono::milliseconds(2000);
constexpr size_t kLingerBudget = 1u << 20;  // input bytes dropped per wakeup while lingering

}  // namespace

bool Lingering::start(Conn* c) {
  if (::shutdown(c->fd.get(), SHUT_WR) != 0) return false;
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP;
  e.data.fd = c->fd.get();
  if (epoll_ctl(loop_.ep.get(), c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd.get(), &e) != 0) return false;
  c->registered = true;
  c->lingering = true;
  c->linger_until = net::Clock::now() + kLinger;
  return true;
}

void Lingering::drain(Conn* c) {
  static thread_local uint8_t sink[64 << 10];
  size_t got = 0;
  while (got < kLingerBudget) {
    ssize_t n = ::recv(c->fd.get(), sink, sizeof sink, MSG_DONTWAIT);
    if (n > 0) {
      got += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      return over(c);  // end of stream or an error
    }
  }
  if (net::Clock::now() >= c->linger_until) over(c);  // else: more at the next wakeup
}

// Closed after the current batch of events, like Loop::reap(): its fd number must not be reused
// (by an accept) while events of the batch may still name it.
void Lingering::over(Conn* c) {
  c->lingering = false;
  done_.push_back(c);
}

void Lingering::close_done() {
  for (Conn* c : done_) loop_.close_conn(c);
  done_.clear();
}

void Lingering::expire() {
  const auto now = net::Clock::now();
  std::vector<Conn*> due;
  for (auto& kv : loop_.conns)
    if (kv.second->lingering && now >= kv.second->linger_until) due.push_back(kv.second.get());
  for (Conn* c : due) loop_.close_conn(c);
}

}  // namespace rs::server
