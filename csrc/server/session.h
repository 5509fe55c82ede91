// Drives a connection's handshake on loop 0 (docs/protocol.md section 1): reads the hello's
// fixed part and names, applies the decisions of server/handshake.h, refuses with a reply or
// hands the connection to the loop that owns its group; expires handshakes that take too long.
#pragma once

#include <string>

#include "protocol/wire.h"

namespace rs::server {

struct Conn;
struct Loop;

class Session {
 public:
  explicit Session(Loop& loop) : loop_(loop) {}

  // Reads what the hello has sent; false if the connection was handed to another loop (the
  // caller must not touch it again).
  bool on_readable(Conn* c);
  // A connection waiting for its group to complete may not send anything yet.
  void on_waiting_readable(Conn* c);
  // Refuses the hello: the reply with `status` and `msg`, then the connection is closed.
  void reject(Conn* c, proto::Status status, const std::string& msg);
  // Closes the connections whose handshake is past its deadline.
  void sweep();

 private:
  // What read() did with a connection.
  enum class Step {
    More,      // read something; call again
    Stop,      // nothing to read now, or refused: the connection is still this loop's
    HandedOff  // handed to the loop that owns its group: `c` must not be touched again
  };
  Step read(Conn* c);
  // The fixed part of the hello; false if it is incomplete or refused.
  bool read_fixed(Conn* c, Step* step);
  // An authenticated connection moves from its address's connection count to its job's; false
  // (refused with OverLimit) if the job is at max_connections_per_peer.
  bool account_to_job(Conn* c);

  Loop& loop_;
};

}  // namespace rs::server
