// Unit tests of what a worker believes of other workers and reducers (issue 25): the failover
// exchange's bounds (failover::check_summaries, Limits, Table), the checks of a reducer's RESULT
// and CLEAR frames (client/reducer_frames.h) and the quoting of a reducer's text (peer_text).
// Built with ASan/UBSan and run by tests/client/test_worker_lies.py: every lie must be an
// Error(Protocol) naming the rank, never a read or write out of bounds.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "client/failover.h"
#include "client/peer_text.h"
#include "client/reducer_frames.h"
#include "common/error.h"

using namespace rs;
using namespace rs::client;
using namespace rs::client::failover;

namespace {

constexpr int64_t kMin = INT64_MIN;
constexpr int64_t kMax = INT64_MAX;
constexpr uint64_t kWrapped = (~uint64_t(0)) / 6 + 1;  // 2 x kWrapped x 3 words wraps to 2 words

// The Error(kind) f throws, with its message; "" (and kind Internal) when it throws nothing.
std::string thrown(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  if (kind) *kind = ErrorKind::Internal;
  return "";
}

// f throws Error(Protocol) whose message contains `part`.
bool protocol_error(const std::function<void()>& f, const std::string& part) {
  ErrorKind kind = ErrorKind::Internal;
  const std::string msg = thrown(f, &kind);
  const bool ok = kind == ErrorKind::Protocol && msg.find(part) != std::string::npos;
  if (!ok) std::fprintf(stderr, "  expected a Protocol error with \"%s\", got \"%s\"\n", part.c_str(), msg.c_str());
  return ok;
}

// This worker (rank 0 of `world`): rounds [5, 8) started, 5 and 7 unfinished here (1000 bytes
// of 4-byte elements each: up to 125 spans), 5 with bytes [0, 40) in.
Limits my_limits() {
  Limits lim;
  lim.rank = 0;
  Intervals held;
  held.add(0, 40);
  lim.add_round(5, held, 1000, 4);
  lim.add_round(7, Intervals{}, 1000, 4);
  lim.finish(8);
  return lim;
}

std::vector<int64_t> summaries(const Limits& lim, std::vector<std::vector<int64_t>> others) {
  std::vector<int64_t> s = {int64_t(lim.own.oldest), int64_t(lim.own.next), int64_t(lim.own.entries)};
  for (const auto& row : others) s.insert(s.end(), row.begin(), row.end());
  return s;
}

// The second exchange's table: this worker's entries in row 0, `other` (flat triples) in row 1.
std::vector<int64_t> entries(const Limits& lim, uint64_t max_e, const std::vector<int64_t>& other) {
  std::vector<int64_t> t(table_words(2, max_e), 0);
  put_entries(&t, 0, max_e, lim.mine);
  for (size_t i = 0; i < other.size(); ++i) t[max_e * kEntryWords + i] = other[i];
  return t;
}

void test_summaries() {
  const Limits lim = my_limits();
  CHECK(lim.own.oldest == 5 && lim.own.next == 8 && lim.own.entries == 3);  // 2 markers + 1 span
  CHECK(lim.spans_allowed(5) == 125 && lim.spans_allowed(6) == 1 && lim.spans_allowed(4) == 1);
  CHECK(lim.spans_allowed(8) == 0 && lim.spans_allowed(~uint64_t(0)) == 0);
  // [3, 10): 7 markers; spans: 3, 4, 6 one each (finished here), 5 and 7 125 each, 8 and 9 none.
  CHECK(lim.entry_bound(3, 10) == 7 + 3 + 250);
  CHECK(lim.entry_bound(8, 12) == 4);  // not started here: markers only
  CHECK(lim.entry_bound(5, 5) == 0);
  // Honest rows pass; the second exchange is as wide as the largest row.
  CHECK(check_summaries(2, summaries(lim, {{5, 8, 3}}), lim) == 3);
  CHECK(check_summaries(2, summaries(lim, {{6, 9, 12}}), lim) == 12);
  CHECK(check_summaries(3, summaries(lim, {{8, 8, 0}, {4, 8, 256}}), lim) == 256);
  CHECK(protocol_error([&] { check_summaries(3, summaries(lim, {{8, 8, 0}, {4, 8, 257}}), lim); },
                       "rank 2 reports 257"));
  // Lies about counts: each a Protocol error naming the rank, before anything is sized from it.
  const auto bad = [&](std::vector<int64_t> row, const std::string& part) {
    return protocol_error([&] { check_summaries(2, summaries(lim, {row}), lim); }, "failover exchange: rank 1" + part);
  };
  CHECK(bad({5, 8, int64_t(kWrapped)}, " reports 3074457345618258603 entries"));
  CHECK(bad({5, 8, kMin}, " reports a negative round or count"));  // 2^63 as int64
  CHECK(bad({5, 8, kMax}, " reports 9223372036854775807 entries"));
  CHECK(bad({5, 8, -1}, " reports a negative round or count"));
  CHECK(bad({5, 8, 1 << 27}, " reports 134217728 entries"));
  CHECK(bad({5, 8, 255}, " reports 255 entries"));  // one more than [5, 8) can carry here (3 + 125 + 1 + 125)
  CHECK(check_summaries(2, summaries(lim, {{5, 8, 254}}), lim) == 254);
  // Lies about rounds.
  CHECK(bad({-1, 8, 0}, " reports a negative round or count"));
  CHECK(bad({9, 8, 0}, " reports its next round below its oldest"));
  CHECK(bad({0, 70000, 0}, " reports 70000 unfinished rounds"));
  CHECK(bad({1 << 20, 1 << 20, 0}, " is at round 1048576, this worker at 8"));
  CHECK(bad({kMax, kMax, 0}, " is at round 9223372036854775807"));
  // This worker's own row must come back as it was sent.
  CHECK(protocol_error([&] { check_summaries(2, {5, 8, 4, 5, 8, 3}, lim); }, "rank 0 (this worker) came back altered"));
  // The whole table is capped: 3 rows of 254 entries fit the default, not a 16 KiB cap.
  Limits small = lim;
  small.max_table_bytes = 16 << 10;
  CHECK(protocol_error([&] { check_summaries(3, summaries(small, {{5, 8, 254}, {5, 8, 3}}), small); },
                       "rank 1 reports 254 entries: 3 rows of that many would take more than the 16384-byte limit"));
  // A table of the wrong size is this worker's bug, not a peer's.
  ErrorKind kind = ErrorKind::Protocol;
  thrown([&] { check_summaries(2, {5, 8, 3}, lim); }, &kind);
  CHECK(kind == ErrorKind::Internal);
  // Sizes are checked: no wrap-around.
  CHECK(protocol_error([] { table_words(2, kWrapped); }, "does not fit in memory"));
  CHECK(protocol_error([] { table_words(65536, uint64_t(1) << 50); }, "does not fit in memory"));
  CHECK(table_words(3, 4) == 36);
  CHECK(protocol_error([] { Table::max_entries(2, {0, 1, 1, 0, 1, kMin}); }, "rank 1 reports a negative entry count"));
}

void test_table() {
  const Limits lim = my_limits();
  // The old code's overflow: a wrapped width passed the size check (2 words) and rows were read far
  // beyond the table. Now the width is checked first.
  CHECK(protocol_error([] { Table(2, {0, 1, 1, 0, 1, int64_t(kWrapped)}, std::vector<int64_t>(2, 0), kWrapped); },
                       "does not fit in memory"));
  // An honest row 1: round 5 with [40, 80), round 6 finished there, round 7 nothing yet.
  std::vector<int64_t> honest = {5, -1, -1, 5, 40, 80, 7, -1, -1};
  Table t(2, summaries(lim, {{5, 8, 3}}), entries(lim, 3, honest), 3, &lim);
  auto p = t.plan(5, 1000, 4);
  CHECK(p.size() == 3 && p[0].end == 40 && p[1].end == 80 && p[2].end == 1000);
  CHECK(p[0].holder == 0 && p[1].holder == 1 && p[2].holder == -1);
  CHECK(t.plan(6, 1000, 4).empty());  // finished on both ranks
  // Lies in the entries, each refused with the rank and the entry.
  const auto bad = [&](std::vector<int64_t> row, int64_t count, const std::string& part) {
    return protocol_error(
        [&] {
          const uint64_t m = check_summaries(2, summaries(lim, {{5, 8, count}}), lim);
          Table(2, summaries(lim, {{5, 8, count}}), entries(lim, m, row), m, &lim);
        },
        "failover exchange: rank 1" + part);
  };
  CHECK(bad({4, -1, -1}, 1, " reports a round outside its rounds [5, 8) in entry 0 (4, -1, -1)"));
  CHECK(bad({8, -1, -1}, 1, " reports a round outside its rounds [5, 8)"));
  CHECK(bad({kMax, -1, -1}, 1, " reports a round outside its rounds"));
  CHECK(bad({kMin, -1, -1}, 1, " sent an invalid entry"));
  CHECK(bad({5, -1, 7}, 1, " sent an invalid entry"));
  CHECK(bad({5, 8, 8}, 1, " sent an invalid entry"));  // empty span
  CHECK(bad({5, 9, 8}, 1, " sent an invalid entry"));
  CHECK(bad({5, kMin, -1}, 1, " sent an invalid entry"));
  CHECK(bad({5, 0, 8}, 1, " reports a span of round 5 before its marker"));
  CHECK(bad({7, -1, -1, 5, -1, -1}, 2, "'s rounds are out of order"));
  CHECK(bad({5, -1, -1, 5, 40, 80, 5, 0, 8}, 3, "'s spans are out of order"));
  CHECK(bad({6, -1, -1, 6, 0, 8, 6, 16, 24}, 3, " reports more spans of round 6 than its 1 possible here"));
  // A span past the round's bytes is refused when the round is planned.
  Table far(2, summaries(lim, {{5, 8, 2}}), entries(lim, 3, {5, -1, -1, 5, 0, int64_t(1) << 40}), 3, &lim);
  CHECK(protocol_error([&] { far.plan(5, 1000, 4); }, "rank 1 reports bytes [0, 1099511627776) of round 5"));
  // This worker's own entries must come back unchanged.
  std::vector<int64_t> mine = entries(lim, 3, honest);
  mine[5] = 44;
  CHECK(protocol_error([&] { Table(2, summaries(lim, {{5, 8, 3}}), mine, 3, &lim); },
                       "rank 0 (this worker) came back altered in entry 1"));
}

// The old plan(): every piece between two span boundaries checked against every rank.
std::vector<Table::Piece> reference_plan(const std::vector<std::vector<std::pair<uint64_t, uint64_t>>>& spans,
                                         const std::vector<bool>& finished, uint64_t nbytes) {
  const size_t world = spans.size();
  std::vector<uint64_t> cuts{0, nbytes};
  for (const auto& v : spans)
    for (const auto& s : v) {
      cuts.push_back(s.first);
      cuts.push_back(s.second);
    }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<Table::Piece> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const uint64_t a = cuts[i], b = cuts[i + 1];
    int64_t holder = -1;
    bool all = true;
    for (size_t w = 0; w < world; ++w) {
      bool has = finished[w];
      for (const auto& s : spans[w]) has = has || (s.first <= a && s.second >= b);
      if (has && holder < 0) holder = int64_t(w);
      all = all && has;
    }
    if (all) continue;
    if (!out.empty() && out.back().end == a && out.back().holder == holder) out.back().end = b;
    else out.push_back({a, b, holder});
  }
  return out;
}

