// Event loops of the reducer (see server.h, docs/protocol.md, docs/security.md).
//
// Threads: `threads` epoll loops. Loop 0 owns the listening socket and runs every handshake; a
// validated connection is handed to the loop that owns its group (hash of job, group, stream),
// so all state of a group is touched by one thread and needs no locks. Ownership of a
// connection moves with it (server/conn.h): after the hand-off loop 0 never touches it again.
// The stream index is part of the key: a worker's several streams to one reducer spread over
// loops. What this file does: epoll, accept, moving bytes, and turning the decisions of
// server/handshake.h and server/group_table.h into replies, frames and log lines.
#include "server/server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/raised.h"
#include "net/socket.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"
#include "server/conn.h"
#include "server/group.h"
#include "server/group_table.h"
#include "server/handshake.h"
#include "server/limits.h"

namespace rs::server {

using net::Clock;

const std::vector<double> kLatencyBounds = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
                                            0.2,    0.5,   1.0,   2.0,   5.0,  10.0, 30.0};

namespace {

// Read budget per connection per wakeup; every frame costs at least its header plus
// net::IoBudget::kFrameCharge, so frames without payload (a flood of BYE headers) cannot starve
// the other connections of a loop.
constexpr size_t kReadBudget = 8u << 20;  // bytes per connection per wakeup
constexpr uint64_t kClearToken = 1;        // a CLEAR frame in a member's queue (results use their Slot*, aligned)
constexpr size_t kEndedGroupsKept = 16;   // ended groups still shown by group_stats()
// How long a connection closed after its last frame (an error, a refusal) keeps draining its
// input before it is closed anyway: time for the peer to read that frame and close (Conn::linger).
constexpr auto kLinger = std::chrono::milliseconds(2000);
constexpr size_t kLingerBudget = 1u << 20;  // input bytes dropped per wakeup while lingering

std::string ip_of(const std::string& peer) {
  if (!peer.empty() && peer[0] == '[') return peer.substr(1, peer.find(']') - 1);
  return peer.substr(0, peer.rfind(':'));
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.compare(0, 4, "127.") == 0;
}

std::chrono::milliseconds ms(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

}  // namespace

struct Loop;

struct Server::Impl {
  ServerOptions opts;
  std::vector<std::unique_ptr<Loop>> loops;
  mutable std::mutex loops_mu;  // group_stats() (any thread) against stop() clearing `loops`
  net::Fd listener;
  uint16_t port = 0;
  std::atomic<bool> running{false};
  std::atomic<bool> accepting{false};
  MemoryBudget budget;
  PeerTable peers;
  LogLimiter accept_log, refuse_log, reject_log;
  // stats
  std::atomic<uint64_t> bytes_received{0}, bytes_sent{0}, rounds_completed{0}, chunks_reduced{0};
  std::atomic<uint64_t> connections{0}, workers{0}, groups{0}, errors{0}, rejected{0}, over_limit{0};
  std::atomic<uint64_t> open_conns{0}, handshakes{0}, waiting{0};
  std::atomic<int64_t> busy_slots{0};
  std::atomic<bool> draining{false};
  std::vector<std::atomic<uint64_t>> latency_counts = std::vector<std::atomic<uint64_t>>(kLatencyBounds.size() + 1);
  std::atomic<uint64_t> latency_sum_us{0};

  void record_latency(double seconds) {
    size_t i = 0;
    while (i < kLatencyBounds.size() && seconds > kLatencyBounds[i]) ++i;
    latency_counts[i]++;
    latency_sum_us += uint64_t(seconds * 1e6);
  }

  // A log line that an attacker could repeat: let through a few per period, count the rest.
  static void log_limited(LogLimiter& lim, LogLevel level, const std::string& msg) {
    uint64_t dropped = 0;
    if (!lim.allow(&dropped)) return;
    log(level, dropped ? msg + " (" + std::to_string(dropped) + " similar lines suppressed)" : msg);
  }
};

struct Loop {
  Server::Impl* srv = nullptr;
  int index = 0;
  net::Fd ep;
  net::Fd ev;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::unique_ptr<GroupTable> table;
  std::vector<Conn*> dying;
  std::vector<Conn*> lingered;  // lingering connections done: closed after the batch of events
  std::vector<Slot*> delivered_scratch;  // flush(): results written, reused (no allocation per chunk)
  std::vector<Conn*> clears_due;  // members owed a CLEAR (flush_clears)
  bool flushing_clears = false;
  std::mutex inbox_mu;
  std::vector<std::unique_ptr<Conn>> inbox;
  // accept back-off after EMFILE/ENFILE (loop 0 only)
  bool listener_paused = false;
  Clock::time_point listener_resume;
  // group_stats() snapshot: refreshed every sweep, and at once when group_stats() asks
  mutable std::mutex snap_mu;
  std::condition_variable snap_cv;
  std::atomic<uint64_t> snap_requested{0};
  std::atomic<uint64_t> snap_done{0};  // written under snap_mu (for snap_cv)
  std::vector<GroupStat> snapshot;
  std::deque<GroupStat> ended;

  void wake() {
    uint64_t one = 1;
    ssize_t r = ::write(ev.get(), &one, sizeof one);
    (void)r;
  }

  // ---- epoll plumbing ----------------------------------------------------------
  void update_mask(Conn* c) {
    if (c->dead) return;
    uint32_t want = EPOLLRDHUP;
    bool reading = !c->paused && !c->close_after_flush && c->state != ConnState::Leaving;
    if (reading) want |= EPOLLIN;
    if (!c->out.empty()) want |= EPOLLOUT;
    if (c->registered && want == c->epoll_mask) return;
    epoll_event e{};
    e.events = want;
    e.data.fd = c->fd.get();
    epoll_ctl(ep.get(), c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd.get(), &e);
    c->registered = true;
    c->epoll_mask = want;
  }

