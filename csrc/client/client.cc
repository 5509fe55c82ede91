#include "client/client.h"

#include "client/handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"

namespace rs::client {

using net::Clock;

ShardPlan plan_shards(uint64_t elems, size_t reducers) {
  ShardPlan p;
  p.offset.resize(reducers);
  p.count.resize(reducers);
  uint64_t base = elems / reducers, rem = elems % reducers, off = 0;
  for (size_t r = 0; r < reducers; ++r) {
    p.offset[r] = off;
    p.count[r] = base + (r < rem ? 1 : 0);
    off += p.count[r];
  }
  return p;
}

ShardPlan plan_round(uint64_t elems, size_t elem_size, size_t reducers, uint64_t round) {
  const uint64_t nbytes = elems * elem_size;
  size_t used = reducers;
  if (nbytes < uint64_t(reducers) * kMinShardBytes)
    used = size_t(std::max<uint64_t>(1, (nbytes + kMinShardBytes - 1) / kMinShardBytes));
  ShardPlan dense = plan_shards(elems, used);
  if (used == reducers) return dense;
  ShardPlan p;
  p.offset.assign(reducers, 0);
  p.count.assign(reducers, 0);
  const size_t rot = size_t(round % reducers);
  for (size_t j = 0; j < used; ++j) {
    p.offset[(j + rot) % reducers] = dense.offset[j];
    p.count[(j + rot) % reducers] = dense.count[j];
  }
  return p;
}

uint64_t chunk_for(uint64_t shard_bytes, uint64_t max_chunk) {
  uint64_t c = (shard_bytes / kChunksPerShard + 4095) / 4096 * 4096;
  c = std::max(c, kMinPipelineChunk);
  return std::min(c, max_chunk);
}

struct Client::Link {
  net::Fd fd;
  std::string peer;  // "reducer host:port (stream s)"
  size_t reducer = 0;
  int stream = 0;
  // per round
  uint8_t* shard = nullptr;
  uint64_t shard_bytes = 0;
  uint64_t chunk = 0;         // chunk size of this round on this shard
  uint64_t nchunks = 0;       // chunks of this shard (all streams)
  uint64_t next_send = 0;     // next chunk index to send (stream, stream + S, ...)
  size_t sent = 0;            // bytes of the current frame written
  uint8_t hdr_out[proto::kFrameHeaderBytes];
  bool hdr_ready = false;
  uint64_t expected = 0, received = 0;
  uint8_t hdr_in[proto::kFrameHeaderBytes];
  size_t hdr_got = 0;
  bool have_hdr = false;
  proto::FrameHeader in;
  uint8_t* dst = nullptr;
  size_t dst_got = 0;
  std::string error_text;     // payload of an Error frame being read

