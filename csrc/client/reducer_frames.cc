#include "client/reducer_frames.h"

#include <algorithm>

#include "client/peer_text.h"

namespace rs::client {

namespace {

std::string n(uint64_t v) { return std::to_string(v); }

}  // namespace

std::string check_result(const proto::FrameHeader& h, const SentRound* round, const LinkShare& p, uint64_t stream,
                         uint64_t streams) {
  if (!round) return "round " + n(h.round) + " is not in flight";
  if (h.dtype != round->dtype || h.op != round->op)
    return "dtype/op " + n(h.dtype) + "/" + n(h.op) + " where this worker sent " + n(round->dtype) + "/" + n(round->op);
  if (h.total_bytes != round->nbytes || h.shard_bytes != p.shard_bytes)
    return "a round of " + n(h.total_bytes) + " bytes with a shard of " + n(h.shard_bytes) +
           " where this worker sent " + n(round->nbytes) + " and " + n(p.shard_bytes);
  if (p.chunk == 0 || p.received >= p.expected) return "no result is due on this link";
  const uint64_t idx = uint64_t(stream) + p.received * streams;  // results come in chunk order
  if (h.offset % p.chunk || h.offset / p.chunk != idx)
    return "offset " + n(h.offset) + " where the next result due starts at " + n(idx * p.chunk);
  if (p.received >= p.written) return "chunk " + n(idx) + " was not sent yet";
  const uint64_t len = std::min<uint64_t>(p.chunk, p.shard_bytes - h.offset);
  if (h.length != len) return n(h.length) + " bytes where this worker sent " + n(len);
  return "";
}

std::string check_clear(uint64_t upto, uint64_t done_sent, bool failover) {
  if (!failover) return "a CLEAR (round " + n(upto) + ") on a connection without reducer failover";
  if (upto > done_sent)
    return "cleared round " + n(upto) + " before this worker said it had the results (its last DONE: " + n(done_sent) +
           ")";
  return "";
}

std::string reducer_error_text(const std::string& reducer, const std::string& text) {
  return "reducer " + reducer + ": " + peer_text(text);
}

}  // namespace rs::client
