#include "client/recovery.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "client/schedule.h"
#include "client/staging.h"
#include "common/error.h"
#include "common/log.h"
#include "common/raised.h"
#include "net/tcp_path.h"

namespace rs::client {

using net::Clock;

namespace {

ErrorKind kind_of(proto::ErrorCode code) {
  switch (code) {
    case proto::ErrorCode::Mismatch: return ErrorKind::Mismatch;
    case proto::ErrorCode::Protocol: return ErrorKind::Protocol;
    case proto::ErrorCode::PeerLost:
    case proto::ErrorCode::Failover:
    case proto::ErrorCode::Shutdown: return ErrorKind::PeerLost;
    default: return ErrorKind::Internal;
  }
}

// Writes the identity of a sum over wire bytes [2 off or off, ...) of a round's buffer: -0.0 for
// floats (x + -0.0 == x bit for bit, also for x = +0.0), 0 for integers. `buf_dtype` is the
// buffer's type (float32 for compressed rounds).
void fill_identity(const net::Segments& buf, DType buf_dtype, uint64_t off, uint64_t len) {
  const size_t es = dtype_size(buf_dtype);
  uint64_t at = off;  // elements start at multiples of es in the round's buffer
  for_each_piece(buf, off, len, [&](const iovec& piece) {
    uint8_t* p = static_cast<uint8_t*>(piece.iov_base);
    std::memset(p, 0, piece.iov_len);
    if (buf_dtype != DType::I32 && buf_dtype != DType::I64) {
      // Little-endian: the sign bit is the top bit of each element's last byte.
      for (size_t b = size_t(es - 1 - at % es); b < piece.iov_len; b += es) p[b] = 0x80;
    }
    at += piece.iov_len;
  });
}

bool contains(const std::vector<size_t>& v, size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

Recovery::Recovery(std::unique_ptr<RecoveryHost> host)
    : host_(std::move(host)), c_(*host_), lost_(c_.addresses().size(), 0) {}

int Recovery::poll_ms() const { return c_.timer().poll_ms(peer_left_.empty() ? 200 : 20); }

void Recovery::reset() {
  check_ = nullptr;  // a rejoin check under way is over (the boundary is not checked again)
  check_open_ = false;
  std::fill(lost_.begin(), lost_.end(), 0);
  loss_pending_ = false;
  loss_why_.clear();
  peer_left_.clear();
  recoveries_ = 0;
}

void Recovery::restart() {
  reset();
  rejoin_checked_ = 0;
  rejoin_from_ = 0;
  probes_.clear();
  lost_all_idle_ = false;
}

// ---- losses ------------------------------------------------------------------------------

void Recovery::note_lost(size_t reducer, const std::string& why) {
  if (reducer >= lost_.size()) return;
  if (!lost_[reducer] && contains(c_.active(), reducer))
    log_warn("reducer " + c_.addresses()[reducer].str() + " lost (rank " + std::to_string(c_.options().rank) +
             ", group " + c_.options().group + "): " + why);
  lost_[reducer] = 1;
  loss_pending_ = true;
  if (loss_why_.empty()) loss_why_ = c_.addresses()[reducer].str() + ": " + why;
}

// After a reducer reports that another worker left, how long this worker waits for a reducer
// loss of its own that would explain it (that worker may have left for a failover, its goodbye lost).
constexpr int kPeerLeftGraceMs = 200;

void Recovery::on_reducer_error(Link& l, proto::ErrorCode code, uint64_t tag, const std::string& msg) {
  if (!c_.options().failover) throw Error(kind_of(code), msg);
  l.closed = true;  // the reducer closes this connection after its error
  switch (code) {
    case proto::ErrorCode::Shutdown: note_lost(l.reducer, msg); return;
    case proto::ErrorCode::Failover:  // another worker lost reducers: the tag says which
      for (size_t i = 0; i < c_.addresses().size() && i < 64; ++i)
        if (tag >> i & 1) note_lost(i, "another worker of the group lost it (" + msg + ")");
      loss_pending_ = true;  // (beyond 64 reducers the mask is empty: connecting finds them)
      if (loss_why_.empty()) loss_why_ = msg;
      return;
    case proto::ErrorCode::PeerLost:  // a worker left: fatal unless a reducer loss explains it
      if (peer_left_.empty()) {
        peer_left_ = msg;
        peer_left_until_ = Clock::now() + std::chrono::milliseconds(kPeerLeftGraceMs);
      }
      return;
    default: throw Error(kind_of(code), msg);
  }
}

bool Recovery::after_pass() {
  if (loss_pending_) {
    if (!recovering_) recover();
    c_.wake_waiters();
    return true;
  }
  if (!peer_left_.empty() && Clock::now() >= peer_left_until_) throw Error(ErrorKind::PeerLost, peer_left_);
  if (c_.open_rounds() > 0) warn_stall();
  if (c_.open_rounds() > 0 && c_.timer().expired()) {
    size_t k = 0;
    if (c_.options().failover && stall_is_one_reducer(&k)) {
      note_lost(k, "no progress from it for " + std::to_string(c_.options().timeout) + " s while the others finished");
      if (!recovering_) recover();
      c_.wake_waiters();
      return true;
    }
    throw Error(ErrorKind::Timeout, c_.describe_stall(c_.timer().seconds()));
  }
  return false;
}

// Half of the timeout without progress: says which links are stuck and what TCP makes of each
// (retransmission backoff, the reducer's zero window, nothing owed) while there is time to look.
void Recovery::warn_stall() {
  const net::ProgressTimer& t = c_.timer();
  const double idle = t.idle_seconds();
  if (t.last() == stall_warned_ || idle < t.seconds() / 2 || t.expired()) return;
  stall_warned_ = t.last();
  log_warn("rank " + std::to_string(c_.options().rank) + ", still waiting (RS_TIMEOUT " +
           net::duration_text(uint64_t(t.seconds() * 1e6)) + "): " + c_.describe_stall(idle));
}

// No progress for `timeout`: a lost reducer if it alone still owes this worker results or
// clears (a slow or missing worker would hold up every reducer).
bool Recovery::stall_is_one_reducer(size_t* reducer) const {
  if (c_.active().size() < 2) return false;
  std::vector<uint8_t> owing(c_.addresses().size(), 0);
  for (const Round* r : c_.schedule().rounds) {
    if (r->state != Round::State::Running) continue;
    for (size_t li = 0; li < c_.links().size(); ++li) {
      const Round::Part& p = r->parts[li];
      if (p.received < p.expected || (p.expected > 0 && c_.options().failover && !p.cleared))
        owing[c_.links()[li]->reducer] = 1;
    }
  }
  size_t n = 0;
  for (size_t i = 0; i < owing.size(); ++i)
    if (owing[i]) {
      n++;
      *reducer = i;
    }
  return n == 1;
}

// ---- failover ----------------------------------------------------------------------------

// Adds what this session's rounds received to their user rounds' `held` (wire bytes).
void Recovery::collect_held() {
  const uint64_t S = uint64_t(c_.options().streams);
  for (Round* r : c_.schedule().rounds) {
    if (r->state != Round::State::Running || r->role == Round::Role::Exchange) continue;
    failover::Intervals got;
    for (size_t li = 0; li < c_.links().size(); ++li) {
      const Round::Part& p = r->parts[li];
      const Link& l = *c_.links()[li];
      for (uint64_t k = 0; k < p.received; ++k) {
        const uint64_t off = (uint64_t(l.stream) + k * S) * p.chunk;
        got.add(p.shard_off + off, p.shard_off + std::min(off + p.chunk, p.shard_bytes));
      }
      // A result being read: its first whole elements are in place (compressed rounds widen
      // only complete frames, so nothing of theirs is).
      if (l.reading == r && l.in.reading_payload() && l.in.header().type == proto::FrameType::Result &&
          r->comp == Compression::None) {
        if (l.in.torn())
          throw Error(ErrorKind::Internal, "reducer failover: a result from " + l.peer +
                                               " ended inside an element; the round cannot be repaired");
        const uint64_t off = p.shard_off + l.in.header().offset;
        got.add(off, off + l.in.payload_in_place());
      }
    }
    if (r->role == Round::Role::User) {
      for (const auto& sp : got.spans()) r->held.add(sp.first, sp.second);
      continue;
    }
    for (const auto& sp : got.spans())  // Repair: its bytes map onto the parent's
      for (const Round::Span& m : r->map) {
        const uint64_t a = std::max(sp.first, m.at), b = std::min(sp.second, m.at + m.len);
        if (a < b) r->parent->held.add(m.pos + (a - m.at), m.pos + (b - m.at));
      }
  }
}

// How long a worker that is leaving for a failover waits to finish a frame it is half-way
// through writing, so that its goodbye is read as one (the others then learn it is a failover).
constexpr int kByeFinishMs = 1000;

// Tells every surviving reducer that this worker leaves for a failover and which reducers were
// lost (BYE with kByeFailover, tag = mask): each fails the group's session with
// ErrorCode::Failover, so the other workers learn it even if they have not noticed the loss.
void Recovery::say_failover_bye() {
  uint64_t mask = 0;
  bool any = false;
  for (size_t i = 0; i < lost_.size(); ++i) {
    if (!lost_[i]) continue;
    any = true;
    if (i < 64) mask |= uint64_t(1) << i;
  }
  proto::FrameHeader h;
  h.type = proto::FrameType::Bye;
  h.flags = any ? proto::kByeFailover : 0;  // a rejoin leaves between rounds: an ordinary goodbye
  h.tag = mask;
  uint8_t bye[proto::kFrameHeaderBytes];
  proto::encode(h, bye);
  const auto until = Clock::now() + std::chrono::milliseconds(kByeFinishMs);
  for (auto& lp : c_.links()) {
    Link& l = *lp;
    if (l.closed || lost_[l.reducer]) continue;
    try {
      // Frames queued are written first (a half-written one would swallow the goodbye, and with
      // frame integrity every queued frame has taken its place in the sequence).
      while (!l.out.empty() && Clock::now() < until) {
        pollfd p{l.fd.get(), POLLOUT, 0};
        if (::poll(&p, 1, net::ms_until(until, 50)) <= 0) continue;
        l.out.flush(l.fd.get(), l.peer, nullptr, [](uint64_t) {});
      }
      l.out.send_now(l.fd.get(), l.peer, bye, sizeof bye);
    } catch (const Error&) {
      // gone too: its own loss shows when connecting the survivors
    }
    ::shutdown(l.fd.get(), SHUT_WR);
  }
  c_.drop_links();  // (and the probes: the next check only starts probes, for the set the new session leaves out)
}

// User rounds not finished here, by round number (Round::seq).
std::vector<Round*> Recovery::unfinished_rounds() {
  std::vector<Round*> pending;
  for (Round* r : c_.schedule().rounds)
    if (r->role == Round::Role::User && r->state == Round::State::Running) pending.push_back(r);
  for (Round* r : c_.parents())
    if (r->state == Round::State::Running) pending.push_back(r);
  std::sort(pending.begin(), pending.end(), [](const Round* a, const Round* b) { return a->seq < b->seq; });
  return pending;
}

// Failover sessions (a failover's exchange starts again when another loss interrupts it) since a
// user round last finished: beyond this many (plus one per reducer) something keeps interrupting
// them (a reducer that keeps answering ERROR Failover) and the rounds fail instead.
constexpr int kMaxRecoverRestarts = 16;

// Moves the session to the surviving reducers and sets up the repair of every unfinished round
// (see client/failover.h and docs/protocol.md, "Reducer failover"). Blocks until the workers
// have agreed (two small all-reduces); the repairs then run like any round.
void Recovery::recover() {
  Raised flag(recovering_);
  collect_held();  // the unfinished rounds' progress so far goes into `held`
  const std::vector<Round*> pending = unfinished_rounds();
  for (;;) {
    if (++recoveries_ > kMaxRecoverRestarts + int(c_.addresses().size()))  // a reducer that keeps saying "failover"
      throw Error(ErrorKind::PeerLost, "reducer failover: " + std::to_string(recoveries_ - 1) +
                                           " failover sessions without a round finishing (last: " + loss_why_ + ")");
    if (!move_session(pending)) continue;
    c_.timer().progress();
    std::optional<failover::Table> table;
    if (!exchange(pending, &table)) continue;
    rejoin_from_ = table->max_next();
    plan_repairs(pending, *table);
    c_.timer().progress();
    c_.wake_waiters();
    return;
  }
}

// 1. Leaves the session, telling the survivors why; 2. connects a session on them. False if a
// reducer refused it (it is lost too: start again).
bool Recovery::move_session(const std::vector<Round*>& pending) {
  say_failover_bye();
  for (Round* r : pending) {
    r->parts.clear();
    r->in_session = false;
    r->parts_left = r->clears_left = r->children = 0;
  }
  c_.clear_session(pending);  // not in a session until re-planned (fail_all finds them there)
  check_ = nullptr;           // a rejoin check under way is abandoned: try_rejoin() sees it
  std::vector<size_t> next;
  std::string lost_names;
  for (size_t i : c_.active()) {
    if (!lost_[i]) next.push_back(i);
    else lost_names += (lost_names.empty() ? "" : ", ") + c_.addresses()[i].str();
  }
  const std::string why = loss_why_;
  std::fill(lost_.begin(), lost_.end(), 0);
  loss_pending_ = false;
  loss_why_.clear();
  peer_left_.clear();
  if (next.empty()) {
    // The rounds fail (the workers hold them in different states, nowhere to repair them); the
    // next start() reconnects from the configured reducers and the base group, where every
    // worker meets again however the loss found it (Client::reconnect).
    // Rounds released early are their callers' already (fail_all() ends them as done).
    lost_all_idle_ = std::all_of(pending.begin(), pending.end(), [](const Round* r) { return r->released; });
    if (lost_all_idle_)
      log_warn("every reducer of the session is lost (rank " + std::to_string(c_.options().rank) + ", group " +
               c_.options().group + ", no round waiting; last: " + why + "): the next call reconnects");
    throw Error(ErrorKind::PeerLost, "every reducer is lost (last: " + why + ")");
  }
  if (next.size() != c_.active().size()) c_.stats().reducer_failovers++;
  c_.set_active(next);
  log_move(lost_names, why, pending.size());
  std::vector<size_t> refused;  // a reducer that refuses the new session is lost too
  c_.connect(&refused);
  for (size_t i : refused) note_lost(i, "it refused the failover session");
  return refused.empty();
}

void Recovery::log_move(const std::string& lost_names, const std::string& why, size_t pending) const {
  const ClientOptions& o = c_.options();
  const std::string who = "(rank " + std::to_string(o.rank) + ", group " + o.group + ")";
  if (why.empty()) {  // a rejoin
    log_info("new session on " + std::to_string(c_.active().size()) + " reducers " + who);
    return;
  }
  log_warn("reducer failover " + who + ": " +
           (lost_names.empty() ? std::string("another worker lost a reducer") : "lost " + lost_names) +
           "; continuing on " + std::to_string(c_.active().size()) + " of " + std::to_string(c_.addresses().size()) +
           " reducers with " + std::to_string(pending) + " round(s) to finish");
}

// 3. The exchange: what every worker holds of every unfinished round (two all-gathers: SUM of
// rows, each worker fills its own). Every row that comes back is checked before anything is
// sized from it (failover::Limits). False if a loss interrupted it.
bool Recovery::exchange(const std::vector<Round*>& pending, std::optional<failover::Table>* table) {
  failover::Limits lim;
  lim.rank = c_.options().rank;
  for (Round* r : pending) lim.add_round(r->seq, r->held, r->nbytes, dtype_size(r->dtype));
  lim.finish(c_.next_seq());
  const uint32_t W = c_.options().world_size, me = c_.options().rank;
  auto launch = [&](size_t words, auto&& put) -> Round* {
    Round* x = c_.new_internal(Round::Role::Exchange);
    x->store.assign(words, 0);
    put(&x->store);
    seal_exchange(x, Op::Sum);
    c_.enqueue(x);
    return x;
  };
  Round* x1 = launch(size_t(W) * failover::kSummaryWords,
                     [&](std::vector<int64_t>* t) { failover::put_summary(t, me, lim.own); });
  if (!run_internal(x1)) return false;
  const std::vector<int64_t> summaries = x1->store;
  const uint64_t max_e = failover::check_summaries(W, summaries, lim);
  Round* x2 = launch(failover::table_words(W, max_e),
                     [&](std::vector<int64_t>* t) { failover::put_entries(t, me, max_e, lim.mine); });
  if (!run_internal(x2)) return false;
  table->emplace(W, summaries, x2->store, max_e, &lim);
  return true;
}

// 4. Repairs (in round-number order, the same on every worker), then rounds not started everywhere.
void Recovery::plan_repairs(const std::vector<Round*>& pending, const failover::Table& table) {
  std::vector<Round*> parents;
  for (Round* r : pending) {
    if (r->seq >= table.hi()) {
      if (!r->held.empty())
        throw Error(ErrorKind::Protocol, "reducer failover: round " + std::to_string(r->seq) +
                                             " has results here but was not started on every worker");
      r->wire = c_.schedule().next_wire++;
      c_.enqueue(r);
      continue;
    }
    repair(r, table);
    if (r->children > 0) parents.push_back(r);
    else {
      r->held.clear();
      c_.settle(*r);  // every worker holds all of it
    }
  }
  c_.parents() = parents;
}

// Enqueues the repair rounds of user round `r`: copies first, then reductions.
void Recovery::repair(Round* r, const failover::Table& table) {
  const auto pieces = table.plan(r->seq, r->nbytes, dtype_size(r->dtype));
  const DType buf_dtype = r->comp != Compression::None ? DType::F32 : r->dtype;
  const int64_t me = int64_t(c_.options().rank);
  for (int pass = 0; pass < 2; ++pass) {
    const bool copy = pass == 0;
    Round* c = nullptr;
    std::vector<iovec> segs;
    for (const auto& pc : pieces) {
      if ((pc.holder >= 0) != copy) continue;
      if (!c) {
        c = c_.new_internal(Round::Role::Repair);
        c->parent = r;
        c->dtype = r->dtype;
        c->op = copy ? Op::Sum : r->op;
        c->tag = r->tag;
        c->comp = r->comp;
      }
      const uint64_t len = pc.end - pc.begin;
      c->map.push_back({c->nbytes, pc.begin, len});
      c->nbytes += len;
      if (copy && pc.holder != me) fill_identity(r->buf, buf_dtype, pc.begin * r->scale(), len * r->scale());
      for_each_piece(r->buf, pc.begin * r->scale(), len * r->scale(),
                     [&](const iovec& piece) { segs.push_back(piece); });
    }
    if (!c) continue;
    c->buf.assign(segs.data(), segs.size());
    c->wire = c_.schedule().next_wire++;
    c_.enqueue(c);
    r->children++;
  }
}

// ---- internal rounds ---------------------------------------------------------------------

// The fingerprint of the failover exchange rounds (all workers send the same).
constexpr uint64_t kExchangeTag = 0x5245564f4c494146ull;  // "FAILOVER"

// An exchange round over its own table (x->store, int64), with the next round number.
void Recovery::seal_exchange(Round* x, Op op) {
  x->dtype = DType::I64;
  x->op = op;
  x->tag = kExchangeTag;
  x->nbytes = x->store.size() * sizeof(int64_t);
  x->buf.assign(reinterpret_cast<uint8_t*>(x->store.data()), x->nbytes);
  x->wire = c_.schedule().next_wire++;
}

// Drives the session until internal round `r` is done, with the lock held (other threads
// wait: nothing else may start while the workers agree). False if a reducer was lost meanwhile.
bool Recovery::run_internal(Round* r) {
  std::vector<pollfd> pfds;
  while (r->state == Round::State::Running) {
    if (loss_pending_) return false;
    if (c_.links().empty()) throw Error(ErrorKind::PeerLost, "reducer failover: the new session was dropped");
    c_.poll_and_pump(&pfds, poll_ms());
  }
  return !loss_pending_;
}

// Finishes every round in flight (with the lock held). False if it would have to wait and
// `may_wait` is false, or if the session failed meanwhile.
bool Recovery::drain(bool may_wait) {
  std::vector<pollfd> pfds;
  Raised force(c_.force_dones());  // every round must end: no DONE may wait in the kernel meanwhile
  while (c_.open_rounds() > 0 && !c_.links().empty()) {
    if (!may_wait) {
      c_.pump();
      if (c_.open_rounds() > 0) return false;
      break;
    }
    c_.poll_and_pump(&pfds, poll_ms());
  }
  return !c_.links().empty();
}

// ---- rejoin checks -----------------------------------------------------------------------

// While reducers are lost, the workers check every kRejoinEvery rounds (at the same round number
// on every worker) whether they came back (with the probes the previous check started).
constexpr uint64_t kRejoinEvery = 32;

// A rejoin check at this round boundary (start() of a round number, Round::seq, that is a multiple of
// kRejoinEvery, on every worker): drain, agree with a MIN all-reduce on the lost reducers
// every worker reached with the probe it started at the previous check, move the session to
// the larger set if there are any, and start the probes the next check reads. Nothing here
// waits for a connect: a probe still under way counts as not reached (so the first check
// after a failover only starts probes, and a reducer that is back rejoins one check later).
// False: try_start() (`may_wait` false) would have had to wait, for the drain or for the other
// workers to reach the check; the check then stays open (check_open_) and every later start
// comes back here, so nothing else starts before it is over. try_start() never waits for the
// MIN all-reduce: it enqueues it once and moves it on without waiting at each later call
// (start() and wait() drive it too); only a rejoin (recover(): a new session) still blocks.
bool Recovery::check_due() const {
  const uint64_t next = c_.next_seq();
  return c_.options().failover && c_.active().size() < c_.addresses().size() && next >= rejoin_from_ && next > 0 &&
         next % kRejoinEvery == 0 && rejoin_checked_ != next;
}

bool Recovery::try_rejoin(bool may_wait) {
  if (!check_open_) {
    if (!drain(may_wait)) {
      // The session failed while draining: its error may have reached no caller (rounds released
      // early are their callers' already), so this call raises it; the next start reconnects.
      if (c_.links().empty()) throw c_.dropped();
      return false;
    }
    if (!check_due()) return true;  // a failover while draining moved the boundary
    rejoin_checked_ = c_.next_seq();
    open_check();
  }
  try {
    bool agreed = false;
    if (check_) {                // else a failover in an earlier call dropped it: that call recovered already
      Raised flag(recovering_);  // a loss during the check is handled below (recover() frees the round)
      if (may_wait) {
        agreed = run_internal(check_);
      } else {
        c_.pump();
        if (check_->state == Round::State::Running && !loss_pending_) return false;  // not every worker is there
        agreed = !loss_pending_;
      }
    }
    Round* x = check_;
    check_ = nullptr;  // (still owned by the internal rounds: the next check frees it)
    check_open_ = false;
    return finish_check(may_wait, agreed, x);
  } catch (const Error& e) {
    // Out of step with the group (the check's round is left half done): drop the session, as
    // pump() does for any error; the next start reconnects.
    c_.fail_all(e.kind(), e.what());
    throw;
  }
}

// The check's MIN all-reduce `x` is over (`agreed`), or a failover abandoned it.
bool Recovery::finish_check(bool may_wait, bool agreed, Round* x) {
  if (!agreed) {
    if (x) recover();
    // A failover abandoned the check. Whether a worker had opened it before the loss differs
    // between workers (another may have noticed the loss while draining, then opened the
    // check in the new session), so every worker decides again from agreed values only
    // (rejoin_from_, the next round number): the check is redone in the new session if still due.
    rejoin_checked_ = 0;
    if (!c_.links().empty() && check_due()) return try_rejoin(may_wait);
    start_probes();
    return true;
  }
  const size_t R = c_.addresses().size();
  std::vector<size_t> back;
  for (size_t i = 0; i < R; ++i)
    if (x->store[i] == 1 && !contains(c_.active(), i)) back.push_back(i);
  if (!back.empty()) {
    std::string names;
    std::vector<size_t> next = c_.active();
    for (size_t i : back) {
      names += (names.empty() ? "" : ", ") + c_.addresses()[i].str();
      next.push_back(i);
    }
    std::sort(next.begin(), next.end());
    c_.set_active(next);
    c_.stats().reducer_rejoins += back.size();
    log_info("reducer(s) " + names + " rejoined (rank " + std::to_string(c_.options().rank) + ", group " +
             c_.options().group + "): continuing on " + std::to_string(c_.active().size()) + " of " +
             std::to_string(R) + " reducers");
    recover();  // no round in flight: a new session on the larger set
  }
  start_probes();
  return true;
}

// Enqueues the check's MIN all-reduce (every round in flight is done): 1 for each reducer of
// the session and each lost one whose probe connected.
void Recovery::open_check() {
  c_.free_exchanges();  // earlier checks' rounds
  Round* x = c_.new_internal(Round::Role::Exchange);
  x->store.assign(c_.addresses().size(),
                  0);  // 1 = reached: a MIN over the workers keeps the reducers every worker reached
  for (size_t i : c_.active()) x->store[i] = 1;
  for (auto& [i, probe] : probes_)  // connected (the reducer logs the close at debug level)
    if (probe.check() == net::ConnectProbe::State::Reached) x->store[i] = 1;
  probes_.clear();
  seal_exchange(x, Op::Min);
  c_.timer().progress();  // the no-progress clock starts with the round, as for a user round
  c_.enqueue(x);
  check_ = x;
  check_open_ = true;
}

// Starts a connect to every reducer the session leaves out, for the next rejoin check.
void Recovery::start_probes() {
  probes_.clear();
  if (c_.links().empty()) return;
  for (size_t i = 0; i < c_.addresses().size(); ++i) {
    if (contains(c_.active(), i)) continue;
    probes_.emplace_back(i, net::ConnectProbe(c_.addresses()[i]));
    c_.stats().rejoin_probes++;
  }
}

// Closes the probes whose connect is over, at each round start and test() (so a reducer sees a
// probe's connection closed soon, normally long before its handshake timeout); their outcome
// stays for the next check.
void Recovery::check_probes() {
  for (auto& p : probes_) p.second.check();
}

}  // namespace rs::client
