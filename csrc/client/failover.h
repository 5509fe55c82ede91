// Reducer failover, the part that needs no sockets: what each worker reports about the rounds
// it has not finished when a reducer is lost, and what the workers then do with every byte of
// those rounds. client.cc runs the exchange (two small all-reduces on the surviving reducers)
// and the repair rounds; docs/protocol.md ("Reducer failover") describes the whole sequence.
//
// A worker reduces in place, so each byte of an unfinished round is, on each worker, either
// still its input or already the result (the transport writes whole elements only, see
// net::Sink::scatter's `align`). After the exchange every worker knows, for every byte of every
// round that some worker has not finished, which workers hold its result:
//   - everyone      -> nothing to do;
//   - some          -> the lowest such rank sends its bytes, everyone else sends the identity of
//                      a sum (-0.0 for floats, 0 for integers) in a SUM round: x + (-0.0) = x bit
//                      for bit, so everyone ends with exactly the result (a "copy");
//   - nobody        -> every worker still has its input there: reduce it again ("reduce") on the
//                      surviving reducers, which fold in rank order like the lost one did.
// Rounds are identified by their RoundId, which is the same on every worker (every worker
// starts the same rounds in the same order).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rs::client::failover {

// A sorted set of disjoint byte ranges [begin, end).
class Intervals {
 public:
  void add(uint64_t begin, uint64_t end);  // merges
  bool covers(uint64_t begin, uint64_t end) const;
  bool empty() const { return spans_.empty(); }
  void clear() { spans_.clear(); }
  const std::vector<std::pair<uint64_t, uint64_t>>& spans() const { return spans_; }
  uint64_t bytes() const;

 private:
  std::vector<std::pair<uint64_t, uint64_t>> spans_;
};

// What one worker reports (one row of the first exchange, then its entries in the second).
struct Summary {
  uint64_t oldest = 0;   // RoundId of its oldest unfinished round (= next when none)
  uint64_t next = 0;     // RoundId its next round will get
  uint64_t entries = 0;  // entries it sends in the second exchange
};
constexpr size_t kSummaryWords = 3;

// Entries: (round, begin, end) held intervals, and (round, -1, -1) for "this round is unfinished
// here" (a round below `next` without that marker is finished there, so held everywhere).
constexpr size_t kEntryWords = 3;
struct Entry {
  int64_t round = 0, begin = 0, end = 0;
};
void append_round(uint64_t round, const Intervals& held, std::vector<Entry>* out);

// Every worker's reports, gathered (rows in rank order).
class Table {
 public:
  // `summaries`: world x kSummaryWords; `entries`: world x max_entries x kEntryWords.
  Table(uint32_t world, const std::vector<int64_t>& summaries, const std::vector<int64_t>& entries,
        uint64_t max_entries);
  uint64_t lo() const { return lo_; }  // rounds [lo, hi) are repaired
  uint64_t hi() const { return hi_; }  // rounds >= hi were not started everywhere: they start afresh
  uint64_t max_next() const { return max_next_; }  // no worker has started a round from here on
  static uint64_t max_entries(uint32_t world, const std::vector<int64_t>& summaries);
  // What happens to round `round` (of `nbytes`, element size `elem`): pieces in order.
  struct Piece {
    uint64_t begin = 0, end = 0;
    int64_t holder = -1;  // -1: reduce again; >= 0: copy from this rank
  };
  // Pieces every worker holds are left out. Throws Error(Protocol) on a report that does not fit.
  std::vector<Piece> plan(uint64_t round, uint64_t nbytes, uint64_t elem) const;

 private:
  uint32_t world_;
  uint64_t lo_ = 0, hi_ = 0, max_next_ = 0;
  std::vector<Summary> rows_;
  struct Held {
    bool unfinished = false;
    Intervals spans;
  };
  std::vector<std::vector<std::pair<uint64_t, Held>>> held_;  // per rank: (round, held), sorted by round
  const Held* find(uint32_t rank, uint64_t round) const;
};

}  // namespace rs::client::failover
