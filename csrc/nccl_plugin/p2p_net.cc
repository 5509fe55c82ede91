#include "nccl_plugin/p2p_net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/error.h"
#include "nccl_plugin/nccl_abi.h"
#include "nccl_plugin/p2p_listen.h"
#include "nccl_plugin/plugin_log.h"
#include "net/socket.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"

namespace rs::nccl::p2p {

using proto::get_u16;
using proto::get_u32;
using proto::get_u64;
using proto::put_u16;
using proto::put_u32;
using proto::put_u64;

namespace {

// ---- the listen handle (NCCL_NET_HANDLE_MAXSIZE bytes, little-endian) ----------------------
// [0,4) magic  [4,6) version  [6,8) family  [8,10) port  [10,12) sockets  [16,24) nonce
// [24,40) address bytes  [64,72) connector-side state (a pointer; zero as sent by listen)
constexpr uint32_t kHandleMagic = 0x4c4e5352u;  // "RSNL"
constexpr uint16_t kVersion = 1;
constexpr size_t kStateOffset = 64;
static_assert(kStateOffset + sizeof(void*) <= NCCL_NET_HANDLE_MAXSIZE, "handle layout");

// The hello each connecting socket sends: p2p_listen.h.

// ---- per-message header on socket 0 (16 bytes): [0,4) magic [8,16) size --------------------
constexpr uint32_t kMsgMagic = 0x4d4e5352u;  // "RSNM"
constexpr size_t kMsgHeaderBytes = 16;

constexpr int kSlots = NCCL_NET_MAX_REQUESTS;
enum SlotState : int { kFree = 0, kPosted = 1, kDone = 2, kError = 3 };

NetInterface g_if;
std::once_flag g_if_once;

uint64_t random_u64() {
  uint8_t b[8];
  proto::random_bytes(b, sizeof b);
  return get_u64(b);
}

class Comm;

struct Request {
  static constexpr uint32_t kMagic = 0x51524e52u;  // "RNRQ"
  uint32_t magic = kMagic;
  Comm* comm = nullptr;
  std::atomic<int> state{kFree};
  uint8_t* data = nullptr;
  uint64_t size = 0;  // send: message size; receive: buffer capacity
  // Progress-thread private:
  // Set by post() (send) or by socket 0's thread (receive: from the header), then size_known is
  // released; the other sockets' threads read `actual` only after acquiring size_known.
  uint64_t actual = 0;
  std::atomic<bool> size_known{false};
  std::atomic<int> parts_left{0};  // sockets still moving their part; the last one completes it
};

// A connected send or receive comm: its sockets, request ring and progress threads (NCCL's
// socket net model: socket s is moved by thread s % nthreads, each thread polls its own sockets).
class Comm {
 public:
  static constexpr uint32_t kMagic = 0x4d434e52u;  // "RNCM"

  Comm(std::vector<net::Fd> socks, bool sender, std::string peer, int nthreads)
      : socks_(std::move(socks)), sender_(sender), peer_(std::move(peer)) {
    const size_t nt = std::clamp<size_t>(size_t(std::max(nthreads, 1)), 1, socks_.size());
    for (size_t t = 0; t < nt; ++t) {
      wake_.emplace_back(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
      if (!wake_.back().valid()) throw Error(ErrorKind::Internal, "eventfd: " + errno_text(errno));
    }
    for (auto& s : socks_) {
      net::set_nonblocking(s.get(), true);
      net::tune_socket(s.get(), 0);
    }
    for (auto& r : slots_) r.comm = this;
    cursor_.assign(socks_.size(), 0);
    off_.assign(socks_.size(), 0);
    try {
      for (size_t t = 0; t < nt; ++t) threads_.emplace_back([this, t] { run(t); });
    } catch (...) {
      stop_threads();
      throw;
    }
  }

  ~Comm() {
    magic_ = 0;
    stop_threads();
  }

  bool valid() const { return magic_ == kMagic; }

  Request* post(uint8_t* data, uint64_t size) {
    if (failed_.load(std::memory_order_acquire)) throw Error(ErrorKind::PeerLost, error());
    Request& r = slots_[next_ % kSlots];
    if (r.state.load(std::memory_order_acquire) != kFree) return nullptr;  // ring full: NCCL retries
    r.data = data;
    r.size = size;
    r.actual = sender_ ? size : 0;
    r.size_known.store(sender_, std::memory_order_relaxed);
    r.parts_left.store(int(socks_.size()), std::memory_order_relaxed);
    r.state.store(kPosted, std::memory_order_relaxed);
    ++next_;
    posted_.store(next_, std::memory_order_release);
    wake();
    return &r;
  }

  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  bool sender() const { return sender_; }
  bool failed() const { return failed_.load(std::memory_order_acquire); }

 private:
  void stop_threads() {
    stop_.store(true);
    wake();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  void wake() {
    uint64_t one = 1;
    for (auto& w : wake_) {
      ssize_t rc = ::write(w.get(), &one, sizeof one);
      (void)rc;  // EAGAIN means a wake-up is already pending
    }
  }

  void run(size_t t) {
    try {
      loop(t);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.empty())
          error_ = std::string(sender_ ? "send to " : "receive from ") + peer_ + " failed: " + e.what();
      }
      failed_.store(true, std::memory_order_release);
      // Every request NCCL posted and did not see finish fails now (test() reports it).
      for (auto& r : slots_) {
        int expected = kPosted;
        r.state.compare_exchange_strong(expected, kError, std::memory_order_acq_rel);
      }
      // Requests posted after this point fail in post().
    }
  }

