#include "net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"

namespace rs::net {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string HostPort::str() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

// The process-wide congestion control (set_tcp_congestion); read once per new connection.
std::mutex g_congestion_mu;
std::string g_congestion;

// setsockopt(TCP_CONGESTION); 0 or the errno.
int apply_congestion(int fd, const std::string& name) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), socklen_t(name.size())) == 0) return 0;
  return errno;
}

}  // namespace

std::string set_tcp_congestion(const std::string& requested) {
  const bool automatic = requested == "auto";  // kAutoCongestion if allowed, else the kernel's, quietly
  std::string name = automatic ? kAutoCongestion : requested == "default" ? "" : requested;
  if (!name.empty()) {
    if (name.size() >= 16 || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
      throw Error(ErrorKind::Config, "TCP congestion control '" + name + "': not an algorithm name");
    Fd probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const int err = probe.valid() ? apply_congestion(probe.get(), name) : errno;
    if (automatic && err != 0) name.clear();
    else if (!probe.valid()) throw Error(ErrorKind::Config, "cannot create a TCP socket: " + errno_text(err));
    else if (err == ENOENT)
      throw Error(ErrorKind::Config, "TCP congestion control '" + name +
                                         "' is not available in this kernel "
                                         "(see net.ipv4.tcp_available_congestion_control; a module such as tcp_" +
                                         name + " may need loading)");
    else if (err == EPERM)
      throw Error(ErrorKind::Config, "TCP congestion control '" + name +
                                         "' is not allowed for this process: add it to "
                                         "net.ipv4.tcp_allowed_congestion_control or run with CAP_NET_ADMIN");
    else if (err != 0) throw Error(ErrorKind::Config, "TCP congestion control '" + name + "': " + errno_text(err));
  }
  std::lock_guard<std::mutex> lock(g_congestion_mu);
  g_congestion = name;
  return name;
}

std::string tcp_congestion() {
  std::lock_guard<std::mutex> lock(g_congestion_mu);
  return g_congestion;
}

std::string socket_congestion(int fd) {
  char buf[16] = {};
  socklen_t len = sizeof buf;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, buf, &len) != 0) return "";
  return std::string(buf, strnlen(buf, std::min<size_t>(len, sizeof buf)));
}

void preset_congestion(int fd) {
  std::string cc = tcp_congestion();
  if (!cc.empty()) apply_congestion(fd, cc);
}

namespace {

Keepalive read_keepalive(const settings::EnvLookup& env) {
  Keepalive k;
  k.idle = int(settings::read_int(settings::spec("keepalive_idle"), env));
  k.interval = int(settings::read_int(settings::spec("keepalive_interval"), env));
  k.count = int(settings::read_int(settings::spec("keepalive_count"), env));
  k.user_timeout = int(settings::read_int(settings::spec("tcp_user_timeout"), env));
  return k;
}

struct KeepaliveState {
  Keepalive k;
  std::string error;  // a malformed variable: the defaults are in `k`
};

const KeepaliveState& keepalive_state() {
  static const KeepaliveState state = [] {
    KeepaliveState st;
    try {
      st.k = read_keepalive(settings::process_env());
    } catch (const Error& e) {
      st.error = e.what();
      st.k = read_keepalive([](const char*) { return std::optional<std::string>(); });
    }
    return st;
  }();
  return state;
}

void apply_keepalive(int fd) {
  const KeepaliveState& st = keepalive_state();
  static std::once_flag warned;
  if (!st.error.empty())
    std::call_once(warned, [&] { log_warn(st.error + ": data connections use the default keepalive settings"); });
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &st.k.idle, sizeof st.k.idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &st.k.interval, sizeof st.k.interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &st.k.count, sizeof st.k.count);
  if (st.k.user_timeout > 0) {
    const unsigned ms = unsigned(st.k.user_timeout) * 1000u;  // <= 86,400,000 (the setting's bound)
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
  }
}

}  // namespace

Keepalive keepalive_settings() {
  const KeepaliveState& st = keepalive_state();
  if (!st.error.empty()) throw Error(ErrorKind::Config, st.error);
  return st.k;
}

