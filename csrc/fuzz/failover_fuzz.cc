// libFuzzer target for what a worker believes of the other workers in a failover exchange
// (csrc/client/failover.cc): failover::check_summaries, Limits and Table, the rows of both
// all-reduces as a lying co-member or reducer can make them. Built by scripts/fuzz.sh.
//
// Input: a small header describes this worker (world, rank, its unfinished rounds and what it
// holds of them), then come the other rows' summaries and entries. Each value is read either as
// a small number near this worker's rounds (most inputs then reach the Table) or, when the input
// says so, as a raw 64-bit word (wrapped, negative and 2^63 counts). Besides "no crash, no
// sanitizer report, no unbounded allocation": whatever check_summaries accepts fits its bounds,
// the Table accepts only rows inside them, plan() gives ordered, aligned pieces inside the round,
// and every refusal is an Error(Protocol), never an Internal one.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "client/failover.h"
#include "common/error.h"
#include "fuzz/fuzz_input.h"

namespace {

using namespace rs::client::failover;

// a + b, wrapping (values near a raw word must not be undefined behaviour in the harness itself).
int64_t wrap_add(int64_t a, int64_t b) { return int64_t(uint64_t(a) + uint64_t(b)); }

// The input, with values read as a raw word (flag bit set) or a small signed offset from `near`.
struct Input : rs::fuzz::Input {
  int64_t value(int64_t near) {
    const uint8_t tag = byte();
    if (tag & 0x80) return int64_t(u64());
    return wrap_add(near, int8_t(uint8_t(tag << 1)) >> 1);  // -64..63
  }
};

constexpr uint64_t kElem = 4;
constexpr uint64_t kFuzzTableBytes = 1 << 20;  // keeps each run small; the bounds scale with it

void check_plan(const Table& t, uint32_t world, uint64_t round, uint64_t nbytes) {
  std::vector<Table::Piece> pieces;
  try {
    pieces = t.plan(round, nbytes, kElem);
  } catch (const rs::Error& e) {
    FUZZ_CHECK(e.kind() == rs::ErrorKind::Protocol);
    return;
  }
  uint64_t at = 0;
  for (const auto& p : pieces) {
    FUZZ_CHECK(p.begin >= at && p.begin < p.end && p.end <= nbytes);
    FUZZ_CHECK(p.begin % kElem == 0 && p.end % kElem == 0);
    FUZZ_CHECK(p.holder >= -1 && p.holder < int64_t(world));
    at = p.end;
  }
}

void run(Input in) {
  const uint32_t world = 1 + in.byte() % 8;
  Limits lim;
  lim.rank = in.byte() % world;
  lim.max_table_bytes = kFuzzTableBytes;
  // This worker: up to 4 unfinished rounds from `base`, each of up to 256 elements.
  const uint64_t base = in.byte();
  std::vector<std::pair<uint64_t, uint64_t>> mine;  // (round, nbytes)
  uint64_t round = base;
  for (int k = in.byte() % 5; k > 0; --k) {
    round += 1 + in.byte() % 4;
    const uint64_t nbytes = kElem * (1 + in.byte());
    Intervals held;
    for (int s = in.byte() % 4; s > 0; --s) {
      const uint64_t a = kElem * (in.byte() % (nbytes / kElem)), b = a + kElem * (1 + in.byte() % 8);
      held.add(a, b < nbytes ? b : nbytes);
    }
    lim.add_round(round, held, nbytes, kElem);
    mine.push_back({round, nbytes});
  }
  lim.finish(round + 1 + in.byte() % 4);
  // The first exchange: this worker's row as sent, the others' from the input.
  std::vector<int64_t> summaries(size_t(world) * kSummaryWords, 0);
  for (uint32_t w = 0; w < world; ++w) {
    if (w == lim.rank && !(in.byte() & 1)) {
      put_summary(&summaries, w, lim.own);
      continue;
    }
    int64_t* s = &summaries[size_t(w) * kSummaryWords];
    s[0] = in.value(int64_t(lim.own.oldest));
    s[1] = in.value(int64_t(lim.own.next));
    s[2] = in.value(int64_t(lim.own.entries));
  }
  uint64_t max_e = 0;
  try {
    max_e = check_summaries(world, summaries, lim);
  } catch (const rs::Error& e) {
    FUZZ_CHECK(e.kind() == rs::ErrorKind::Protocol);
    return;
  }
  // Accepted: every row fits its bounds, and the table fits the cap.
  for (uint32_t w = 0; w < world; ++w) {
    const int64_t* s = &summaries[size_t(w) * kSummaryWords];
    FUZZ_CHECK(s[0] >= 0 && s[1] >= s[0] && s[2] >= 0 && uint64_t(s[2]) <= max_e);
    FUZZ_CHECK(uint64_t(s[1] - s[0]) <= lim.window);
    FUZZ_CHECK(uint64_t(s[2]) <= lim.entry_bound(uint64_t(s[0]), uint64_t(s[1])));
  }
  FUZZ_CHECK(uint64_t(world) * max_e * kEntryWords * sizeof(int64_t) <= lim.max_table_bytes);
  // The second exchange: this worker's entries, the others' from the input.
  std::vector<int64_t> table(table_words(world, max_e), 0);
  put_entries(&table, lim.rank, max_e, lim.mine);
  for (uint32_t w = 0; w < world; ++w) {
    if (w == lim.rank && !(in.byte() & 1)) continue;
    const uint64_t count = uint64_t(summaries[size_t(w) * kSummaryWords + 2]);
    int64_t* e = table.data() + size_t(w) * max_e * kEntryWords;
    int64_t r = summaries[size_t(w) * kSummaryWords];
    for (uint64_t i = 0; i < count && in.n > 0; ++i, e += kEntryWords) {
      r = in.value(r);
      e[0] = r;
      const bool marker = in.byte() & 1;
      e[1] = marker ? -1 : in.value(int64_t(kElem) * (in.byte() % 64));
      e[2] = marker ? -1 : in.value(wrap_add(e[1], int64_t(kElem) * (1 + in.byte() % 8)));
    }
  }
  try {
    Table t(world, summaries, table, max_e, &lim);
    FUZZ_CHECK(t.lo() <= t.hi() && t.hi() <= t.max_next());
    for (const auto& m : mine)
      if (m.first < t.hi()) check_plan(t, world, m.first, m.second);
  } catch (const rs::Error& e) {
    FUZZ_CHECK(e.kind() == rs::ErrorKind::Protocol);
  }
}

// The table without Limits (the form the old code used): a width from the input must never be
// trusted past the table's real size.
void run_unbounded(Input in) {
  const uint32_t world = 1 + in.byte() % 4;
  std::vector<int64_t> summaries(size_t(world) * kSummaryWords);
  for (auto& v : summaries) v = in.value(1);
  std::vector<int64_t> table(in.byte() % 64);
  for (auto& v : table) v = in.value(0);
  try {
    const uint64_t width = (in.byte() & 1) ? in.u64() : Table::max_entries(world, summaries);
    Table t(world, summaries, table, width);
    for (uint32_t w = 0; w < world; ++w) FUZZ_CHECK(uint64_t(summaries[size_t(w) * kSummaryWords + 2]) <= width);
    FUZZ_CHECK(table.size() == size_t(world) * width * kEntryWords);
    check_plan(t, world, t.lo(), kElem * 16);
  } catch (const rs::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Input in{{data + 1, size - 1}};
  if (data[0] & 1) run_unbounded(in);
  else run(in);
  return 0;
}
