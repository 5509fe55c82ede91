#include "client/client.h"

#include "client/failover.h"
#include "client/handshake.h"
#include "client/recovery.h"
#include "client/recovery_host.h"
#include "client/reducer_frames.h"
#include "client/round.h"
#include "client/schedule.h"
#include "client/staging.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "common/text.h"
#include "net/address.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"

namespace rs::client {

using net::Clock;

namespace {

// Bytes one link may move per pass before the next link gets its turn.
constexpr size_t kLinkBudget = 8u << 20;

// After every reducer was lost while idle, how long the next call's reconnect waits for a reducer
// that refuses connections before it raises that loss (reconnect()).
constexpr double kBackAfterLossS = 1.0;

}  // namespace

Client::Client(ClientOptions opts)
    : opts_(std::move(opts)), sched_(std::make_unique<Schedule>(opts_)), timer_(opts_.timeout) {
  if (opts_.reducers.empty()) throw Error(ErrorKind::Config, "no reducers given");
  if (opts_.world_size < 1) throw Error(ErrorKind::Config, "world_size must be at least 1");
  if (opts_.rank >= opts_.world_size)
    throw Error(ErrorKind::Config, "rank " + std::to_string(opts_.rank) + " out of range for world size " +
                                       std::to_string(opts_.world_size));
  if (opts_.streams < 1 || opts_.streams > proto::kMaxStreams)
    throw Error(ErrorKind::Config, "streams must be in 1..64");
  std::string bad_chunk = proto::check_chunk_bytes(opts_.chunk_bytes);
  if (!bad_chunk.empty()) throw Error(ErrorKind::Config, "chunk_bytes: " + bad_chunk);
  for (const std::string& why :
       {proto::check_name("job id", opts_.job_id), proto::check_name("group name", opts_.group)})
    if (!why.empty()) throw Error(ErrorKind::Config, why);
  credential_ = proto::Credential::parse(opts_.auth_token);
  if (credential_.present()) credential_.key_for(opts_.job_id);  // a credential for another job fails here, clearly
  settings::check_seconds(opts_.timeout, "timeout");
  settings::check_seconds(opts_.connect_timeout, "connect_timeout");
  if (opts_.window < 1 || opts_.window > 1024) throw Error(ErrorKind::Config, "window must be in 1..1024");
  if (opts_.max_rounds_in_flight < 1 || opts_.max_rounds_in_flight > 4096)
    throw Error(ErrorKind::Config, "max_rounds_in_flight must be in 1..4096");
  for (const auto& a : opts_.reducers) addrs_.push_back(net::parse_host_port(a));
  for (size_t i = 0; i < addrs_.size(); ++i) active_.push_back(i);
  recovery_ = std::make_unique<Recovery>(recovery_host());
  wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  idle_wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_.valid() || !idle_wake_.valid()) throw Error(ErrorKind::Internal, "eventfd failed: " + errno_text(errno));
  ready_.watch_wake(wake_.get());
  interrupt_ = [this] { check_interrupt(); };
  connect_all();
}

Client::~Client() {
  if (inherited()) {               // a forked child: the parent's thread is not here, its connections are the parent's
    (void)idle_thread_.release();  // (a joinable std::thread must not be destroyed): left as it is
    return;                        // the members close their descriptors, nothing is sent or shut down
  }
  try {
    close();  // (ends the idle progress thread too)
  } catch (...) {
  }
}

