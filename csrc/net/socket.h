// Sockets: RAII file descriptors, address parsing/resolution, listen, connect with
// bounded retries, and deadline-bounded blocking I/O for handshakes.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "net/deadline.h"

namespace rs::net {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
  std::string str() const;  // "host:port" or "[v6]:port"
};

// Socket options every data connection gets: TCP_NODELAY, large buffers, keepalive (below), and
// the process-wide TCP congestion control (TCP_CONGESTION) if one is set. Never throws.
void tune_socket(int fd, int buffer_bytes);

// Dead-peer detection on every data connection (tune_socket): SO_KEEPALIVE with these probe
// timings and TCP_USER_TIMEOUT, so that a peer that vanished silently (a link cut, a host gone,
// no FIN or RST ever comes) is found dead in about `user_timeout` seconds (the defaults: 15 s)
// instead of the kernel's two hours (keepalive) or fifteen minutes (retransmissions). A peer
// that is alive answers the probes whatever it is doing (a stopped process too: its kernel
// answers). Read once per process from RS_KEEPALIVE_IDLE, RS_KEEPALIVE_INTERVAL,
// RS_KEEPALIVE_COUNT and RS_TCP_USER_TIMEOUT (common/settings.h); user_timeout 0 leaves the
// kernel's default.
struct Keepalive {
  int idle = 0;          // seconds of silence before the first probe (TCP_KEEPIDLE)
  int interval = 0;      // seconds between probes (TCP_KEEPINTVL)
  int count = 0;         // unanswered probes before the peer is dead (TCP_KEEPCNT)
  int user_timeout = 0;  // seconds data or probes may go unacknowledged (TCP_USER_TIMEOUT), 0: kernel's
  // About how long a silent dead peer goes unnoticed: with a user timeout, Linux drops the
  // connection once that long passed since it last heard from the peer and a probe is out
  // (TCP_KEEPCNT no longer counts); without, after idle + count x interval.
  int dead_after() const {
    return user_timeout > 0 ? std::max(user_timeout, idle + interval) : idle + count * interval;
  }
};
// The process's settings; throws Error(Config) naming a malformed variable (tune_socket then
// uses the defaults, with one warning).
Keepalive keepalive_settings();

// The congestion control tune_socket gives every data connection of this process (workers,
// reducers, ring, NCCL plugin): "" or "default" = the kernel's default
// (net.ipv4.tcp_congestion_control of the socket's network namespace); "auto" (the default of
// RS_TCP_CONGESTION) = kAutoCongestion if this process may use it, else the kernel's, quietly;
// any other name is checked on a probe socket first: throws Error(Config) naming the algorithm
// and the cause (not built into / loaded by the kernel, or not in
// net.ipv4.tcp_allowed_congestion_control for a process without CAP_NET_ADMIN).
// Returns the setting now in force ("" = the kernel's).
// Why cubic: with BBR (the default of many distributions) a worker's R parallel flows and a
// reducer's W incoming ones get very uneven rates through a queueing link, and a round waits for
// its slowest flow (docs/performance.md, "TCP congestion control").
constexpr const char* kAutoCongestion = "cubic";
std::string set_tcp_congestion(const std::string& name);
std::string tcp_congestion();

// Gives a socket the process-wide congestion control BEFORE connect() or listen() (accepted
// connections inherit a listener's). Switching a connected socket later is not the same: a
// connection that started under BBR (a common kernel default) keeps BBR's internal pacing after
// TCP_CONGESTION switches it to cubic (the kernel leaves sk_pacing_status set), and that pacing
// throttles bursts: measured at 1 Gbit/s, W=4 R=4, 64 KiB rs rounds took 1.1-1.4 ms for their
// first hundreds of rounds instead of 0.5 ms (docs/performance.md). listen_on and the connects of
// this file call it; tune_socket() still applies the setting to any other socket.
void preset_congestion(int fd);

// The congestion control a socket uses now ("" if it cannot be read).
std::string socket_congestion(int fd);
void set_nonblocking(int fd, bool on);

// Listening socket on host:port (port 0 = any); returns the fd and the bound port.
Fd listen_on(const std::string& host, uint16_t port, uint16_t* bound_port);

// Connect to addr, retrying refused/unreachable connections with backoff until
// `deadline`; throws Error(Connect) naming the address and the last cause.
// After kConnectWarnAfter of failed attempts it logs one WARNING naming the address, the last
// error and how long it keeps trying.
constexpr std::chrono::seconds kConnectWarnAfter{3};
// `intr` (net/deadline.h) may end the waits early (it throws).
Fd connect_with_retry(const HostPort& addr, Clock::time_point deadline, const Interrupt& intr = Interrupt());

// A TCP connect that never waits (a reachability probe): the constructor starts a
// non-blocking connect (SOCK_NONBLOCK) to every address `addr` resolves to and returns at
// once; check() asks, without waiting (poll with a 0 timeout, then SO_ERROR), whether one got
// through. A connect still under way is Pending. The sockets are closed as soon as the answer
// is known, and by the destructor. Resolving a numeric address never waits; a host name goes
// through getaddrinfo (the system resolver, which may ask DNS).
class ConnectProbe {
 public:
  enum class State { Pending, Reached, Failed };
  explicit ConnectProbe(const HostPort& addr);
  State check();  // never waits; Reached / Failed are final
  State state() const { return state_; }

 private:
  std::vector<Fd> fds_;  // connects under way, one per resolved address
  State state_ = State::Failed;
};

// Blocking (poll-based) I/O with a deadline: throws Error(Timeout / PeerLost), or what `intr` throws.
void send_all(int fd, const void* data, size_t len, Clock::time_point deadline, const std::string& peer,
              const Interrupt& intr = Interrupt());
void recv_all(int fd, void* data, size_t len, Clock::time_point deadline, const std::string& peer,
              const Interrupt& intr = Interrupt());

// Non-blocking I/O helpers: bytes moved (>= 0), or -1 for "would block".
// Throw Error(PeerLost) on EOF/reset with the peer's name.
// `more`: MSG_MORE, the bytes may wait in the kernel for the next write on this socket (which
// takes them along), for about 200 ms at most (the kernel's cork limit), or until push_pending().
ssize_t send_some(int fd, const iovec* iov, int iovcnt, const std::string& peer, bool more = false);
// Sends at once what a `more` write left waiting in the kernel (re-setting TCP_NODELAY pushes it).
void push_pending(int fd);
ssize_t recv_some(int fd, void* data, size_t len, const std::string& peer);
ssize_t recv_some(int fd, const iovec* iov, int iovcnt, const std::string& peer);  // readv

// Name of the remote end of a connected socket, "host:port".
std::string peer_name(int fd);

}  // namespace rs::net
