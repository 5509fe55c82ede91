#include "server/group.h"

#include <cstring>
#include <sstream>

namespace rs::server {

Group::Group(GroupKey k, uint32_t w, uint32_t c, uint16_t ns, int window)
    : key(std::move(k)), world(w), chunk(c), num_streams(ns), members_(w, nullptr), slots_(size_t(window < 1 ? 1 : window)) {}

size_t Group::allocate() {
  if (arena_) return 0;
  // Per slot: one receive buffer per rank plus a float32 accumulator for 16-bit dtypes
  // (chunk/2 elements x 4 bytes = 2 x chunk).
  size_t per_slot = size_t(world) * chunk + 2 * size_t(chunk);
  arena_bytes_ = per_slot * slots_.size();
  arena_ = std::make_unique<uint8_t[]>(arena_bytes_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].data = arena_.get() + i * per_slot;
    slots_[i].acc = slots_[i].data + size_t(world) * chunk;
    slots_[i].arrived.assign(world, 0);
  }
  return arena_bytes_;
}

static std::string describe(const proto::FrameHeader& h) {
  std::ostringstream o;
  o << dtype_name(DType(h.dtype)) << " " << op_name(Op(h.op)) << " of " << h.total_bytes << " bytes (round " << h.round
    << ", chunk at " << h.offset << "+" << h.length << " of a " << h.shard_bytes << "-byte shard";
  if (h.tag) o << ", fingerprint " << std::hex << h.tag << std::dec;
  o << ")";
  return o.str();
}

std::string Group::mismatch(const proto::FrameHeader& a, uint32_t rank_a, const proto::FrameHeader& b, uint32_t rank_b,
                            uint16_t stream) {
  if (a.round == b.round && a.dtype == b.dtype && a.op == b.op && a.total_bytes == b.total_bytes &&
      a.shard_bytes == b.shard_bytes && a.offset == b.offset && a.length == b.length && a.tag == b.tag &&
      a.flags == b.flags)
    return "";
  std::ostringstream o;
  o << "workers disagree on an all-reduce: rank " << rank_a << " sent " << describe(a) << ", rank " << rank_b
    << " sent " << describe(b);
  if (a.tag != b.tag && a.total_bytes == b.total_bytes && a.dtype == b.dtype)
    o << "; the fused tensor lists differ";
  return o.str();
}

bool Group::advance(Slot& s) {
  const DType t = DType(s.params.dtype);
  const Op op = Op(s.params.op);
  const size_t n = s.params.length / dtype_size(t);
  const bool in_place = acc_is_wire_type(t);
  void* acc = in_place ? static_cast<void*>(s.data) : static_cast<void*>(s.acc);
  while (s.next_rank < world && s.arrived[s.next_rank]) {
    const uint8_t* x = contribution(s, s.next_rank);
    if (s.next_rank == 0) {
      if (!in_place) kernels::init(t, acc, x, n);
    } else {
      kernels::accumulate(t, op, acc, x, n);
    }
    ++s.next_rank;
  }
  if (s.next_rank < world) return false;
  if (!in_place || op == Op::Avg) kernels::finalize(t, op, s.data, acc, n, world);
  return true;
}

void Group::release(Slot& s) {
  s.seq = -1;
  s.next_rank = 0;
  s.pending_sends = 0;
  std::fill(s.arrived.begin(), s.arrived.end(), 0);
}

}  // namespace rs::server