  bool sending_done(int streams) const { return next_send >= nchunks; }
  // Frames sent (or being sent) on this link whose results have not come back yet.
  uint64_t in_flight(int streams) const {
    uint64_t started = next_send > uint64_t(stream) ? (next_send - uint64_t(stream)) / uint64_t(streams) : 0;
    if (hdr_ready) ++started;
    return started - std::min(started, received);
  }
  // A worker keeps at most `window` chunks in flight per link: the flows to all reducers then
  // advance together instead of one racing ahead while a reducer waits for another's chunk.
  bool may_send(int streams, uint64_t window) const {
    return !sending_done(streams) && (hdr_ready || in_flight(streams) < window);
  }
  bool done(int streams) const { return sending_done(streams) && received == expected; }
};

namespace {

ErrorKind kind_of(proto::ErrorCode code) {
  switch (code) {
    case proto::ErrorCode::Mismatch: return ErrorKind::Mismatch;
    case proto::ErrorCode::Protocol: return ErrorKind::Protocol;
    case proto::ErrorCode::PeerLost:
    case proto::ErrorCode::Shutdown: return ErrorKind::PeerLost;
    default: return ErrorKind::Internal;
  }
}

}  // namespace

Client::Client(ClientOptions opts) : opts_(std::move(opts)) {
  if (opts_.reducers.empty()) throw Error(ErrorKind::Config, "no reducers given");
  if (opts_.world_size < 1) throw Error(ErrorKind::Config, "world_size must be at least 1");
  if (opts_.rank >= opts_.world_size)
    throw Error(ErrorKind::Config, "rank " + std::to_string(opts_.rank) + " out of range for world size " +
                                       std::to_string(opts_.world_size));
  if (opts_.streams < 1 || opts_.streams > proto::kMaxStreams) throw Error(ErrorKind::Config, "streams must be in 1..64");
  if (opts_.chunk_bytes < proto::kMinChunkBytes || opts_.chunk_bytes > proto::kMaxChunkBytes || opts_.chunk_bytes % 8)
    throw Error(ErrorKind::Config, "chunk_bytes must be a multiple of 8 between 64 and 64 MiB");
  for (const std::string& why : {proto::check_name("job id", opts_.job_id), proto::check_name("group name", opts_.group)})
    if (!why.empty()) throw Error(ErrorKind::Config, why);
  credential_ = proto::Credential::parse(opts_.auth_token);
  if (credential_.present()) credential_.key_for(opts_.job_id);  // a credential for another job fails here, clearly
  if (opts_.timeout <= 0) throw Error(ErrorKind::Config, "timeout must be positive");
  if (opts_.window < 1 || opts_.window > 1024) throw Error(ErrorKind::Config, "window must be in 1..1024");
  for (const auto& a : opts_.reducers) addrs_.push_back(net::parse_host_port(a));
  connect_all();
}

Client::~Client() {
  try {
    close();
  } catch (...) {
  }
}

void Client::connect_all() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(opts_.connect_timeout * 1000));
  const int S = opts_.streams;
  std::vector<std::unique_ptr<Link>> links(addrs_.size() * size_t(S));
  std::vector<PendingLink> pending(links.size());
  std::vector<size_t> todo;
  for (size_t i = 0; i < links.size(); ++i) todo.push_back(i);
  // Phase 1 sends a hello on every link; phase 2 waits for the replies, which come
  // only once every rank of the group has connected (a rendezvous). A link whose
  // rank is still held by our own previous connection is retried.
  while (!todo.empty()) {
    for (size_t i : todo) {
      auto l = std::make_unique<Link>();
      l->reducer = i / size_t(S);
      l->stream = int(i % size_t(S));
      l->peer = "reducer " + addrs_[l->reducer].str() + (S > 1 ? " (stream " + std::to_string(l->stream) + ")" : "");
      pending[i] = begin_handshake(addrs_[l->reducer], l->peer, hello_for(l->stream), credential_, opts_.socket_buffer,
                                   deadline);
      links[i] = std::move(l);
    }
    std::vector<size_t> retry;
    for (size_t i : todo) {
      if (finish_handshake(pending[i], deadline) == proto::Status::RankTaken) {
        if (Clock::now() >= deadline)
          throw Error(ErrorKind::Connect, links[i]->peer + ": rank " + std::to_string(opts_.rank) +
                                              " is still held by an earlier connection");
        retry.push_back(i);
        continue;
      }
      links[i]->fd = std::move(pending[i].fd);
    }
    if (!retry.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    todo.swap(retry);
  }
  for (auto& l : links) net::set_nonblocking(l->fd.get(), true);
  links_ = std::move(links);
  round_ = 0;
}

HelloParams Client::hello_for(int stream) const {
  HelloParams h;
  h.world_size = opts_.world_size;
  h.rank = opts_.rank;
  h.stream_index = uint16_t(stream);
  h.num_streams = uint16_t(opts_.streams);
  h.chunk_bytes = opts_.chunk_bytes;
  h.job_id = opts_.job_id;
  h.group = opts_.group;
  return h;
}

