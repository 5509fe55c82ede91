#include "client/failover.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "common/error.h"

namespace rs::client::failover {

void Intervals::add(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  auto it = std::lower_bound(spans_.begin(), spans_.end(), std::make_pair(begin, uint64_t(0)));
  if (it != spans_.begin() && std::prev(it)->second >= begin) --it;
  auto last = it;
  while (last != spans_.end() && last->first <= end) {
    begin = std::min(begin, last->first);
    end = std::max(end, last->second);
    ++last;
  }
  it = spans_.erase(it, last);
  spans_.insert(it, {begin, end});
}

bool Intervals::covers(uint64_t begin, uint64_t end) const {
  if (begin >= end) return true;
  auto it = std::upper_bound(spans_.begin(), spans_.end(), std::make_pair(begin, ~uint64_t(0)));
  if (it == spans_.begin()) return false;
  --it;
  return it->first <= begin && it->second >= end;
}

uint64_t Intervals::bytes() const {
  uint64_t n = 0;
  for (const auto& s : spans_) n += s.second - s.first;
  return n;
}

void append_round(uint64_t round, const Intervals& held, std::vector<Entry>* out) {
  out->push_back({int64_t(round), -1, -1});
  for (const auto& s : held.spans()) out->push_back({int64_t(round), int64_t(s.first), int64_t(s.second)});
}

uint64_t max_spans(uint64_t nbytes, uint64_t elem) {
  const uint64_t elems = nbytes / (elem ? elem : 1);
  return elems / 2 + elems % 2;  // disjoint, non-adjacent (merged) ranges of whole elements
}

// ---- this worker's side, and the checks of the others' rows ------------------------------------

namespace {

std::string num(uint64_t v) { return std::to_string(v); }
std::string who(uint32_t rank) { return "failover exchange: rank " + num(rank); }
uint64_t sat_add(uint64_t a, uint64_t b) { return a > ~uint64_t(0) - b ? ~uint64_t(0) : a + b; }
bool same(const Entry& a, const Entry& b) { return a.round == b.round && a.begin == b.begin && a.end == b.end; }

}  // namespace

void Limits::add_round(uint64_t round, const Intervals& held, uint64_t nbytes, uint64_t elem) {
  if (!pending.empty() && pending.back().first >= round)
    throw Error(ErrorKind::Internal, "failover exchange: unfinished rounds added out of order");
  append_round(round, held, &mine);
  pending.push_back({round, max_spans(nbytes, elem)});
}

void Limits::finish(uint64_t next) {
  own = {pending.empty() ? next : pending.front().first, next, uint64_t(mine.size())};
  extra_.assign(1, 0);  // extra_[i]: what pending[0, i) allow beyond one span each
  for (const auto& p : pending) extra_.push_back(sat_add(extra_.back(), p.second > 0 ? p.second - 1 : 0));
}

uint64_t Limits::spans_allowed(uint64_t round) const {
  if (round >= own.next) return 0;  // not started here: nobody holds any of its results
  auto it = std::lower_bound(pending.begin(), pending.end(), std::make_pair(round, uint64_t(0)));
  if (it != pending.end() && it->first == round) return it->second;
  return 1;  // finished here: every worker held all of it, one merged span
}

uint64_t Limits::entry_bound(uint64_t oldest, uint64_t next) const {
  uint64_t bound = next - oldest;  // a marker per round
  const uint64_t started = std::min(next, own.next);
  if (started <= oldest) return bound;
  bound = sat_add(bound, started - oldest);  // a span per started round ...
  const auto key = [](uint64_t r) { return std::make_pair(r, uint64_t(0)); };
  const size_t a = size_t(std::lower_bound(pending.begin(), pending.end(), key(oldest)) - pending.begin());
  const size_t b = size_t(std::lower_bound(pending.begin(), pending.end(), key(started)) - pending.begin());
  if (extra_.size() != pending.size() + 1)
    throw Error(ErrorKind::Internal, "failover exchange: Limits::finish() not called");
  return sat_add(bound, extra_[b] - extra_[a]);  // ... and more for the rounds unfinished here
}

uint64_t check_summaries(uint32_t world, const std::vector<int64_t>& summaries, const Limits& lim) {
  if (world == 0 || lim.rank >= world || summaries.size() != size_t(world) * kSummaryWords)
    throw Error(ErrorKind::Internal, "failover exchange: summary table of the wrong size");
  uint64_t max_e = 0;
  uint32_t largest = 0;
  for (uint32_t w = 0; w < world; ++w) {
    const int64_t* s = &summaries[size_t(w) * kSummaryWords];
    const auto said = [s] {
      return " (oldest " + std::to_string(s[0]) + ", next " + std::to_string(s[1]) + ", entries " +
             std::to_string(s[2]) + ")";
    };
    if (s[0] < 0 || s[1] < 0 || s[2] < 0)
      throw Error(ErrorKind::Protocol, who(w) + " reports a negative round or count" + said());
    const Summary row{uint64_t(s[0]), uint64_t(s[1]), uint64_t(s[2])};
    if (w == lim.rank && (row.oldest != lim.own.oldest || row.next != lim.own.next || row.entries != lim.own.entries))
      throw Error(ErrorKind::Protocol, who(w) + " (this worker) came back altered" + said() + ": it sent (oldest " +
                                           num(lim.own.oldest) + ", next " + num(lim.own.next) + ", entries " +
                                           num(lim.own.entries) + ")");
    if (row.next < row.oldest)
      throw Error(ErrorKind::Protocol, who(w) + " reports its next round below its oldest" + said());
    if (row.next - row.oldest > lim.window)
      throw Error(ErrorKind::Protocol, who(w) + " reports " + num(row.next - row.oldest) + " unfinished rounds" +
                                           said() + ", more than the " + num(lim.window) + " any worker can have");
    const uint64_t gap = row.next > lim.own.next ? row.next - lim.own.next : lim.own.next - row.next;
    if (gap > lim.window)
      throw Error(ErrorKind::Protocol, who(w) + " is at round " + num(row.next) + ", this worker at " +
                                           num(lim.own.next) + ": more than " + num(lim.window) + " rounds apart");
    const uint64_t bound = lim.entry_bound(row.oldest, row.next);
    if (row.entries > bound)
      throw Error(ErrorKind::Protocol, who(w) + " reports " + num(row.entries) + " entries" + said() +
                                           ": its rounds [" + num(row.oldest) + ", " + num(row.next) +
                                           ") carry at most " + num(bound) + " with what this worker has in flight");
    if (row.entries > max_e) {
      max_e = row.entries;
      largest = w;
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(world), max_e, &bytes) ||
      __builtin_mul_overflow(bytes, uint64_t(kEntryWords * sizeof(int64_t)), &bytes) || bytes > lim.max_table_bytes)
    throw Error(ErrorKind::Protocol, who(largest) + " reports " + num(max_e) + " entries: " + num(world) +
                                         " rows of that many would take more than the " + num(lim.max_table_bytes) +
                                         "-byte limit of the exchange");
  return max_e;
}

size_t table_words(uint32_t world, uint64_t max_entries) {
  uint64_t words = 0;
  if (__builtin_mul_overflow(uint64_t(world), max_entries, &words) ||
      __builtin_mul_overflow(words, uint64_t(kEntryWords), &words) || words > uint64_t(SIZE_MAX) / sizeof(int64_t))
    throw Error(ErrorKind::Protocol, "failover exchange: a table of " + num(world) + " rows of " + num(max_entries) +
                                         " entries does not fit in memory");
  return size_t(words);
}

void put_summary(std::vector<int64_t>* table, uint32_t rank, const Summary& s) {
  if (table->size() < (size_t(rank) + 1) * kSummaryWords)
    throw Error(ErrorKind::Internal, "failover exchange: summary table too small");
  int64_t* row = &(*table)[size_t(rank) * kSummaryWords];
  row[0] = int64_t(s.oldest);
  row[1] = int64_t(s.next);
  row[2] = int64_t(s.entries);
}

void put_entries(std::vector<int64_t>* table, uint32_t rank, uint64_t max_entries, const std::vector<Entry>& mine) {
  if (mine.empty()) return;
  if (mine.size() > max_entries || table->size() / kEntryWords / max_entries <= rank)  // (max_entries > 0 here)
    throw Error(ErrorKind::Internal, "failover exchange: entry table too small for this worker's row");
  int64_t* e = table->data() + size_t(rank) * size_t(max_entries) * kEntryWords;
  for (const Entry& x : mine) {
    *e++ = x.round;
    *e++ = x.begin;
    *e++ = x.end;
  }
}

// ---- the gathered table ------------------------------------------------------------------------

uint64_t Table::max_entries(uint32_t world, const std::vector<int64_t>& summaries) {
  if (summaries.size() != size_t(world) * kSummaryWords)
    throw Error(ErrorKind::Internal, "failover exchange: summary table of the wrong size");
  uint64_t m = 0;
  for (uint32_t w = 0; w < world; ++w) {
    const int64_t n = summaries[size_t(w) * kSummaryWords + 2];
    if (n < 0) throw Error(ErrorKind::Protocol, who(w) + " reports a negative entry count (" + std::to_string(n) + ")");
    m = std::max(m, uint64_t(n));
  }
  return m;
}

Table::Table(uint32_t world, const std::vector<int64_t>& summaries, const std::vector<int64_t>& entries,
             uint64_t max_entries, const Limits* lim)
    : world_(world), rows_(world), held_(world) {
  if (summaries.size() != size_t(world) * kSummaryWords || entries.size() != table_words(world, max_entries))
    throw Error(ErrorKind::Internal, "failover exchange: table of the wrong size");
  if (lim && check_summaries(world, summaries, *lim) > max_entries)
    throw Error(ErrorKind::Internal, "failover exchange: table narrower than its rows");
  lo_ = ~uint64_t(0);
  hi_ = ~uint64_t(0);
  for (uint32_t w = 0; w < world; ++w) {
    const int64_t* s = &summaries[size_t(w) * kSummaryWords];
    if (s[0] < 0 || s[1] < s[0] || s[2] < 0 || uint64_t(s[2]) > max_entries)
      throw Error(ErrorKind::Protocol, who(w) + " sent an invalid summary");
    rows_[w] = {uint64_t(s[0]), uint64_t(s[1]), uint64_t(s[2])};
    lo_ = std::min(lo_, rows_[w].oldest);
    hi_ = std::min(hi_, rows_[w].next);
    max_next_ = std::max(max_next_, rows_[w].next);
    add_row(w, entries.data() + size_t(w) * size_t(max_entries) * kEntryWords, lim);
  }
  if (lo_ > hi_) lo_ = hi_;
}

// Row w's entries (rows_[w].entries of them at `e`): rounds ascending inside [oldest, next), each
// round's spans ascending and disjoint (as append_round writes them), within `lim`.
void Table::add_row(uint32_t w, const int64_t* e, const Limits* lim) {
  const Summary& row = rows_[w];
  auto& mine = held_[w];
  uint64_t spans = 0, last_end = 0;  // of the round mine.back()
  for (uint64_t i = 0; i < row.entries; ++i, e += kEntryWords) {
    const auto at = [&] {
      return " in entry " + num(i) + " (" + std::to_string(e[0]) + ", " + std::to_string(e[1]) + ", " +
             std::to_string(e[2]) + ")";
    };
    const bool marker = e[1] == -1 && e[2] == -1;
    if (e[0] < 0 || (!marker && (e[1] < 0 || e[1] >= e[2])))
      throw Error(ErrorKind::Protocol, who(w) + " sent an invalid entry" + at());
    if (lim && w == lim->rank && (i >= lim->mine.size() || !same(lim->mine[i], Entry{e[0], e[1], e[2]})))
      throw Error(ErrorKind::Protocol, who(w) + " (this worker) came back altered" + at());
    const uint64_t round = uint64_t(e[0]);
    if (round < row.oldest || round >= row.next)
      throw Error(ErrorKind::Protocol, who(w) + " reports a round outside its rounds [" + num(row.oldest) + ", " +
                                           num(row.next) + ")" + at());
    if (mine.empty() || mine.back().first != round) {
      if (!mine.empty() && mine.back().first > round)
        throw Error(ErrorKind::Protocol, who(w) + "'s rounds are out of order" + at());
      mine.push_back({round, Held{}});
      spans = last_end = 0;
    }
    Held& h = mine.back().second;
    if (marker) {
      h.unfinished = true;
      continue;
    }
    if (!h.unfinished)  // append_round writes the marker first: spans alone would mean nothing
      throw Error(ErrorKind::Protocol, who(w) + " reports a span of round " + num(round) + " before its marker" + at());
    if (uint64_t(e[1]) < last_end) throw Error(ErrorKind::Protocol, who(w) + "'s spans are out of order" + at());
    if (lim && ++spans > lim->spans_allowed(round))
      throw Error(ErrorKind::Protocol, who(w) + " reports more spans of round " + num(round) + " than its " +
                                           num(lim->spans_allowed(round)) + " possible here" + at());
    last_end = uint64_t(e[2]);
    h.spans.add(uint64_t(e[1]), uint64_t(e[2]));  // at the end: O(1)
  }
}

const Table::Held* Table::find(uint32_t rank, uint64_t round) const {
  const auto& v = held_[rank];
  auto it = std::lower_bound(v.begin(), v.end(), round,
                             [](const std::pair<uint64_t, Held>& a, uint64_t r) { return a.first < r; });
  return it != v.end() && it->first == round && it->second.unfinished ? &it->second : nullptr;
}

std::vector<Table::Piece> Table::plan(uint64_t round, uint64_t nbytes, uint64_t elem) const {
  // A rank that finished the round (it is below its `next` and has no "unfinished" marker) was
  // told by every reducer that every worker holds the results (CLEAR): it holds all of it.
  // The others hold their spans: a sweep over the span boundaries keeps the set of ranks holding
  // the bytes between two boundaries (stops before starts at one point).
  struct Edge {
    uint64_t at;
    bool start;
    uint32_t rank;
    bool operator<(const Edge& o) const { return at != o.at ? at < o.at : start < o.start; }
  };
  std::vector<Edge> edges;
  uint32_t everywhere = 0;  // ranks holding all of it
  int64_t first_full = -1;  // the lowest of them
  for (uint32_t w = 0; w < world_; ++w) {
    if (round >= rows_[w].next)
      throw Error(ErrorKind::Protocol, "failover exchange: round " + num(round) + " is not started on rank " + num(w));
    const Held* h = find(w, round);
    if (!h) {  // finished there
      if (everywhere++ == 0) first_full = int64_t(w);
      continue;
    }
    for (const auto& s : h->spans.spans()) {
      if (s.second > nbytes || s.first % elem || s.second % elem)
        throw Error(ErrorKind::Protocol, who(w) + " reports bytes [" + num(s.first) + ", " + num(s.second) +
                                             ") of round " + num(round) + " (" + num(nbytes) + " bytes)");
      edges.push_back({s.first, true, w});
      edges.push_back({s.second, false, w});
    }
  }
  std::sort(edges.begin(), edges.end());
  std::set<uint32_t> holding;
  std::vector<Piece> out;
  auto piece = [&](uint64_t a, uint64_t b) {
    if (a >= b || everywhere + holding.size() == world_) return;  // empty, or everyone holds it
    int64_t holder = first_full;
    if (!holding.empty() && (holder < 0 || int64_t(*holding.begin()) < holder)) holder = int64_t(*holding.begin());
    if (!out.empty() && out.back().end == a && out.back().holder == holder) out.back().end = b;
    else out.push_back({a, b, holder});
  };
  uint64_t pos = 0;
  for (size_t i = 0; i < edges.size();) {
    const uint64_t at = edges[i].at;
    piece(pos, at);
    for (; i < edges.size() && edges[i].at == at; ++i) {
      if (edges[i].start) holding.insert(edges[i].rank);
      else holding.erase(edges[i].rank);
    }
    pos = at;
  }
  piece(pos, nbytes);
  return out;
}

}  // namespace rs::client::failover