  // Moves bytes of socket s until it would block or has nothing to do; true if it progressed.
  bool pump(size_t s, uint64_t posted, bool* blocked) {
    bool progressed = false;
    *blocked = false;
    const int n = int(socks_.size());
    while (cursor_[s] < posted) {
      Request& r = slots_[cursor_[s] % kSlots];
      if (!r.size_known.load(std::memory_order_acquire)) {
        if (s != 0) return progressed;  // socket 0 has not read this message's header yet (it wakes us)
        // Receiver, socket 0: read the header first.
        ssize_t got = net::recv_some(socks_[0].get(), hdr_in_ + off_[0], kMsgHeaderBytes - off_[0], peer_);
        if (got < 0) {
          *blocked = true;
          return progressed;
        }
        progressed = true;
        off_[0] += size_t(got);
        if (off_[0] < kMsgHeaderBytes) continue;
        if (get_u32(hdr_in_) != kMsgMagic)
          throw Error(ErrorKind::Protocol, "stream out of step (bad message header) from " + peer_);
        uint64_t size = get_u64(hdr_in_ + 8);
        if (size > r.size)
          throw Error(ErrorKind::Protocol, "message of " + std::to_string(size) + " bytes from " + peer_ +
                                               " is larger than the posted receive buffer of " +
                                               std::to_string(r.size) + " bytes");
        r.actual = size;
        r.size_known.store(true, std::memory_order_release);
        off_[0] = 0;
        if (wake_.size() > 1) wake();  // the other threads wait for this size
      }
      uint64_t soff = 0, slen = 0;
      stripe(r.actual, n, int(s), &soff, &slen);
      // On socket 0 the sender's part starts with the header.
      const size_t hdr = (s == 0 && sender_) ? kMsgHeaderBytes : 0;
      if (s == 0 && sender_ && off_[0] == 0) {
        put_u32(hdr_out_, kMsgMagic);
        put_u32(hdr_out_ + 4, 0);
        put_u64(hdr_out_ + 8, r.actual);
      }
      const uint64_t total = hdr + slen;
      while (off_[s] < total) {
        ssize_t moved;
        if (sender_) {
          iovec iov[2];
          int k = 0;
          if (off_[s] < hdr) iov[k++] = {hdr_out_ + off_[s], hdr - size_t(off_[s])};
          uint64_t done_data = off_[s] > hdr ? off_[s] - hdr : 0;
          if (slen > done_data) iov[k++] = {r.data + soff + done_data, size_t(slen - done_data)};
          moved = net::send_some(socks_[s].get(), iov, k, peer_);
        } else {
          moved = net::recv_some(socks_[s].get(), r.data + soff + off_[s], size_t(slen - off_[s]), peer_);
        }
        if (moved < 0) {
          *blocked = true;
          return progressed;
        }
        progressed = true;
        off_[s] += uint64_t(moved);
      }
      off_[s] = 0;
      ++cursor_[s];
      if (r.parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        int expected = kPosted;  // not if a failing thread already marked it kError
        r.state.compare_exchange_strong(expected, kDone, std::memory_order_acq_rel);
      }
      progressed = true;
    }
    return progressed;
  }