  // The counter a state is counted in (handshakes, waiting), or none.
  std::atomic<uint64_t>* counter_of(ConnState st) {
    switch (st) {
      case ConnState::Hello:
      case ConnState::Names: return &srv->handshakes;
      case ConnState::Waiting: return &srv->waiting;
      default: return nullptr;
    }
  }

  void set_state(Conn* c, ConnState st) {
    if (auto* old = counter_of(c->state)) (*old)--;
    if (auto* now = counter_of(st)) (*now)++;
    c->state = st;
  }

  // Ends a connection (reap() closes it). `linger`: its last frame went out; shut it for
  // writing and drain its input for a while first (Conn::linger).
  void kill(Conn* c, const std::string& why, bool is_error, bool linger = false) {
    if (c->dead) return;
    c->dead = true;
    c->linger = linger;
    c->why = why;
    if (is_error && !c->error_counted) {
      srv->errors++;
      c->error_counted = true;
    }
    dying.push_back(c);
  }

  // ---- output --------------------------------------------------------------------
  void send_ctl(Conn* c, std::string bytes) {
    c->out.push_copy(std::move(bytes), 0);
    flush(c);
  }

  void send_error(Conn* c, proto::ErrorCode code, const std::string& msg, uint64_t tag = 0) {
    std::string text = msg.substr(0, proto::kMaxMessageBytes);
    proto::FrameHeader h;
    h.type = proto::FrameType::Error;
    h.flags = uint8_t(code);
    h.tag = tag;
    h.length = uint32_t(text.size());
    std::string bytes(proto::kFrameHeaderBytes, '\0');
    proto::encode(h, reinterpret_cast<uint8_t*>(&bytes[0]));
    bytes += text;
    // Results already queued are complete and correct: they go out before the error.
    c->close_after_flush = true;
    send_ctl(c, std::move(bytes));
  }

  void send_reply(Conn* c, proto::Status status, const std::string& msg) {
    send_ctl(c, make_reply(status, msg, c->authenticated, c->key, c->hello.nonce, c->nonce));
  }

  // Writes what the connection's queue holds. Results whose last byte went out are handled after
  // the write (never from inside the writer: handling one may queue more on this connection).
  void flush(Conn* c) {
    if (c->dead) return;
    // A CLEAR owed goes in the same write as whatever else is queued (a result, most often).
    if (!c->clear_queued && c->group && c->clear_sent < c->group->cleared() && !c->close_after_flush) queue_clear(c);
    std::vector<Slot*>& delivered = delivered_scratch;
    const size_t mark = delivered.size();  // flush() may nest through result_delivered()
    try {
      net::IoResult res = c->out.flush(c->fd.get(), c->peer, nullptr, [&](uint64_t token) {
        if (token == kClearToken) c->clear_queued = false;
        else if (token) delivered.push_back(reinterpret_cast<Slot*>(token));
      });
      srv->bytes_sent += res.bytes;
      if (c->group) c->group->bytes_sent += res.bytes;
    } catch (const Error& e) {
      delivered.resize(mark);
      kill(c, e.what(), true);
      return;
    }
    for (size_t i = mark; i < delivered.size() && !c->dead; ++i) result_delivered(c, delivered[i]);
    delivered.resize(mark);
    if (c->dead) return;
    if (!c->clear_queued && c->group && c->clear_sent < c->group->cleared() && !c->close_after_flush) {
      queue_clear(c);  // CLEARs are cumulative: the newest one replaces those not sent
      return flush(c);
    }
    if (c->out.empty() && c->close_after_flush) {
      kill(c, c->why.empty() ? "closed after error" : c->why, false, true);
      return;
    }
    update_mask(c);
  }

  // ---- accept and handshake ------------------------------------------------------------
  void pause_listener(int err) {
    Server::Impl::log_limited(srv->accept_log, LogLevel::Warning,
                              "accept failed: " + errno_text(err) + " (" + std::to_string(srv->open_conns.load()) +
                                  " connections open): pausing accepts for 100 ms; raise the descriptor limit " +
                                  "(ulimit -n) or lower RS_MAX_CONNECTIONS");
    epoll_ctl(ep.get(), EPOLL_CTL_DEL, srv->listener.get(), nullptr);
    listener_paused = true;
    listener_resume = Clock::now() + std::chrono::milliseconds(100);
  }

  void resume_listener_if_due() {
    if (!listener_paused || Clock::now() < listener_resume || !srv->accepting.load()) return;
    listener_paused = false;
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = srv->listener.get();
    epoll_ctl(ep.get(), EPOLL_CTL_ADD, srv->listener.get(), &e);
  }

  void accept_all() {
    for (int accepted = 0; accepted < 256; ++accepted) {  // bounded: the loop also serves data
      int fd = ::accept4(srv->listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) pause_listener(errno);
        else if (errno != EAGAIN && errno != EWOULDBLOCK)
          Server::Impl::log_limited(srv->accept_log, LogLevel::Warning, "accept failed: " + errno_text(errno));
        return;
      }
      auto c = std::make_unique<Conn>();
      c->fd.reset(fd);
      c->peer = net::peer_name(fd);
      c->peer_ip = ip_of(c->peer);
      if (srv->open_conns.load() >= srv->opts.max_connections) {
        refuse_connection(c->peer, std::to_string(srv->open_conns.load()) + " connections open (max_connections)");
        continue;  // closed by the Fd's destructor
      }
      if (!srv->peers.acquire(PeerTable::Kind::Connection, c->peer_ip, srv->opts.max_connections_per_peer,
                              &c->peer_ticket)) {
        refuse_connection(c->peer, std::to_string(srv->opts.max_connections_per_peer) +
                                       " connections already open from " + c->peer_ip + " (max_connections_per_peer)");
        continue;
      }
      srv->open_conns++;
      srv->handshakes++;  // the state starts as Hello
      net::tune_socket(fd, srv->opts.socket_buffer);
      c->deadline = Clock::now() + ms(srv->opts.handshake_timeout);
      proto::random_bytes(c->nonce.data(), c->nonce.size());
      proto::Challenge ch;
      ch.auth_required = srv->opts.auth_token.empty() ? 0 : 1;
      ch.nonce = c->nonce;
      std::string bytes(proto::kChallengeBytes, '\0');
      proto::encode(ch, reinterpret_cast<uint8_t*>(&bytes[0]));
      Conn* raw = c.get();
      conns[fd] = std::move(c);
      log_debug("connection from " + raw->peer);
      send_ctl(raw, std::move(bytes));
    }
  }

