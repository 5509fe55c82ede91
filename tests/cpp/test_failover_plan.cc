// Unit tests of the failover exchange's decisions (csrc/client/failover.h), without sockets.
// Built and run by tests/client/test_failover_plan.py.
#include <cstdint>
#include <functional>
#include <vector>

#include "check.h"
#include "client/failover.h"
#include "common/error.h"

using namespace rs;
using namespace rs::client::failover;

namespace {

// world x kSummaryWords and world x max_e x kEntryWords tables, as the two all-reduces leave them.
struct Exchange {
  uint32_t world;
  std::vector<Summary> rows;
  std::vector<std::vector<Entry>> entries;
  explicit Exchange(uint32_t w) : world(w), rows(w), entries(w) {}
  void unfinished(uint32_t rank, uint64_t round, std::vector<std::pair<uint64_t, uint64_t>> held) {
    Intervals iv;
    for (auto& h : held) iv.add(h.first, h.second);
    append_round(round, iv, &entries[rank]);
  }
  Table table() const {
    std::vector<int64_t> s(world * kSummaryWords, 0);
    for (uint32_t w = 0; w < world; ++w) {
      s[w * kSummaryWords + 0] = int64_t(rows[w].oldest);
      s[w * kSummaryWords + 1] = int64_t(rows[w].next);
      s[w * kSummaryWords + 2] = int64_t(entries[w].size());
    }
    const uint64_t m = Table::max_entries(world, s);
    std::vector<int64_t> e(world * m * kEntryWords, 0);
    for (uint32_t w = 0; w < world; ++w)
      for (size_t i = 0; i < entries[w].size(); ++i) {
        int64_t* p = &e[(w * m + i) * kEntryWords];
        p[0] = entries[w][i].round;
        p[1] = entries[w][i].begin;
        p[2] = entries[w][i].end;
      }
    return Table(world, s, e, m);
  }
};

bool throws(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error&) {
    return true;
  }
  return false;
}

}  // namespace

int main() {
  // Intervals merge, cover and count.
  Intervals iv;
  iv.add(10, 20);
  iv.add(30, 40);
  iv.add(20, 30);  // bridges both
  CHECK(iv.spans().size() == 1 && iv.spans()[0].first == 10 && iv.spans()[0].second == 40);
  iv.add(50, 60);
  iv.add(5, 12);
  CHECK(iv.spans().size() == 2 && iv.spans()[0].first == 5);
  CHECK(iv.covers(5, 40) && iv.covers(50, 60) && !iv.covers(39, 51) && !iv.covers(0, 6) && iv.covers(7, 7));
  CHECK(iv.bytes() == 35 + 10);
  iv.add(3, 3);  // empty: nothing
  CHECK(iv.spans().size() == 2);

  // Three workers, round 5 of 100 bytes (4-byte elements), nobody finished it:
  // rank 0 holds [0, 40), rank 1 [0, 20) and [60, 100), rank 2 nothing.
  {
    Exchange x(3);
    for (auto& r : x.rows) r = {5, 7, 0};
    x.unfinished(0, 5, {{0, 40}});
    x.unfinished(1, 5, {{0, 20}, {60, 100}});
    x.unfinished(2, 5, {});
    for (uint32_t w = 0; w < 3; ++w) x.unfinished(w, 6, {});  // round 6: nobody holds anything
    Table t = x.table();
    CHECK(t.lo() == 5 && t.hi() == 7 && t.max_next() == 7);
    auto p = t.plan(5, 100, 4);
    CHECK(p.size() == 3);
    CHECK(p[0].begin == 0 && p[0].end == 40 && p[0].holder == 0);   // copied from rank 0
    CHECK(p[1].begin == 40 && p[1].end == 60 && p[1].holder == -1);  // reduced again
    CHECK(p[2].begin == 60 && p[2].end == 100 && p[2].holder == 1);  // copied from rank 1
    auto q = t.plan(6, 64, 8);
    CHECK(q.size() == 1 && q[0].begin == 0 && q[0].end == 64 && q[0].holder == -1);
    // A report that does not fit the round (not element aligned, or past its end) is refused.
    CHECK(throws([&] { t.plan(5, 100, 8); }));  // 20, 60 are not multiples of 8
    CHECK(throws([&] { t.plan(5, 50, 4); }));
  }

  // A worker that handed round 3 back (below its `next`, no mark) holds all of it: pieces the
  // others lack are copied from it, even from a higher rank; pieces everyone holds are left out.
  {
    Exchange x(2);
    x.rows[0] = {3, 5, 0};
    x.rows[1] = {4, 5, 0};  // rank 1 finished round 3
    x.unfinished(0, 3, {{0, 16}});
    x.unfinished(0, 4, {{0, 32}});
    x.unfinished(1, 4, {{0, 32}});
    Table t = x.table();
    CHECK(t.lo() == 3 && t.hi() == 5);
    auto p = t.plan(3, 32, 4);
    CHECK(p.size() == 1 && p[0].begin == 16 && p[0].end == 32 && p[0].holder == 1);
    CHECK(t.plan(4, 32, 4).empty());  // everyone holds round 4
  }

  // Rounds not started everywhere are beyond hi; asking for one is an error.
  {
    Exchange x(2);
    x.rows[0] = {2, 4, 0};
    x.rows[1] = {2, 3, 0};
    x.unfinished(0, 2, {});
    x.unfinished(0, 3, {});
    x.unfinished(1, 2, {});
    Table t = x.table();
    CHECK(t.hi() == 3 && t.max_next() == 4);
    CHECK(throws([&] { t.plan(3, 8, 4); }));
  }

  // Invalid summaries and entries from a broken peer are refused, not trusted.
  {
    std::vector<int64_t> s = {5, 4, 0, 0, 1, 0};  // rank 0: next < oldest
    CHECK(throws([&] { Table(2, s, {}, 0); }));
    std::vector<int64_t> ok = {0, 1, 1, 0, 1, 1};
    std::vector<int64_t> bad = {0, 8, 4, 0, -1, 3};  // begin > end; mixed marker
    CHECK(throws([&] { Table(2, ok, bad, 1); }));
    CHECK(throws([&] { Table(2, ok, std::vector<int64_t>(5, 0), 1); }));  // wrong size
  }
  return finish("test_failover_plan");
}
