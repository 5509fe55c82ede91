// Joining and leaving groups on the loop that owns them: turns the outcomes of GroupTable
// (server/group_table.h) into replies, error frames, counters and log lines; fails groups and
// expires those that never gather their ranks.
#pragma once

#include <memory>
#include <string>

#include "protocol/wire.h"

namespace rs::server {

struct Conn;
struct Loop;
class Group;
struct JoinOutcome;

class Membership {
 public:
  explicit Membership(Loop& loop) : loop_(loop) {}

  // A validated connection joins its group (after the hand-off to this loop).
  void join(Conn* c);
  // A member's connection ends: the group learns it, and the others may get an error.
  void leave(Conn* c);
  // Fails a group: every remaining member gets an error frame and is closed.
  void fail_group(const std::shared_ptr<Group>& g, proto::ErrorCode code, const std::string& msg);
  // From the sweep: idle groups give their memory back; groups that never completed are refused.
  void expire_groups();
  // The error the others get when a member left: a failover goodbye names the lost reducers.
  static proto::ErrorCode end_code(const Group& g);

 private:
  void completed(const Group& g);  // every member gets Ok: data may flow
  // A joiner took the place of a connection of its rank: close that one (and end its group).
  void replaced(const JoinOutcome& j);
  Loop& loop_;
};

}  // namespace rs::server
