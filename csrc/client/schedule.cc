#include "client/schedule.h"

#include <algorithm>
#include <chrono>

#include "net/tcp_path.h"
#include "protocol/plan.h"
#include "protocol/wire.h"

namespace rs::client {

Round* Schedule::by_wire(uint64_t wire) const {
  if (rounds.empty() || wire < rounds.front()->wire) return nullptr;
  uint64_t i = wire - rounds.front()->wire;
  return i < rounds.size() ? rounds[size_t(i)] : nullptr;
}

size_t Schedule::staging_slots() const { return std::min(size_t(opts_.window), kMaxStagingSlots); }

// One contiguous shard per reducer of the session, in chunks dealt round-robin to its streams.
void Schedule::plan(Round& r, const Links& links, size_t reducers) const {
  const size_t wes = dtype_size(r.dtype);
  const uint64_t es = wes * r.scale();  // bytes per element in the buffer
  const uint64_t S = uint64_t(opts_.streams);
  proto::ShardPlan sp = proto::plan_round(r.nbytes / wes, wes, reducers, opts_.world_size, r.wire);
  r.parts.assign(links.size(), Round::Part{});
  r.parts_left = 0;
  r.clears_left = 0;
  for (size_t li = 0; li < links.size(); ++li) {
    const Link& l = *links[li];
    const size_t pos = li / size_t(S);  // the reducer's place in the session
    Round::Part& p = r.parts[li];
    p.shard_off = sp.offset[pos] * wes;
    p.shard_bytes = sp.count[pos] * wes;
    // Chunks as large on the wire as the uncompressed round's (the rule on the shard's buffer
    // bytes, so 32 per shard instead of 64): a reducer holds a few chunks per stream at once, so
    // the chunk size bounds the bytes in flight per link (measured: half-size chunks reached 40%
    // of a 1 Gbit/s link instead of 70-90%).
    const proto::Pipeline pipe = proto::pipeline_for(p.shard_bytes / wes * es, opts_.chunk_bytes, opts_.world_size,
                                                     reducers, uint64_t(opts_.window));
    p.chunk = pipe.chunk;
    p.window = pipe.window;
    p.nchunks = (p.shard_bytes + p.chunk - 1) / p.chunk;
    p.next_send = uint64_t(l.stream);
    p.expected = p.nchunks > uint64_t(l.stream) ? (p.nchunks - uint64_t(l.stream) + S - 1) / S : 0;
    if (p.expected > 0) {
      r.parts_left++;
      if (opts_.failover) r.clears_left++;
    }
  }
  r.in_session = true;
}

void Schedule::fill(Link& l, size_t li, bool copies_short) {
  if (l.closed) return;
  // Rounds before the oldest unfinished one are complete, so this link sent all of them.
  if (rounds.empty()) l.send_wire = next_wire;
  else l.send_wire = std::max(l.send_wire, rounds.front()->wire);
  while (!l.out.full()) {
    Round* r = by_wire(l.send_wire);
    if (!r) break;
    Round::Part& p = r->parts[li];
    if (p.next_send >= p.nchunks) {
      l.send_wire++;  // this round's chunks on this link are all queued: the next round's follow
      continue;
    }
    // The window of the round being queued (proto::pipeline_for, widened to the path's
    // bandwidth-delay product: window_of; the sender's alone: workers need not agree on it).
    if (l.in_flight >= window_of(l, p)) break;
    if (r->comp != Compression::None) {
      l.staging.ensure(staging_slots(), opts_.chunk_bytes);  // once per session and link
      if (l.staging.full()) break;                           // every slot waits to be written
    }
    queue_chunk(l, *r, p);
  }
  queue_done(l, li, copies_short);
}

// The rate link `l`'s results came back at, over at least `window_bytes` of them (a window's worth)
// since the sample began; a sample begins at a check (the window is the limit) and a link that runs
// dry ends it (Client::on_frame), so the time counted is time the link was busy. The rate the window
// follows is the largest of the last kRateSamples samples: a capacity estimate that a few
// loss-depressed samples do not pull down (1% loss at 40 ms held a window at 4 chunks for a whole
// 16 MiB round once). True when it took a new sample (and only then may the window change).
//
// Not TCP's tcpi_delivery_rate: one sample of that is the rate of the last few segments, and a burst
// that a queue lets through at once reads as the NIC's rate or more. At W = R = 16 on emulated
// 50 Mbit/s links (a token bucket that passes 256 KiB at memory speed) it read 4-9 Gbit/s on half
// of a worker's links, with tcpi_min_rtt 10 us: windows of 6 chunks where 2 fill the link, 16 links
// x 6 x 8 KiB overflowing the worker's own queue, and rounds that lost 0.2 s to the drops
// (docs/performance.md, "The path window and bursts").
bool Schedule::sample_rate(Link& l, uint64_t window_bytes, int64_t now) {
  if (l.rate_from_ns == 0) {
    l.rate_from_ns = now;
    l.got_bytes = 0;
    return false;
  }
  if (l.got_bytes < window_bytes || now <= l.rate_from_ns) return false;
  l.rates[l.rate_next++ % l.rates.size()] = uint64_t(double(l.got_bytes) * 1e9 / double(now - l.rate_from_ns));
  l.rate_Bps = *std::max_element(l.rates.begin(), l.rates.end());
  l.rate_from_ns = now;
  l.got_bytes = 0;
  return true;
}

// The chunks link `l` may keep in flight while it queues part `p`: the round's window, or more
// where the path needs them (proto::path_window of this part's window and chunk, from the link's
// last round trip and rate: so a round with another window or chunk than the last one's gets its
// own at once). The path is measured again only while the window is the limit, at most every
// kPathCheckNs, and TCP_INFO read only when a new rate sample is in: a getsockopt per window's worth
// of results at most (every 2 ms per link was 9% of the CPU of a W = R = 32 bench on 2 cores).
uint64_t Schedule::window_of(Link& l, const Round::Part& p) const {
  const uint64_t w = proto::path_window(p.window, p.chunk, l.rtt_us, l.rate_Bps);
  if (l.in_flight < w) return w;
  l.window_used = w;  // the window is the limit (what stats report: a small round's never is)
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (now - l.path_checked_ns < kPathCheckNs) return w;
  l.path_checked_ns = now;
  if (!sample_rate(l, w * p.chunk, now)) return w;
  l.rtt_us = net::tcp_path(l.fd.get()).rtt_us;
  l.window_used = proto::path_window(p.window, p.chunk, l.rtt_us, l.rate_Bps);
  return l.window_used;
}

// Queues the next chunk of round `r` on link `l` (narrowed into a staging slot if compressed).
void Schedule::queue_chunk(Link& l, Round& r, Round::Part& p) {
  const uint64_t S = uint64_t(opts_.streams);
  const uint64_t off = p.next_send * p.chunk;
  const uint64_t len = std::min<uint64_t>(p.chunk, p.shard_bytes - off);
  proto::FrameHeader h;
  h.type = proto::FrameType::Data;
  h.dtype = uint8_t(r.dtype);
  h.op = uint8_t(r.op);
  h.flags = (p.next_send + S >= p.nchunks) ? proto::kLastInStream : 0;
  h.length = uint32_t(len);
  h.round = r.wire;
  h.total_bytes = r.nbytes;
  h.shard_bytes = p.shard_bytes;
  h.offset = off;
  h.tag = r.tag;
  uint8_t hdr[proto::kFrameHeaderBytes];
  proto::encode(h, hdr);
  if (r.comp != Compression::None) {
    const uint8_t* slot = l.staging.narrow_next(r.buf, r.dtype, p.shard_off + off, len);
    l.out.push(hdr, sizeof hdr, net::Payload::bytes(slot, len), frame_token(r.wire, true));
  } else {
    l.out.push(hdr, sizeof hdr, net::Payload::range(r.buf, p.shard_off + off, len), frame_token(r.wire, false));
  }
  p.next_send += S;
  l.in_flight++;
  l.cork = false;
}

// The DONE goes out with what this link writes anyway. Alone, when only rounds released early
// wait for it (their copies do, no caller), it is written with MSG_MORE: the kernel keeps it
// for the link's next write (the next round on this reducer, usually within a round or two),
// about 200 ms at most. That spares the reducer a wake-up per DONE, and its CLEARs then leave
// with that round's results. A round this worker cannot hand back before the CLEAR
// (done_urgent), a drain or a pool of copies (nearly) full (copies_short) send it at once.
void Schedule::queue_done(Link& l, size_t li, bool copies_short) {
  if (l.done_queued || !l.done_owed || l.done_sent >= l.done_next || l.out.full()) return;
  l.cork = l.out.empty() && l.in_flight == 0 && !copies_short && !done_urgent(l, li);
  proto::FrameHeader h;
  h.type = proto::FrameType::Done;
  h.round = l.done_next;
  uint8_t hdr[proto::kFrameHeaderBytes];
  proto::encode(h, hdr);
  l.out.push(hdr, sizeof hdr, net::Payload::none(), kDoneToken);
  l.done_queued = true;
  l.done_owed = false;
  l.done_sent = l.done_next;
}

// DONE(n): this worker holds the results of every round below n on this link (fill() sends it).
// Only a round with a part on the link makes one owed: the reducer knows nothing of the others
// (a small round uses some of the reducers), and a DONE for them would cost both ends a frame
// and a wake-up, and the reducer a CLEAR to every worker, for nothing.
void Schedule::advance_done(Link& l, size_t li) {
  if (!opts_.failover) return;
  if (!rounds.empty()) l.done_next = std::max(l.done_next, rounds.front()->wire);
  while (Round* r = by_wire(l.done_next)) {
    const Round::Part& p = r->parts[li];
    if (p.received < p.expected) break;
    if (p.expected) l.done_owed = true;
    l.done_next++;
  }
}

// True if a round the DONE owed on link li covers will wait for its CLEAR in its caller's hands
// (not released early): an internal round or a large one. (A small one the pool of copies has no
// room for waits too; then copies_short holds, which sends every DONE at once anyway.)
bool Schedule::done_urgent(const Link& l, size_t li) const {
  for (uint64_t w = l.done_sent; w < l.done_next; ++w) {
    const Round* r = by_wire(w);
    if (r && r->parts[li].expected > 0 && r->state == Round::State::Running && !r->released && !r->small_user())
      return true;
  }
  return false;
}

}  // namespace rs::client
