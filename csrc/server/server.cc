// Event loops and connections of the reducer (see server.h, docs/protocol.md).
//
// Threads: `threads` epoll loops. Loop 0 owns the listening socket and runs every
// handshake; a validated connection is handed to the loop that owns its group
// (hash of job, group, stream), so all state of a group is touched by one thread
// and needs no locks. The stream index is part of the key: a worker's several
// streams to one reducer spread over loops.
#include "server/server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "net/socket.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"
#include "server/group.h"

namespace rs::server {

using net::Clock;

namespace {

// One frame (or control message) waiting to be written to a connection.
struct OutItem {
  uint8_t hdr[proto::kFrameHeaderBytes];
  size_t hdr_len = 0;
  const uint8_t* payload = nullptr;  // result data (points into a group slot)
  size_t payload_len = 0;
  size_t sent = 0;
  Slot* slot = nullptr;              // released when every member got its copy
  std::string ctl;                   // control bytes (handshake replies, errors): rare, not the hot path
};

// Fixed-capacity FIFO reused for the life of the connection: results are queued
// per chunk without touching the heap (it grows only if control messages pile up).
class OutQueue {
 public:
  explicit OutQueue(size_t cap = 16) : items_(cap) {}
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  OutItem& front() { return items_[head_]; }
  OutItem& push() {
    if (count_ == items_.size()) grow();
    OutItem& it = items_[(head_ + count_) % items_.size()];
    it.hdr_len = 0;
    it.payload = nullptr;
    it.payload_len = 0;
    it.sent = 0;
    it.slot = nullptr;
    it.ctl.clear();
    ++count_;
    return it;
  }
  void pop() {
    head_ = (head_ + 1) % items_.size();
    --count_;
  }
 private:
  void grow() {
    std::vector<OutItem> bigger(items_.size() * 2);
    for (size_t i = 0; i < count_; ++i) bigger[i] = std::move(items_[(head_ + i) % items_.size()]);
    items_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<OutItem> items_;
  size_t head_ = 0, count_ = 0;
};

enum class State { Hello, Names, Waiting, Active };

}  // namespace

struct Loop;

struct Conn {
  net::Fd fd;
  std::string peer;
  State state = State::Hello;
  Clock::time_point deadline;
  uint32_t epoll_mask = 0;
  bool registered = false;
  // handshake
  std::array<uint8_t, proto::kNonceBytes> nonce{};
  uint8_t fixed[proto::kHelloFixedBytes];
  size_t got = 0;
  size_t job_len = 0, group_len = 0;
  std::string names;
  proto::Hello hello;
  GroupKey key;
  // membership
  std::shared_ptr<Group> group;
  uint32_t rank = 0;
  bool member = false;    // counted in group->members
  // data frames
  uint8_t hdr[proto::kFrameHeaderBytes];
  size_t hdr_got = 0;
  bool have_hdr = false;
  bool paused = false;    // header read, waiting for its slot to free
  proto::FrameHeader cur;
  Slot* cur_slot = nullptr;
  uint8_t* dst = nullptr;
  size_t dst_got = 0;
  int64_t seq_next = 0;
  uint64_t last_round = 0;
  bool said_bye = false;
  // lifecycle
  OutQueue out;
  bool close_after_flush = false;
  bool dead = false;
  bool counted = false;   // in stats.connections
  std::string why;
};

struct Server::Impl {
  ServerOptions opts;
  std::vector<std::unique_ptr<Loop>> loops;
  net::Fd listener;
  uint16_t port = 0;
  std::atomic<bool> running{false};
  std::atomic<bool> accepting{false};
  // stats
  std::atomic<uint64_t> bytes_received{0}, bytes_sent{0}, rounds_completed{0}, chunks_reduced{0};
  std::atomic<uint64_t> connections{0}, workers{0}, groups{0}, errors{0}, rejected{0}, memory{0};
  std::atomic<int64_t> busy_slots{0};
};

struct Loop {
  Server::Impl* srv = nullptr;
  int index = 0;
  net::Fd ep;
  net::Fd ev;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::unordered_map<GroupKey, std::shared_ptr<Group>, GroupKeyHash> groups;
  std::vector<Conn*> dying;
  std::mutex inbox_mu;
  std::vector<std::unique_ptr<Conn>> inbox;

  void wake() {
    uint64_t one = 1;
    ssize_t r = ::write(ev.get(), &one, sizeof one);
    (void)r;
  }

