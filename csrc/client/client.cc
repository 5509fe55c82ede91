#include "client/client.h"

#include "client/handshake.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"

namespace rs::client {

using net::Clock;

namespace {

// Bytes one link may move per pass before the next link gets its turn.
constexpr size_t kLinkBudget = 8u << 20;

// Narrowed chunks one link may have queued and not yet written (its staging ring), at most.
constexpr size_t kMaxStagingSlots = 4;

// A frame's token in the link's writer: the round number, and whether the payload sits in a
// staging slot (which the write frees).
uint64_t frame_token(uint64_t wire, bool staged) { return (wire << 1) | (staged ? 1 : 0); }

DType wire_dtype(Compression c) { return c == Compression::F16 ? DType::F16 : DType::BF16; }

}  // namespace

bool parse_compression(const std::string& s, Compression* out) {
  if (s.empty() || s == "none") *out = Compression::None;
  else if (s == "bf16" || s == "bfloat16") *out = Compression::BF16;
  else if (s == "fp16" || s == "float16" || s == "half") *out = Compression::F16;
  else return false;
  return true;
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::BF16: return "bf16";
    case Compression::F16: return "fp16";
    default: return "none";
  }
}

// A round: its buffer, and its progress on every link.
struct Client::Round {
  RoundId id = 0;
  uint64_t wire = 0;  // round number on the wire (per session)
  DType dtype = DType::F32;
  Op op = Op::Sum;
  uint64_t tag = 0;
  uint64_t nbytes = 0;        // on the wire (compressed: half the buffer's)
  Compression comp = Compression::None;  // comp != None: dtype is the 16-bit wire type, buf float32
  net::Segments buf;
  // Offsets and sizes below are wire bytes; in the buffer they are twice that when compressed.
  struct Part {  // this round on one link: the link's share of its reducer's shard
    uint64_t shard_off = 0;    // of the shard in the buffer
    uint64_t shard_bytes = 0;
    uint64_t chunk = 0;        // chunk size of this round on this shard
    uint64_t nchunks = 0;      // chunks of this shard (all streams)
    uint64_t expected = 0;     // chunks of this stream
    uint64_t next_send = 0;    // next chunk index to queue (stream, stream + S, ...)
    uint64_t written = 0;      // chunks of this stream completely written
    uint64_t received = 0;     // results received
  };
  std::vector<Part> parts;     // by link
  size_t parts_left = 0;       // parts still waiting for results
  enum class State { Running, Done, Failed } state = State::Running;
  bool collected = false;      // done and reported, freed when it leaves session_
  ErrorKind kind = ErrorKind::Internal;
  std::string error;
};

struct Client::Link {
  net::Fd fd;
  std::string peer;  // "reducer host:port (stream s)"
  size_t reducer = 0;
  int stream = 0;
  net::FrameWriter out;
  net::FrameReader in;
  uint64_t send_wire = 0;   // the round whose chunks this link queues next
  uint64_t in_flight = 0;   // chunks queued or sent whose result is not back (all rounds)
  Round* reading = nullptr; // the round of the result frame being read
  std::string error_text;   // payload of an Error frame being read
  // Compressed rounds' staging, allocated at the session's first compressed round on this link:
  std::vector<uint8_t> tx;  // staging_slots() chunks: narrowed payloads queued, not yet written
  uint64_t tx_pushed = 0;   // narrowed frames queued (slot = tx_pushed % slots)
  uint64_t tx_written = 0;  // narrowed frames written (they free their slots in order)
  std::vector<uint8_t> rx;  // one chunk: the 16-bit result being read, widened into place when complete
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

// Converts between the 16-bit wire chunk `wire` and bytes [2 off, 2 (off + len)) of a compressed
// round's float32 buffer (off, len: wire bytes): narrow (buffer -> wire) or widen (wire -> buffer).
// Segments hold whole floats (start_locked checks it), so every piece gather() returns does too.
void convert(const net::Segments& buf, DType wire, uint64_t off, uint64_t len, uint8_t* chunk, bool narrow) {
  constexpr int kPieces = 16;
  uint64_t at = off * 2, left = len * 2;
  while (left > 0) {
    iovec piece[kPieces];
    int n = 0;
    const uint64_t got = buf.gather(at, left, piece, &n, kPieces);
    for (int i = 0; i < n; ++i) {
      const size_t elems = piece[i].iov_len / sizeof(float);
      float* f = static_cast<float*>(piece[i].iov_base);
      if (narrow) kernels::narrow(wire, chunk, f, elems);
      else kernels::widen(wire, f, chunk, elems);
      chunk += elems * 2;
    }
    at += got;
    left -= got;
  }
}

}  // namespace

