#include "server/loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "common/error.h"
#include "common/log.h"

namespace rs::server {

void Loop::wake() {
  uint64_t one = 1;
  ssize_t r = ::write(ev.get(), &one, sizeof one);
  (void)r;
}

// The counter a state is counted in (handshakes, waiting), or none.
std::atomic<uint64_t>* Loop::counter_of(ConnState st) {
  switch (st) {
    case ConnState::Hello:
    case ConnState::Names: return &srv->handshakes;
    case ConnState::Waiting: return &srv->waiting;
    default: return nullptr;
  }
}

void Loop::set_state(Conn* c, ConnState st) {
  if (auto* old = counter_of(c->state)) (*old)--;
  if (auto* now = counter_of(st)) (*now)++;
  c->state = st;
}

void Loop::kill(Conn* c, const std::string& why, bool is_error, bool linger) {
  if (c->dead) return;
  c->dead = true;
  c->linger = linger;
  c->why = why;
  if (is_error && !c->error_counted) {
    srv->errors++;
    c->error_counted = true;
  }
  dying_.push_back(c);
}

bool Loop::handoff(Conn* c) {
  size_t owner = GroupKeyHash()(c->gkey) % srv->loops.size();
  if (owner == size_t(index)) {
    members.join(c);
    return false;
  }
  // Move the connection to the loop that owns its group. From here on `c` is that loop's.
  if (c->registered) epoll_ctl(ep.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  c->registered = false;
  auto it = conns.find(c->fd.get());
  std::unique_ptr<Conn> moved = std::move(it->second);
  conns.erase(it);
  Loop* dst = srv->loops[owner].get();
  {
    std::lock_guard<std::mutex> lock(dst->inbox_mu_);
    dst->inbox_.push_back(std::move(moved));
  }
  dst->wake();
  return true;
}

void Loop::drain_inbox() {
  std::vector<std::unique_ptr<Conn>> got;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    got.swap(inbox_);
  }
  for (auto& c : got) {
    Conn* raw = c.get();
    conns[raw->fd.get()] = std::move(c);
    members.join(raw);
  }
}

bool Loop::on_readable(Conn* c) {
  try {
    if (c->state == ConnState::Hello || c->state == ConnState::Names) return session.on_readable(c);
    if (c->state == ConnState::Waiting) {
      session.on_waiting_readable(c);
      return true;
    }
    data.read_data(c);
  } catch (const Error& e) {
    bool error = !(c->said_bye || c->close_after_flush);
    kill(c, e.what(), error);
  }
  return true;
}

// Nothing one connection does may take the reducer down: drop it (and fail its group).
void Loop::on_internal_error(Conn* c, const std::exception& e) {
  log_error("internal error on " + c->peer + ": " + e.what());
  if (c->member && c->group)
    members.fail_group(c->group, proto::ErrorCode::Internal, std::string("reducer error: ") + e.what());
  kill(c, std::string("internal error: ") + e.what(), true);
}

void Loop::on_event(const epoll_event& event) {
  const int fd = event.data.fd;
  const uint32_t ev_mask = event.events;
  if (fd == ev.get()) {
    uint64_t v;
    ssize_t r = ::read(ev.get(), &v, sizeof v);
    (void)r;
    drain_inbox();
    return;
  }
  if (index == 0 && srv->listener.valid() && fd == srv->listener.get()) {
    if (srv->accepting.load()) acceptor.accept_all();
    return;
  }
  auto it = conns.find(fd);
  if (it == conns.end()) return;
  Conn* c = it->second.get();
  if (c->lingering) lingering.drain(c);
  if (c->dead) return;
  try {
    if (ev_mask & EPOLLOUT) out.flush(c);
    if (!c->dead && (ev_mask & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !on_readable(c)) return;  // handed off
    if (!c->dead && (ev_mask & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) &&
        (c->paused || c->close_after_flush || c->state == ConnState::Leaving))
      kill(c,
           c->close_after_flush || c->state == ConnState::Leaving
               ? c->why
               : "peer closed the connection while its chunk was waiting",
           !c->close_after_flush && c->state != ConnState::Leaving);
    if (!c->dead && (ev_mask & (EPOLLIN | EPOLLRDHUP)) == EPOLLRDHUP && !c->paused && c->state != ConnState::Active &&
        c->state != ConnState::Leaving && !on_readable(c))
      return;  // handed off
  } catch (const std::exception& e) {
    on_internal_error(c, e);
  }
  releases.flush_due();
}

void Loop::reap() {
  releases.flush_due();  // (dead members are skipped by flush())
  while (!dying_.empty()) {
    std::vector<Conn*> batch;
    batch.swap(dying_);
    for (Conn* c : batch) {
      if (c->member) members.leave(c);
      else if (!c->close_after_flush) log_debug("closed " + c->peer + ": " + c->why);
      set_state(c, ConnState::Closing);
    }
    for (Conn* c : batch) {
      if (c->linger && lingering.start(c)) continue;
      close_conn(c);
    }
  }
}

void Loop::close_conn(Conn* c) {
  if (c->registered) epoll_ctl(ep.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  srv->open_conns--;
  conns.erase(c->fd.get());
}

void Loop::sweep() {
  session.sweep();
  members.expire_groups();
  reap();
  lingering.expire();
  stats.refresh(*table);
}

void Loop::run() {
  constexpr int kMaxEvents = 128;
  epoll_event events[kMaxEvents];
  auto last_sweep = net::Clock::now();
  while (!stop.load()) {
    int n = epoll_wait(ep.get(), events, kMaxEvents, acceptor.paused() ? 20 : 200);
    if (n < 0 && errno != EINTR) {
      log_error("epoll_wait failed: " + errno_text(errno));
      break;
    }
    for (int i = 0; i < n; ++i) on_event(events[i]);
    reap();
    lingering.close_done();
    if (index == 0) acceptor.resume_if_due();
    if (stats.requested()) stats.refresh(*table);
    auto now = net::Clock::now();
    if (now - last_sweep > std::chrono::milliseconds(250)) {
      sweep();
      last_sweep = now;
    }
  }
  shutdown_all();
}

void Loop::shutdown_all() {
  // Tell members, then drop every connection.
  for (auto& kv : conns) {
    Conn* c = kv.second.get();
    if (c->state == ConnState::Active && !c->dead) {
      const std::string frame = error_frame(proto::ErrorCode::Shutdown, "reducer is shutting down");
      c->out.send_now(c->fd.get(), c->peer, reinterpret_cast<const uint8_t*>(frame.data()), frame.size());
    }
    if (c->member) {
      c->why = "reducer shutting down";
      c->said_bye = true;
    }
  }
  for (auto& kv : conns) {
    Conn* c = kv.second.get();
    if (c->member) members.leave(c);
    set_state(c, ConnState::Closing);
    srv->open_conns--;
  }
  conns.clear();
  table->clear();
  stats.refresh(*table);
}

}  // namespace rs::server
