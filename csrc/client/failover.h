// Reducer failover, the part that needs no sockets: what each worker reports about the rounds
// it has not finished when a reducer is lost, and what the workers then do with every byte of
// those rounds. client/recovery.cc runs the exchange (two small all-reduces on the surviving reducers)
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
// Rounds are identified by their round number (Round::seq: counted from the last reconnect, not
// the caller's RoundId), which is the same on every worker (every worker
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
  uint64_t oldest = 0;   // round number of its oldest unfinished round (= next when none)
  uint64_t next = 0;     // round number its next round will get
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

// ---- what a worker believes of the others' rows --------------------------------------------
// Every row of both exchanges comes from other workers through the reducers' all-reduce: a
// broken or hostile co-member, reducer or on-path peer can put anything there. Nothing is sized,
// allocated or indexed from a row before check_summaries() accepted it, and Table accepts an
// entry only inside these bounds (docs/protocol.md, "Reducer failover", lists them):
//  - rounds: oldest <= next, a row spans at most kMaxRoundWindow rounds, and its next is within
//    kMaxRoundWindow of this worker's (a worker has at most max_rounds_in_flight <= 4096 rounds
//    running, and as many released, so honest rows are far closer);
//  - entries: one marker per round of the row, plus held spans only for rounds this worker has
//    started: for a round unfinished here at most max_spans() of its size (disjoint, non-adjacent,
//    element-aligned ranges), for one finished here one (every worker held all of it then);
//  - the second exchange's table (world x the largest row x 24 bytes) at most kMaxTableBytes;
//  - this worker's own row and entries come back as it sent them.
constexpr uint64_t kMaxRoundWindow = uint64_t(1) << 16;
constexpr uint64_t kMaxTableBytes = uint64_t(64) << 20;

// The most held spans a round of `nbytes` with `elem`-byte elements can have.
uint64_t max_spans(uint64_t nbytes, uint64_t elem);

// This worker's side of the exchange: its row, its entries, its unfinished rounds.
struct Limits {
  uint32_t rank = 0;
  Summary own;                                         // set by finish()
  std::vector<Entry> mine;                             // this worker's entries (append_round for each unfinished round)
  std::vector<std::pair<uint64_t, uint64_t>> pending;  // (round number, max_spans) of its unfinished rounds, ascending
  uint64_t window = kMaxRoundWindow;
  uint64_t max_table_bytes = kMaxTableBytes;
  // Adds an unfinished round (in round-number order): its entries and its span bound.
  void add_round(uint64_t round, const Intervals& held, uint64_t nbytes, uint64_t elem);
  // Sets `own` once every unfinished round is added; `next`: the number of the next round.
  void finish(uint64_t next);
  // Spans a row may report for `round` (0 for a round this worker has not started).
  uint64_t spans_allowed(uint64_t round) const;
  // Entries the row [oldest, next) may carry at most (saturating).
  uint64_t entry_bound(uint64_t oldest, uint64_t next) const;

 private:
  std::vector<uint64_t> extra_;  // prefix sums over `pending` of the spans beyond one (finish())
};

// Checks every row of the first exchange (`summaries`: world x kSummaryWords) against `lim` and
// returns the entries per row of the second (the largest row's count). Throws
// Error(Protocol) "failover exchange: rank N ..." for a row outside the bounds above.
uint64_t check_summaries(uint32_t world, const std::vector<int64_t>& summaries, const Limits& lim);
// Words of the second exchange's table (world x max_entries x kEntryWords), checked: throws
// Error(Protocol) when they do not fit in a size_t.
size_t table_words(uint32_t world, uint64_t max_entries);
// Writes row `rank` of the first exchange, and `mine` into row `rank` of the second.
void put_summary(std::vector<int64_t>* table, uint32_t rank, const Summary& s);
void put_entries(std::vector<int64_t>* table, uint32_t rank, uint64_t max_entries, const std::vector<Entry>& mine);

// Every worker's reports, gathered (rows in rank order).
class Table {
 public:
  // `summaries`: world x kSummaryWords; `entries`: world x max_entries x kEntryWords. With
  // `lim` every entry is held to its bounds (check_summaries must have accepted the rows).
  // Throws Error(Protocol) for a report that does not fit, Error(Internal) for tables of the
  // wrong size.
  Table(uint32_t world, const std::vector<int64_t>& summaries, const std::vector<int64_t>& entries,
        uint64_t max_entries, const Limits* lim = nullptr);
  uint64_t lo() const { return lo_; }              // rounds [lo, hi) are repaired
  uint64_t hi() const { return hi_; }              // rounds >= hi were not started everywhere: they start afresh
  uint64_t max_next() const { return max_next_; }  // no worker has started a round from here on
  // The largest row's entry count; throws Error(Protocol) for a negative one.
  static uint64_t max_entries(uint32_t world, const std::vector<int64_t>& summaries);
  // What happens to round `round` (of `nbytes`, element size `elem`): pieces in order.
  struct Piece {
    uint64_t begin = 0, end = 0;
    int64_t holder = -1;  // -1: reduce again; >= 0: copy from this rank
  };
  // Pieces every worker holds are left out. Throws Error(Protocol) on a report that does not fit.
  // O(S log S) in the spans S reported for the round.
  std::vector<Piece> plan(uint64_t round, uint64_t nbytes, uint64_t elem) const;

 private:
  struct Held {
    bool unfinished = false;
    Intervals spans;
  };
  void add_row(uint32_t w, const int64_t* e, const Limits* lim);
  uint32_t world_;
  uint64_t lo_ = 0, hi_ = 0, max_next_ = 0;
  std::vector<Summary> rows_;
  std::vector<std::vector<std::pair<uint64_t, Held>>> held_;  // per rank: (round, held), sorted by round
  const Held* find(uint32_t rank, uint64_t round) const;
};

}  // namespace rs::client::failover