  // Thread t's loop over its sockets t, t + nthreads, ...
  void loop(size_t t) {
    std::vector<size_t> mine;
    for (size_t s = t; s < socks_.size(); s += wake_.size()) mine.push_back(s);
    std::vector<pollfd> pfds(mine.size() + 1);
    std::vector<bool> blocked(mine.size(), false);
    for (;;) {
      if (stop_.load(std::memory_order_acquire)) return;
      const uint64_t posted = posted_.load(std::memory_order_acquire);
      bool progressed = true;
      while (progressed) {
        progressed = false;
        for (size_t i = 0; i < mine.size(); ++i) {
          bool b = false;
          progressed |= pump(mine[i], posted, &b);
          blocked[i] = b;
        }
      }
      pfds[0] = {wake_[t].get(), POLLIN, 0};
      for (size_t i = 0; i < mine.size(); ++i) {
        // Only sockets waiting for the kernel are polled (an idle socket that the peer closed
        // would report POLLHUP forever); its failure shows when work for it is posted.
        pfds[i + 1] = {blocked[i] ? socks_[mine[i]].get() : -1, short(sender_ ? POLLOUT : POLLIN), 0};
      }
      int pr = ::poll(pfds.data(), pfds.size(), -1);
      if (pr < 0 && errno != EINTR) throw Error(ErrorKind::Internal, "poll: " + errno_text(errno));
      if (pr > 0 && (pfds[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t rc = ::read(wake_[t].get(), &v, sizeof v);
        (void)rc;
      }
    }
  }

  uint32_t magic_ = kMagic;
  std::vector<net::Fd> socks_;
  const bool sender_;
  const std::string peer_;
  std::vector<net::Fd> wake_;  // one eventfd per progress thread
  std::array<Request, kSlots> slots_;
  uint64_t next_ = 0;                // NCCL-thread side: requests posted so far
  std::atomic<uint64_t> posted_{0};  // published to the progress thread
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::string error_;
  // Per socket, touched only by the socket's thread (socket 0's thread owns the headers):
  std::vector<uint64_t> cursor_, off_;
  uint8_t hdr_out_[kMsgHeaderBytes];
  uint8_t hdr_in_[kMsgHeaderBytes];
  std::vector<std::thread> threads_;
};

// ---- connection set-up ----------------------------------------------------------------------

struct HandleInfo {
  uint16_t family = 0, port = 0, nsocks = 0;
  uint64_t nonce = 0;
  uint8_t addr[16] = {};

  sockaddr_storage sockaddr_of(socklen_t* len) const {
    sockaddr_storage ss{};
    if (family == AF_INET) {
      auto* s = reinterpret_cast<sockaddr_in*>(&ss);
      s->sin_family = AF_INET;
      s->sin_port = htons(port);
      std::memcpy(&s->sin_addr, addr, 4);
      *len = sizeof(sockaddr_in);
    } else {
      auto* s = reinterpret_cast<sockaddr_in6*>(&ss);
      s->sin6_family = AF_INET6;
      s->sin6_port = htons(port);
      std::memcpy(&s->sin6_addr, addr, 16);
      *len = sizeof(sockaddr_in6);
    }
    return ss;
  }
  std::string str() const {
    char host[INET6_ADDRSTRLEN] = "?";
    inet_ntop(family, addr, host, sizeof host);
    return family == AF_INET6 ? "[" + std::string(host) + "]:" + std::to_string(port)
                              : std::string(host) + ":" + std::to_string(port);
  }
};

HandleInfo decode_handle(const uint8_t* h) {
  if (get_u32(h) != kHandleMagic)
    throw Error(ErrorKind::Protocol, "connect: the handle is not from this plugin's listen() (bad magic)");
  if (get_u16(h + 4) != kVersion)
    throw Error(ErrorKind::Protocol, "connect: handle version " + std::to_string(get_u16(h + 4)) + ", expected " +
                                         std::to_string(kVersion) + " (mixed plugin versions in one job?)");
  HandleInfo hi;
  hi.family = get_u16(h + 6);
  hi.port = get_u16(h + 8);
  hi.nsocks = get_u16(h + 10);
  hi.nonce = get_u64(h + 16);
  std::memcpy(hi.addr, h + 24, 16);
  if ((hi.family != AF_INET && hi.family != AF_INET6) || hi.port == 0 || hi.nsocks < 1 || hi.nsocks > 16)
    throw Error(ErrorKind::Protocol, "connect: malformed handle");
  return hi;
}

struct PendingConnect {
  HandleInfo to;
  uint64_t conn_id = 0;
  std::vector<net::Fd> socks;
  std::vector<int> stage;  // 0 connecting, 1 sending the hello, 2 done
  std::vector<size_t> sent;
  std::vector<Hello> hello;
};

void set_state(uint8_t* handle, PendingConnect* p) { std::memcpy(handle + kStateOffset, &p, sizeof p); }
PendingConnect* get_state(const uint8_t* handle) {
  PendingConnect* p = nullptr;
  std::memcpy(&p, handle + kStateOffset, sizeof p);
  return p;
}

// Advances a pending connect; true once every socket has sent its hello.
bool progress_connect(PendingConnect& p) {
  bool all = true;
  for (size_t s = 0; s < p.socks.size(); ++s) {
    const std::string peer = "peer " + p.to.str() + " (socket " + std::to_string(s) + ")";
    if (p.stage[s] == 0) {
      pollfd pfd{p.socks[s].get(), POLLOUT, 0};
      if (::poll(&pfd, 1, 0) == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(p.socks[s].get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) throw Error(ErrorKind::Connect, "cannot connect to " + peer + ": " + errno_text(err));
        p.stage[s] = 1;
      }
    }
    if (p.stage[s] == 1) {
      iovec iov{p.hello[s].data() + p.sent[s], kHelloBytes - p.sent[s]};
      ssize_t w = net::send_some(p.socks[s].get(), &iov, 1, peer);
      if (w > 0) p.sent[s] += size_t(w);
      if (p.sent[s] == kHelloBytes) p.stage[s] = 2;
    }
    all &= p.stage[s] == 2;
  }
  return all;
}

struct ListenComm {
  static constexpr uint32_t kMagic = 0x4c434e52u;  // "RNCL"
  uint32_t magic = kMagic;
  std::unique_ptr<Listener> listener;
};

Comm* comm_of(void* c) {
  auto* comm = static_cast<Comm*>(c);
  if (!comm || !comm->valid()) throw Error(ErrorKind::Internal, "not a communicator of this plugin");
  return comm;
}

}  // namespace

void stripe(uint64_t size, int nsocks, int s, uint64_t* off, uint64_t* len) {
  uint64_t used = std::min<uint64_t>(uint64_t(nsocks), std::max<uint64_t>(1, size / kMinStripeBytes));
  uint64_t chunk = (size + used - 1) / used;
  uint64_t b = std::min(size, uint64_t(s) * chunk), e = std::min(size, uint64_t(s + 1) * chunk);
  *off = b;
  *len = e - b;
}

void init() {
  std::call_once(g_if_once, [] { g_if = pick_interface(); });
  if (g_if.name.empty()) throw Error(ErrorKind::Config, "no network interface");
}

const NetInterface& interface() {
  init();
  return g_if;
}

void listen(void* handle, void** listen_comm) {
  const NetInterface& ni = interface();
  const int nsocks = p2p_sockets_from_env();
  const uint64_t nonce = random_u64();
  const auto hello_timeout =
      std::chrono::duration_cast<Listener::Clock::duration>(std::chrono::duration<double>(hello_timeout_from_env()));
  sockaddr_storage ss = ni.addr;
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = 0;
  else reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = 0;
  net::Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error(ErrorKind::Internal, "socket: " + errno_text(errno));
  net::preset_congestion(fd.get());  // accepted connections inherit it (net/socket.h)
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), ni.addr_len) != 0 || ::listen(fd.get(), 256) != 0)
    throw Error(ErrorKind::Config, "cannot listen on " + ni.name + " (" + ni.ip + "): " + errno_text(errno));
  socklen_t len = sizeof ss;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  auto lc = std::make_unique<ListenComm>();
  lc->listener = std::make_unique<Listener>(std::move(fd), nonce, nsocks, hello_timeout);
  auto* h = static_cast<uint8_t*>(handle);
  std::memset(h, 0, NCCL_NET_HANDLE_MAXSIZE);
  put_u32(h, kHandleMagic);
  put_u16(h + 4, kVersion);
  put_u16(h + 6, uint16_t(ss.ss_family));
  put_u16(h + 10, uint16_t(nsocks));
  put_u64(h + 16, nonce);
  if (ss.ss_family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&ss);
    put_u16(h + 8, ntohs(s->sin_port));
    std::memcpy(h + 24, &s->sin_addr, 4);
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(&ss);
    put_u16(h + 8, ntohs(s->sin6_port));
    std::memcpy(h + 24, &s->sin6_addr, 16);
  }
  *listen_comm = lc.release();
}

