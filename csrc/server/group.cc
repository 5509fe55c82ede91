#include "server/group.h"
#include "server/conn.h"

#include <sys/mman.h>

#include <algorithm>
#include <sstream>

namespace rs::server {

Arena::~Arena() {
  if (data_) ::munmap(data_, bytes_);
}

void Arena::discard() {
  if (data_) ::madvise(data_, bytes_, MADV_DONTNEED);
}

bool Arena::map(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  data_ = static_cast<uint8_t*>(p);
  bytes_ = bytes;
  return true;
}

Group::Group(GroupKey k, uint32_t w, uint32_t c, uint16_t ns, int slots, PeerTable::Ticket creator)
    : key_(std::move(k)),
      world_(w),
      chunk_(c),
      num_streams_(ns),
      slot_count_(slots < 1 ? 1 : slots),
      created_(Clock::now()),
      creator_(std::move(creator)) {}

uint64_t Group::bytes_needed(uint32_t world, uint32_t chunk, int slots) {
  return uint64_t(slots < 1 ? 1 : slots) * (uint64_t(world) + 2) * uint64_t(chunk);
}

Conn* Group::member(uint32_t rank) const {
  if (complete_) return rank < members_.size() ? members_[rank] : nullptr;
  for (const auto& w : waiting_)
    if (w.rank == rank) return w.conn;
  return nullptr;
}

void Group::add_member(uint32_t rank, Conn* c, const std::string& ip) {
  if (complete_) {
    members_[rank] = c;
  } else {
    waiting_.push_back(Waiting{rank, c, ip});
  }
  ++joined_;
}

void Group::remove_member(uint32_t rank) {
  if (complete_) {
    if (rank < members_.size() && members_[rank]) {
      members_[rank] = nullptr;
      --joined_;
    }
    return;
  }
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [rank](const auto& w) { return w.rank == rank; });
  if (it != waiting_.end()) {
    waiting_.erase(it);
    --joined_;
  }
}

std::vector<uint32_t> Group::missing_ranks(size_t at_most) const {
  std::vector<uint32_t> joined;
  for (const auto& w : waiting_) joined.push_back(w.rank);
  std::sort(joined.begin(), joined.end());
  std::vector<uint32_t> out;
  size_t j = 0;
  for (uint32_t r = 0; r < world_ && out.size() < at_most; ++r) {
    if (j < joined.size() && joined[j] == r) {
      ++j;
      continue;
    }
    out.push_back(r);
  }
  return out;
}

std::string Group::incomplete_message(int timeout_s) const {
  std::string missing;
  for (uint32_t r : missing_ranks(8)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  if (world_ - joined_ > 8) missing += ", ...";
  return "group " + key_.label() + ": only " + std::to_string(joined_) + " of " + std::to_string(world_) +
         " ranks joined within " + std::to_string(timeout_s) +
         " s (group_timeout): " + std::to_string(world_ - joined_) + " missing (ranks " + missing + ")";
}

void Group::mark_failed(const std::string& why) {
  failed_ = true;
  last_error_ = why;
}

std::string Group::complete(MemoryBudget& budget) {
  const uint64_t need = bytes_needed(world_, chunk_, slot_count_);
  std::string why = budget.reserve(claim(), &reservation_);
  if (!why.empty())
    return "group " + key_.label() + " needs " + std::to_string(need >> 20) + " MiB of reduction buffers but " + why +
           ": add reducers, use a smaller chunk size, or raise that limit";
  if (!arena_.map(size_t(need))) {
    reservation_ = MemoryBudget::Reservation();
    return "group " + key_.label() + ": the operating system refused " + std::to_string(need >> 20) + " MiB";
  }
  const size_t per_slot = size_t(world_) * chunk_ + 2 * size_t(chunk_);
  slots_.resize(size_t(slot_count_));
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].data = arena_.data() + i * per_slot;
    slots_[i].acc = slots_[i].data + size_t(world_) * chunk_;
    slots_[i].arrived.assign(world_, 0);
  }
  members_.assign(world_, nullptr);
  for (const auto& w : waiting_) members_[w.rank] = w.conn;
  waiting_.clear();
  waiting_.shrink_to_fit();
  complete_ = true;
  active_at_ = Clock::now();
  return "";
}

MemoryBudget::Claim Group::claim() const {
  MemoryBudget::Claim c;
  c.job = key_.job;
  const uint64_t per_rank = uint64_t(slot_count_) * chunk_;
  std::vector<std::pair<std::string, uint64_t>> parts;
  parts.reserve(waiting_.size());
  for (const auto& w : waiting_)  // each rank's receive buffers; the accumulator (2 x theirs) to rank 0
    parts.emplace_back(w.ip, per_rank * (w.rank == 0 ? 3 : 1));
  std::sort(parts.begin(), parts.end());
  for (auto& p : parts) {  // one entry per address
    c.bytes += p.second;
    if (!c.peers.empty() && c.peers.back().first == p.first) c.peers.back().second += p.second;
    else c.peers.push_back(std::move(p));
  }
  return c;
}

