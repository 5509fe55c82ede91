// One reduction unit on a reducer: the chunks of one stream of one group (job id, group name,
// stream index). Holds the members, the window of chunk slots, the members' receive buffers and
// the fixed-order reduction. No sockets here: members are opaque handles (Conn*) that the event
// loop owns; a Group never dereferences them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "protocol/wire.h"
#include "server/limits.h"

namespace rs::server {

struct Conn;  // a worker connection (server/conn.h); opaque here

struct GroupKey {
  std::string job;
  std::string group;
  uint16_t stream = 0;
  bool operator==(const GroupKey& o) const { return stream == o.stream && job == o.job && group == o.group; }
  std::string label() const { return job + "/" + group + "#" + std::to_string(stream); }
};

struct GroupKeyHash {
  size_t operator()(const GroupKey& k) const {
    return std::hash<std::string>()(k.job) * 31 ^ std::hash<std::string>()(k.group) * 7 ^ k.stream;
  }
};

struct Slot {
  int64_t seq = -1;           // chunk sequence number in the stream, -1 = free
  proto::FrameHeader params;  // as sent by first_rank
  uint32_t first_rank = 0;
  uint32_t next_rank = 0;        // next contribution to fold in (rank order)
  uint32_t pending_sends = 0;    // results still being written to members
  std::vector<uint8_t> arrived;  // per rank
  uint8_t* data = nullptr;       // world x chunk bytes: contribution of rank r at r * chunk
  uint8_t* acc = nullptr;        // accumulator (float32 for 16-bit dtypes)
};

// Reduction buffers: an anonymous mapping committed page by page as data arrives, so creating
// a large group costs no zero-filling on the event loop and no memory a group never uses.
class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  bool map(size_t bytes);  // false if the kernel refuses
  // Gives the committed pages back to the kernel (they read as zeros when next touched).
  void discard();
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

class Group {
 public:
  using Clock = std::chrono::steady_clock;

  Group(GroupKey key, uint32_t world, uint32_t chunk, uint16_t num_streams, int slots, PeerTable::Ticket creator);

  // Reduction-buffer bytes of a group stream: slots x (world + 2) x chunk (one receive buffer per
  // rank plus a float32 accumulator for 16-bit dtypes: chunk/2 elements x 4 bytes = 2 x chunk).
  static uint64_t bytes_needed(uint32_t world, uint32_t chunk, int slots);

  const GroupKey& key() const { return key_; }
  uint32_t world() const { return world_; }
  uint32_t chunk() const { return chunk_; }
  uint16_t num_streams() const { return num_streams_; }
  Clock::time_point created() const { return created_; }

  // ---- membership (the rules live in GroupTable) ----
  Conn* member(uint32_t rank) const;  // nullptr if that rank is not connected
  uint32_t joined() const { return joined_; }
  bool complete() const { return complete_; }
  bool failed() const { return failed_; }
  const std::string& left() const { return left_; }
  // Failed, or a member left: no round can run in it any more (it is among the ended groups).
  bool ended() const { return failed_ || !left_.empty(); }
  // `ip`: the member's address, charged for its part of the group's memory (MemoryBudget).
  void add_member(uint32_t rank, Conn* c, const std::string& ip);
  void remove_member(uint32_t rank);
  // Every connected member, in rank order once complete (join order before).
  template <class F>
  void for_each_member(F&& f) const {
    if (complete_) {
      for (Conn* m : members_)
        if (m) f(m);
    } else {
      for (const auto& w : waiting_) f(w.conn);
    }
  }
  std::vector<uint32_t> missing_ranks(size_t at_most) const;
  // Why a group that did not complete within `timeout_s` (group_timeout) is refused.
  std::string incomplete_message(int timeout_s) const;
  void mark_failed(const std::string& why);
  void mark_left(const std::string& why) { left_ = why; }
  // Why the group ended when a member left with a failover goodbye: the others get
  // ErrorCode::Failover with the lost reducers' mask instead of PeerLost.
  void mark_failover(uint64_t lost) {
    failover_ = true;
    failover_lost_ = lost;
  }
  bool failover() const { return failover_; }
  uint64_t failover_lost() const { return failover_lost_; }
  // The hello flags every member must share (set by the first member).
  uint16_t flags() const { return flags_; }
  void set_flags(uint16_t f) { flags_ = f; }
  // Releases: every member holds the results of the rounds below cleared() (see FrameType::Done).
  uint64_t cleared() const { return cleared_; }
  // Recomputes the minimum DONE over the members; true if it advanced.
  bool update_cleared();

