// What a reducer loop writes to its connections: control messages, error frames, handshake
// replies, and the flush that writes a connection's queue (results point into group slots, no
// copy) and hands each result whose last byte went out to the data path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "protocol/wire.h"

namespace rs::server {

struct Conn;
struct Loop;
struct Slot;

constexpr uint64_t kClearToken = 1;  // a CLEAR frame in a member's queue (results use their Slot*, aligned)

// An ERROR frame: its header (`code` in the flags, `tag`) and `msg` cut to kMaxMessageBytes.
std::string error_frame(proto::ErrorCode code, const std::string& msg, uint64_t tag = 0);

class Output {
 public:
  explicit Output(Loop& loop) : loop_(loop) {}

  // Registers the events the connection wants now (reading unless paused or closing, writing
  // while its queue holds something); no syscall if they did not change.
  void update_mask(Conn* c);
  void send_ctl(Conn* c, std::string bytes);
  // Results already queued go out first; the connection is closed after the error.
  void send_error(Conn* c, proto::ErrorCode code, const std::string& msg, uint64_t tag = 0);
  void send_reply(Conn* c, proto::Status status, const std::string& msg);
  // Writes what the connection's queue holds. Results whose last byte went out are handled after
  // the write (never from inside the writer: handling one may queue more on this connection).
  void flush(Conn* c);

 private:
  Loop& loop_;
  std::vector<Slot*> delivered_;  // results written, reused (no allocation per chunk)
};

}  // namespace rs::server
