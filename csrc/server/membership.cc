#include "server/membership.h"

#include "common/log.h"
#include "server/conn.h"
#include "server/group_table.h"
#include "server/loop.h"
#include "server/server_impl.h"

namespace rs::server {

proto::ErrorCode Membership::end_code(const Group& g) {
  return g.failover() ? proto::ErrorCode::Failover : proto::ErrorCode::PeerLost;
}

void Membership::join(Conn* c) {
  Server::Impl* srv = loop_.srv;
  if (srv->draining.load() && !loop_.table->contains(c->gkey)) {
    loop_.set_state(c, ConnState::Closing);
    loop_.session.reject(
        c, proto::Status::ShuttingDown,
        "reducer " + std::to_string(srv->port) + " is draining: it serves the groups it has but takes no new one");
    return;
  }
  Joiner who;
  who.ip = c->peer_ip;
  who.peer = c->peer;
  who.authenticated = c->authenticated;
  // A joiner that proved it is of the job (a secret is set) takes its rank's place from a stale
  // connection. Without a secret anyone could push a live member out of a running group, so the
  // rank stays taken (RankTaken, retried by the worker) until keepalive finds the old one dead.
  who.may_replace = c->authenticated;
  JoinOutcome j = loop_.table->join(c, c->hello, c->gkey, who);
  if (j.replaced) replaced(j);
  switch (j.kind) {
    case JoinOutcome::Kind::Rejected:
      loop_.set_state(c, ConnState::Closing);
      loop_.session.reject(c, j.status, j.message);
      return;
    case JoinOutcome::Kind::CompletionFailed:
      // Every member (this one included) is refused; the group has failed and left the table.
      c->group = j.group;
      c->member = true;
      j.group->for_each_member([&](Conn* m) {
        loop_.set_state(m, ConnState::Closing);
        loop_.session.reject(m, j.status, j.message);
      });
      return;
    case JoinOutcome::Kind::Waiting:
    case JoinOutcome::Kind::Completed: break;
  }
  c->group = j.group;
  c->member = true;
  const Group& g = *j.group;
  if (j.created) {
    log_info("group " + c->gkey.label() + " created by " + c->peer + " (world size " + std::to_string(g.world()) +
             ", " + count_of(uint64_t(g.num_streams()), "stream") + ", chunk " + std::to_string(g.chunk()) + " bytes)");
  }
  log_debug("worker " + c->peer + " joined group " + c->gkey.label() + " as rank " + std::to_string(c->rank) + " (" +
            std::to_string(g.joined()) + "/" + std::to_string(g.world()) + ")");
  loop_.out.update_mask(c);
  if (j.kind == JoinOutcome::Kind::Completed) completed(g);
}

void Membership::replaced(const JoinOutcome& j) {
  Conn* old = j.replaced;
  log_warn(j.replaced_message + " (was " + old->peer + ")");
  if (j.replaced_group) {
    // The complete group failed (GroupTable::fail): every member learns why, the stale one too.
    loop_.stats.record_ended(*j.replaced_group);
    j.replaced_group->for_each_member([&](Conn* m) {
      if (!m->dead) loop_.out.send_error(m, proto::ErrorCode::PeerLost, j.replaced_message);
    });
  } else {
    // It waited in a group still gathering: the slot is the new connection's now.
    old->member = false;
    if (!old->dead) {
      loop_.set_state(old, ConnState::Closing);
      loop_.session.reject(old, proto::Status::GroupConflict,
                           j.replaced_message + " (two workers were given the same rank, or this one reconnected)");
    }
  }
  // Stale: it may never read what it was sent, so it is closed now, not after a flush.
  loop_.kill(old, j.replaced_message, false, true);
}

void Membership::completed(const Group& g) {
  Server::Impl* srv = loop_.srv;
  log_info("group " + g.key().label() + " complete: " + std::to_string(g.world()) + " ranks");
  g.for_each_member([&](Conn* m) {
    m->out.reserve(size_t(srv->opts.group_slots) + 8);  // one result per slot + control: never full
    m->reader.set_max_payload(g.chunk());
    loop_.set_state(m, ConnState::Active);
    srv->connections++;
    if (m->gkey.stream == 0) srv->workers++;
    m->counted = true;
    loop_.out.send_reply(m, proto::Status::Ok, "welcome");
    // Frames after the Ok reply carry integrity tags when the hello asked for them (and it
    // was accepted: check_integrity refused it otherwise).
    if (m->hello.flags & proto::kHelloIntegrity)
      net::protect(&m->out, &m->reader, m->key, m->hello.nonce, m->nonce, proto::Direction::ReducerToWorker);
  });
}

void Membership::fail_group(const std::shared_ptr<Group>& g, proto::ErrorCode code, const std::string& msg) {
  if (!loop_.table->fail(g, msg)) return;
  loop_.stats.record_ended(*g);
  log_warn("group " + g->key().label() + " failed: " + msg);
  g->for_each_member([&](Conn* m) {
    if (!m->dead) loop_.out.send_error(m, code, msg, code == proto::ErrorCode::Failover ? g->failover_lost() : 0);
  });
}

void Membership::leave(Conn* c) {
  if (!c->member) return;
  Server::Impl* srv = loop_.srv;
  std::shared_ptr<Group> g = c->group;
  c->member = false;
  if (c->counted) {
    srv->connections--;
    if (c->gkey.stream == 0) srv->workers--;
    c->counted = false;
  }
  const bool was_detached_before = g->ended();
  if (c->bye_failover && !g->failed()) g->mark_failover(c->bye_lost);
  LeaveOutcome o = loop_.table->leave(g, c->rank, c->who() + " of group " + g->key().label(), c->said_bye, c->why);
  switch (o.kind) {
    case LeaveOutcome::Kind::Failed:
      if (!c->error_counted) {  // leaving mid-round is an error even when the connection closed cleanly
        srv->errors++;
        c->error_counted = true;
      }
      loop_.stats.record_ended(*g);
      log_warn("group " + g->key().label() + " failed: " + o.message);
      g->for_each_member([&](Conn* m) {
        if (!m->dead) loop_.out.send_error(m, end_code(*g), o.message, g->failover_lost());
      });
      break;
    case LeaveOutcome::Kind::Left:
      if (!was_detached_before) loop_.stats.record_ended(*g);
      log_info(o.message);
      if (g->failover()) loop_.releases.on_member_left(*g);
      break;
    case LeaveOutcome::Kind::Quiet: log_debug("closed " + c->peer + ": " + c->why); break;
  }
  if (g->joined() == 0) {
    for (Slot& s : g->slots())
      if (s.seq >= 0) {
        srv->busy_slots--;
        s.seq = -1;
      }
  }
}

void Membership::expire_groups() {
  const ServerOptions& opts = loop_.srv->opts;
  loop_.table->release_idle(net::Clock::now(), ms(opts.memory_idle_timeout));  // renewed in try_claim
  auto expired = loop_.table->take_expired(net::Clock::now(), ms(opts.group_timeout));
  for (auto& g : expired) {
    const std::string msg = g->incomplete_message(int(opts.group_timeout));
    g->mark_failed(msg);
    loop_.stats.record_ended(*g);
    log_warn(msg);
    g->for_each_member([&](Conn* m) {
      loop_.set_state(m, ConnState::Closing);
      m->why = msg;
      m->close_after_flush = true;
      loop_.out.send_reply(m, proto::Status::GroupIncomplete, msg);
    });
  }
}

}  // namespace rs::server
