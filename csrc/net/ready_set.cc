#include "net/ready_set.h"

#include <cerrno>
#include <string>

#include "common/error.h"

namespace rs::net {

namespace {
constexpr uint64_t kWakeKey = ~uint64_t(0);

void ctl(int ep, int op, int fd, uint32_t events, uint64_t key) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = key;
  if (::epoll_ctl(ep, op, fd, &ev) == 0) return;
  const int err = errno;
  if (op == EPOLL_CTL_ADD && err == EEXIST && ::epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) == 0) return;
  if (op == EPOLL_CTL_DEL && (err == EBADF || err == ENOENT)) return;  // gone already
  throw Error(ErrorKind::Internal, "epoll_ctl on socket " + std::to_string(fd) + " failed: " + errno_text(err));
}
}  // namespace

ReadySet::ReadySet() : ep_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (!ep_.valid()) throw Error(ErrorKind::Internal, "epoll_create1 failed: " + errno_text(errno));
}

void ReadySet::watch_wake(int fd) { ctl(ep_.get(), EPOLL_CTL_ADD, fd, EPOLLIN, kWakeKey); }

void ReadySet::track(size_t i, int fd, uint32_t events) {
  if (i >= links_.size()) links_.resize(i + 1);
  Entry& e = links_[i];
  if (e.fd != fd && e.events != 0) {  // another socket under this index: the old one goes first
    ctl(ep_.get(), EPOLL_CTL_DEL, e.fd, 0, 0);
    e.events = 0;
  }
  e.fd = fd;
  if (fd < 0) events = 0;
  if (events == e.events) return;
  if (events == 0) ctl(ep_.get(), EPOLL_CTL_DEL, fd, 0, 0);
  else ctl(ep_.get(), e.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, events, uint64_t(i));
  e.events = events;
}

void ReadySet::forget_all() {
  for (Entry& e : links_)
    if (e.events != 0) ctl(ep_.get(), EPOLL_CTL_DEL, e.fd, 0, 0);
  links_.clear();
}

int ReadySet::wait(int ms, pollfd* ready, size_t n, bool* woke, std::vector<epoll_event>* events) const {
  *woke = false;
  if (events->size() < n + 1) events->resize(n + 1);
  const int got = ::epoll_wait(ep_.get(), events->data(), int(events->size()), ms);
  for (int k = 0; k < got; ++k) {
    const epoll_event& ev = (*events)[size_t(k)];
    if (ev.data.u64 == kWakeKey) {
      *woke = true;
      continue;
    }
    // EPOLLIN/OUT/ERR/HUP are POLLIN/OUT/ERR/HUP's bits. An index past `n` is a link of another
    // session (a wait without the lock may race a reconnect): the caller drops the readiness then.
    if (ev.data.u64 < n) ready[ev.data.u64].revents |= short(ev.events & (EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP));
  }
  return got;
}

}  // namespace rs::net
