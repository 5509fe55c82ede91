// Which of a session's sockets can move bytes, at the cost of the ready ones: an epoll set over
// the links' sockets and a wake-up eventfd, kept in step with what each link waits for. A wait
// with poll() costs every socket of the set each time (the kernel asks each one), and a worker
// wakes about once per result frame: at W = R = 32 the workers' polls over 33 sockets were 14% of
// the machine (docs/performance.md, "A wake-up costs the ready links"). Level-triggered: a link
// read only in part (its turn's byte budget) is reported again.
#pragma once

#include <poll.h>
#include <sys/epoll.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "net/socket.h"

namespace rs::net {

class ReadySet {
 public:
  ReadySet();  // throws Internal if the kernel gives no epoll instance
  // Link i (socket `fd`) waits for `events` (EPOLLIN / EPOLLOUT; 0: for nothing, e.g. closed).
  // Only a change costs a system call.
  void track(size_t i, int fd, uint32_t events);
  // Drops every link's registration while their sockets are still open (before they close: a
  // socket a forked child still holds would otherwise stay in the set under a stale index).
  void forget_all();
  // Waits up to `ms` (0: not at all, -1: for ever) and ORs the poll bits of each ready link i < n
  // into ready[i].revents; `*woke` says whether the wake-up eventfd fired (it is not read here).
  // Returns what epoll_wait returned (-1 with errno set). Safe without the caller's lock, beside
  // track() from another thread: `events` is the caller's own buffer.
  int wait(int ms, pollfd* ready, size_t n, bool* woke, std::vector<epoll_event>* events) const;
  void watch_wake(int fd);  // the eventfd whose readability wait() reports as *woke

 private:
  struct Entry {
    int fd = -1;
    uint32_t events = 0;  // registered (0: not in the set)
  };
  Fd ep_;
  std::vector<Entry> links_;
};

}  // namespace rs::net
