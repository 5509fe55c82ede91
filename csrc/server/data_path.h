// The data path of a loop (docs/protocol.md section 2): data frames are read straight into a
// group slot's receive buffers, reduced when every rank has sent its part, and the result is
// queued to every member (pointing into the slot, no copy); the slot is freed once the result
// is written to all of them. Also the other frames a member may send (BYE, DONE).
#pragma once

#include <string>

#include "net/frame_io.h"
#include "protocol/wire.h"

namespace rs::server {

struct Conn;
struct Loop;
struct Slot;

class DataPath {
 public:
  explicit DataPath(Loop& loop) : loop_(loop) {}

  // Reads the frames of an active member. Errors end this connection only (also when called
  // for another connection's event).
  void read_data(Conn* c);
  // A result was written to member `c` (from Output::flush): the slot is freed after the last.
  void result_delivered(Conn* c, Slot* s);

 private:
  net::Sink on_header(Conn* c, const proto::FrameHeader& h, const std::string& decode_error);
  bool on_frame(Conn* c);  // false stops reading this connection for now
  bool try_claim(Conn* c);
  void on_bye(Conn* c);
  void on_payload(Conn* c);
  void protocol_error(Conn* c, const std::string& err);

  Loop& loop_;
};

}  // namespace rs::server