// plan()'s sweep gives the same pieces as the reference on random tables.
void test_plan_matches_the_reference() {
  std::mt19937_64 rng(25);
  for (int trial = 0; trial < 3000; ++trial) {
    const uint32_t world = 1 + uint32_t(rng() % 6);
    const uint64_t nbytes = 4 * (1 + rng() % 64);
    std::vector<int64_t> s, e;
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(world);
    std::vector<bool> finished(world);
    std::vector<std::vector<Entry>> rows(world);
    for (uint32_t w = 0; w < world; ++w) {
      finished[w] = rng() % 4 == 0;
      Intervals iv;
      for (int k = int(rng() % 5); k > 0; --k) {
        const uint64_t a = 4 * (rng() % (nbytes / 4)), b = a + 4 * (1 + rng() % 8);
        iv.add(a, std::min(b, nbytes));
      }
      if (!finished[w]) {
        append_round(3, iv, &rows[w]);
        spans[w] = iv.spans();
      }
    }
    uint64_t m = 0;
    for (const auto& r : rows) m = std::max<uint64_t>(m, r.size());
    e.assign(table_words(world, m), 0);
    for (uint32_t w = 0; w < world; ++w) {
      s.insert(s.end(), {3, 4, int64_t(rows[w].size())});
      put_entries(&e, w, m, rows[w]);
    }
    const auto got = Table(world, s, e, m).plan(3, nbytes, 4);
    const auto want = reference_plan(spans, finished, nbytes);
    bool same = got.size() == want.size();
    for (size_t i = 0; same && i < got.size(); ++i)
      same = got[i].begin == want[i].begin && got[i].end == want[i].end && got[i].holder == want[i].holder;
    CHECK(same);
    if (!same) return;
  }
}