void Client::disconnect(bool say_bye) {
  if (say_bye) {
    proto::FrameHeader h;
    h.type = proto::FrameType::Bye;
    uint8_t b[proto::kFrameHeaderBytes];
    proto::encode(h, b);
    for (auto& l : links_) {
      // Best effort: a link mid-frame cannot take a goodbye; the reducer then sees a plain close.
      if (l->sent == 0 && !l->hdr_ready) ::send(l->fd.get(), b, sizeof b, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(l->fd.get(), SHUT_WR);
    }
  }
  links_.clear();
}

void Client::close() {
  std::lock_guard<std::mutex> lock(mu_);
  disconnect(true);
}

ClientStats Client::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Client::allreduce(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t es = dtype_size(dtype);
  if (nbytes % es)
    throw Error(ErrorKind::Config, "buffer of " + std::to_string(nbytes) + " bytes is not a whole number of " +
                                       dtype_name(dtype) + " elements");
  if (links_.empty()) {
    // First use after an error (or after close): start a fresh group session.
    connect_all();
    stats_.reconnects++;
  }
  try {
    run_round(static_cast<uint8_t*>(data), nbytes, dtype, op, tag);
    stats_.rounds++;
  } catch (...) {
    // The session is out of step with the group now: drop it; the next call reconnects.
    // Links at a frame boundary say goodbye, so groups that were idle on them do not report
    // this worker as lost (which could reach the others before the real cause).
    disconnect(true);
    throw;
  }
}

void Client::run_round(uint8_t* data, size_t nbytes, DType dtype, Op op, uint64_t tag) {
  const uint64_t round = round_++;
  if (nbytes == 0) return;
  const size_t R = addrs_.size();
  const int S = opts_.streams;
  const size_t es = dtype_size(dtype);
  const uint64_t window = uint64_t(opts_.window);
  ShardPlan plan = plan_round(nbytes / es, es, R, round);
  for (auto& lp : links_) {
    Link& l = *lp;
    l.shard = data + plan.offset[l.reducer] * es;
    l.shard_bytes = plan.count[l.reducer] * es;
    l.chunk = chunk_for(l.shard_bytes, opts_.chunk_bytes);
    l.nchunks = (l.shard_bytes + l.chunk - 1) / l.chunk;
    l.next_send = uint64_t(l.stream);
    l.sent = 0;
    l.hdr_ready = false;
    l.expected = l.nchunks > uint64_t(l.stream) ? (l.nchunks - uint64_t(l.stream) + S - 1) / S : 0;
    l.received = 0;
    l.hdr_got = 0;
    l.have_hdr = false;
    l.dst = nullptr;
    l.dst_got = 0;
  }
  std::vector<pollfd> pfds(links_.size());
  auto last_progress = Clock::now();
  const auto timeout = std::chrono::milliseconds(int64_t(opts_.timeout * 1000));

  for (;;) {
    bool all_done = true;
    for (size_t i = 0; i < links_.size(); ++i) {
      Link& l = *links_[i];
      pfds[i].fd = l.fd.get();
      // Always watch for input: results, or an error frame from the reducer.
      pfds[i].events = POLLIN | (l.may_send(S, window) ? POLLOUT : 0);
      pfds[i].revents = 0;
      all_done &= l.done(S);
    }
    if (all_done) return;
    auto idle = Clock::now() - last_progress;
    if (idle > timeout) {
      std::string waiting;
      for (auto& lp : links_)
        if (!lp->done(S)) {
          if (!waiting.empty()) waiting += "; ";
          waiting += lp->peer + ": sent " + std::to_string(std::min(lp->next_send, lp->nchunks) / S) + "/" +
                     std::to_string(lp->expected) + " chunks, got " + std::to_string(lp->received) + "/" +
                     std::to_string(lp->expected) + " results";
        }
      throw Error(ErrorKind::Timeout, "all-reduce round " + std::to_string(round) + " made no progress for " +
                                          std::to_string(opts_.timeout) + " s (a worker of the group may be missing or " +
                                          "slow): " + waiting);
    }
    int wait_ms = int(std::max<int64_t>(1, std::min<int64_t>(
                                               200, std::chrono::duration_cast<std::chrono::milliseconds>(timeout - idle).count())));
    int pr = ::poll(pfds.data(), pfds.size(), wait_ms);
    if (pr < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::Internal, std::string("poll failed: ") + errno_text(errno));
    }
    if (pr == 0) continue;
    for (size_t i = 0; i < links_.size(); ++i) {
      Link& l = *links_[i];
      short rev = pfds[i].revents;
      if (!rev) continue;
      // ---- send ----
      if ((rev & POLLOUT) && l.may_send(S, window)) {
        for (;;) {
          if (!l.may_send(S, window)) break;
          const uint64_t chunk = l.chunk;
          uint64_t off = l.next_send * chunk;
          uint64_t len = std::min<uint64_t>(chunk, l.shard_bytes - off);
          if (!l.hdr_ready) {
            proto::FrameHeader h;
            h.type = proto::FrameType::Data;
            h.dtype = uint8_t(dtype);
            h.op = uint8_t(op);
            h.flags = (l.next_send + uint64_t(S) >= l.nchunks) ? proto::kLastInStream : 0;
            h.length = uint32_t(len);
            h.round = round;
            h.total_bytes = nbytes;
            h.shard_bytes = l.shard_bytes;
            h.offset = off;
            h.tag = tag;
            proto::encode(h, l.hdr_out);
            l.hdr_ready = true;
            l.sent = 0;
          }
          iovec iov[2];
          int n = 0;
          if (l.sent < proto::kFrameHeaderBytes) iov[n++] = {l.hdr_out + l.sent, proto::kFrameHeaderBytes - l.sent};
          size_t poff = l.sent > proto::kFrameHeaderBytes ? l.sent - proto::kFrameHeaderBytes : 0;
          iov[n++] = {l.shard + off + poff, size_t(len - poff)};
          ssize_t w = net::send_some(l.fd.get(), iov, n, l.peer);
          if (w < 0) break;
          stats_.bytes_sent += uint64_t(w);
          last_progress = Clock::now();
          l.sent += size_t(w);
          if (l.sent == proto::kFrameHeaderBytes + len) {
            l.hdr_ready = false;
            l.sent = 0;
            l.next_send += uint64_t(S);
          }
        }
      }
      // ---- receive ----
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        for (;;) {
          if (!l.have_hdr) {
            ssize_t n = net::recv_some(l.fd.get(), l.hdr_in + l.hdr_got, proto::kFrameHeaderBytes - l.hdr_got,
                                       l.peer);
            if (n < 0) break;
            stats_.bytes_received += uint64_t(n);
            last_progress = Clock::now();
            l.hdr_got += size_t(n);
            if (l.hdr_got < proto::kFrameHeaderBytes) continue;
            l.hdr_got = 0;
            const uint64_t chunk = l.chunk;
            std::string err = proto::decode(l.hdr_in, &l.in, uint32_t(opts_.chunk_bytes));
            if (!err.empty()) throw Error(ErrorKind::Protocol, "bad frame from reducer " + l.peer + ": " + err);
            if (l.in.type == proto::FrameType::Error) {
              l.error_text.assign(l.in.length, '\0');
              l.dst = reinterpret_cast<uint8_t*>(&l.error_text[0]);
            } else {
              if (l.in.type != proto::FrameType::Result)
                throw Error(ErrorKind::Protocol, "unexpected frame type from reducer " + l.peer);
              uint64_t idx = l.in.offset / chunk;
              bool ok = l.in.round == round && l.in.dtype == uint8_t(dtype) && l.in.op == uint8_t(op) &&
                        l.in.shard_bytes == l.shard_bytes && l.in.total_bytes == nbytes && l.in.offset % chunk == 0 &&
                        idx % uint64_t(S) == uint64_t(l.stream) && idx < l.nchunks &&
                        l.in.length == std::min<uint64_t>(chunk, l.shard_bytes - l.in.offset) && l.received < l.expected &&
                        l.in.offset + l.in.length <= l.next_send * chunk;  // only chunks we already sent
              if (!ok)
                throw Error(ErrorKind::Protocol, l.peer + " sent a result that does not belong to round " +
                                                     std::to_string(round) + " (offset " + std::to_string(l.in.offset) + ")");
              l.dst = l.shard + l.in.offset;
            }
            l.have_hdr = true;
            l.dst_got = 0;
          }
          if (l.dst_got < l.in.length) {
            ssize_t n = net::recv_some(l.fd.get(), l.dst + l.dst_got, l.in.length - l.dst_got, l.peer);
            if (n < 0) break;
            stats_.bytes_received += uint64_t(n);
            last_progress = Clock::now();
            l.dst_got += size_t(n);
            if (l.dst_got < l.in.length) continue;
          }
          l.have_hdr = false;
          if (l.in.type == proto::FrameType::Error) {
            proto::ErrorCode code = proto::ErrorCode(l.in.flags);
            throw Error(kind_of(code), "reducer " + addrs_[l.reducer].str() + ": " + l.error_text);
          }
          l.received++;
          if (l.done(S)) break;
        }
      }
    }
  }
}

}  // namespace rs::client