Client::Client(ClientOptions opts) : opts_(std::move(opts)), timer_(opts_.timeout) {
  if (opts_.reducers.empty()) throw Error(ErrorKind::Config, "no reducers given");
  if (opts_.world_size < 1) throw Error(ErrorKind::Config, "world_size must be at least 1");
  if (opts_.rank >= opts_.world_size)
    throw Error(ErrorKind::Config, "rank " + std::to_string(opts_.rank) + " out of range for world size " +
                                       std::to_string(opts_.world_size));
  if (opts_.streams < 1 || opts_.streams > proto::kMaxStreams) throw Error(ErrorKind::Config, "streams must be in 1..64");
  std::string bad_chunk = proto::check_chunk_bytes(opts_.chunk_bytes);
  if (!bad_chunk.empty()) throw Error(ErrorKind::Config, "chunk_bytes: " + bad_chunk);
  for (const std::string& why : {proto::check_name("job id", opts_.job_id), proto::check_name("group name", opts_.group)})
    if (!why.empty()) throw Error(ErrorKind::Config, why);
  credential_ = proto::Credential::parse(opts_.auth_token);
  if (credential_.present()) credential_.key_for(opts_.job_id);  // a credential for another job fails here, clearly
  if (opts_.timeout <= 0) throw Error(ErrorKind::Config, "timeout must be positive");
  if (opts_.window < 1 || opts_.window > 1024) throw Error(ErrorKind::Config, "window must be in 1..1024");
  if (opts_.max_rounds_in_flight < 1 || opts_.max_rounds_in_flight > 4096)
    throw Error(ErrorKind::Config, "max_rounds_in_flight must be in 1..4096");
  for (const auto& a : opts_.reducers) addrs_.push_back(net::parse_host_port(a));
  wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_.valid()) throw Error(ErrorKind::Internal, "eventfd failed: " + errno_text(errno));
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
      protect_link(pending[i], &links[i]->out, &links[i]->in);
    }
    if (!retry.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    todo.swap(retry);
  }
  for (auto& l : links) {
    net::set_nonblocking(l->fd.get(), true);
    l->out.reserve(size_t(opts_.window));
    l->in.set_max_payload(opts_.chunk_bytes);
  }
  links_ = std::move(links);
  wire_next_ = 0;
  session_gen_++;
}

proto::Hello Client::hello_for(int stream) const {
  proto::Hello h;
  h.world_size = opts_.world_size;
  h.rank = opts_.rank;
  h.stream_index = uint16_t(stream);
  h.num_streams = uint16_t(opts_.streams);
  h.chunk_bytes = opts_.chunk_bytes;
  h.job_id = opts_.job_id;
  h.group = opts_.group;
  if (opts_.integrity) h.flags |= proto::kHelloIntegrity;
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
      l->out.send_now(l->fd.get(), l->peer, b, sizeof b);
      ::shutdown(l->fd.get(), SHUT_WR);
    }
  }
  links_.clear();
  session_gen_++;
}

void Client::fail_all(ErrorKind kind, const std::string& why) {
  for (Round* r : session_) {
    if (r->collected) {
      rounds_.erase(r->id);
    } else if (r->state == Round::State::Running) {
      r->state = Round::State::Failed;
      r->kind = kind;
      r->error = why;
    }
  }
  session_.clear();
  running_ = 0;
  // The session is out of step with the group now: drop it; the next start() reconnects.
  // Links at a frame boundary say goodbye, so groups that were idle on them do not report
  // this worker as lost (which could reach the others before the real cause).
  disconnect(true);
  wake_waiters();
}

void Client::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ > 0) fail_all(ErrorKind::Config, "the client was closed while the round was in flight");
  disconnect(true);
}

bool Client::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !links_.empty();
}

size_t Client::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

ClientStats Client::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Client::allreduce(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag, Compression comp) {
  wait(start(data, nbytes, dtype, op, tag, comp));
}

