#include "server/releases.h"

#include "common/error.h"
#include "common/raised.h"
#include "server/loop.h"

namespace rs::server {

void Releases::queue_clear(Conn* c) {
  proto::FrameHeader h;
  h.type = proto::FrameType::Clear;
  h.round = c->group->cleared();
  uint8_t hdr[proto::kFrameHeaderBytes];
  proto::encode(h, hdr);
  // The queue holds one result per slot plus a few control frames (reserved at join); one CLEAR at a time.
  if (!c->out.push(hdr, sizeof hdr, net::Payload::none(), kClearToken))
    throw Error(ErrorKind::Internal, "output queue of " + c->peer + " is full");
  c->clear_queued = true;
  c->clear_sent = h.round;
}

void Releases::on_done(Conn* c) {
  Group& g = *c->group;
  if (c->cur.round > c->done_round) c->done_round = c->cur.round;
  if (g.update_cleared()) mark_due(g);
}

void Releases::on_member_left(Group& g) {
  if (g.update_cleared()) {
    mark_due(g);
    flush_due();
  }
}

void Releases::mark_due(Group& g) {
  // Not written at once: the DONE that completes a release usually arrives with the data that
  // completes the next round's first chunk, so the CLEAR leaves with that chunk's result in
  // one write (one wake-up of the worker instead of two). flush_due() sends the CLEARs due
  // after the next data frame of this read, or when the connection's event is handled.
  g.for_each_member([&](Conn* m) {
    if (m->dead || m->close_after_flush || m->clear_due) return;
    m->clear_due = true;
    due_.push_back(m);
  });
}

void Releases::flush_due() {
  if (flushing_) return;  // called again from inside flush(): the loop below goes on
  Raised busy(flushing_);
  for (size_t i = 0; i < due_.size(); ++i) {  // (flush() may add more: read by index)
    Conn* c = due_[i];
    c->clear_due = false;
    loop_.out.flush(c);
  }
  due_.clear();
}

}  // namespace rs::server
