// The client's waits: which links can move bytes (an epoll set, net::ReadySet, kept in step with
// the links), the wait in wait()/start() for a round or a slot (drive), and the poll of the
// recovery's exchanges (poll_and_pump). The I/O itself is pump() (client.cc), under the lock.
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>

#include "client/client.h"
#include "client/recovery.h"
#include "client/round.h"

namespace rs::client {

void Client::watch(std::vector<pollfd>* pfds) {
  pfds->resize(links_.size());
  const bool short_of_copies = copies_short();
  for (size_t li = 0; li < links_.size(); ++li) {
    Link& l = *links_[li];
    if (l.corked && short_of_copies && !l.closed) {  // the DONEs waiting in the kernel go now
      net::push_pending(l.fd.get());
      l.corked = false;
    }
    fill(li);
    (*pfds)[li] = {l.closed ? -1 : l.fd.get(), short(POLLIN | (l.out.empty() ? 0 : POLLOUT)), 0};
  }
}

// Fills every link (watch), keeps the epoll set in step (every open link waits to be readable,
// and writable only once a write would have blocked), and marks the links with frames queued that
// may be written at once: sockets are writable nearly always, and asking the kernel first would
// cost a wake-up per frame. Then waits up to `ms` for the set (not at all if a write is due),
// without the lock if `lk`. The revents of `pfds` say which links can move bytes.
int Client::wait_ready(std::vector<pollfd>* pfds, std::vector<epoll_event>* events, int ms, Lock* lk, bool* woke) {
  watch(pfds);
  bool writes = false;
  for (size_t li = 0; li < links_.size(); ++li) {
    Link& l = *links_[li];
    pollfd& p = (*pfds)[li];
    p.revents = 0;
    const bool queued = !l.closed && !l.out.empty();
    const uint32_t want = l.closed ? 0u : uint32_t(EPOLLIN) | (queued && l.write_blocked ? uint32_t(EPOLLOUT) : 0u);
    ready_.track(li, l.closed ? -1 : l.fd.get(), want);
    if (queued && !l.write_blocked) {
      p.revents = POLLOUT;
      writes = true;
    }
  }
  if (writes) ms = 0;
  const bool unlock = lk && ms != 0;
  if (unlock) {
    pollers_++;
    lk->unlock();
  }
  const int pr = ready_.wait(ms, pfds->data(), pfds->size(), woke, events);
  const int err = errno;
  if (unlock) {
    lk->lock();
    pollers_--;
  }
  errno = err;
  return pr;
}

// Without waiting: which links can move bytes; only those are touched (no syscalls that would
// only report EAGAIN).
const pollfd* Client::poll_links() {
  bool woke = false;
  if (wait_ready(&pfds_, &events_, 0, nullptr, &woke) < 0 && errno != EINTR)
    throw Error(ErrorKind::Internal, std::string("epoll_wait failed: ") + errno_text(errno));
  return pfds_.data();
}

void Client::poll_and_pump(std::vector<pollfd>* pfds, int ms) {
  watch(pfds);
  int pr = net::poll_interruptible(pfds->data(), pfds->size(), ms, interrupt_);  // close() ends the wait
  if (pr < 0 && errno != EINTR) throw Error(ErrorKind::Internal, std::string("poll failed: ") + errno_text(errno));
  pump(pr > 0 ? pfds->data() : nullptr);
}

void Client::wake_waiters() {
  if (pollers_ == 0) return;
  uint64_t one = 1;
  ssize_t n = ::write(wake_.get(), &one, sizeof one);
  (void)n;
}

void Client::drive(Lock& lk, RoundId id, bool until_slot) {
  std::vector<pollfd> pfds;
  std::vector<epoll_event> events;  // this thread's own: several may wait at once
  for (;;) {
    if (until_slot) {
      if (running_ < size_t(opts_.max_rounds_in_flight)) return;
    } else {
      auto it = rounds_.find(id);
      if (it == rounds_.end() || it->second->state != Round::State::Running || it->second->released) return;
    }
    // Sleep until a socket is ready (at once if one is), another thread changed the state
    // (wake_), or the no-progress timer needs a look. I/O happens only with the lock held
    // (in pump); the wait is only a wake-up, so it runs unlocked and other threads keep going.
    const uint64_t gen = session_gen_;
    bool woke = false;
    const int pr = wait_ready(&pfds, &events, recovery_->poll_ms(), &lk, &woke);
    if (pr < 0 && errno != EINTR) {
      fail_all(ErrorKind::Internal, std::string("epoll_wait failed: ") + errno_text(errno));
      continue;
    }
    if (woke) {
      uint64_t v;
      ssize_t n = ::read(wake_.get(), &v, sizeof v);
      (void)n;
    }
    // The readiness applies only if the links are still the ones waited for.
    pump(gen == session_gen_ ? pfds.data() : nullptr);
  }
}

}  // namespace rs::client