RoundId Client::start(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag, Compression comp) {
  iovec one{data, nbytes};
  return start(&one, 1, dtype, op, tag, comp);
}

RoundId Client::start(const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag, Compression comp) {
  std::unique_lock<std::mutex> lk(mu_);
  Driving driving(this);
  RoundId id = 0;
  start_locked(lk, segs, nsegs, dtype, op, tag, comp, true, &id);
  return id;
}

bool Client::try_start(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag, RoundId* out, Compression comp) {
  iovec one{data, nbytes};
  return try_start(&one, 1, dtype, op, tag, out, comp);
}

bool Client::try_start(const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag, RoundId* out,
                       Compression comp) {
  std::unique_lock<std::mutex> lk(mu_);
  Driving driving(this);
  return start_locked(lk, segs, nsegs, dtype, op, tag, comp, false, out);
}

bool Client::start_locked(std::unique_lock<std::mutex>& lk, const iovec* segs, size_t nsegs, DType dtype, Op op,
                          uint64_t tag, Compression comp, bool may_wait, RoundId* out) {
  const bool compressed = comp != Compression::None;
  if (compressed && dtype != DType::F32)
    throw Error(ErrorKind::Config, std::string("compression ") + compression_name(comp) +
                                       " needs a float32 buffer, got " + dtype_name(dtype));
  const size_t es = dtype_size(dtype);
  uint64_t nbytes = 0;
  for (size_t i = 0; i < nsegs; ++i) {
    if (!segs[i].iov_base && segs[i].iov_len) throw Error(ErrorKind::Config, "null pointer in a round's buffer");
    if (compressed && segs[i].iov_len && (segs[i].iov_len % es || reinterpret_cast<uintptr_t>(segs[i].iov_base) % es))
      throw Error(ErrorKind::Config, "a compressed round's segments must be whole, 4-byte aligned float32 arrays "
                                     "(segment " + std::to_string(i) + " is not)");
    nbytes += segs[i].iov_len;
  }
  if (nbytes % es)
    throw Error(ErrorKind::Config, "buffer of " + std::to_string(nbytes) + " bytes is not a whole number of " +
                                       dtype_name(dtype) + " elements");
  // Everything below is planned on the wire bytes: a compressed round is a 16-bit round there.
  const DType wire = compressed ? wire_dtype(comp) : dtype;
  const size_t wes = dtype_size(wire);
  const uint64_t elems = nbytes / es;
  const size_t max_rounds = size_t(opts_.max_rounds_in_flight);
  if (running_ >= max_rounds) pump();
  if (running_ >= max_rounds) {
    if (!may_wait) return false;
    drive(lk, 0, true);
  }
  if (links_.empty()) {
    // First use after an error (or after close): start a fresh group session.
    connect_all();
    stats_.reconnects++;
  }
  if (compressed) {
    for (auto& l : links_) {  // the staging of compressed rounds: once per session and link
      if (!l->tx.empty()) continue;
      l->tx.resize(staging_slots() * opts_.chunk_bytes);
      l->rx.resize(opts_.chunk_bytes);
    }
  }
  auto owned = std::make_unique<Round>();
  Round& r = *owned;
  r.id = id_next_++;
  r.wire = wire_next_++;
  r.dtype = wire;
  r.op = op;
  r.tag = tag;
  r.nbytes = elems * wes;
  r.comp = comp;
  r.buf.assign(segs, nsegs);
  const size_t R = addrs_.size();
  const uint64_t S = uint64_t(opts_.streams);
  proto::ShardPlan plan = proto::plan_round(elems, wes, R, r.wire);
  r.parts.resize(links_.size());
  for (size_t li = 0; li < links_.size(); ++li) {
    const Link& l = *links_[li];
    Round::Part& p = r.parts[li];
    p.shard_off = plan.offset[l.reducer] * wes;
    p.shard_bytes = plan.count[l.reducer] * wes;
    // Chunks as large on the wire as the uncompressed round's (chunk_for of the shard's buffer
    // bytes, so 32 per shard instead of 64): a reducer holds a few chunks per stream at once, so
    // the chunk size bounds the bytes in flight per link (measured: half-size chunks reached 40%
    // of a 1 Gbit/s link instead of 70-90%).
    p.chunk = proto::chunk_for(p.shard_bytes / wes * es, opts_.chunk_bytes);
    p.nchunks = (p.shard_bytes + p.chunk - 1) / p.chunk;
    p.next_send = uint64_t(l.stream);
    p.expected = p.nchunks > uint64_t(l.stream) ? (p.nchunks - uint64_t(l.stream) + S - 1) / S : 0;
    if (p.expected > 0) r.parts_left++;
  }
  if (r.parts_left == 0) {
    r.state = Round::State::Done;  // an empty buffer: nothing to send
    stats_.rounds++;
  } else {
    if (running_ == 0) timer_.progress();  // the no-progress clock starts with the first round in flight
    running_++;
  }
  session_.push_back(&r);
  rounds_.emplace(r.id, std::move(owned));
  *out = r.id;
  pump();  // start streaming now
  retire();
  return true;
}

