// Group membership rules of one event loop: who may join which group stream, when a group is
// complete, what a member's departure means for the others, and when a group that never
// completes expires. No sockets and no I/O: the caller (membership.cc) turns the outcomes into
// replies, error frames and log lines. Members are opaque handles (Conn*), never dereferenced.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "protocol/wire.h"
#include "server/group.h"
#include "server/limits.h"

namespace rs::server {

struct GroupLimits {
  int slots = 4;
  uint64_t max_group_bytes = 0;
  uint32_t max_groups_per_peer = 0;
};

struct JoinOutcome {
  enum class Kind {
    Rejected,          // only this connection is refused: reply `status` + `message`
    Waiting,           // joined; the group is still gathering its ranks
    Completed,         // the group is complete: every member gets Ok
    CompletionFailed,  // the group cannot get its buffers: every member gets `status` + `message`
  };
  Kind kind = Kind::Rejected;
  proto::Status status = proto::Status::Ok;
  std::string message;
  std::shared_ptr<Group> group;
  bool created = false;  // this join created the group
  // Set when the joiner took the place of a connection of its rank (Joiner::may_replace): that
  // connection, now no member of `group`, is to be closed; if its group was complete, that
  // group has failed (`replaced_group`) and its members get `replaced_message`.
  Conn* replaced = nullptr;
  std::shared_ptr<Group> replaced_group;
  std::string replaced_message;
};

// Who joins: `ip` and `peer` ("ip:port") for limits and messages; `authenticated` (with a
// secret): its groups count against its job, its memory against its job share only;
// `may_replace`: it takes the place of a connection of the same rank still in the group.
struct Joiner {
  std::string ip;
  std::string peer;
  bool authenticated = false;
  bool may_replace = false;
};

struct LeaveOutcome {
  enum class Kind {
    Quiet,   // nothing for the others to learn (group still gathering, or already failed)
    Left,    // left between rounds: the group is closed; the others' next round fails with `message`
    Failed,  // left in the middle of a round: every other member must get ERROR PeerLost `message`
  };
  Kind kind = Kind::Quiet;
  std::string message;
};

class GroupTable {
 public:
  // `live_groups` counts the stream-0 groups in the table (shared by every loop's table).
  GroupTable(GroupLimits limits, MemoryBudget* budget, PeerTable* peers, std::atomic<uint64_t>* live_groups)
      : limits_(limits), budget_(budget), peers_(peers), live_groups_(live_groups) {}
  ~GroupTable() { clear(); }
  GroupTable(const GroupTable&) = delete;
  GroupTable& operator=(const GroupTable&) = delete;

  JoinOutcome join(Conn* c, const proto::Hello& h, const GroupKey& key, const Joiner& who);
  // An unauthenticated joiner that may not replace (RankTaken while its rank is connected).
  JoinOutcome join(Conn* c, const proto::Hello& h, const GroupKey& key, const std::string& peer_ip,
                   const std::string& peer) {
    return join(c, h, key, Joiner{peer_ip, peer, false, false});
  }
  LeaveOutcome leave(const std::shared_ptr<Group>& g, uint32_t rank, const std::string& who, bool said_bye,
                     const std::string& why);
  // Marks the group failed and removes it from the table; false if it had already failed.
  bool fail(const std::shared_ptr<Group>& g, const std::string& why);
  // Removes the group from the table (a reconnecting group then starts afresh).
  void detach(const std::shared_ptr<Group>& g);
  // Groups still gathering their ranks `timeout` after they were created; removed from the table.
  std::vector<std::shared_ptr<Group>> take_expired(Group::Clock::time_point now, std::chrono::milliseconds timeout);
  // Idle reservations expire: every complete group that received nothing for `timeout` (and has
  // no chunk in flight) gives its memory back to the budget and its pages to the kernel, so a
  // job that connects and goes quiet (or a tenant that only sends hellos) holds no memory. The
  // group stays; its next chunk takes the memory again (renew). A zero timeout: never. Returns
  // how many groups gave their memory back. Call it from the sweep, not per chunk.
  size_t release_idle(Group::Clock::time_point now, std::chrono::milliseconds timeout);
  // Before a released group's next chunk: "" once its memory is reserved again, or why not
  // (the caller fails the group with that message).
  std::string renew(const std::shared_ptr<Group>& g) { return g->renew_memory(*budget_); }

  size_t size() const { return groups_.size(); }
  bool contains(const GroupKey& key) const { return groups_.count(key) != 0; }
  template <class F>
  void for_each(F&& f) const {
    for (const auto& kv : groups_) f(*kv.second);
  }
  void clear();

 private:
  // A new group in the table, or nullptr with the refusal in *out.
  std::shared_ptr<Group> create(const proto::Hello& h, const GroupKey& key, const Joiner& who, JoinOutcome* out);
  GroupLimits limits_;
  MemoryBudget* budget_;
  PeerTable* peers_;
  std::atomic<uint64_t>* live_groups_;
  std::unordered_map<GroupKey, std::shared_ptr<Group>, GroupKeyHash> groups_;
};

}  // namespace rs::server
