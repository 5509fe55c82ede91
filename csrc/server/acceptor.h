// Loop 0's listening socket: accepts connections (a bounded batch per wakeup), enforces the
// connection caps (max_connections, max_connections_per_peer), sends each new connection its
// challenge, and backs off for 100 ms when the process runs out of descriptors or memory.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "net/socket.h"
#include "protocol/wire.h"

namespace rs::server {

struct Loop;

class Acceptor {
 public:
  explicit Acceptor(Loop& loop) : loop_(loop) {}

  void accept_all();
  bool paused() const { return paused_; }
  // Watches the listener again once the back-off is over (while the reducer accepts).
  void resume_if_due();

 private:
  void pause(int err);
  // Refuses a new connection over a cap (the caller closes `fd`). Unless `fd` is -1, the worker
  // gets a challenge and a reply OverLimit naming the cap: it raises that error at once.
  void refuse(int fd, const std::string& peer, const std::string& why);
  std::string challenge(const std::array<uint8_t, proto::kNonceBytes>& nonce) const;

  Loop& loop_;
  bool paused_ = false;  // back-off after EMFILE/ENFILE
  net::Clock::time_point resume_at_;
};

}  // namespace rs::server