// Rounds progress only inside calls. Time in which no thread is inside start/test/wait does
// not count as "no progress": a worker may start rounds, compute, then wait.
Client::Driving::Driving(Client* c) : c_(c) {
  if (c_->callers_++ == 0) c_->timer_.exclude(Clock::now() - c_->idle_since_);
}

Client::Driving::~Driving() {
  if (--c_->callers_ == 0) c_->idle_since_ = Clock::now();
}

void Client::retire() {
  while (!session_.empty() && session_.front()->state != Round::State::Running) {
    Round* r = session_.front();
    session_.pop_front();
    if (r->collected) rounds_.erase(r->id);
  }
}

Client::Round* Client::by_wire(uint64_t wire) const {
  if (session_.empty() || wire < session_.front()->wire) return nullptr;
  uint64_t i = wire - session_.front()->wire;
  return i < session_.size() ? session_[size_t(i)] : nullptr;
}

size_t Client::staging_slots() const { return std::min(size_t(opts_.window), kMaxStagingSlots); }

void Client::fill(size_t li) {
  Link& l = *links_[li];
  const uint64_t S = uint64_t(opts_.streams), window = uint64_t(opts_.window);
  // Rounds before the oldest unfinished one are complete, so this link sent all of them.
  if (session_.empty()) l.send_wire = wire_next_;
  else l.send_wire = std::max(l.send_wire, session_.front()->wire);
  while (l.in_flight < window && !l.out.full()) {
    Round* r = by_wire(l.send_wire);
    if (!r) break;
    Round::Part& p = r->parts[li];
    if (p.next_send >= p.nchunks) {
      l.send_wire++;  // this round's chunks on this link are all queued: the next round's follow
      continue;
    }
    const bool staged = r->comp != Compression::None;
    if (staged && l.tx_pushed - l.tx_written >= staging_slots()) break;  // every slot waits to be written
    const uint64_t off = p.next_send * p.chunk;
    const uint64_t len = std::min<uint64_t>(p.chunk, p.shard_bytes - off);
    proto::FrameHeader h;
    h.type = proto::FrameType::Data;
    h.dtype = uint8_t(r->dtype);
    h.op = uint8_t(r->op);
    h.flags = (p.next_send + S >= p.nchunks) ? proto::kLastInStream : 0;
    h.length = uint32_t(len);
    h.round = r->wire;
    h.total_bytes = r->nbytes;
    h.shard_bytes = p.shard_bytes;
    h.offset = off;
    h.tag = r->tag;
    uint8_t hdr[proto::kFrameHeaderBytes];
    proto::encode(h, hdr);
    if (staged) {
      uint8_t* slot = l.tx.data() + (l.tx_pushed++ % staging_slots()) * opts_.chunk_bytes;
      convert(r->buf, r->dtype, p.shard_off + off, len, slot, true);
      l.out.push(hdr, sizeof hdr, net::Payload::bytes(slot, len), frame_token(r->wire, true));
    } else {
      l.out.push(hdr, sizeof hdr, net::Payload::range(r->buf, p.shard_off + off, len), frame_token(r->wire, false));
    }
    p.next_send += S;
    l.in_flight++;
  }
}

void Client::watch(std::vector<pollfd>* pfds) {
  pfds->resize(links_.size());
  for (size_t li = 0; li < links_.size(); ++li) {
    fill(li);
    (*pfds)[li] = {links_[li]->fd.get(), short(POLLIN | (links_[li]->out.empty() ? 0 : POLLOUT)), 0};
  }
}

