// Releases of a failover group (docs/protocol.md, FrameType::Done / Clear): the DONEs members
// send, and the cumulative CLEAR each member is owed once every member holds a round's results.
#pragma once

#include <vector>

#include "server/conn.h"

namespace rs::server {

struct Loop;

class Releases {
 public:
  explicit Releases(Loop& loop) : loop_(loop) {}

  // Whether `c` is owed a CLEAR that is not in its queue yet (and may still get one).
  static bool owes_clear(const Conn* c) {
    return !c->clear_queued && c->group && c->clear_sent < c->group->cleared() && !c->close_after_flush;
  }
  // Puts the group's newest CLEAR in the member's queue (Output::flush writes it).
  void queue_clear(Conn* c);
  // A DONE frame from `c` (its header in c->cur).
  void on_done(Conn* c);
  // A member left the group between rounds: the others' own DONEs may now earn them a CLEAR.
  void on_member_left(Group& g);
  bool any_due() const { return !due_.empty(); }
  // After a data frame, after each event and first thing in reap() (so no connection in
  // `due_` is freed while listed): every member owed a CLEAR gets it.
  void flush_due();

 private:
  void mark_due(Group& g);  // every member owed the group's new CLEAR joins due_

  Loop& loop_;
  std::vector<Conn*> due_;  // members owed a CLEAR
  bool flushing_ = false;
};

}  // namespace rs::server