  void refuse_connection(const std::string& peer, const std::string& why) {
    srv->over_limit++;
    srv->rejected++;
    Server::Impl::log_limited(srv->refuse_log, LogLevel::Warning, "refused a connection from " + peer + ": " + why);
  }

  void reject(Conn* c, proto::Status status, const std::string& msg) {
    srv->rejected++;
    if (status == proto::Status::OverLimit) srv->over_limit++;
    Server::Impl::log_limited(srv->reject_log, LogLevel::Warning, "rejected " + c->peer + ": " + msg);
    c->close_after_flush = true;
    c->why = msg;
    send_reply(c, status, msg);
  }

  // What read_handshake did with a connection.
  enum class Step {
    More,     // read something; call again
    Stop,     // nothing to read now, or refused: the connection is still this loop's
    HandedOff // handed to the loop that owns its group: `c` must not be touched again
  };

  Step read_handshake(Conn* c) {
    if (c->state == ConnState::Hello) {
      ssize_t n = net::recv_some(c->fd.get(), c->fixed + c->got, proto::kHelloFixedBytes - c->got, c->peer);
      if (n < 0) return Step::Stop;
      c->got += size_t(n);
      if (c->got < proto::kHelloFixedBytes) {
        // The magic and the version decide alone: a worker of another version may send a shorter hello.
        if (c->got >= 6 && (proto::get_u32(c->fixed) != proto::kMagic || proto::get_u16(c->fixed + 4) != proto::kVersion))
          c->got = proto::kHelloFixedBytes;  // judge it now (check_hello_fixed reads only what it needs first)
        else
          return Step::More;
      }
      Verdict v = check_hello_fixed(c->fixed, &c->hello, &c->job_len, &c->group_len, c->peer);
      if (v.garbage) {
        srv->rejected++;
        kill(c, v.message, true);
        Server::Impl::log_limited(srv->reject_log, LogLevel::Warning, v.message);
        return Step::Stop;
      }
      if (!v.ok()) {
        reject(c, v.status, v.message);
        return Step::Stop;
      }
      set_state(c, ConnState::Names);
      c->got = 0;
      c->names.assign(c->job_len + c->group_len, '\0');
    }
    if (c->got < c->names.size()) {
      ssize_t n = net::recv_some(c->fd.get(), &c->names[c->got], c->names.size() - c->got, c->peer);
      if (n < 0) return Step::Stop;
      c->got += size_t(n);
      if (c->got < c->names.size()) return Step::More;
    }
    Verdict v = check_hello_names(&c->hello, c->names, c->job_len, srv->opts.auth_token, c->nonce, c->peer, &c->key,
                                  &c->authenticated);
    if (v.ok()) v = check_integrity(c->hello, srv->opts.integrity, c->peer);
    if (!v.ok()) {
      reject(c, v.status, v.message);
      return Step::Stop;
    }
    c->gkey = GroupKey{c->hello.job_id, c->hello.group, c->hello.stream_index};
    c->rank = c->hello.rank;
    set_state(c, ConnState::Waiting);
    return handoff(c) ? Step::HandedOff : Step::Stop;
  }

  bool handoff(Conn* c);  // true if moved to another loop; defined after Server::Impl has its loops
  void adopt(std::unique_ptr<Conn> c);

  // ---- groups -------------------------------------------------------------------------
  void join(Conn* c) {
    if (srv->draining.load() && !table->contains(c->gkey)) {
      set_state(c, ConnState::Closing);
      reject(c, proto::Status::ShuttingDown, "reducer " + std::to_string(srv->port) +
                                                 " is draining: it serves the groups it has but takes no new one");
      return;
    }
    JoinOutcome j = table->join(c, c->hello, c->gkey, c->peer_ip, c->peer);
    switch (j.kind) {
      case JoinOutcome::Kind::Rejected:
        set_state(c, ConnState::Closing);
        reject(c, j.status, j.message);
        return;
      case JoinOutcome::Kind::CompletionFailed:
        // Every member (this one included) is refused; the group has failed and left the table.
        c->group = j.group;
        c->member = true;
        j.group->for_each_member([&](Conn* m) {
          set_state(m, ConnState::Closing);
          reject(m, j.status, j.message);
        });
        return;
      case JoinOutcome::Kind::Waiting:
      case JoinOutcome::Kind::Completed:
        break;
    }
    c->group = j.group;
    c->member = true;
    const Group& g = *j.group;
    if (j.created) {
      log_info("group " + c->gkey.label() + " created by " + c->peer + " (world size " + std::to_string(g.world()) +
               ", " + std::to_string(g.num_streams()) + " streams, chunk " + std::to_string(g.chunk()) + " bytes)");
    }
    log_debug("worker " + c->peer + " joined group " + c->gkey.label() + " as rank " + std::to_string(c->rank) + " (" +
              std::to_string(g.joined()) + "/" + std::to_string(g.world()) + ")");
    update_mask(c);
    if (j.kind != JoinOutcome::Kind::Completed) return;
    log_info("group " + c->gkey.label() + " complete: " + std::to_string(g.world()) + " ranks");
    g.for_each_member([&](Conn* m) {
      m->out.reserve(size_t(srv->opts.group_slots) + 8);  // one result per slot + control: never full
      m->reader.set_max_payload(g.chunk());
      set_state(m, ConnState::Active);
      srv->connections++;
      if (m->gkey.stream == 0) srv->workers++;
      m->counted = true;
      send_reply(m, proto::Status::Ok, "welcome");
      // Frames after the Ok reply carry integrity tags when the hello asked for them (and it
      // was accepted: check_integrity refused it otherwise).
      if (m->hello.flags & proto::kHelloIntegrity)
        net::protect(&m->out, &m->reader, m->key, m->hello.nonce, m->nonce, proto::Direction::ReducerToWorker);
    });
  }

