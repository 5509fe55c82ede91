// The per-link schedule of the worker client: how a round splits over the links (one
// contiguous shard per reducer, its chunks dealt round-robin to the reducer's streams), which
// frames each link queues next (a round's chunks follow the previous round's, within the link's
// window and, for compressed rounds, its staging ring), and when a link owes its reducer a DONE
// (failover). It also holds the session's rounds in round order, which is what it schedules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "client/round.h"
#include "client/types.h"

namespace rs::client {

// A frame's token in a link's writer: the round number, and whether the payload sits in a
// staging slot (which the write frees); kDoneToken for a DONE frame.
inline uint64_t frame_token(uint64_t wire, bool staged) { return (wire << 1) | (staged ? 1 : 0); }
constexpr uint64_t kDoneToken = ~uint64_t(0);
constexpr int64_t kPathCheckNs = 2'000'000;  // a window-bound link reads TCP_INFO at most every 2 ms

class Schedule {
 public:
  explicit Schedule(const ClientOptions& opts) : opts_(opts) {}

  std::deque<Round*> rounds;  // this session's rounds from the oldest unfinished one, in round order
  uint64_t next_wire = 0;     // round number of the next round of this session

  Round* by_wire(uint64_t wire) const;  // a round of this session by round number
  uint64_t oldest_wire() const { return rounds.empty() ? next_wire : rounds.front()->wire; }
  // Splits `r` over `links` (whose reducers are the session's `reducers`).
  void plan(Round& r, const Links& links, size_t reducers) const;
  // Queues on link `l` (index li) the frames its window allows, then the DONE it owes.
  // `copies_short`: no DONE may wait in the kernel (a drain, or the pool of copies nearly full).
  void fill(Link& l, size_t li, bool copies_short);
  // Results came in on link li: rounds complete on it make a DONE owed.
  void advance_done(Link& l, size_t li);
  // A round the DONE owed on link li covers will wait for its CLEAR in its caller's hands.
  bool done_urgent(const Link& l, size_t li) const;
  size_t staging_slots() const;  // narrowed chunks a link may have queued, unwritten

 private:
  void queue_chunk(Link& l, Round& r, Round::Part& p);
  uint64_t window_of(Link& l, const Round::Part& p) const;
  static bool sample_rate(Link& l, uint64_t window_bytes, int64_t now);
  void queue_done(Link& l, size_t li, bool copies_short);
  const ClientOptions& opts_;
};

}  // namespace rs::client
