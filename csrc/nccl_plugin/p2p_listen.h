// The listening side of the point-to-point net: accepts TCP connections, reads each socket's
// 32-byte hello and groups the sockets of one connection (NCCL's accept()).
//
// The listener lives in the training process, and anyone who can reach its port can connect
// without a word. So it is bounded: at most kMaxPending accepted sockets wait for their hello,
// each for at most the hello timeout (RS_HANDSHAKE_TIMEOUT,
// default 10 s); connections with some but not all hellos in are bounded the same way
// (kMaxGroups, the same timeout). Every drop is logged through one rate limiter (plugin_log.h).
//
// When a new socket finds every waiting place taken, one waiting socket is closed: one from the
// source address that holds the most places (a flood from a few addresses evicts itself, not a
// peer whose hello is a little late), and of that address's sockets the oldest that has sent
// nothing yet (a socket part-way through its hello is making progress: kept while there is another).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "net/socket.h"

namespace rs::nccl::p2p {

// ---- the hello each connecting socket sends (32 bytes, little-endian) ----------------------
// [0,4) magic  [4,6) version  [6,8) socket index  [8,10) sockets  [16,24) listen nonce  [24,32) connection id
constexpr size_t kHelloBytes = 32;
using Hello = std::array<uint8_t, kHelloBytes>;
Hello make_hello(uint16_t index, uint16_t nsocks, uint64_t listen_nonce, uint64_t conn_id);

// A connection whose every socket sent its hello: the sockets by index.
struct Accepted {
  std::vector<net::Fd> socks;
  std::string peer;  // "host:port" of socket 0
};

class Listener {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxPending = 64;  // accepted sockets waiting for their hello
  static constexpr size_t kMaxGroups = 16;   // connections with some, not all, hellos in
  static constexpr size_t kMaxAcceptsPerPoll = 512;

  Listener(net::Fd fd, uint64_t nonce, int nsocks, Clock::duration hello_timeout);

  // Non-blocking (NCCL's accept()): takes the connections the kernel queued, reads hellos,
  // closes the expired and the evicted; returns a complete connection if there is one.
  std::optional<Accepted> poll();

  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    net::Fd fd;
    std::string peer;
    std::string source;  // the peer's address without the port
    Clock::time_point since;
    Hello hello{};
    size_t got = 0;
  };
  struct Group {
    std::vector<net::Fd> socks;
    std::string peer;
    Clock::time_point since;
  };

  void expire(Clock::time_point now);
  void accept_queued(Clock::time_point now);
  void evict_one();                              // closes one waiting socket (see above)
  bool step(Pending& p, Clock::time_point now);  // true: finished (filed in a group, or dropped)
  void file(Pending& p, Clock::time_point now);
  std::optional<Accepted> take_complete();
  std::string timeout_text() const;

  net::Fd fd_;
  uint64_t nonce_;
  int nsocks_;
  Clock::duration timeout_;
  std::deque<Pending> pending_;       // oldest first
  std::map<uint64_t, Group> groups_;  // connection id -> sockets so far
};

}  // namespace rs::nccl::p2p
