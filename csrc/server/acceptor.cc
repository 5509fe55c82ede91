#include "server/acceptor.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <memory>

#include "common/error.h"
#include "common/log.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"
#include "server/conn.h"
#include "server/handshake.h"
#include "server/loop.h"
#include "server/server_impl.h"

namespace rs::server {

namespace {

std::string ip_of(const std::string& peer) {
  if (!peer.empty() && peer[0] == '[') return peer.substr(1, peer.find(']') - 1);
  return peer.substr(0, peer.rfind(':'));
}

}  // namespace

void Acceptor::pause(int err) {
  Server::Impl* srv = loop_.srv;
  Server::Impl::log_limited(srv->accept_log, LogLevel::Warning,
                            "accept failed: " + errno_text(err) + " (" + std::to_string(srv->open_conns.load()) +
                                " connections open): pausing accepts for 100 ms; raise the descriptor limit " +
                                "(ulimit -n) or lower RS_MAX_CONNECTIONS");
  epoll_ctl(loop_.ep.get(), EPOLL_CTL_DEL, srv->listener.get(), nullptr);
  paused_ = true;
  resume_at_ = net::Clock::now() + std::chrono::milliseconds(100);
}

void Acceptor::resume_if_due() {
  Server::Impl* srv = loop_.srv;
  if (!paused_ || net::Clock::now() < resume_at_ || !srv->accepting.load()) return;
  paused_ = false;
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = srv->listener.get();
  epoll_ctl(loop_.ep.get(), EPOLL_CTL_ADD, srv->listener.get(), &e);
}

void Acceptor::accept_all() {
  Server::Impl* srv = loop_.srv;
  for (int accepted = 0; accepted < 256; ++accepted) {  // bounded: the loop also serves data
    int fd = ::accept4(srv->listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) pause(errno);
      else if (errno != EAGAIN && errno != EWOULDBLOCK)
        Server::Impl::log_limited(srv->accept_log, LogLevel::Warning, "accept failed: " + errno_text(errno));
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd.reset(fd);
    c->peer = net::peer_name(fd);
    c->peer_ip = ip_of(c->peer);
    if (srv->open_conns.load() >= srv->opts.max_connections) {
      // Closed before its challenge: the worker retries until its connect deadline (the reducer
      // is busy, connections close all the time), then raises the timeout.
      refuse(-1, c->peer, std::to_string(srv->open_conns.load()) + " connections open (max_connections)");
      continue;  // closed by the Fd's destructor
    }
    if (!srv->peers.acquire(PeerTable::Kind::Connection, c->peer_ip, srv->opts.max_connections_per_peer,
                            &c->peer_ticket)) {
      refuse(fd, c->peer,
             std::to_string(srv->opts.max_connections_per_peer) + " connections already open from " + c->peer_ip +
                 " (max_connections_per_peer)");
      continue;
    }
    srv->open_conns++;
    srv->handshakes++;  // the state starts as Hello
    net::tune_socket(fd, srv->opts.socket_buffer);
    c->deadline = net::Clock::now() + ms(srv->opts.handshake_timeout);
    proto::random_bytes(c->nonce.data(), c->nonce.size());
    std::string bytes = challenge(c->nonce);
    Conn* raw = c.get();
    loop_.conns[fd] = std::move(c);
    log_debug("connection from " + raw->peer);
    loop_.out.send_ctl(raw, std::move(bytes));
  }
}

std::string Acceptor::challenge(const std::array<uint8_t, proto::kNonceBytes>& nonce) const {
  proto::Challenge ch;
  ch.auth_required = loop_.srv->opts.auth_token.empty() ? 0 : 1;
  ch.nonce = nonce;
  std::string bytes(proto::kChallengeBytes, '\0');
  proto::encode(ch, reinterpret_cast<uint8_t*>(&bytes[0]));
  return bytes;
}

void Acceptor::refuse(int fd, const std::string& peer, const std::string& why) {
  Server::Impl* srv = loop_.srv;
  srv->over_limit++;
  srv->rejected++;
  Server::Impl::log_limited(srv->refuse_log, LogLevel::Warning, "refused a connection from " + peer + ": " + why);
  if (fd < 0) return;
  // The worker learns why (issue 29.5): a challenge, so that it sends its hello and reads a
  // reply, then the reply OverLimit with the reason, in one write that never waits; then the
  // connection is closed (by the caller) without holding anything. Nothing was read from it, so
  // the close sends both before its FIN (a hello that arrives after it is answered with a reset,
  // which leaves what the worker already received readable). A worker with a credential sees the
  // reply as unauthenticated: it is an error anyway, never an Ok.
  std::array<uint8_t, proto::kNonceBytes> nonce{};
  proto::random_bytes(nonce.data(), nonce.size());
  std::string bytes = challenge(nonce) + make_reply(proto::Status::OverLimit, why, false, proto::Key{}, {}, nonce);
  const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)n;  // best effort: a peer that cannot take 200 bytes learns it from the close
}

}  // namespace rs::server