void Client::connect_all(std::vector<size_t>* lost, double refused_after_s) {
  // A failover session waits for the other workers like the first one (they notice the loss
  // when they next call in); a reducer that refuses the connection there is lost too, and so is
  // a peer at its address that does not speak the protocol (something else took the port).
  const auto deadline = net::deadline_after(opts_.connect_timeout);
  const auto connect_deadline = lost ? std::min(deadline, net::deadline_after(refused_after_s)) : deadline;
  const int S = opts_.streams;
  std::vector<std::unique_ptr<Link>> links(active_.size() * size_t(S));
  std::vector<PendingLink> pending(links.size());
  std::vector<size_t> todo;
  for (size_t i = 0; i < links.size(); ++i) todo.push_back(i);
  auto refused = [&](const Error& e, size_t reducer) {
    check_interrupt();  // close(), or a call that waited for this idle pass: not the reducer's fault
    const bool reducer_gone = e.kind() == ErrorKind::Connect || e.kind() == ErrorKind::PeerLost ||
                              e.kind() == ErrorKind::Protocol ||
                              (e.kind() == ErrorKind::Timeout && Clock::now() < deadline);
    if (!lost || !reducer_gone) return false;
    if (std::find(lost->begin(), lost->end(), reducer) == lost->end()) lost->push_back(reducer);
    log_warn("reducer failover: " + addrs_[reducer].str() + " is not reachable either: " + e.what());
    return true;
  };
  // Phase 1 sends a hello on every link; phase 2 waits for the replies, which come
  // only once every rank of the group has connected (a rendezvous). A link whose
  // rank is still held by our own previous connection is retried.
  while (!todo.empty()) {
    for (size_t i : todo) {
      auto l = std::make_unique<Link>();
      l->reducer = active_[i / size_t(S)];
      l->stream = int(i % size_t(S));
      l->peer = "reducer " + addrs_[l->reducer].str() + (S > 1 ? " (stream " + std::to_string(l->stream) + ")" : "");
      try {
        pending[i] = begin_handshake(addrs_[l->reducer], l->peer, hello_for(l->stream), credential_,
                                     opts_.socket_buffer, connect_deadline, interrupt_);
      } catch (const Error& e) {
        if (!refused(e, l->reducer)) throw;
      }
      links[i] = std::move(l);
    }
    if (lost && !lost->empty()) return;  // the caller drops them and starts again
    std::vector<size_t> retry;
    for (size_t i : todo) {
      proto::Status st;
      try {
        st = finish_handshake(pending[i], deadline, interrupt_);
      } catch (const Error& e) {
        if (!refused(e, links[i]->reducer)) throw;
        return;
      }
      if (st == proto::Status::RankTaken) {
        if (Clock::now() >= deadline)
          throw Error(ErrorKind::Connect, links[i]->peer + ": rank " + std::to_string(opts_.rank) +
                                              " is still held by an earlier connection");
        retry.push_back(i);
        continue;
      }
      links[i]->fd = std::move(pending[i].fd);
      protect_link(pending[i], &links[i]->out, &links[i]->in);
    }
    if (!retry.empty()) net::pause_interruptible(std::chrono::milliseconds(50), interrupt_);
    todo.swap(retry);
  }
  for (auto& l : links) {
    net::set_nonblocking(l->fd.get(), true);
    l->out.reserve(size_t(opts_.window) + 2);  // the window's chunks, a DONE, a goodbye
    l->in.set_max_payload(opts_.chunk_bytes);
  }
  ready_.forget_all();  // the old links' sockets (if any) close here
  links_ = std::move(links);
  sched_->next_wire = 0;
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
  h.group = session_group();
  if (opts_.failover) h.flags |= proto::kHelloFailover;
  if (opts_.integrity) h.flags |= proto::kHelloIntegrity;
  return h;
}

