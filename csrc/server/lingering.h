// Lingering close (Conn::linger): after a connection's last frame (an error, a refusal) went
// out, it is shut for writing and its input is read and dropped until the peer closes or the
// linger time is over, so that input still in flight cannot make the kernel reset the
// connection and destroy that frame before the peer reads it.
#pragma once

#include <vector>

namespace rs::server {

struct Conn;
struct Loop;

class Lingering {
 public:
  explicit Lingering(Loop& loop) : loop_(loop) {}

  // Shuts `c` for writing (its queued frames are out: the peer reads them, then end of stream)
  // and watches its input only; false if that fails (then it is closed at once).
  bool start(Conn* c);
  // A lingering connection is readable: drop its input; it is closed at end of stream or an
  // error (or past its time: a peer that keeps sending is not drained for ever).
  void drain(Conn* c);
  // After a batch of events: closes the connections whose lingering ended in it.
  void close_done();
  // From the sweep: closes the connections past their linger time.
  void expire();

 private:
  void over(Conn* c);
  Loop& loop_;
  std::vector<Conn*> done_;  // lingering connections done: closed after the batch of events
};

}  // namespace rs::server
