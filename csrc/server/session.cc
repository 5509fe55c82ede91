#include "server/session.h"

#include "common/log.h"
#include "server/conn.h"
#include "server/handshake.h"
#include "server/loop.h"
#include "server/server_impl.h"

namespace rs::server {

void Session::reject(Conn* c, proto::Status status, const std::string& msg) {
  Server::Impl* srv = loop_.srv;
  srv->rejected++;
  if (status == proto::Status::OverLimit) srv->over_limit++;
  Server::Impl::log_limited(srv->reject_log, LogLevel::Warning, "rejected " + c->peer + ": " + msg);
  c->close_after_flush = true;
  c->why = msg;
  loop_.out.send_reply(c, status, msg);
}

bool Session::read_fixed(Conn* c, Step* step) {
  *step = Step::Stop;
  ssize_t n = net::recv_some(c->fd.get(), c->fixed + c->got, proto::kHelloFixedBytes - c->got, c->peer);
  if (n < 0) return false;
  c->got += size_t(n);
  if (c->got < proto::kHelloFixedBytes) {
    // The magic and the version decide alone: a worker of another version may send a shorter hello.
    if (c->got >= 6 && (proto::get_u32(c->fixed) != proto::kMagic || proto::get_u16(c->fixed + 4) != proto::kVersion)) {
      c->got = proto::kHelloFixedBytes;  // judge it now (check_hello_fixed reads only what it needs first)
    } else {
      *step = Step::More;
      return false;
    }
  }
  Verdict v = check_hello_fixed(c->fixed, &c->hello, &c->job_len, &c->group_len, c->peer);
  if (v.garbage) {
    loop_.srv->rejected++;
    loop_.kill(c, v.message, true);
    Server::Impl::log_limited(loop_.srv->reject_log, LogLevel::Warning, v.message);
    return false;
  }
  if (!v.ok()) {
    reject(c, v.status, v.message);
    return false;
  }
  loop_.set_state(c, ConnState::Names);
  c->got = 0;
  c->names.assign(c->job_len + c->group_len, '\0');
  return true;
}

Session::Step Session::read(Conn* c) {
  Step step = Step::Stop;
  if (c->state == ConnState::Hello && !read_fixed(c, &step)) return step;
  if (c->got < c->names.size()) {
    ssize_t n = net::recv_some(c->fd.get(), &c->names[c->got], c->names.size() - c->got, c->peer);
    if (n < 0) return Step::Stop;
    c->got += size_t(n);
    if (c->got < c->names.size()) return Step::More;
  }
  const ServerOptions& opts = loop_.srv->opts;
  Verdict v = check_hello_names(&c->hello, c->names, c->job_len, opts.auth_token, c->nonce, c->peer, &c->key,
                                &c->authenticated);
  if (v.ok()) v = check_integrity(c->hello, opts.integrity, c->peer);
  if (!v.ok()) {
    reject(c, v.status, v.message);
    return Step::Stop;
  }
  if (c->authenticated && !account_to_job(c)) return Step::Stop;
  c->gkey = GroupKey{c->hello.job_id, c->hello.group, c->hello.stream_index};
  c->rank = c->hello.rank;
  loop_.set_state(c, ConnState::Waiting);
  return loop_.handoff(c) ? Step::HandedOff : Step::Stop;
}

bool Session::account_to_job(Conn* c) {
  // Until now the connection counted against its address (max_connections_per_peer), the only
  // thing known of a stranger; authenticated, it counts against its job instead, so that jobs
  // behind one address (NAT, one host) do not share one address's connections.
  Server::Impl* srv = loop_.srv;
  PeerTable::Ticket ticket;
  if (!srv->peers.acquire(PeerTable::Kind::Connection, job_account(c->hello.job_id), srv->opts.max_connections_per_peer,
                          &ticket)) {
    reject(c, proto::Status::OverLimit,
           "job " + c->hello.job_id + " already has " + std::to_string(srv->opts.max_connections_per_peer) +
               " connections open to this reducer (max_connections_per_peer)");
    return false;
  }
  c->peer_ticket = std::move(ticket);  // gives the address's unit back
  return true;
}

bool Session::on_readable(Conn* c) {
  Step step;
  do {
    step = read(c);
  } while (step == Step::More && !c->dead);
  return step != Step::HandedOff;
}

void Session::on_waiting_readable(Conn* c) {
  uint8_t b;
  ssize_t n = net::recv_some(c->fd.get(), &b, 1, c->peer);
  if (n > 0) {
    loop_.kill(c, "protocol error from " + c->peer + ": data before the group was complete", true);
    Server::Impl::log_limited(loop_.srv->reject_log, LogLevel::Warning, c->why);
  }
}

void Session::sweep() {
  auto now = net::Clock::now();
  for (auto& kv : loop_.conns) {
    Conn* c = kv.second.get();
    if ((c->state == ConnState::Hello || c->state == ConnState::Names) && !c->dead && now > c->deadline) {
      loop_.srv->rejected++;
      loop_.kill(c, "handshake timeout from " + c->peer, true);
      Server::Impl::log_limited(loop_.srv->reject_log, LogLevel::Warning, c->why);
    }
  }
}

}  // namespace rs::server