  // Fails a group: every remaining member gets an error frame and is closed.
  void fail_group(const std::shared_ptr<Group>& g, proto::ErrorCode code, const std::string& msg) {
    if (!table->fail(g, msg)) return;
    record_ended(*g);
    log_warn("group " + g->key().label() + " failed: " + msg);
    g->for_each_member([&](Conn* m) {
      if (!m->dead) send_error(m, code, msg, code == proto::ErrorCode::Failover ? g->failover_lost() : 0);
    });
  }

  // The error the others get when a member left: a failover goodbye names the lost reducers.
  static proto::ErrorCode end_code(const Group& g) {
    return g.failover() ? proto::ErrorCode::Failover : proto::ErrorCode::PeerLost;
  }

  // ---- releases (reducer failover) ----------------------------------------------------------
  void queue_clear(Conn* c) {
    proto::FrameHeader h;
    h.type = proto::FrameType::Clear;
    h.round = c->group->cleared();
    uint8_t hdr[proto::kFrameHeaderBytes];
    proto::encode(h, hdr);
    // The queue holds one result per slot plus a few control frames (reserved at join); one CLEAR at a time.
    if (!c->out.push(hdr, sizeof hdr, net::Payload::none(), kClearToken))
      throw Error(ErrorKind::Internal, "output queue of " + c->peer + " is full");
    c->clear_queued = true;
    c->clear_sent = h.round;
  }

  void on_done(Conn* c) {
    Group& g = *c->group;
    if (c->cur.round > c->done_round) c->done_round = c->cur.round;
    if (!g.update_cleared()) return;
    // Not written at once: the DONE that completes a release usually arrives with the data that
    // completes the next round's first chunk, so the CLEAR leaves with that chunk's result in
    // one write (one wake-up of the worker instead of two). flush_clears() sends the CLEARs due
    // after the next data frame of this read, or when the connection's event is handled.
    g.for_each_member([&](Conn* m) {
      if (m->dead || m->close_after_flush || m->clear_due) return;
      m->clear_due = true;
      clears_due.push_back(m);
    });
  }

  // After a data frame, after each event and first thing in reap() (so no connection in
  // `clears_due` is freed while listed): every member owed a CLEAR gets it.
  void flush_clears() {
    if (flushing_clears) return;  // called again from inside flush(): the loop below goes on
    Raised busy(flushing_clears);
    for (size_t i = 0; i < clears_due.size(); ++i) {  // (flush() may add more: read by index)
      Conn* c = clears_due[i];
      c->clear_due = false;
      flush(c);
    }
    clears_due.clear();
  }

  void leave(Conn* c) {
    if (!c->member) return;
    std::shared_ptr<Group> g = c->group;
    c->member = false;
    if (c->counted) {
      srv->connections--;
      if (c->gkey.stream == 0) srv->workers--;
      c->counted = false;
    }
    const bool was_detached_before = g->failed() || !g->left().empty();
    if (c->bye_failover && !g->failed()) g->mark_failover(c->bye_lost);
    LeaveOutcome o = table->leave(g, c->rank, c->who() + " of group " + g->key().label(), c->said_bye, c->why);
    switch (o.kind) {
      case LeaveOutcome::Kind::Failed:
        if (!c->error_counted) {  // leaving mid-round is an error even when the connection closed cleanly
          srv->errors++;
          c->error_counted = true;
        }
        record_ended(*g);
        log_warn("group " + g->key().label() + " failed: " + o.message);
        g->for_each_member([&](Conn* m) {
          if (!m->dead) send_error(m, end_code(*g), o.message, g->failover_lost());
        });
        break;
      case LeaveOutcome::Kind::Left:
        if (!was_detached_before) record_ended(*g);
        log_info(o.message);
        break;
      case LeaveOutcome::Kind::Quiet:
        log_debug("closed " + c->peer + ": " + c->why);
        break;
    }
    if (g->joined() == 0) {
      for (Slot& s : g->slots())
        if (s.seq >= 0) {
          srv->busy_slots--;
          s.seq = -1;
        }
    }
  }

  void expire_groups() {
    table->release_idle(Clock::now(), ms(srv->opts.memory_idle_timeout));  // renewed in try_claim
    auto expired = table->take_expired(Clock::now(), ms(srv->opts.group_timeout));
    for (auto& g : expired) {
      const std::string msg = g->incomplete_message(int(srv->opts.group_timeout));
      g->mark_failed(msg);
      record_ended(*g);
      log_warn(msg);
      g->for_each_member([&](Conn* m) {
        set_state(m, ConnState::Closing);
        m->why = msg;
        m->close_after_flush = true;
        send_reply(m, proto::Status::GroupIncomplete, msg);
      });
    }
  }

  // ---- data path ------------------------------------------------------------------------
  bool try_claim(Conn* c) {
    Group& g = *c->group;
    Slot& s = g.slot_for(c->seq_next);
    const std::string why = s.seq == -1 && !g.memory_held() ? table->renew(c->group) : "";  // idle: release_idle
    if (!why.empty()) {
      fail_group(c->group, proto::ErrorCode::Internal, why);
      return false;
    }
    if (s.seq == -1) {
      s.seq = c->seq_next;
      s.params = c->cur;
      s.first_rank = c->rank;
      srv->busy_slots++;
      if (c->cur.offset == 0 && g.key().stream == 0) g.round_started(c->cur.round, Clock::now());
    } else if (s.seq == c->seq_next) {
      std::string diff = Group::mismatch(s.params, s.first_rank, c->cur, c->rank);
      if (!diff.empty()) {
        fail_group(c->group, proto::ErrorCode::Mismatch, diff);
        return false;
      }
    } else {
      c->paused = true;  // an older chunk still owns the slot
      update_mask(c);
      return false;
    }
    c->paused = false;
    c->cur_slot = &s;
    return true;
  }

