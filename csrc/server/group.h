// One reduction unit on a reducer: the chunks of one stream of one group
// (job id, group name, stream index). Holds the window of chunk slots, the
// members' receive buffers and the fixed-order reduction. No sockets here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "protocol/wire.h"

namespace rs::server {

struct Conn;  // a worker connection (server.cc); opaque here

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
  int64_t seq = -1;                 // chunk sequence number in the stream, -1 = free
  proto::FrameHeader params;        // as sent by first_rank
  uint32_t first_rank = 0;
  uint32_t next_rank = 0;           // next contribution to fold in (rank order)
  uint32_t pending_sends = 0;       // results still being written to members
  std::vector<uint8_t> arrived;     // per rank
  uint8_t* data = nullptr;          // world x chunk bytes: contribution of rank r at r * chunk
  uint8_t* acc = nullptr;           // accumulator (float32 for 16-bit dtypes)
};

class Group {
 public:
  Group(GroupKey key, uint32_t world, uint32_t chunk, uint16_t num_streams, int window);

  const GroupKey key;
  const uint32_t world;
  const uint32_t chunk;
  const uint16_t num_streams;

  // Allocates the window once (when the group is complete); returns the bytes allocated.
  size_t allocate();
  size_t memory_bytes() const { return arena_bytes_; }

  Slot& slot_for(int64_t seq) { return slots_[size_t(seq % int64_t(slots_.size()))]; }
  std::vector<Slot>& slots() { return slots_; }
  uint8_t* contribution(Slot& s, uint32_t rank) { return s.data + size_t(rank) * chunk; }

  // Describes how `h` (from rank b) differs from the slot's parameters, or "" if it matches.
  static std::string mismatch(const proto::FrameHeader& a, uint32_t rank_a, const proto::FrameHeader& b, uint32_t rank_b,
                              uint16_t stream);

  // Folds in every contribution that is next in rank order. Returns true when the chunk is
  // fully reduced; the result is then in contribution(slot, 0).
  bool advance(Slot& s);
  void release(Slot& s);

  // Membership, maintained by the event loop that owns the group.
  std::vector<Conn*> members_;
  uint32_t joined_ = 0;
  bool complete_ = false;   // every rank connected once: rounds may run
  bool failed_ = false;     // an error frame went to every member; no more rounds
  std::string left_;        // set when a member left cleanly: the next round fails with this

 private:
  std::vector<Slot> slots_;
  std::unique_ptr<uint8_t[]> arena_;
  size_t arena_bytes_ = 0;
};

}  // namespace rs::server