void connect(void* handle, void** send_comm) {
  *send_comm = nullptr;
  auto* h = static_cast<uint8_t*>(handle);
  PendingConnect* p = get_state(h);
  std::unique_ptr<PendingConnect> owned;
  try {
    if (!p) {
      owned = std::make_unique<PendingConnect>();
      owned->to = decode_handle(h);
      owned->conn_id = random_u64();
      socklen_t alen = 0;
      sockaddr_storage ss = owned->to.sockaddr_of(&alen);
      for (int s = 0; s < owned->to.nsocks; ++s) {
        net::Fd fd(::socket(owned->to.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!fd.valid()) throw Error(ErrorKind::Internal, "socket: " + errno_text(errno));
        net::preset_congestion(fd.get());
        if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), alen) != 0 && errno != EINPROGRESS)
          throw Error(ErrorKind::Connect, "cannot connect to peer " + owned->to.str() + ": " + errno_text(errno));
        owned->socks.push_back(std::move(fd));
        owned->stage.push_back(0);
        owned->sent.push_back(0);
        owned->hello.push_back(make_hello(uint16_t(s), owned->to.nsocks, owned->to.nonce, owned->conn_id));
      }
      p = owned.get();
      set_state(h, owned.release());
    }
    if (!progress_connect(*p)) return;
    owned.reset(p);
    set_state(h, nullptr);
    auto comm = std::make_unique<Comm>(std::move(p->socks), true, "peer " + p->to.str(), p2p_threads_from_env());
    *send_comm = comm.release();
  } catch (...) {
    if (!owned && get_state(h)) owned.reset(get_state(h));
    set_state(h, nullptr);
    throw;
  }
}