  void protocol_error(Conn* c, const std::string& err) {
    const std::string who = c->who() + " of group " + c->gkey.label();
    Server::Impl::log_limited(srv->reject_log, LogLevel::Warning, "protocol error from " + who + ": " + err);
    srv->errors++;
    c->why = "protocol error: " + err;
    fail_group(c->group, proto::ErrorCode::Protocol, "protocol error from " + who + ": " + err);
    if (!c->dead && !c->close_after_flush) send_error(c, proto::ErrorCode::Protocol, c->why);
  }

  // The reader's header callback: where the payload of `h` goes.
  net::Sink on_header(Conn* c, const proto::FrameHeader& h, const std::string& decode_error) {
    std::string err = decode_error;
    if (err.empty() && h.type == proto::FrameType::Bye) {
      c->cur = h;
      return net::Sink::text_into(&c->text);
    }
    if (err.empty() && h.type == proto::FrameType::Done) {
      c->cur = h;
      return net::Sink::discard();  // no payload (decode checked): on_frame handles it
    }
    if (err.empty() && h.type != proto::FrameType::Data) err = "unexpected frame type from a worker";
    if (err.empty() && h.round < c->last_round) err = "round number went backwards";
    if (!err.empty()) {
      protocol_error(c, err);
      return net::Sink::stop();
    }
    Group& g = *c->group;
    if (!g.left().empty() || g.failed()) {
      const std::string why = g.left().empty() ? g.last_error() : g.left();
      fail_group(c->group, end_code(g), why);
      if (!c->dead && !c->close_after_flush) send_error(c, end_code(g), why, g.failover_lost());
      return net::Sink::stop();
    }
    c->cur = h;
    if (try_claim(c)) return net::Sink::memory(g.contribution(*c->cur_slot, c->rank));
    return c->paused ? net::Sink::pause() : net::Sink::stop();
  }

  // The reader's frame callback; false stops reading this connection for now.
  bool on_frame(Conn* c) {
    if (c->cur.type == proto::FrameType::Bye) {
      on_bye(c);
      return false;
    }
    if (c->cur.type == proto::FrameType::Done) {
      on_done(c);  // (its CLEARs wait for the next frame: see on_done)
      return !c->dead && !c->close_after_flush && c->state == ConnState::Active;
    }
    on_payload(c);
    if (!clears_due.empty()) flush_clears();
    return !c->dead && !c->close_after_flush && !c->paused && c->state == ConnState::Active;
  }

  void on_bye(Conn* c) {
    c->said_bye = true;
    c->bye_failover = (c->cur.flags & proto::kByeFailover) != 0;
    c->bye_lost = c->cur.tag;
    set_state(c, ConnState::Leaving);  // nothing more is read from this connection
    std::string text;
    for (char ch : c->text) text += (ch >= 32 && ch < 127) ? ch : '?';  // untrusted: printable only
    c->text.clear();
    c->why = text.empty() ? "said goodbye" : "said goodbye: " + text;
    log_debug(c->who() + " of group " + c->gkey.label() + " " + c->why);
    update_mask(c);
  }

  void on_payload(Conn* c) {
    Slot& s = *c->cur_slot;
    Group& g = *c->group;
    s.arrived[c->rank] = 1;
    c->seq_next++;
    c->last_round = c->cur.round;
    c->cur_slot = nullptr;
    if (!g.advance(s)) return;
    srv->chunks_reduced++;
    proto::FrameHeader h = s.params;
    h.type = proto::FrameType::Result;
    s.pending_sends = g.world();
    std::shared_ptr<Group> keep = c->group;
    uint8_t hdr[proto::kFrameHeaderBytes];
    proto::encode(h, hdr);
    g.for_each_member([&](Conn* m) {
      // A member's queue holds at most one result per slot plus control messages (reserved at join).
      if (!m->out.push(hdr, sizeof hdr, net::Payload::bytes(s.data, h.length), reinterpret_cast<uint64_t>(&s)))
        throw Error(ErrorKind::Internal, "output queue of " + m->peer + " is full");
    });
    keep->for_each_member([&](Conn* m) { flush(m); });
  }

  void result_delivered(Conn* c, Slot* s) {
    std::shared_ptr<Group> g = c->group;
    if (g->failed() || --s->pending_sends > 0) return;
    if (s->params.flags & proto::kLastInStream) {
      g->rounds++;
      if (g->key().stream == 0) {
        srv->rounds_completed++;
        const double age = g->round_age(s->params.round, Clock::now());
        if (age >= 0) srv->record_latency(age);
      }
    }
    g->release(*s);
    srv->busy_slots--;
    g->for_each_member([&](Conn* m) {
      if (!m->paused || m->dead) return;
      m->paused = false;  // the reader offers the waiting header again
      read_data(m);
      update_mask(m);
    });
  }

  // Errors end this connection only (also when called for another connection's event).
  void read_data(Conn* c) {
    if (c->dead || c->paused || c->close_after_flush || c->state != ConnState::Active) return;
    net::IoBudget budget(kReadBudget);
    net::IoResult res;
    try {
      res = c->reader.pump(
          c->fd.get(), c->peer, &budget,
          [&](const proto::FrameHeader& h, const std::string& err) { return on_header(c, h, err); },
          [&](const proto::FrameHeader&) { return on_frame(c); });
    } catch (const Error& e) {
      // A frame that fails its integrity check: the whole group learns why it fails.
      if (e.kind() == ErrorKind::Protocol && c->member && !c->said_bye) protocol_error(c, e.what());
      else kill(c, e.what(), !(c->said_bye || c->close_after_flush));
      return;
    }
    srv->bytes_received += res.bytes;
    if (c->group) c->group->bytes_received += res.bytes;
  }