// The group name of the current reducer set: the configured one with every reducer, else a
// suffix naming the survivors, so workers that (briefly) disagree on the set never pair up.
std::string Client::session_group() const {
  if (active_.size() == addrs_.size()) return opts_.group;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the survivors' indices
  for (size_t i : active_) {
    for (int b = 0; b < 8; ++b) {
      h ^= (uint64_t(i) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  const std::string suffix = "#f" + rs::hex_u64(h);
  std::string base = opts_.group.substr(0, proto::kMaxNameBytes - suffix.size());
  return base + suffix;
}

// A fresh group session from the state every member of the group can derive, whatever each went
// through before (a failover, a reducer lost, a restart of its own process): every configured
// reducer, the base group, round numbers from 0, no rejoin check or probe pending. A reconnect
// keeps nothing the members must agree on (docs/protocol.md, "Reconnecting").
// After every reducer was lost while no caller waited (Recovery::lost_all_idle), a reducer that
// still refuses connections for kBackAfterLossS raises that loss at once instead of a wait of
// connect_timeout for a reducer that is gone (the next call tries again).
void Client::reconnect() {
  const bool after_loss = recovery_->lost_all_idle();
  active_.clear();
  for (size_t i = 0; i < addrs_.size(); ++i) active_.push_back(i);
  seq_next_ = 0;
  recovery_->restart();
  if (after_loss) {
    std::vector<size_t> refused;
    connect_all(&refused, kBackAfterLossS);
    if (!refused.empty())
      throw Error(dropped_kind_, dropped_why_ + "; " + addrs_[refused.front()].str() +
                                     " still refuses connections (the next call tries again)");
  } else {
    connect_all();
  }
  stats_.reconnects++;
}

void Client::disconnect(bool say_bye) {
  if (say_bye) {
    proto::FrameHeader h;
    h.type = proto::FrameType::Bye;
    uint8_t b[proto::kFrameHeaderBytes];
    proto::encode(h, b);
    for (auto& l : links_) {
      // Best effort: a link mid-frame cannot take a goodbye; the reducer then sees a plain close.
      if (!l->closed) l->out.send_now(l->fd.get(), l->peer, b, sizeof b);
      ::shutdown(l->fd.get(), SHUT_WR);
    }
  }
  ready_.forget_all();  // while the sockets are still open
  links_.clear();
  recovery_->drop_probes();
  session_gen_++;
}

void Client::fail_all(ErrorKind kind, const std::string& why) {
  dropped_kind_ = kind;
  dropped_why_ = why;
  auto fail = [&](Round* r) {
    if (r->role != Round::Role::User) return;
    if (r->collected) {
      rounds_.erase(r->id);
    } else if (r->released) {
      r->state = Round::State::Done;  // its results were complete, in the caller's buffer
      recycle_copy(*r);
    } else if (r->state == Round::State::Running) {
      r->state = Round::State::Failed;
      r->kind = kind;
      r->error = why;
    }
  };
  for (Round* r : sched_->rounds) fail(r);
  for (Round* r : parents_) fail(r);
  sched_->rounds.clear();
  parents_.clear();
  internal_.clear();
  recovery_->reset();  // a rejoin check under way is over too (the boundary is not checked again)
  open_ = 0;
  running_ = 0;
  released_open_ = 0;
  // The session is out of step with the group now: drop it; the next start() reconnects.
  // Links at a frame boundary say goodbye, so groups that were idle on them do not report
  // this worker as lost (which could reach the others before the real cause).
  disconnect(true);
  wake_waiters();
}

void Client::close() {
  if (inherited()) return;  // the parent's connections: nothing to say, nothing to wait for
  // Every network wait under the lock (a connect, a handshake, a failover exchange, by a call or
  // the idle thread) ends within a slice (check_interrupt), so the lock comes soon.
  closing_++;
  struct Done {
    std::atomic<int>& n;
    ~Done() { n--; }
  } done{closing_};
  stop_idle_thread();  // first: it would otherwise pass over the links as they close
  Lock lock(mu_);
  // (A rejoin check's exchange round may be open with no user round: it is dropped too.)
  // Released rounds still waiting for their CLEARs leave with the session (their callers have them).
  if (running_ > 0 || released_open_ > 0 || recovery_->check_open())
    fail_all(ErrorKind::Config, "the client was closed while the round was in flight");
  disconnect(true);
  idle_error_.reset();  // a later start() connects a new session
}

bool Client::connected() const {
  if (inherited()) return false;
  Lock lock = enter();
  return !links_.empty();
}

size_t Client::in_flight() const {
  if (inherited()) return 0;
  Lock lock = enter();
  return running_;
}

ClientStats Client::stats() const {
  if (inherited()) return stats_;  // (the child has one thread: nothing changes it)
  Lock lock = enter();
  ClientStats st = stats_;
  st.reducers_active = active_.size();
  for (const auto& l : links_) st.link_window_max = std::max(st.link_window_max, l->window_used);
  return st;
}

void Client::allreduce(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag, Compression comp) {
  wait(start(data, nbytes, dtype, op, tag, comp));
}

RoundId Client::start(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag, Compression comp) {
  iovec one{data, nbytes};
  return start(&one, 1, dtype, op, tag, comp);
}

RoundId Client::start(const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag, Compression comp) {
  refuse_inherited();
  Lock lk = enter();
  Driving driving(this);
  RoundId id = 0;
  if (!start_locked(lk, segs, nsegs, dtype, op, tag, comp, true, &id))
    throw Error(ErrorKind::Internal, "start() returned without starting the round");  // never: it waits
  return id;
}

bool Client::try_start(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag, RoundId* out, Compression comp) {
  iovec one{data, nbytes};
  return try_start(&one, 1, dtype, op, tag, out, comp);
}

bool Client::try_start(const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag, RoundId* out,
                       Compression comp) {
  refuse_inherited();
  Lock lk = enter();
  Driving driving(this);
  return start_locked(lk, segs, nsegs, dtype, op, tag, comp, false, out);
}

bool Client::start_locked(Lock& lk, const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag, Compression comp,
                          bool may_wait, RoundId* out) {
  const bool compressed = comp != Compression::None;
  if (compressed && dtype != DType::F32)
    throw Error(ErrorKind::Config, std::string("compression ") + rs::wire_compression_name(comp) +
                                       " needs a float32 buffer, got " + dtype_name(dtype));
  const size_t es = dtype_size(dtype);
  uint64_t nbytes = 0;
  for (size_t i = 0; i < nsegs; ++i) {
    if (!segs[i].iov_base && segs[i].iov_len) throw Error(ErrorKind::Config, "null pointer in a round's buffer");
    if (compressed && segs[i].iov_len && (segs[i].iov_len % es || reinterpret_cast<uintptr_t>(segs[i].iov_base) % es))
      throw Error(ErrorKind::Config,
                  "a compressed round's segments must be whole, 4-byte aligned float32 arrays "
                  "(segment " +
                      std::to_string(i) + " is not)");
    nbytes += segs[i].iov_len;
  }
  if (nbytes % es)
    throw Error(ErrorKind::Config, "buffer of " + std::to_string(nbytes) + " bytes is not a whole number of " +
                                       dtype_name(dtype) + " elements");
  // Everything below is planned on the wire bytes: a compressed round is a 16-bit round there.
  const DType wire = compressed ? rs::wire_compression_dtype(comp) : dtype;
  const size_t wes = dtype_size(wire);
  const uint64_t elems = nbytes / es;
  const size_t max_rounds = size_t(opts_.max_rounds_in_flight);
  recovery_->check_probes();
  if (running_ >= max_rounds) pump();
  if (running_ >= max_rounds) {
    if (!may_wait) return false;
    drive(lk, 0, true);
  }
  if (idle_error_) {  // an idle pass met an error (idle.cc): this call reports it, the next reconnects
    Error e = std::move(*idle_error_);
    idle_error_.reset();
    throw e;
  }
  if (links_.empty()) reconnect();  // first use after an error (or after close)
  // (A worker that started this round before the failover did not check: only rounds that no
  // worker had started then are checked, so every worker checks at the same ones. A check that
  // try_start() left under way holds every start until it is over.)
  if (!recovery_->before_start(may_wait)) return false;
  auto owned = std::make_unique<Round>();
  Round& r = *owned;
  r.id = id_next_++;
  r.seq = seq_next_++;
  r.wire = sched_->next_wire++;
  r.dtype = wire;
  r.op = op;
  r.tag = tag;
  r.nbytes = elems * wes;
  r.comp = comp;
  r.buf.assign(segs, nsegs);
  sched_->plan(r, links_, active_.size());
  if (r.parts_left == 0) {
    r.state = Round::State::Done;  // an empty buffer: nothing to send
    stats_.rounds++;
  } else {
    if (open_ == 0) timer_.progress();  // the no-progress clock starts with the first round in flight
    running_++;
    open_++;
  }
  sched_->rounds.push_back(&r);
  rounds_.emplace(r.id, std::move(owned));
  *out = r.id;
  pump();  // start streaming now
  retire();
  return true;
}

// Plans an internal or re-planned round on the current links and appends it to the session.
void Client::enqueue(Round* r) {
  sched_->plan(*r, links_, active_.size());
  sched_->rounds.push_back(r);
  open_++;
  settle(*r);  // an empty one (nothing on any link) is done at once
}

// A round is done once every result is in and, with failover, every reducer cleared it. A small
// user round is released to its caller as soon as its results are in (release_early).
void Client::settle(Round& r) {
  if (r.state != Round::State::Running || r.parts_left > 0 || r.children > 0) return;
  if (r.clears_left > 0) {
    release_early(r);
    return;
  }
  r.state = Round::State::Done;
  recycle_copy(r);
  if (r.in_session) open_--;
  switch (r.role) {
    case Round::Role::User:
      recovery_->round_finished();
      if (r.released) released_open_--;  // (counted in stats and left running_ when it was released)
      else {
        running_--;
        stats_.rounds++;
      }
      // A repaired round leaves parents_ now: once collected it is freed (collect()). One the
      // caller collected when it was released is in neither parents_ nor sched_->rounds any more:
      // nothing else frees it.
      parents_.erase(std::remove(parents_.begin(), parents_.end(), &r), parents_.end());
      if (r.collected && !r.in_session) rounds_.erase(r.id);  // (r is gone)
      break;
    case Round::Role::Repair: {
      Round& parent = *r.parent;
      for (const Round::Span& m : r.map) parent.held.add(m.pos, m.pos + m.len);
      stats_.repaired_bytes += r.nbytes;
      parent.children--;
      settle(parent);
      break;
    }
    case Round::Role::Exchange: break;
  }
}

// Every result of user round `r` is in, a CLEAR is still owed: hands it back now if it is small
// (kEarlyReleaseBytes). Its results are copied aside and `buf` points at the copy from here on,
// so a failover before the CLEARs repairs from the copy, never from memory the caller has back.

void Client::release_early(Round& r) {
  if (r.released || !r.small_user() || released_open_ >= size_t(opts_.max_rounds_in_flight)) return;
  if (!spare_copies_.empty()) {
    r.copy = std::move(spare_copies_.back());
    spare_copies_.pop_back();
  }
  if (r.copy.size() < r.buf.size()) r.copy.resize(r.buf.size());
  uint64_t at = 0;
  for_each_piece(r.buf, 0, r.buf.size(), [&](const iovec& piece) {
    std::memcpy(r.copy.data() + at, piece.iov_base, piece.iov_len);
    at += piece.iov_len;
  });
  r.buf.assign(r.copy.data(), at);
  r.released = true;
  running_--;  // the caller has it back: it no longer counts against max_rounds_in_flight
  released_open_++;
  stats_.rounds++;
  stats_.early_releases++;
}

// A done or failed round's copy goes back to the pool (kept up to max_rounds_in_flight).
void Client::recycle_copy(Round& r) {
  if (r.copy.empty()) return;
  r.buf.clear();
  if (spare_copies_.size() < size_t(opts_.max_rounds_in_flight)) spare_copies_.push_back(std::move(r.copy));
  r.copy = {};
}

void Client::finish_part(size_t li, Round& r) {
  r.parts_left--;
  sched_->advance_done(*links_[li], li);
  settle(r);
}

// CLEAR(n) on link li: every worker holds the results of the rounds below n on this link.
void Client::apply_clear(size_t li, uint64_t upto) {
  Link& l = *links_[li];
  const std::string bad = check_clear(upto, l.done_sent, opts_.failover);
  if (!bad.empty()) throw Error(ErrorKind::Protocol, l.peer + ": " + bad);
  const uint64_t from = std::max(l.cleared, sched_->oldest_wire());
  for (uint64_t w = from; w < upto; ++w) {
    Round* r = sched_->by_wire(w);
    if (!r) continue;
    Round::Part& p = r->parts[li];
    if (p.expected == 0 || p.cleared) continue;
    p.cleared = true;
    r->clears_left--;
    settle(*r);
  }
  l.cleared = std::max(l.cleared, upto);
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
  while (!sched_->rounds.empty() && sched_->rounds.front()->state != Round::State::Running) {
    Round* r = sched_->rounds.front();
    sched_->rounds.pop_front();
    r->in_session = false;
    if (r->role == Round::Role::User) {
      if (r->collected) rounds_.erase(r->id);
    } else if (r->role == Round::Role::Repair) {  // exchange rounds: recover() reads them, the next one frees them
      auto it = std::find_if(internal_.begin(), internal_.end(), [&](const auto& p) { return p.get() == r; });
      if (it != internal_.end()) internal_.erase(it);
    }
  }
}

void Client::fill(size_t li) { sched_->fill(*links_[li], li, copies_short()); }

bool Client::copies_short() const { return force_dones_ || released_open_ + 1 >= size_t(opts_.max_rounds_in_flight); }

// One non-blocking pass over the links: each link that can move bytes takes its turn
// (pump_link), then finished rounds retire and the recovery coordinator looks at losses and
// stalls. Any error that is not a reducer's loss fails every round in flight.
bool Client::pump(const pollfd* ready, bool idle) {
  if (links_.empty() || (open_ == 0 && !idle)) return false;
  bool moved = false;
  try {
    if (!ready) ready = poll_links();
    for (size_t li = 0; li < links_.size(); ++li)
      if (ready[li].revents != 0 && !links_[li]->closed && pump_link(li, ready[li].revents)) moved = true;
    retire();
    if (recovery_->after_pass()) return true;  // a loss moved the session
  } catch (const Error& e) {
    if (recovery_->recovering()) throw;  // recover() unwinds, then the outer pump fails the rounds
    fail_all(e.kind(), e.what());
    return true;
  }
  if (moved) wake_waiters();
  return moved;
}

// Link li's turn (`rev`: the wait said it is readable, or writable; frames queued count as
// writable until a write would block), up to kLinkBudget bytes: it writes, then reads; frames
// written or results read make room, so it queues and writes more before the next link's turn.
// True if bytes moved.
bool Client::pump_link(size_t li, short rev) {
  Link& l = *links_[li];
  net::IoBudget budget(kLinkBudget);
  uint64_t sent = 0, got = 0;
  try {
    if (rev & POLLOUT) {
      net::IoResult wr = write_link(li, &budget);
      sent += wr.bytes;
      // Written frames free staging slots: queue (narrow) and write the next ones now.
      if (wr.frames > 0 && !wr.blocked && !budget.spent()) {
        fill(li);
        sent += write_link(li, &budget).bytes;
      }
    }
    if (rev & (POLLIN | POLLHUP | POLLERR)) {
      net::IoResult rd = l.in.pump(
          l.fd.get(), l.peer, &budget,
          [&](const proto::FrameHeader& h, const std::string& err) { return on_header(li, h, err); },
          [&](const proto::FrameHeader& h) { return on_frame(li, h); });
      got += rd.bytes;
      // Results free window slots: queue and write more before the next link's turn.
      if (rd.frames > 0 && !budget.spent() && !l.closed) {
        fill(li);
        sent += write_link(li, &budget).bytes;
      }
    }
  } catch (const Error& e) {
    // A connection that closes or resets is a lost reducer (failover); anything else fails the rounds.
    if (!opts_.failover || e.kind() != ErrorKind::PeerLost) throw;
    l.closed = true;
    recovery_->note_lost(l.reducer, e.what());
  }
  return count_io(sent, got);
}

// Writes link li's queued frames (a write without MSG_MORE takes along whatever waited in the kernel).
net::IoResult Client::write_link(size_t li, net::IoBudget* budget) {
  Link& l = *links_[li];
  net::IoResult wr = l.out.flush(l.fd.get(), l.peer, budget, [&](uint64_t token) { on_written(li, token); }, l.cork);
  if (wr.bytes) l.corked = l.cork;
  l.write_blocked = !l.out.empty() && !budget->spent();  // (a spent budget: the next pass writes on)
  return wr;
}

// The frame with `token` (schedule.h) is written on link li.
void Client::on_written(size_t li, uint64_t token) {
  Link& l = *links_[li];
  if (token == kDoneToken) {
    l.done_queued = false;
    return;
  }
  if (token & 1) l.staging.written();
  if (Round* r = sched_->by_wire(token >> 1)) r->parts[li].written++;
}

// Where the payload of a frame from link li goes: an ERROR's text, nothing for a CLEAR, and a
// RESULT (checked against what this worker sent) straight into its round's buffer, or into the
// link's staging chunk for a compressed round.
net::Sink Client::on_header(size_t li, const proto::FrameHeader& h, const std::string& err) {
  Link& l = *links_[li];
  if (!err.empty()) throw Error(ErrorKind::Protocol, "bad frame from " + l.peer + ": " + err);
  if (h.type == proto::FrameType::Error) return net::Sink::text_into(&l.error_text);
  if (h.type == proto::FrameType::Clear) return net::Sink::discard();  // no payload: on_frame applies it
  if (h.type != proto::FrameType::Result)
    throw Error(ErrorKind::Protocol, "unexpected frame type " + std::to_string(int(h.type)) + " from " + l.peer);
  Round* r = sched_->by_wire(h.round);
  if (r && r->state != Round::State::Running) r = nullptr;
  const SentRound sent{uint8_t(r ? r->dtype : DType::F32), uint8_t(r ? r->op : Op::Sum), r ? r->nbytes : 0};
  const std::string bad =
      check_result(h, r ? &sent : nullptr, r ? r->parts[li] : LinkShare{}, uint64_t(l.stream), uint64_t(opts_.streams));
  if (!bad.empty())
    throw Error(ErrorKind::Protocol, l.peer + " sent a result (round " + std::to_string(h.round) + ", offset " +
                                         std::to_string(h.offset) + ", " + std::to_string(h.length) +
                                         " bytes) this worker did not ask for: " + bad);
  l.reading = r;
  if (r->comp != Compression::None) return net::Sink::memory(l.staging.result_chunk());  // widened in on_frame
  // Whole elements only: after a failure each element is either the input or the result.
  return net::Sink::scatter(r->buf, r->parts[li].shard_off + h.offset, uint32_t(dtype_size(r->dtype)));
}

// A complete frame from link li. False: nothing more is read from it (an ERROR).
bool Client::on_frame(size_t li, const proto::FrameHeader& h) {
  Link& l = *links_[li];
  if (h.type == proto::FrameType::Error) {
    recovery_->on_reducer_error(l, proto::ErrorCode(h.flags), h.tag,
                                reducer_error_text(addrs_[l.reducer].str(), l.error_text));
    return false;
  }
  if (h.type == proto::FrameType::Clear) {
    apply_clear(li, h.round);
    return true;
  }
  Round& r = *l.reading;
  Round::Part& p = r.parts[li];
  if (r.comp != Compression::None) l.staging.widen(r.buf, r.dtype, p.shard_off + h.offset, h.length);
  p.received++;
  l.in_flight--;
  l.got_bytes += uint64_t(h.length) * r.scale();
  if (l.in_flight == 0) l.rate_from_ns = 0;  // ran dry: the next rate sample starts when it is window-bound
  if (p.received == p.expected) finish_part(li, r);
  return true;
}

// The bytes a link's turn moved: counted, and progress for the no-progress timer. True if any.
bool Client::count_io(uint64_t sent, uint64_t got) {
  stats_.bytes_sent += sent;
  stats_.bytes_received += got;
  if (!sent && !got) return false;
  timer_.progress();
  return true;
}

bool Client::collect(RoundId id) {
  auto it = rounds_.find(id);
  if (it == rounds_.end())
    throw Error(ErrorKind::Config,
                "round " + std::to_string(id) + (id < id_next_ ? " was already waited for" : " was never started"));
  Round& r = *it->second;
  if (r.collected) throw Error(ErrorKind::Config, "round " + std::to_string(id) + " was already waited for");
  if (r.state == Round::State::Running && !r.released) return false;
  if (r.state == Round::State::Failed) {  // failed rounds are no longer in sched_->rounds
    Error e(r.kind, r.error);
    rounds_.erase(it);
    throw e;
  }
  // A finished round may still sit in sched_->rounds behind an unfinished older one, and a released
  // one waits for its CLEARs in sched_->rounds (or for its repair in parents_): each is freed when it
  // leaves them (retire, settle, fail_all).
  if (r.state == Round::State::Running || sched_->by_wire(r.wire) == &r) r.collected = true;
  else rounds_.erase(it);
  return true;
}

bool Client::test(RoundId id) {
  refuse_inherited();
  Lock lk = enter();
  Driving driving(this);
  if (!rounds_.count(id)) collect(id);  // throws: unknown id
  recovery_->check_probes();
  pump();
  return collect(id);
}

void Client::wait(RoundId id) {
  refuse_inherited();
  Lock lk = enter();
  Driving driving(this);
  if (!rounds_.count(id)) collect(id);  // throws: unknown id
  drive(lk, id, false);
  collect(id);
}

}  // namespace rs::client