void accept(void* listen_comm, void** recv_comm) {
  *recv_comm = nullptr;
  auto* lc = static_cast<ListenComm*>(listen_comm);
  if (!lc || lc->magic != ListenComm::kMagic)
    throw Error(ErrorKind::Internal, "accept: not a listen comm of this plugin");
  std::optional<Accepted> a = lc->listener->poll();
  if (!a) return;
  auto comm = std::make_unique<Comm>(std::move(a->socks), false, "peer " + a->peer, p2p_threads_from_env());
  *recv_comm = comm.release();
}

void isend(void* send_comm, void* data, size_t size, void** request) {
  Comm* c = comm_of(send_comm);
  if (!c->sender()) throw Error(ErrorKind::Internal, "isend on a receive comm");
  if (size > kMaxMessageBytes)
    throw Error(ErrorKind::Config, "isend of " + std::to_string(size) + " bytes: more than maxP2pBytes");
  if (size && !data) throw Error(ErrorKind::Config, "isend of a null buffer");
  *request = c->post(static_cast<uint8_t*>(data), size);
}

void irecv(void* recv_comm, int n, void** data, const size_t* sizes, void** request) {
  Comm* c = comm_of(recv_comm);
  if (c->sender()) throw Error(ErrorKind::Internal, "irecv on a send comm");
  if (n != 1) throw Error(ErrorKind::Config, "irecv of " + std::to_string(n) + " buffers: maxRecvs is 1");
  if (sizes[0] && !data[0]) throw Error(ErrorKind::Config, "irecv into a null buffer");
  *request = c->post(static_cast<uint8_t*>(data[0]), std::min<uint64_t>(sizes[0], kMaxMessageBytes));
}

void test(void* request, int* done, int* size) {
  auto* r = static_cast<Request*>(request);
  if (!r || r->magic != Request::kMagic) throw Error(ErrorKind::Internal, "test: not a request of this plugin");
  int st = r->state.load(std::memory_order_acquire);
  *done = 0;
  if (st == kDone) {
    if (size) *size = int(r->actual);
    r->state.store(kFree, std::memory_order_release);
    *done = 1;
  } else if (st == kError) {
    r->state.store(kFree, std::memory_order_release);
    throw Error(ErrorKind::PeerLost, r->comm->error());
  } else if (st == kPosted && r->comm->failed()) {
    // Posted just as the progress thread stopped on an error: it will never finish.
    r->state.store(kFree, std::memory_order_release);
    throw Error(ErrorKind::PeerLost, r->comm->error());
  } else if (st == kFree) {
    throw Error(ErrorKind::Internal, "test: request already completed");
  }
}

void close_comm(void* comm) {
  if (!comm) return;
  std::unique_ptr<Comm> c(comm_of(comm));  // joins the progress thread, closes the sockets
}

void close_listen(void* listen_comm) {
  if (!listen_comm) return;
  auto* lc = static_cast<ListenComm*>(listen_comm);
  if (lc->magic != ListenComm::kMagic)
    throw Error(ErrorKind::Internal, "closeListen: not a listen comm of this plugin");
  std::unique_ptr<ListenComm> owned(lc);
  owned->magic = 0;
}

}  // namespace rs::nccl::p2p