  // Returns false if the connection was handed to another loop: the caller must not touch it.
  bool on_readable(Conn* c) {
    try {
      if (c->state == ConnState::Hello || c->state == ConnState::Names) {
        Step step;
        do {
          step = read_handshake(c);
        } while (step == Step::More && !c->dead);
        return step != Step::HandedOff;
      }
      if (c->state == ConnState::Waiting) {
        uint8_t b;
        ssize_t n = net::recv_some(c->fd.get(), &b, 1, c->peer);
        if (n > 0) {
          kill(c, "protocol error from " + c->peer + ": data before the group was complete", true);
          Server::Impl::log_limited(srv->reject_log, LogLevel::Warning, c->why);
        }
        return true;
      }
      read_data(c);
    } catch (const Error& e) {
      bool error = !(c->said_bye || c->close_after_flush);
      kill(c, e.what(), error);
    }
    return true;
  }

  void reap() {
    flush_clears();  // (dead members are skipped by flush())
    while (!dying.empty()) {
      std::vector<Conn*> batch;
      batch.swap(dying);
      for (Conn* c : batch) {
        if (c->member) leave(c);
        else if (!c->close_after_flush) log_debug("closed " + c->peer + ": " + c->why);
        set_state(c, ConnState::Closing);
      }
      for (Conn* c : batch) {
        if (c->linger && start_linger(c)) continue;
        close_conn(c);
      }
    }
  }