void test_frames() {
  proto::FrameHeader h;
  h.type = proto::FrameType::Result;
  h.dtype = 0;
  h.op = 0;
  h.round = 3;
  h.total_bytes = 10000;
  h.shard_bytes = 6000;
  h.offset = 4096;
  h.length = 6000 - 4096;
  const SentRound sent{0, 0, 10000};
  LinkShare p;
  p.shard_bytes = 6000;
  p.chunk = 4096;
  p.nchunks = 2;
  p.expected = 1;   // stream 1 of 2: chunk 1 only
  p.written = 1;
  CHECK(check_result(h, &sent, p, 1, 2).empty());
  CHECK(check_result(h, nullptr, p, 1, 2) == "round 3 is not in flight");
  auto with = [&](auto change) {
    proto::FrameHeader x = h;
    change(x);
    return check_result(x, &sent, p, 1, 2);
  };
  CHECK(with([](proto::FrameHeader& x) { x.length = 4096; }) == "4096 bytes where this worker sent 1904");
  CHECK(with([](proto::FrameHeader& x) { x.offset = 0; }) == "offset 0 where the next result due starts at 4096");
  CHECK(with([](proto::FrameHeader& x) { x.total_bytes = 20000; }).find("a round of 20000 bytes") == 0);
  CHECK(with([](proto::FrameHeader& x) { x.dtype = 1; }).find("dtype/op 1/0") == 0);
  LinkShare unsent = p;
  unsent.written = 0;
  CHECK(check_result(h, &sent, unsent, 1, 2) == "chunk 1 was not sent yet");
  LinkShare done = p;
  done.received = 1;
  CHECK(check_result(h, &sent, done, 1, 2) == "no result is due on this link");
  LinkShare none;  // a link with no share of the round (chunk 0: never divided by)
  CHECK(check_result(h, &sent, none, 0, 1).find("a round of 10000 bytes with a shard of 6000") == 0);
  none.shard_bytes = 6000;
  CHECK(check_result(h, &sent, none, 0, 1) == "no result is due on this link");
  CHECK(check_clear(3, 3, true).empty());
  CHECK(check_clear(~uint64_t(0), 3, true).find("cleared round 18446744073709551615 before") == 0);
  CHECK(check_clear(1, 3, false).find("without reducer failover") != std::string::npos);
}