void tune_socket(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  apply_keepalive(fd);
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
  // Checked by set_tcp_congestion; a failure here (e.g. a module unloaded since) keeps the
  // kernel's default for this connection, which still works. Sockets this file opens were
  // preset before connect()/listen() already (preset_congestion): this covers the others.
  preset_congestion(fd);
}

void set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return;
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

namespace {

struct AddrInfo {
  addrinfo* ai = nullptr;
  ~AddrInfo() {
    if (ai) freeaddrinfo(ai);
  }
};

int resolve(const std::string& host, uint16_t port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string service = std::to_string(port);
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->ai);
}

// Opens a non-blocking socket for `a` and starts connecting it: 0 (connected already; the
// socket is in *out), EINPROGRESS (under way; the socket is in *out), or the errno of the failure.
int start_connect(const addrinfo* a, Fd* out) {
  Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
  if (!fd.valid()) return errno;
  preset_congestion(fd.get());
  const int err = ::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
  if (err == 0 || err == EINPROGRESS) *out = std::move(fd);
  return err;
}

// The outcome of a connect that was under way and whose socket polled ready: 0 or its errno.
int connect_result(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

}  // namespace

Fd listen_on(const std::string& host, uint16_t port, uint16_t* bound_port) {
  AddrInfo res;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int rc = resolve(h, port, true, &res);
  if (rc != 0) throw Error(ErrorKind::Config, "cannot resolve listen address '" + host + "': " + gai_strerror(rc));
  std::string last;
  for (addrinfo* a = res.ai; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last = errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    preset_congestion(fd.get());  // accepted connections inherit it
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
      last = errno_text(errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    *bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return fd;
  }
  throw Error(ErrorKind::Config, "cannot listen on " + host + ":" + std::to_string(port) + ": " + last);
}

int poll_interruptible(pollfd* fds, nfds_t n, int ms, const Interrupt& intr) {
  if (!intr) return ::poll(fds, n, ms);
  const auto until = ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    intr();
    // (rounded up: the last slice never ends before `until`, as one poll(ms) would not)
    const int left = ms < 0 ? kInterruptSliceMs : ms_until(until + std::chrono::microseconds(999));
    const int slice = std::min(left, kInterruptSliceMs);
    const int pr = ::poll(fds, n, slice);
    if (pr != 0 || slice == left) return pr;
  }
}

void pause_interruptible(Clock::duration d, const Interrupt& intr) {
  if (!intr) {
    std::this_thread::sleep_for(d);
    return;
  }
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
    intr();
    std::this_thread::sleep_for(
        std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(kInterruptSliceMs)));
  }
  intr();
}