bool Group::idle(Clock::time_point now, std::chrono::milliseconds timeout) {
  if (bytes_received != idle_mark_) {
    idle_mark_ = bytes_received;
    active_at_ = now;
    return false;
  }
  for (const Slot& s : slots_)
    if (s.seq >= 0) return false;
  return now - active_at_ >= timeout;
}

void Group::release_memory() {
  reservation_.release();
  arena_.discard();
}

std::string Group::renew_memory(MemoryBudget& budget) {
  std::string why = budget.renew(&reservation_);
  if (why.empty()) return "";
  return "group " + key_.label() + " gave its " + std::to_string(bytes_needed(world_, chunk_, slot_count_) >> 20) +
         " MiB of reduction buffers back while it was idle (memory_idle_timeout) and cannot take them again: " + why;
}

std::vector<uint32_t> Group::stalled_ranks(uint32_t leaver, size_t at_most) const {
  const Slot* oldest = nullptr;
  for (const Slot& s : slots_)
    if (s.seq >= 0 && s.next_rank < world_ && (!oldest || s.seq < oldest->seq)) oldest = &s;
  std::vector<uint32_t> out;
  if (!oldest || leaver >= world_ || !oldest->arrived[leaver]) return out;
  for (uint32_t r = 0; r < world_ && out.size() < at_most; ++r)
    if (!oldest->arrived[r]) out.push_back(r);
  return out;
}

bool Group::busy() const {
  for (const Slot& s : slots_)
    if (s.seq >= 0 && s.next_rank < world_) return true;
  return false;
}

static std::string describe(const proto::FrameHeader& h) {
  std::ostringstream o;
  o << dtype_name(DType(h.dtype)) << " " << op_name(Op(h.op)) << " of " << h.total_bytes << " bytes (round " << h.round
    << ", chunk at " << h.offset << "+" << h.length << " of a " << h.shard_bytes << "-byte shard";
  if (h.tag) o << ", fingerprint " << std::hex << h.tag << std::dec;
  o << ")";
  return o.str();
}

std::string Group::mismatch(const proto::FrameHeader& a, uint32_t rank_a, const proto::FrameHeader& b,
                            uint32_t rank_b) {
  if (a.round == b.round && a.dtype == b.dtype && a.op == b.op && a.total_bytes == b.total_bytes &&
      a.shard_bytes == b.shard_bytes && a.offset == b.offset && a.length == b.length && a.tag == b.tag &&
      a.flags == b.flags)
    return "";
  std::ostringstream o;
  o << "workers disagree on an all-reduce: rank " << rank_a << " sent " << describe(a) << ", rank " << rank_b
    << " sent " << describe(b);
  if (a.tag != b.tag && a.total_bytes == b.total_bytes && a.dtype == b.dtype) o << "; the fused tensor lists differ";
  return o.str();
}

bool Group::advance(Slot& s) {
  const DType t = DType(s.params.dtype);
  const Op op = Op(s.params.op);
  const size_t n = s.params.length / dtype_size(t);
  const bool in_place = acc_is_wire_type(t);
  void* acc = in_place ? static_cast<void*>(s.data) : static_cast<void*>(s.acc);
  while (s.next_rank < world_ && s.arrived[s.next_rank]) {
    const uint8_t* x = contribution(s, s.next_rank);
    if (s.next_rank == 0) {
      if (!in_place) kernels::init(t, acc, x, n);
    } else {
      kernels::accumulate(t, op, acc, x, n);
    }
    ++s.next_rank;
  }
  if (s.next_rank < world_) return false;
  if (!in_place || op == Op::Avg) kernels::finalize(t, op, s.data, acc, n, world_);
  return true;
}

void Group::release(Slot& s) {
  s.seq = -1;
  s.next_rank = 0;
  s.pending_sends = 0;
  std::fill(s.arrived.begin(), s.arrived.end(), 0);
}

}  // namespace rs::server

namespace rs::server {

bool Group::update_cleared() {
  if (!complete_) return false;
  uint64_t low = ~uint64_t(0);
  for (Conn* m : members_) {
    if (!m) {
      // A member that left between rounds (the group ended cleanly: left()) holds nobody back:
      // no repair can involve it any more, and the others still get the CLEARs their own DONEs
      // earn (a round they hold unreleased would otherwise wait for a CLEAR that never comes).
      // A member gone any other way: the group failed, nothing is cleared any more.
      if (left_.empty()) return false;
      continue;
    }
    low = std::min(low, m->done_round);
  }
  if (low == ~uint64_t(0) || low <= cleared_) return false;
  cleared_ = low;
  return true;
}

}  // namespace rs::server
