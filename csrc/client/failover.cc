#include "client/failover.h"

#include <algorithm>

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

uint64_t Table::max_entries(uint32_t world, const std::vector<int64_t>& summaries) {
  uint64_t m = 0;
  for (uint32_t w = 0; w < world; ++w) m = std::max<uint64_t>(m, uint64_t(summaries[w * kSummaryWords + 2]));
  return m;
}

Table::Table(uint32_t world, const std::vector<int64_t>& summaries, const std::vector<int64_t>& entries,
             uint64_t max_entries)
    : world_(world), rows_(world), held_(world) {
  if (summaries.size() != size_t(world) * kSummaryWords || entries.size() != size_t(world * max_entries * kEntryWords))
    throw Error(ErrorKind::Internal, "failover exchange: table of the wrong size");
  lo_ = ~uint64_t(0);
  hi_ = ~uint64_t(0);
  for (uint32_t w = 0; w < world; ++w) {
    const int64_t* s = &summaries[w * kSummaryWords];
    if (s[0] < 0 || s[1] < s[0] || s[2] < 0 || uint64_t(s[2]) > max_entries)
      throw Error(ErrorKind::Protocol, "failover exchange: rank " + std::to_string(w) + " sent an invalid summary");
    rows_[w] = {uint64_t(s[0]), uint64_t(s[1]), uint64_t(s[2])};
    lo_ = std::min(lo_, rows_[w].oldest);
    hi_ = std::min(hi_, rows_[w].next);
    max_next_ = std::max(max_next_, rows_[w].next);
    auto& mine = held_[w];
    for (uint64_t i = 0; i < rows_[w].entries; ++i) {
      const int64_t* e = &entries[(w * max_entries + i) * kEntryWords];
      if (e[0] < 0 || (e[1] < 0) != (e[2] < 0) || (e[1] >= 0 && e[1] > e[2]))
        throw Error(ErrorKind::Protocol, "failover exchange: rank " + std::to_string(w) + " sent an invalid entry");
      const uint64_t round = uint64_t(e[0]);
      if (mine.empty() || mine.back().first != round) {
        if (!mine.empty() && mine.back().first > round)
          throw Error(ErrorKind::Protocol, "failover exchange: rank " + std::to_string(w) + "'s rounds are out of order");
        mine.push_back({round, Held{}});
      }
      Held& h = mine.back().second;
      if (e[1] < 0) h.unfinished = true;
      else h.spans.add(uint64_t(e[1]), uint64_t(e[2]));
    }
  }
  if (lo_ > hi_) lo_ = hi_;
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
  std::vector<const Intervals*> held(world_, nullptr);
  std::vector<uint64_t> cuts{0, nbytes};
  for (uint32_t w = 0; w < world_; ++w) {
    if (round >= rows_[w].next)
      throw Error(ErrorKind::Protocol, "failover exchange: round " + std::to_string(round) + " is not started on rank " +
                                           std::to_string(w));
    const Held* h = find(w, round);
    if (!h) continue;  // finished there
    held[w] = &h->spans;
    for (const auto& s : h->spans.spans()) {
      if (s.second > nbytes || s.first % elem || s.second % elem)
        throw Error(ErrorKind::Protocol, "failover exchange: rank " + std::to_string(w) + " reports bytes [" +
                                             std::to_string(s.first) + ", " + std::to_string(s.second) + ") of round " +
                                             std::to_string(round) + " (" + std::to_string(nbytes) + " bytes)");
      cuts.push_back(s.first);
      cuts.push_back(s.second);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<Piece> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const uint64_t a = cuts[i], b = cuts[i + 1];
    int64_t holder = -1;
    bool all = true;
    for (uint32_t w = 0; w < world_; ++w) {
      const bool has = !held[w] || held[w]->covers(a, b);
      if (has && holder < 0) holder = int64_t(w);
      all = all && has;
    }
    if (all) continue;
    if (!out.empty() && out.back().end == a && out.back().holder == holder) out.back().end = b;
    else out.push_back({a, b, holder});
  }
  return out;
}

}  // namespace rs::client::failover