bool Client::pump(const pollfd* ready) {
  if (links_.empty() || running_ == 0) return false;
  const int S = opts_.streams;
  bool moved = false;
  try {
    // A poll says which links can move bytes; only those are touched (no syscalls that
    // would only report EAGAIN).
    if (!ready) {
      watch(&pfds_);
      int pr = ::poll(pfds_.data(), pfds_.size(), 0);
      if (pr < 0 && errno != EINTR) throw Error(ErrorKind::Internal, std::string("poll failed: ") + errno_text(errno));
      if (pr < 0) for (pollfd& p : pfds_) p.revents = 0;
      ready = pfds_.data();
    }
    for (size_t li = 0; li < links_.size(); ++li) {
      if (ready[li].revents == 0) continue;
      Link& l = *links_[li];
      auto written = [&](uint64_t token) {
        if (token & 1) l.tx_written++;
        if (Round* r = by_wire(token >> 1)) r->parts[li].written++;
      };
      auto on_header = [&](const proto::FrameHeader& h, const std::string& err) -> net::Sink {
        if (!err.empty()) throw Error(ErrorKind::Protocol, "bad frame from reducer " + l.peer + ": " + err);
        if (h.type == proto::FrameType::Error) return net::Sink::text_into(&l.error_text);
        if (h.type != proto::FrameType::Result)
          throw Error(ErrorKind::Protocol, "unexpected frame type from reducer " + l.peer);
        Round* r = by_wire(h.round);
        bool ok = r != nullptr && r->state == Round::State::Running;
        if (ok) {
          const Round::Part& p = r->parts[li];
          const uint64_t chunk = p.chunk, idx = h.offset / chunk;
          ok = h.dtype == uint8_t(r->dtype) && h.op == uint8_t(r->op) && h.shard_bytes == p.shard_bytes &&
               h.total_bytes == r->nbytes && h.offset % chunk == 0 && idx % uint64_t(S) == uint64_t(l.stream) &&
               idx < p.nchunks && h.length == std::min<uint64_t>(chunk, p.shard_bytes - h.offset) &&
               p.received < p.expected && idx / uint64_t(S) < p.written;  // only chunks already sent
        }
        if (!ok)
          throw Error(ErrorKind::Protocol, l.peer + " sent a result that does not belong to any round in flight " +
                                               "(round " + std::to_string(h.round) + ", offset " +
                                               std::to_string(h.offset) + ")");
        l.reading = r;
        if (r->comp != Compression::None) return net::Sink::memory(l.rx.data());  // widened in on_frame
        return net::Sink::scatter(r->buf, r->parts[li].shard_off + h.offset);
      };
      auto on_frame = [&](const proto::FrameHeader& h) -> bool {
        if (h.type == proto::FrameType::Error)
          throw Error(kind_of(proto::ErrorCode(h.flags)), "reducer " + addrs_[l.reducer].str() + ": " + l.error_text);
        Round& r = *l.reading;
        Round::Part& p = r.parts[li];
        if (r.comp != Compression::None) convert(r.buf, r.dtype, p.shard_off + h.offset, h.length, l.rx.data(), false);
        p.received++;
        l.in_flight--;
        if (p.received == p.expected && --r.parts_left == 0) {
          r.state = Round::State::Done;
          running_--;
          stats_.rounds++;
        }
        return true;
      };
      net::IoBudget budget(kLinkBudget);
      uint64_t sent = 0, got = 0;
      const short rev = ready[li].revents;
      if (rev & POLLOUT) {
        net::IoResult wr = l.out.flush(l.fd.get(), l.peer, &budget, written);
        sent += wr.bytes;
        // Written frames free staging slots: queue (narrow) and write the next ones now.
        if (wr.frames > 0 && !wr.blocked && !budget.spent()) {
          fill(li);
          sent += l.out.flush(l.fd.get(), l.peer, &budget, written).bytes;
        }
      }
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        net::IoResult rd = l.in.pump(l.fd.get(), l.peer, &budget, on_header, on_frame);
        got += rd.bytes;
        // Results free window slots: queue and write more before the next link's turn.
        if (rd.frames > 0 && !budget.spent()) {
          fill(li);
          sent += l.out.flush(l.fd.get(), l.peer, &budget, written).bytes;
        }
      }
      stats_.bytes_sent += sent;
      stats_.bytes_received += got;
      if (sent || got) {
        moved = true;
        timer_.progress();
      }
    }
    retire();
    if (running_ > 0 && timer_.expired()) throw Error(ErrorKind::Timeout, describe_stall());
  } catch (const Error& e) {
    fail_all(e.kind(), e.what());
    return true;
  }
  if (moved) wake_waiters();
  return moved;
}