  void close_conn(Conn* c) {
    if (c->registered) epoll_ctl(ep.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
    srv->open_conns--;
    conns.erase(c->fd.get());
  }

  // Shuts `c` for writing (its queued frames are out: the peer reads them, then end of stream)
  // and watches its input only; false if that fails (then it is closed at once).
  bool start_linger(Conn* c) {
    if (::shutdown(c->fd.get(), SHUT_WR) != 0) return false;
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP;
    e.data.fd = c->fd.get();
    if (epoll_ctl(ep.get(), c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd.get(), &e) != 0) return false;
    c->registered = true;
    c->lingering = true;
    c->linger_until = Clock::now() + kLinger;
    return true;
  }

  // A lingering connection is readable: drop its input; close it at end of stream or an error
  // (or past its time: a peer that keeps sending is not drained for ever).
  void drain_lingering(Conn* c) {
    static thread_local uint8_t sink[64 << 10];
    size_t got = 0;
    while (got < kLingerBudget) {
      ssize_t n = ::recv(c->fd.get(), sink, sizeof sink, MSG_DONTWAIT);
      if (n > 0) {
        got += size_t(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        return linger_over(c);  // end of stream or an error
      }
    }
    if (Clock::now() >= c->linger_until) linger_over(c);  // else: more at the next wakeup
  }

  // Closed after the current batch of events, like reap(): its fd number must not be reused
  // (by an accept) while events of the batch may still name it.
  void linger_over(Conn* c) {
    c->lingering = false;
    lingered.push_back(c);
  }

  void expire_lingering() {
    const auto now = Clock::now();
    std::vector<Conn*> due;
    for (auto& kv : conns)
      if (kv.second->lingering && now >= kv.second->linger_until) due.push_back(kv.second.get());
    for (Conn* c : due) close_conn(c);
  }

  void sweep_handshakes() {
    auto now = Clock::now();
    for (auto& kv : conns) {
      Conn* c = kv.second.get();
      if ((c->state == ConnState::Hello || c->state == ConnState::Names) && !c->dead && now > c->deadline) {
        srv->rejected++;
        kill(c, "handshake timeout from " + c->peer, true);
        Server::Impl::log_limited(srv->reject_log, LogLevel::Warning, c->why);
      }
    }
  }

  // ---- stats ------------------------------------------------------------------------------
  GroupStat stat_of(const Group& g) const {
    GroupStat s;
    s.job = g.key().job;
    s.group = g.key().group;
    s.stream = g.key().stream;
    s.world_size = g.world();
    s.connected = g.joined();
    s.complete = g.complete() && !g.failed() && g.left().empty();
    s.rounds = g.rounds;
    s.bytes_received = g.bytes_received;
    s.bytes_sent = g.bytes_sent;
    s.last_error = g.last_error();
    s.age_s = std::chrono::duration<double>(Clock::now() - g.created()).count();
    return s;
  }

  void record_ended(const Group& g) {
    std::lock_guard<std::mutex> lock(snap_mu);
    ended.push_back(stat_of(g));
    if (ended.size() > kEndedGroupsKept) ended.pop_front();
  }

  void refresh_snapshot() {
    const uint64_t wanted = snap_requested.load();
    std::vector<GroupStat> rows;
    rows.reserve(table->size());
    table->for_each([&](const Group& g) { rows.push_back(stat_of(g)); });
    {
      std::lock_guard<std::mutex> lock(snap_mu);
      snapshot.swap(rows);
      snap_done = wanted;
    }
    snap_cv.notify_all();
  }

  // Called from another thread: a snapshot at most one wakeup old (or the last one after `wait`).
  void fresh_snapshot(std::vector<GroupStat>* out, std::chrono::milliseconds wait) {
    const uint64_t want = ++snap_requested;
    wake();
    std::unique_lock<std::mutex> lock(snap_mu);
    snap_cv.wait_for(lock, wait, [&] { return snap_done >= want; });
    out->insert(out->end(), snapshot.begin(), snapshot.end());
    out->insert(out->end(), ended.begin(), ended.end());
  }

  void run() {
    constexpr int kMaxEvents = 128;
    epoll_event events[kMaxEvents];
    auto last_sweep = Clock::now();
    while (!stop.load()) {
      int n = epoll_wait(ep.get(), events, kMaxEvents, listener_paused ? 20 : 200);
      if (n < 0 && errno != EINTR) {
        log_error("epoll_wait failed: " + errno_text(errno));
        break;
      }
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        uint32_t ev_mask = events[i].events;
        if (fd == ev.get()) {
          uint64_t v;
          ssize_t r = ::read(ev.get(), &v, sizeof v);
          (void)r;
          drain_inbox();
          continue;
        }
        if (index == 0 && srv->listener.valid() && fd == srv->listener.get()) {
          if (srv->accepting.load()) accept_all();
          continue;
        }
        auto it = conns.find(fd);
        if (it == conns.end()) continue;
        Conn* c = it->second.get();
        if (c->lingering) drain_lingering(c);
        if (c->dead) continue;
        try {
          if (ev_mask & EPOLLOUT) flush(c);
          if (!c->dead && (ev_mask & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !on_readable(c)) continue;  // handed off
          if (!c->dead && (ev_mask & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) &&
              (c->paused || c->close_after_flush || c->state == ConnState::Leaving))
            kill(c, c->close_after_flush || c->state == ConnState::Leaving ? c->why
                                                                            : "peer closed the connection while its chunk was waiting",
                 !c->close_after_flush && c->state != ConnState::Leaving);
          if (!c->dead && (ev_mask & (EPOLLIN | EPOLLRDHUP)) == EPOLLRDHUP && !c->paused && c->state != ConnState::Active &&
              c->state != ConnState::Leaving && !on_readable(c))
            continue;  // handed off
        } catch (const std::exception& e) {
          // Nothing one connection does may take the reducer down: drop it (and fail its group).
          log_error("internal error on " + c->peer + ": " + e.what());
          if (c->member && c->group)
            fail_group(c->group, proto::ErrorCode::Internal, std::string("reducer error: ") + e.what());
          kill(c, std::string("internal error: ") + e.what(), true);
        }
        flush_clears();
      }
      reap();
      for (Conn* c : lingered) close_conn(c);
      lingered.clear();
      if (index == 0) resume_listener_if_due();
      if (snap_requested.load() != snap_done.load()) refresh_snapshot();
      auto now = Clock::now();
      if (now - last_sweep > std::chrono::milliseconds(250)) {
        sweep_handshakes();
        expire_groups();
        reap();
        expire_lingering();
        refresh_snapshot();
        last_sweep = now;
      }
    }
    shutdown_all();
  }

  void shutdown_all() {
    // Tell members, then drop every connection.
    for (auto& kv : conns) {
      Conn* c = kv.second.get();
      if (c->state == ConnState::Active && !c->dead) {
        proto::FrameHeader h;
        h.type = proto::FrameType::Error;
        h.flags = uint8_t(proto::ErrorCode::Shutdown);
        const std::string msg = "reducer is shutting down";
        h.length = uint32_t(msg.size());
        std::string frame(proto::kFrameHeaderBytes, '\0');
        proto::encode(h, reinterpret_cast<uint8_t*>(&frame[0]));
        frame += msg;
        c->out.send_now(c->fd.get(), c->peer, reinterpret_cast<const uint8_t*>(frame.data()), frame.size());
      }
      if (c->member) {
        c->why = "reducer shutting down";
        c->said_bye = true;
      }
    }
    for (auto& kv : conns) {
      Conn* c = kv.second.get();
      if (c->member) leave(c);
      set_state(c, ConnState::Closing);
      srv->open_conns--;
    }
    conns.clear();
    table->clear();
    refresh_snapshot();
  }

  void drain_inbox() {
    std::vector<std::unique_ptr<Conn>> got;
    {
      std::lock_guard<std::mutex> lock(inbox_mu);
      got.swap(inbox);
    }
    for (auto& c : got) adopt(std::move(c));
  }

};

bool Loop::handoff(Conn* c) {
  size_t owner = GroupKeyHash()(c->gkey) % srv->loops.size();
  if (owner == size_t(index)) {
    join(c);
    return false;
  }
  // Move the connection to the loop that owns its group. From here on `c` is that loop's.
  if (c->registered) epoll_ctl(ep.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  c->registered = false;
  auto it = conns.find(c->fd.get());
  std::unique_ptr<Conn> moved = std::move(it->second);
  conns.erase(it);
  Loop* dst = srv->loops[owner].get();
  {
    std::lock_guard<std::mutex> lock(dst->inbox_mu);
    dst->inbox.push_back(std::move(moved));
  }
  dst->wake();
  return true;
}

void Loop::adopt(std::unique_ptr<Conn> c) {
  Conn* raw = c.get();
  conns[raw->fd.get()] = std::move(c);
  join(raw);
}

Server::Server(ServerOptions opts) : impl_(std::make_unique<Impl>()) { impl_->opts = std::move(opts); }

Server::~Server() {
  try {
    stop(0.0);
  } catch (...) {
  }
}

void Server::start() {
  Impl& s = *impl_;
  if (s.running) throw Error(ErrorKind::Config, "reducer already started");
  int threads = s.opts.threads;
  if (threads <= 0) threads = int(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  if (threads > 256) throw Error(ErrorKind::Config, "threads must be at most 256");
  if (s.opts.integrity == IntegrityMode::Auto)
    s.opts.integrity = s.opts.auth_token.empty() ? IntegrityMode::Off : IntegrityMode::On;
  if (s.opts.integrity != IntegrityMode::Off && s.opts.auth_token.empty())
    throw Error(ErrorKind::Config, std::string("frame integrity '") + integrity_mode_name(s.opts.integrity) +
                                       "' needs authentication: give the reducer a shared secret (--auth-token-file, "
                                       "RS_AUTH_TOKEN) or set integrity off");
  resolve_limits(s.opts);  // server/limits.cc
  s.budget.set_limit(s.opts.max_memory_bytes);
  s.budget.set_shares(s.opts.max_memory_per_job, s.opts.max_memory_per_peer);
  s.listener = net::listen_on(s.opts.host, s.opts.port, &s.port);
  net::set_nonblocking(s.listener.get(), true);
  s.loops.clear();
  GroupLimits gl;
  gl.slots = s.opts.group_slots;
  gl.max_group_bytes = s.opts.max_group_bytes;
  gl.max_groups_per_peer = s.opts.max_groups_per_peer;
  for (int i = 0; i < threads; ++i) {
    auto l = std::make_unique<Loop>();
    l->srv = &s;
    l->index = i;
    l->table = std::make_unique<GroupTable>(gl, &s.budget, &s.peers, &s.groups);
    l->ep.reset(epoll_create1(EPOLL_CLOEXEC));
    l->ev.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!l->ep.valid() || !l->ev.valid()) throw Error(ErrorKind::Internal, "epoll/eventfd: " + errno_text(errno));
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = l->ev.get();
    epoll_ctl(l->ep.get(), EPOLL_CTL_ADD, l->ev.get(), &e);
    s.loops.push_back(std::move(l));
  }
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = s.listener.get();
  epoll_ctl(s.loops[0]->ep.get(), EPOLL_CTL_ADD, s.listener.get(), &e);
  s.accepting = true;
  s.running = true;
  for (auto& l : s.loops) {
    Loop* lp = l.get();
    lp->thread = std::thread([lp] { lp->run(); });
  }
  log_info("reducer listening on " + s.opts.host + ":" + std::to_string(s.port) + " with " + std::to_string(threads) +
           " threads" + (s.opts.auth_token.empty() ? "" : ", authentication required") +
           (s.opts.integrity == IntegrityMode::Required ? ", frame integrity required"
            : s.opts.integrity == IntegrityMode::On    ? ", frame integrity offered"
                                                       : "") +
           "; limits: memory " +
           std::to_string(s.opts.max_memory_bytes >> 20) + " MiB (" + std::to_string(s.opts.max_memory_per_job >> 20) +
           " MiB per job, " + std::to_string(s.opts.max_memory_per_peer >> 20) + " MiB per address), " +
           std::to_string(s.opts.max_connections) +
           " connections (" + std::to_string(s.opts.max_connections_per_peer) + " per address)");
  if (s.opts.auth_token.empty() && !is_loopback(s.opts.host))
    log_warn("reducer on " + s.opts.host + ":" + std::to_string(s.port) +
             " has NO authentication: anyone who can reach this port can join any job's group, inject data into its "
             "sums and read them; set a shared secret (RS_AUTH_TOKEN or --auth-token-file) on reducers and workers, "
             "see docs/security.md");
}

bool parse_integrity_mode(const std::string& s, IntegrityMode* out) {
  if (s.empty() || s == "auto") *out = IntegrityMode::Auto;
  else if (s == "off") *out = IntegrityMode::Off;
  else if (s == "on") *out = IntegrityMode::On;
  else if (s == "required") *out = IntegrityMode::Required;
  else return false;
  return true;
}

const char* integrity_mode_name(IntegrityMode m) {
  switch (m) {
    case IntegrityMode::Off: return "off";
    case IntegrityMode::On: return "on";
    case IntegrityMode::Required: return "required";
    default: return "auto";
  }
}

uint16_t Server::port() const { return impl_->port; }

bool Server::running() const { return impl_->running.load(); }

const ServerOptions& Server::limits() const { return impl_->opts; }

void Server::stop(double drain_timeout) {
  Impl& s = *impl_;
  if (!s.running.exchange(false)) return;
  s.accepting = false;
  // No new connections from here on (epoll_ctl is thread-safe; loop 0 stops seeing the listener).
  if (!s.loops.empty()) epoll_ctl(s.loops[0]->ep.get(), EPOLL_CTL_DEL, s.listener.get(), nullptr);
  if (drain_timeout > 0) {
    auto deadline = Clock::now() + ms(drain_timeout);
    while (s.busy_slots.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (s.busy_slots.load() > 0) log_warn("stopping with rounds still in flight after the drain timeout");
  }
  for (auto& l : s.loops) {
    l->stop = true;
    l->wake();
  }
  for (auto& l : s.loops)
    if (l->thread.joinable()) l->thread.join();
  {
    std::lock_guard<std::mutex> lock(s.loops_mu);
    s.loops.clear();
  }
  s.listener.reset();
  log_info("reducer on port " + std::to_string(s.port) + " stopped");
}

void Server::drain() {
  if (!impl_->draining.exchange(true)) log_info("reducer draining: serving the groups it has, taking no new one");
}

ServerStats Server::stats() const {
  const Impl& s = *impl_;
  ServerStats st;
  st.bytes_received = s.bytes_received;
  st.bytes_sent = s.bytes_sent;
  st.rounds_completed = s.rounds_completed;
  st.chunks_reduced = s.chunks_reduced;
  st.connections = s.connections;
  st.connected_workers = s.workers;
  st.groups = s.groups;
  st.handshakes = s.handshakes;
  st.waiting = s.waiting;
  st.errors = s.errors;
  st.rejected = s.rejected;
  st.refused_over_limit = s.over_limit;
  st.memory_bytes = s.budget.used();
  st.chunks_in_flight = uint64_t(std::max<int64_t>(0, s.busy_slots.load()));
  st.draining = s.draining.load();
  for (const auto& c : s.latency_counts) st.round_latency_counts.push_back(c.load());
  st.round_latency_sum = double(s.latency_sum_us.load()) / 1e6;
  return st;
}

std::vector<GroupStat> Server::group_stats() const {
  std::vector<GroupStat> out;
  std::lock_guard<std::mutex> lock(impl_->loops_mu);
  if (!impl_->running.load()) return out;
  for (const auto& l : impl_->loops) l->fresh_snapshot(&out, std::chrono::milliseconds(500));
  return out;
}

}  // namespace rs::server