  // ---- epoll plumbing ----------------------------------------------------------
  void update_mask(Conn* c) {
    if (c->dead) return;
    uint32_t want = EPOLLRDHUP;
    bool reading = !c->paused && !c->close_after_flush;
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

  void kill(Conn* c, const std::string& why, bool is_error) {
    if (c->dead) return;
    c->dead = true;
    c->why = why;
    if (is_error) srv->errors++;
    dying.push_back(c);
  }

  // ---- output --------------------------------------------------------------------
  void send_ctl(Conn* c, std::string bytes) {
    OutItem& it = c->out.push();
    it.ctl = std::move(bytes);
    flush(c);
  }

  void send_error(Conn* c, proto::ErrorCode code, const std::string& msg) {
    std::string text = msg.substr(0, proto::kMaxMessageBytes);
    proto::FrameHeader h;
    h.type = proto::FrameType::Error;
    h.flags = uint8_t(code);
    h.length = uint32_t(text.size());
    std::string bytes(proto::kFrameHeaderBytes, '\0');
    proto::encode(h, reinterpret_cast<uint8_t*>(&bytes[0]));
    bytes += text;
    // Results already queued are complete and correct: they go out before the error.
    c->close_after_flush = true;
    send_ctl(c, std::move(bytes));
  }

  void flush(Conn* c) {
    if (c->dead) return;
    try {
      while (!c->out.empty()) {
        OutItem& it = c->out.front();
        iovec iov[2];
        int n = 0;
        size_t total;
        if (!it.ctl.empty()) {
          total = it.ctl.size();
          iov[n++] = {const_cast<char*>(it.ctl.data()) + it.sent, total - it.sent};
        } else {
          total = it.hdr_len + it.payload_len;
          if (it.sent < it.hdr_len) iov[n++] = {it.hdr + it.sent, it.hdr_len - it.sent};
          size_t poff = it.sent > it.hdr_len ? it.sent - it.hdr_len : 0;
          if (it.payload_len > poff) iov[n++] = {const_cast<uint8_t*>(it.payload) + poff, it.payload_len - poff};
        }
        ssize_t w = net::send_some(c->fd.get(), iov, n, c->peer);
        if (w < 0) break;
        srv->bytes_sent += uint64_t(w);
        it.sent += size_t(w);
        if (it.sent < total) continue;
        Slot* slot = it.slot;
        c->out.pop();
        if (slot) result_delivered(c, slot);
        if (c->dead) return;
      }
    } catch (const Error& e) {
      kill(c, e.what(), true);
      return;
    }
    if (c->out.empty() && c->close_after_flush) {
      kill(c, c->why.empty() ? "closed after error" : c->why, false);
      return;
    }
    update_mask(c);
  }

  // ---- accept and handshake ------------------------------------------------------------
  void accept_all() {
    for (;;) {
      int fd = ::accept4(srv->listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) log_warn("accept failed: " + errno_text(errno));
        return;
      }
      auto c = std::make_unique<Conn>();
      c->fd.reset(fd);
      c->peer = net::peer_name(fd);
      net::tune_socket(fd, srv->opts.socket_buffer);
      c->deadline = Clock::now() + std::chrono::milliseconds(int64_t(srv->opts.handshake_timeout * 1000));
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

  void reject(Conn* c, proto::Status status, const std::string& msg) {
    srv->rejected++;
    log_warn("rejected " + c->peer + ": " + msg);
    c->close_after_flush = true;
    c->why = msg;
    send_ctl(c, proto::encode_reply(status, msg));
  }

  // Returns false if the connection cannot read more now.
  bool read_handshake(Conn* c) {
    if (c->state == State::Hello) {
      ssize_t n = net::recv_some(c->fd.get(), c->fixed + c->got, proto::kHelloFixedBytes - c->got, c->peer);
      if (n < 0) return false;
      c->got += size_t(n);
      if (c->got < proto::kHelloFixedBytes) return true;
      std::string err = proto::decode_fixed(c->fixed, &c->hello, &c->job_len, &c->group_len);
      if (proto::get_u32(c->fixed) != proto::kMagic) {
        srv->rejected++;
        kill(c, "garbage from " + c->peer + " (no reduction-server hello): connection closed", true);
        log_warn(c->why);
        return false;
      }
      if (c->hello.version != proto::kVersion) {
        reject(c, proto::Status::BadVersion,
               "protocol version mismatch: reducer speaks version " + std::to_string(proto::kVersion) +
                   ", worker sent version " + std::to_string(c->hello.version));
        return false;
      }
      if (!err.empty()) {
        reject(c, proto::Status::BadHello, "bad hello from " + c->peer + ": " + err);
        return false;
      }
      c->state = State::Names;
      c->got = 0;
      c->names.assign(c->job_len + c->group_len, '\0');
    }
    if (c->state == State::Names) {
      if (c->got < c->names.size()) {
        ssize_t n = net::recv_some(c->fd.get(), &c->names[c->got], c->names.size() - c->got, c->peer);
        if (n < 0) return false;
        c->got += size_t(n);
        if (c->got < c->names.size()) return true;
      }
      c->hello.job_id = c->names.substr(0, c->job_len);
      c->hello.group = c->names.substr(c->job_len);
      if (!srv->opts.auth_token.empty()) {
        proto::Digest want = proto::hmac_sha256(srv->opts.auth_token, proto::mac_input(c->hello, c->nonce));
        proto::Digest got;
        std::copy(c->hello.mac.begin(), c->hello.mac.end(), got.begin());
        if (!proto::digest_equal(want, got)) {
          reject(c, proto::Status::AuthFailed,
                 "authentication failed for " + c->peer +
                     ": the worker's token does not match the reducer's (set the same RS_AUTH_TOKEN on both)");
          return false;
        }
      }
      c->key = GroupKey{c->hello.job_id, c->hello.group, c->hello.stream_index};
      c->rank = c->hello.rank;
      c->state = State::Waiting;
      handoff(c);
      return false;
    }
    return false;
  }

  void handoff(Conn* c);        // defined after Server::Impl has its loops
  void adopt(std::unique_ptr<Conn> c);

  // ---- groups -------------------------------------------------------------------------
  void join(Conn* c) {
    const proto::Hello& h = c->hello;
    auto it = groups.find(c->key);
    std::shared_ptr<Group> g;
    if (it == groups.end()) {
      const uint64_t need = uint64_t(srv->opts.window) * (uint64_t(h.world_size) + 2) * h.chunk_bytes;
      if (need > srv->opts.max_group_bytes) {
        reject(c, proto::Status::GroupConflict,
               "group " + c->key.label() + " would need " + std::to_string(need >> 20) + " MiB of reduction buffers " +
                   "(window x (world size + 2) x chunk size); this reducer allows " +
                   std::to_string(srv->opts.max_group_bytes >> 20) + " MiB per group stream: use a smaller chunk size");
        return;
      }
      g = std::make_shared<Group>(c->key, h.world_size, h.chunk_bytes, h.num_streams, srv->opts.window);
      groups.emplace(c->key, g);
      if (c->key.stream == 0) srv->groups++;
      log_info("group " + c->key.label() + " created by " + c->peer + " (world size " + std::to_string(h.world_size) +
               ", " + std::to_string(h.num_streams) + " streams, chunk " + std::to_string(h.chunk_bytes) + " bytes)");
    } else {
      g = it->second;
      std::string conflict;
      if (g->world != h.world_size)
        conflict = "world size " + std::to_string(h.world_size) + " differs from the group's " + std::to_string(g->world);
      else if (g->num_streams != h.num_streams)
        conflict = "streams " + std::to_string(h.num_streams) + " differ from the group's " + std::to_string(g->num_streams);
      else if (g->chunk != h.chunk_bytes)
        conflict = "chunk size " + std::to_string(h.chunk_bytes) + " differs from the group's " + std::to_string(g->chunk);
      if (!conflict.empty()) {
        reject(c, proto::Status::GroupConflict, "group " + c->key.label() + ": rank " + std::to_string(c->rank) + " from " +
                                                    c->peer + ": " + conflict);
        return;
      }
      if (g->members_[c->rank]) {
        reject(c, proto::Status::RankTaken, "group " + c->key.label() + ": rank " + std::to_string(c->rank) +
                                                " is already connected from " + g->members_[c->rank]->peer);
        return;
      }
    }
    c->group = g;
    g->members_[c->rank] = c;
    g->joined_++;
    c->member = true;
    log_info("worker " + c->peer + " joined group " + c->key.label() + " as rank " + std::to_string(c->rank) + " (" +
             std::to_string(g->joined_) + "/" + std::to_string(g->world) + ")");
    update_mask(c);
    if (g->joined_ == g->world) {
      size_t bytes = g->allocate();
      srv->memory += bytes;
      g->complete_ = true;
      for (Conn* m : g->members_) {
        m->state = State::Active;
        srv->connections++;
        if (m->key.stream == 0) srv->workers++;
        m->counted = true;
        send_ctl(m, proto::encode_reply(proto::Status::Ok, "welcome"));
      }
    }
  }

  // Fails a group: every remaining member gets an error frame and is closed.
  void fail_group(const std::shared_ptr<Group>& g, proto::ErrorCode code, const std::string& msg) {
    if (g->failed_) return;
    g->failed_ = true;
    log_warn("group " + g->key.label() + " failed: " + msg);
    detach_group(g);
    for (Conn* m : g->members_) {
      if (!m || m->dead) continue;
      send_error(m, code, msg);
    }
  }

  // Removes a group from the table so that a reconnecting group starts afresh.
  void detach_group(const std::shared_ptr<Group>& g) {
    auto it = groups.find(g->key);
    if (it != groups.end() && it->second == g) {
      groups.erase(it);
      if (g->key.stream == 0) srv->groups--;
    }
  }

  void leave(Conn* c) {
    if (!c->member) return;
    std::shared_ptr<Group> g = c->group;
    c->member = false;
    g->members_[c->rank] = nullptr;
    g->joined_--;
    if (c->counted) {
      srv->connections--;
      if (c->key.stream == 0) srv->workers--;
      c->counted = false;
    }
    if (!g->failed_) {
      if (!g->complete_) {
        // Still gathering: the rank is simply free again.
        if (g->joined_ == 0) detach_group(g);
      } else {
        // Mid-round: a chunk still waits for contributions (results merely being sent do not count).
        bool busy = false;
        for (Slot& s : g->slots()) busy |= s.seq >= 0 && s.next_rank < g->world;
        if (c->said_bye && !busy) {
          log_info("rank " + std::to_string(c->rank) + " (" + c->peer + ") left group " + g->key.label());
          g->left_ = "rank " + std::to_string(c->rank) + " (" + c->peer + ") has left the group";
          detach_group(g);
        } else {
          fail_group(g, proto::ErrorCode::PeerLost,
                     "rank " + std::to_string(c->rank) + " (" + c->peer + ") " +
                         (busy ? "disconnected in the middle of a round" : "disconnected") + ": " + c->why);
        }
      }
    }
    if (g->joined_ == 0) {
      // Last member gone: account the buffers (the memory itself goes with the last reference).
      srv->memory -= g->memory_bytes();
      for (Slot& s : g->slots())
        if (s.seq >= 0) {
          srv->busy_slots--;
          s.seq = -1;
        }
    }
  }

  // ---- data path ------------------------------------------------------------------------
  bool try_claim(Conn* c) {
    Group& g = *c->group;
    Slot& s = g.slot_for(c->seq_next);
    if (s.seq == -1) {
      s.seq = c->seq_next;
      s.params = c->cur;
      s.first_rank = c->rank;
      srv->busy_slots++;
    } else if (s.seq == c->seq_next) {
      std::string diff = Group::mismatch(s.params, s.first_rank, c->cur, c->rank, g.key.stream);
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
    c->dst = g.contribution(s, c->rank);
    c->dst_got = 0;
    return true;
  }

  void on_header(Conn* c) {
    std::string err = proto::decode(c->hdr, &c->cur, c->group->chunk);
    c->hdr_got = 0;
    if (err.empty() && c->cur.type == proto::FrameType::Bye) {
      c->said_bye = true;
      return;
    }
    if (err.empty() && c->cur.type != proto::FrameType::Data) err = "unexpected frame type from a worker";
    if (err.empty() && c->cur.round < c->last_round) err = "round number went backwards";
    if (!err.empty()) {
      const std::string who = "rank " + std::to_string(c->rank) + " (" + c->peer + ") of group " + c->key.label();
      log_warn("protocol error from " + who + ": " + err);
      srv->errors++;
      c->why = "protocol error: " + err;
      fail_group(c->group, proto::ErrorCode::Protocol, "protocol error from " + who + ": " + err);
      return;
    }
    if (!c->group->left_.empty()) {
      fail_group(c->group, proto::ErrorCode::PeerLost, c->group->left_);
      return;
    }
    c->have_hdr = true;
    try_claim(c);
  }

  void on_payload(Conn* c) {
    Slot& s = *c->cur_slot;
    Group& g = *c->group;
    s.arrived[c->rank] = 1;
    c->seq_next++;
    c->last_round = c->cur.round;
    c->have_hdr = false;
    c->cur_slot = nullptr;
    if (!g.advance(s)) return;
    srv->chunks_reduced++;
    proto::FrameHeader h = s.params;
    h.type = proto::FrameType::Result;
    s.pending_sends = g.world;
    std::shared_ptr<Group> keep = c->group;
    for (Conn* m : g.members_) {
      OutItem& it = m->out.push();
      proto::encode(h, it.hdr);
      it.hdr_len = proto::kFrameHeaderBytes;
      it.payload = s.data;
      it.payload_len = h.length;
      it.slot = &s;
    }
    for (Conn* m : keep->members_)
      if (m) flush(m);
  }

  void result_delivered(Conn* c, Slot* s) {
    std::shared_ptr<Group> g = c->group;
    if (g->failed_ || --s->pending_sends > 0) return;
    if ((s->params.flags & proto::kLastInStream) && g->key.stream == 0) srv->rounds_completed++;
    g->release(*s);
    srv->busy_slots--;
    for (Conn* m : g->members_)
      if (m && m->paused && !m->dead) {
        if (try_claim(m)) update_mask(m);
      }
  }

  void read_data(Conn* c) {
    size_t budget = 8u << 20;  // bytes per wakeup, for fairness between connections
    while (budget > 0 && !c->dead && !c->paused && !c->close_after_flush) {
      if (!c->have_hdr) {
        ssize_t n = net::recv_some(c->fd.get(), c->hdr + c->hdr_got, proto::kFrameHeaderBytes - c->hdr_got, c->peer);
        if (n < 0) return;
        srv->bytes_received += uint64_t(n);
        c->hdr_got += size_t(n);
        if (c->hdr_got == proto::kFrameHeaderBytes) on_header(c);
        continue;
      }
      size_t want = c->cur.length - c->dst_got;
      ssize_t n = net::recv_some(c->fd.get(), c->dst + c->dst_got, want, c->peer);
      if (n < 0) return;
      srv->bytes_received += uint64_t(n);
      c->dst_got += size_t(n);
      budget -= std::min(budget, size_t(n));
      if (c->dst_got == c->cur.length) on_payload(c);
    }
  }

  void on_readable(Conn* c) {
    try {
      if (c->state == State::Hello || c->state == State::Names) {
        while (!c->dead && (c->state == State::Hello || c->state == State::Names) && read_handshake(c)) {
        }
        return;
      }
      if (c->state == State::Waiting) {
        uint8_t b;
        ssize_t n = net::recv_some(c->fd.get(), &b, 1, c->peer);
        if (n > 0) {
          kill(c, "protocol error from " + c->peer + ": data before the group was complete", true);
          log_warn(c->why);
        }
        return;
      }
      read_data(c);
    } catch (const Error& e) {
      bool error = !(c->said_bye || c->close_after_flush);
      kill(c, e.what(), error);
    }
  }

  void reap() {
    while (!dying.empty()) {
      std::vector<Conn*> batch;
      batch.swap(dying);
      for (Conn* c : batch) {
        if (c->member) {
          if (c->state == State::Active && !c->said_bye && !c->close_after_flush)
            log_warn("lost " + c->peer + " (rank " + std::to_string(c->rank) + " of " + c->key.label() + "): " + c->why);
          else
            log_debug("closed " + c->peer + ": " + c->why);
          leave(c);
        } else if (!c->close_after_flush) {
          log_debug("closed " + c->peer + ": " + c->why);
        }
      }
      for (Conn* c : batch) {
        if (c->registered) epoll_ctl(ep.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
        conns.erase(c->fd.get());
      }
    }
  }

  void sweep_handshakes() {
    auto now = Clock::now();
    for (auto& kv : conns) {
      Conn* c = kv.second.get();
      if ((c->state == State::Hello || c->state == State::Names) && !c->dead && now > c->deadline) {
        srv->rejected++;
        kill(c, "handshake timeout from " + c->peer, true);
        log_warn(c->why);
      }
    }
  }

  void run() {
    constexpr int kMaxEvents = 128;
    epoll_event events[kMaxEvents];
    auto last_sweep = Clock::now();
    while (!stop.load()) {
      int n = epoll_wait(ep.get(), events, kMaxEvents, 200);
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
        if (srv->listener.valid() && fd == srv->listener.get() && index == 0) {
          if (srv->accepting.load()) accept_all();
          continue;
        }
        auto it = conns.find(fd);
        if (it == conns.end()) continue;
        Conn* c = it->second.get();
        if (c->dead) continue;
        try {
          if (ev_mask & EPOLLOUT) flush(c);
          if (!c->dead && (ev_mask & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(c);
          if (!c->dead && (ev_mask & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && (c->paused || c->close_after_flush))
            kill(c, c->close_after_flush ? c->why : "peer closed the connection while its chunk was waiting",
                 !c->close_after_flush);
          if (!c->dead && (ev_mask & (EPOLLIN | EPOLLRDHUP)) == EPOLLRDHUP && !c->paused && c->state != State::Active)
            on_readable(c);
        } catch (const std::exception& e) {
          // Nothing one connection does may take the reducer down: drop it (and fail its group).
          log_error("internal error on " + c->peer + ": " + e.what());
          if (c->member && c->group) fail_group(c->group, proto::ErrorCode::Internal, std::string("reducer error: ") + e.what());
          kill(c, std::string("internal error: ") + e.what(), true);
        }
      }
      reap();
      auto now = Clock::now();
      if (now - last_sweep > std::chrono::milliseconds(250)) {
        sweep_handshakes();
        reap();
        last_sweep = now;
      }
    }
    // Shutting down: tell members, then drop every connection.
    for (auto& kv : conns) {
      Conn* c = kv.second.get();
      if (c->state == State::Active && !c->dead) {
        proto::FrameHeader h;
        h.type = proto::FrameType::Error;
        h.flags = uint8_t(proto::ErrorCode::Shutdown);
        const std::string msg = "reducer is shutting down";
        h.length = uint32_t(msg.size());
        uint8_t hb[proto::kFrameHeaderBytes];
        proto::encode(h, hb);
        if (c->out.empty() || c->out.front().sent == 0) {
          ::send(c->fd.get(), hb, sizeof hb, MSG_NOSIGNAL | MSG_DONTWAIT);
          ::send(c->fd.get(), msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      }
      if (c->member) {
        c->why = "reducer shutting down";
        c->said_bye = true;
      }
    }
    for (auto& kv : conns)
      if (kv.second->member) leave(kv.second.get());
    conns.clear();
    groups.clear();
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

void Loop::handoff(Conn* c) {
  size_t owner = GroupKeyHash()(c->key) % srv->loops.size();
  if (owner == size_t(index)) {
    join(c);
    return;
  }
  // Move the connection to the loop that owns its group.
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
  if (s.opts.window < 1 || s.opts.window > 64) throw Error(ErrorKind::Config, "window must be in 1..64");
  s.listener = net::listen_on(s.opts.host, s.opts.port, &s.port);
  net::set_nonblocking(s.listener.get(), true);
  s.loops.clear();
  for (int i = 0; i < threads; ++i) {
    auto l = std::make_unique<Loop>();
    l->srv = &s;
    l->index = i;
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
           " threads" + (s.opts.auth_token.empty() ? "" : ", authentication required"));
}

uint16_t Server::port() const { return impl_->port; }

bool Server::running() const { return impl_->running.load(); }

void Server::stop(double drain_timeout) {
  Impl& s = *impl_;
  if (!s.running.exchange(false)) return;
  s.accepting = false;
  // No new connections from here on (epoll_ctl is thread-safe; loop 0 stops seeing the listener).
  if (!s.loops.empty()) epoll_ctl(s.loops[0]->ep.get(), EPOLL_CTL_DEL, s.listener.get(), nullptr);
  if (drain_timeout > 0) {
    auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(drain_timeout * 1000));
    while (s.busy_slots.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (s.busy_slots.load() > 0) log_warn("stopping with rounds still in flight after the drain timeout");
  }
  for (auto& l : s.loops) {
    l->stop = true;
    l->wake();
  }
  for (auto& l : s.loops)
    if (l->thread.joinable()) l->thread.join();
  s.loops.clear();
  s.listener.reset();
  log_info("reducer on port " + std::to_string(s.port) + " stopped");
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
  st.errors = s.errors;
  st.rejected = s.rejected;
  st.memory_bytes = s.memory;
  return st;
}

}  // namespace rs::server