  // Completes the group: reserves its buffers from `budget` (the whole against its job, each
  // member's part against its address) and maps them. Returns "" or why not, naming the limit.
  // (max_group_bytes is checked when the group is created: GroupTable::join.)
  std::string complete(MemoryBudget& budget);
  uint64_t memory_bytes() const { return reservation_.bytes(); }
  bool memory_held() const { return reservation_.held(); }
  // Whether the group has received nothing for `timeout` and has no chunk in its slots. Called
  // by the sweep only: it notices traffic by the change of bytes_received since its last call.
  bool idle(Clock::time_point now, std::chrono::milliseconds timeout);
  // Gives the reservation back and its pages to the kernel (only when idle(): no slot in use).
  void release_memory();
  // Takes the released reservation again (before the first chunk after idling); "" or why not.
  std::string renew_memory(MemoryBudget& budget);

  // ---- chunks ----
  Slot& slot_for(int64_t seq) { return slots_[size_t(seq % int64_t(slots_.size()))]; }
  std::vector<Slot>& slots() { return slots_; }
  uint8_t* contribution(Slot& s, uint32_t rank) { return s.data + size_t(rank) * chunk_; }
  bool busy() const;  // a chunk still waits for contributions (results merely being sent do not count)
  // The ranks whose contribution to the oldest waiting chunk did not arrive (at most `at_most`),
  // when `leaver`'s did: the ranks really missing when `leaver` gives up waiting. Else empty.
  std::vector<uint32_t> stalled_ranks(uint32_t leaver, size_t at_most) const;

  // Describes how `b` (from rank_b) differs from the slot's parameters `a`, or "" if it matches.
  static std::string mismatch(const proto::FrameHeader& a, uint32_t rank_a, const proto::FrameHeader& b,
                              uint32_t rank_b);

  // Folds in every contribution that is next in rank order. Returns true when the chunk is
  // fully reduced; the result is then in contribution(slot, 0).
  bool advance(Slot& s);
  void release(Slot& s);

  // ---- counters (for stats) ----
  uint64_t rounds = 0, bytes_received = 0, bytes_sent = 0;
  // Round timing: when the first chunk of `round` was claimed (several rounds may be in flight).
  void round_started(uint64_t round, Clock::time_point t) { starts_[round % kRoundStarts] = {round, t}; }
  // Seconds since round_started(round), or a negative value if it was not recorded.
  double round_age(uint64_t round, Clock::time_point now) const {
    const RoundStart& r = starts_[round % kRoundStarts];
    return r.round == round && r.set ? std::chrono::duration<double>(now - r.at).count() : -1.0;
  }
  const std::string& last_error() const { return last_error_; }

 private:
  GroupKey key_;
  uint32_t world_;
  uint32_t chunk_;
  uint16_t num_streams_;
  int slot_count_;
  Clock::time_point created_;
  PeerTable::Ticket creator_;  // counts against the creating peer's max_groups_per_peer

  struct Waiting {
    uint32_t rank;
    Conn* conn;
    std::string ip;
  };
  std::vector<Waiting> waiting_;  // before completion: only who joined
  std::vector<Conn*> members_;    // after completion: by rank
  uint32_t joined_ = 0;
  bool complete_ = false;
  bool failed_ = false;
  std::string left_;  // set when a member left between rounds: the next round fails with this
  bool failover_ = false;
  uint64_t failover_lost_ = 0;
  uint16_t flags_ = 0;
  uint64_t cleared_ = 0;
  std::string last_error_;

  MemoryBudget::Claim claim() const;  // of the whole group, every rank joined

  static constexpr size_t kRoundStarts = 64;
  struct RoundStart {
    uint64_t round = 0;
    Clock::time_point at{};
    bool set = false;
    RoundStart() = default;
    RoundStart(uint64_t r, Clock::time_point t) : round(r), at(t), set(true) {}
  };
  RoundStart starts_[kRoundStarts];

  std::vector<Slot> slots_;
  MemoryBudget::Reservation reservation_;
  Arena arena_;
  uint64_t idle_mark_ = 0;         // bytes_received when the sweep last saw it change
  Clock::time_point active_at_{};  // when that was
};

}  // namespace rs::server