std::string Client::describe_stall() const {
  const Round& r = *session_.front();
  std::string waiting;
  for (size_t li = 0; li < links_.size(); ++li) {
    const Round::Part& p = r.parts[li];
    if (p.received == p.expected) continue;
    if (!waiting.empty()) waiting += "; ";
    waiting += links_[li]->peer + ": sent " + std::to_string(p.written) + "/" + std::to_string(p.expected) +
               " chunks, got " + std::to_string(p.received) + "/" + std::to_string(p.expected) + " results";
  }
  std::string more = running_ > 1 ? " (" + std::to_string(running_) + " rounds in flight)" : "";
  return "all-reduce round " + std::to_string(r.wire) + " made no progress for " + std::to_string(opts_.timeout) +
         " s (a worker of the group may be missing or slow): " + waiting + more;
}

void Client::wake_waiters() {
  if (pollers_ == 0) return;
  uint64_t one = 1;
  ssize_t n = ::write(wake_.get(), &one, sizeof one);
  (void)n;
}

void Client::drive(std::unique_lock<std::mutex>& lk, RoundId id, bool until_slot) {
  std::vector<pollfd> pfds;
  for (;;) {
    if (until_slot) {
      if (running_ < size_t(opts_.max_rounds_in_flight)) return;
    } else {
      auto it = rounds_.find(id);
      if (it == rounds_.end() || it->second->state != Round::State::Running) return;
    }
    // Sleep until a socket is ready (at once if one is), another thread changed the state
    // (wake_), or the no-progress timer needs a look. I/O happens only with the lock held
    // (in pump); the poll is only a wake-up, so it runs unlocked and other threads keep going.
    watch(&pfds);
    pfds.push_back({wake_.get(), POLLIN, 0});
    const uint64_t gen = session_gen_;
    const int ms = timer_.poll_ms(200);
    pollers_++;
    lk.unlock();
    int pr = ::poll(pfds.data(), pfds.size(), ms);
    int err = errno;
    lk.lock();
    pollers_--;
    if (pr < 0 && err != EINTR) {
      fail_all(ErrorKind::Internal, std::string("poll failed: ") + errno_text(err));
      continue;
    }
    if (pr > 0 && (pfds.back().revents & POLLIN)) {
      uint64_t v;
      ssize_t n = ::read(wake_.get(), &v, sizeof v);
      (void)n;
    }
    // The readiness applies only if the links are still the ones polled.
    pump(pr > 0 && gen == session_gen_ ? pfds.data() : nullptr);
  }
}

bool Client::collect(RoundId id) {
  auto it = rounds_.find(id);
  if (it == rounds_.end())
    throw Error(ErrorKind::Config, "round " + std::to_string(id) +
                                       (id < id_next_ ? " was already waited for" : " was never started"));
  Round& r = *it->second;
  if (r.collected)
    throw Error(ErrorKind::Config, "round " + std::to_string(id) + " was already waited for");
  if (r.state == Round::State::Running) return false;
  if (r.state == Round::State::Failed) {  // failed rounds are no longer in session_
    Error e(r.kind, r.error);
    rounds_.erase(it);
    throw e;
  }
  // A finished round may still sit in session_ behind an unfinished older one: it is
  // freed when it leaves session_.
  if (by_wire(r.wire) == &r) r.collected = true;
  else rounds_.erase(it);
  return true;
}

bool Client::test(RoundId id) {
  std::unique_lock<std::mutex> lk(mu_);
  Driving driving(this);
  if (!rounds_.count(id)) collect(id);  // throws: unknown id
  pump();
  return collect(id);
}

void Client::wait(RoundId id) {
  std::unique_lock<std::mutex> lk(mu_);
  Driving driving(this);
  if (!rounds_.count(id)) collect(id);  // throws: unknown id
  drive(lk, id, false);
  collect(id);
}

}  // namespace rs::client