void test_peer_text() {
  CHECK(peer_text("rank 1 left") == "rank 1 left");
  CHECK(peer_text(std::string("a\nb\r\tc\x1b[31m\\", 12)) == "a\\nb\\r\\tc\\x1b[31m\\\\");
  CHECK(peer_text(std::string("\0\x7f\x80\xff", 4)) == "\\x00\\x7f\\x80\\xff");
  const std::string big(4096, '\n');
  const std::string q = peer_text(big);
  std::string want;
  for (int i = 0; i < 128; ++i) want += "\\n";
  CHECK(q == want + "... (4096 bytes)");
  const std::string esc(100, '\x1b');  // an escape is never cut: 64 of them fill 256 characters
  CHECK(peer_text(esc).substr(0, 256).find("\\x1b") == 0 && peer_text(esc).substr(256) == "... (100 bytes)");
  CHECK(peer_text(std::string(256, 'a')) == std::string(256, 'a'));  // exactly the cap: not shortened
  for (int c = 0; c < 256; ++c) {
    const std::string one = peer_text(std::string(1, char(c)));
    for (char ch : one) CHECK(ch >= 0x20 && ch < 0x7f);
  }
}

}  // namespace

int main() {
  test_summaries();
  test_table();
  test_plan_matches_the_reference();
  test_frames();
  test_peer_text();
  return finish("test_worker_lies");
}