Fd connect_with_retry(const HostPort& addr, Clock::time_point deadline, const Interrupt& intr) {
  std::string last = "no attempt";
  auto backoff = std::chrono::milliseconds(20);
  int attempts = 0;
  const auto started = Clock::now();
  bool warned = false;
  for (;;) {
    ++attempts;
    AddrInfo res;
    int rc = resolve(addr.host, addr.port, false, &res);
    if (rc != 0) {
      last = std::string("cannot resolve host: ") + gai_strerror(rc);
    } else {
      for (addrinfo* a = res.ai; a; a = a->ai_next) {
        Fd fd;
        int err = start_connect(a, &fd);
        if (err == EINPROGRESS) {
          pollfd p{fd.get(), POLLOUT, 0};
          int pr = poll_interruptible(&p, 1, std::max(1, ms_until(deadline, 5000)), intr);
          err = pr == 1 ? connect_result(fd.get()) : ETIMEDOUT;
        }
        if (err == 0) {
          set_nonblocking(fd.get(), false);
          return fd;
        }
        last = errno_text(err);
      }
    }
    auto now = Clock::now();
    if (now + backoff >= deadline)
      throw Error(ErrorKind::Connect, "cannot connect to reducer " + addr.str() + " after " + std::to_string(attempts) +
                                          " attempts: " + last);
    // Say once, early, who is unreachable and for how long we keep trying (the default
    // connect timeout is minutes: silence until then looks like a hang).
    if (!warned && now - started >= kConnectWarnAfter) {
      warned = true;
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - now).count();
      log_warn("cannot reach reducer " + addr.str() + " yet (" + last + "); retrying for up to " +
               std::to_string(left) + " s more (connect timeout, RS_CONNECT_TIMEOUT)");
    }
    pause_interruptible(backoff, intr);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

ConnectProbe::ConnectProbe(const HostPort& addr) {
  AddrInfo res;
  if (resolve(addr.host, addr.port, false, &res) != 0) return;  // Failed
  for (addrinfo* a = res.ai; a; a = a->ai_next) {
    Fd fd;
    const int err = start_connect(a, &fd);
    if (err == 0) {
      fds_.clear();
      state_ = State::Reached;
      return;
    }
    if (err == EINPROGRESS) fds_.push_back(std::move(fd));
  }
  state_ = fds_.empty() ? State::Failed : State::Pending;
}

ConnectProbe::State ConnectProbe::check() {
  if (state_ != State::Pending) return state_;
  for (size_t i = 0; i < fds_.size();) {
    pollfd p{fds_[i].get(), POLLOUT, 0};
    if (::poll(&p, 1, 0) == 1 && p.revents) {  // POLLOUT / POLLERR / POLLHUP: this connect is over
      if (connect_result(fds_[i].get()) == 0) {
        fds_.clear();
        return state_ = State::Reached;
      }
      fds_.erase(fds_.begin() + std::ptrdiff_t(i));
      continue;
    }
    ++i;
  }
  if (fds_.empty()) state_ = State::Failed;
  return state_;
}

void send_all(int fd, const void* data, size_t len, Clock::time_point deadline, const std::string& peer,
              const Interrupt& intr) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    pollfd pfd{fd, POLLOUT, 0};
    int pr = poll_interruptible(&pfd, 1, ms_until(deadline), intr);
    if (pr == 0 && Clock::now() < deadline) continue;  // (poll's milliseconds end up to 1 ms early)
    if (pr == 0) throw Error(ErrorKind::Timeout, "timed out sending to " + peer);
    if (pr < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::PeerLost, "poll failed for " + peer + ": " + errno_text(errno));
    }
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw Error(ErrorKind::PeerLost, "connection to " + peer + " lost: " + errno_text(errno));
    }
    p += n;
    len -= size_t(n);
  }
}

void recv_all(int fd, void* data, size_t len, Clock::time_point deadline, const std::string& peer,
              const Interrupt& intr) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int pr = poll_interruptible(&pfd, 1, ms_until(deadline), intr);
    if (pr == 0 && Clock::now() < deadline) continue;  // (poll's milliseconds end up to 1 ms early)
    if (pr == 0) throw Error(ErrorKind::Timeout, "timed out waiting for " + peer);
    if (pr < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::PeerLost, "poll failed for " + peer + ": " + errno_text(errno));
    }
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n == 0) throw Error(ErrorKind::PeerLost, peer + " closed the connection");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw Error(ErrorKind::PeerLost, "connection to " + peer + " lost: " + errno_text(errno));
    }
    p += n;
    len -= size_t(n);
  }
}

ssize_t send_some(int fd, const iovec* iov, int iovcnt, const std::string& peer, bool more) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = size_t(iovcnt);
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    throw Error(ErrorKind::PeerLost, "connection to " + peer + " lost: " + errno_text(errno));
  }
}

void push_pending(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

ssize_t recv_some(int fd, void* data, size_t len, const std::string& peer) {
  for (;;) {
    ssize_t n = ::recv(fd, data, len, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) throw Error(ErrorKind::PeerLost, peer + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    throw Error(ErrorKind::PeerLost, "connection to " + peer + " lost: " + errno_text(errno));
  }
}

ssize_t recv_some(int fd, const iovec* iov, int iovcnt, const std::string& peer) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = size_t(iovcnt);
  for (;;) {
    ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) throw Error(ErrorKind::PeerLost, peer + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    throw Error(ErrorKind::PeerLost, "connection to " + peer + " lost: " + errno_text(errno));
  }
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  auto* s = reinterpret_cast<sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
  port = ntohs(s->sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

}  // namespace rs::net
