#include "server/data_path.h"

#include "common/error.h"
#include "common/log.h"
#include "server/conn.h"
#include "server/group_table.h"
#include "server/loop.h"
#include "server/server_impl.h"

namespace rs::server {

namespace {

// Read budget per connection per wakeup; every frame costs at least its header plus
// net::IoBudget::kFrameCharge, so frames without payload (a flood of BYE headers) cannot starve
// the other connections of a loop.
constexpr size_t kReadBudget = 8u << 20;  // bytes per connection per wakeup

}  // namespace

bool DataPath::try_claim(Conn* c) {
  Group& g = *c->group;
  Slot& s = g.slot_for(c->seq_next);
  const std::string why = s.seq == -1 && !g.memory_held() ? loop_.table->renew(c->group) : "";  // idle: release_idle
  if (!why.empty()) {
    loop_.members.fail_group(c->group, proto::ErrorCode::Internal, why);
    return false;
  }
  if (s.seq == -1) {
    s.seq = c->seq_next;
    s.params = c->cur;
    s.first_rank = c->rank;
    loop_.srv->busy_slots++;
    if (c->cur.offset == 0 && g.key().stream == 0) g.round_started(c->cur.round, net::Clock::now());
  } else if (s.seq == c->seq_next) {
    std::string diff = Group::mismatch(s.params, s.first_rank, c->cur, c->rank);
    if (!diff.empty()) {
      loop_.members.fail_group(c->group, proto::ErrorCode::Mismatch, diff);
      return false;
    }
  } else {
    c->paused = true;  // an older chunk still owns the slot
    loop_.out.update_mask(c);
    return false;
  }
  c->paused = false;
  c->cur_slot = &s;
  return true;
}

void DataPath::protocol_error(Conn* c, const std::string& err) {
  const std::string who = c->who() + " of group " + c->gkey.label();
  Server::Impl::log_limited(loop_.srv->reject_log, LogLevel::Warning, "protocol error from " + who + ": " + err);
  loop_.srv->errors++;
  c->why = "protocol error: " + err;
  loop_.members.fail_group(c->group, proto::ErrorCode::Protocol, "protocol error from " + who + ": " + err);
  if (!c->dead && !c->close_after_flush) loop_.out.send_error(c, proto::ErrorCode::Protocol, c->why);
}

net::Sink DataPath::on_header(Conn* c, const proto::FrameHeader& h, const std::string& decode_error) {
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
  if (g.ended()) {
    const std::string why = g.left().empty() ? g.last_error() : g.left();
    const proto::ErrorCode code = Membership::end_code(g);
    loop_.members.fail_group(c->group, code, why);
    if (!c->dead && !c->close_after_flush) loop_.out.send_error(c, code, why, g.failover_lost());
    return net::Sink::stop();
  }
  c->cur = h;
  if (try_claim(c)) return net::Sink::memory(g.contribution(*c->cur_slot, c->rank));
  return c->paused ? net::Sink::pause() : net::Sink::stop();
}

bool DataPath::on_frame(Conn* c) {
  if (c->cur.type == proto::FrameType::Bye) {
    on_bye(c);
    return false;
  }
  if (c->cur.type == proto::FrameType::Done) {
    loop_.releases.on_done(c);  // (its CLEARs wait for the next frame: see Releases::on_done)
    return !c->dead && !c->close_after_flush && c->state == ConnState::Active;
  }
  on_payload(c);
  if (loop_.releases.any_due()) loop_.releases.flush_due();
  return !c->dead && !c->close_after_flush && !c->paused && c->state == ConnState::Active;
}

void DataPath::on_bye(Conn* c) {
  c->said_bye = true;
  c->bye_failover = (c->cur.flags & proto::kByeFailover) != 0;
  c->bye_lost = c->cur.tag;
  loop_.set_state(c, ConnState::Leaving);  // nothing more is read from this connection
  std::string text;
  for (char ch : c->text) text += (ch >= 32 && ch < 127) ? ch : '?';  // untrusted: printable only
  c->text.clear();
  c->why = text.empty() ? "said goodbye" : "said goodbye: " + text;
  log_debug(c->who() + " of group " + c->gkey.label() + " " + c->why);
  loop_.out.update_mask(c);
}

void DataPath::on_payload(Conn* c) {
  Slot& s = *c->cur_slot;
  Group& g = *c->group;
  s.arrived[c->rank] = 1;
  c->seq_next++;
  c->last_round = c->cur.round;
  c->cur_slot = nullptr;
  if (!g.advance(s)) return;
  loop_.srv->chunks_reduced++;
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
  keep->for_each_member([&](Conn* m) { loop_.out.flush(m); });
}

void DataPath::result_delivered(Conn* c, Slot* s) {
  std::shared_ptr<Group> g = c->group;
  if (g->failed() || --s->pending_sends > 0) return;
  if (s->params.flags & proto::kLastInStream) {
    g->rounds++;
    if (g->key().stream == 0) {
      loop_.srv->rounds_completed++;
      const double age = g->round_age(s->params.round, net::Clock::now());
      if (age >= 0) loop_.srv->record_latency(age);
    }
  }
  g->release(*s);
  loop_.srv->busy_slots--;
  g->for_each_member([&](Conn* m) {
    if (!m->paused || m->dead) return;
    m->paused = false;  // the reader offers the waiting header again
    read_data(m);
    loop_.out.update_mask(m);
  });
}

void DataPath::read_data(Conn* c) {
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
    else loop_.kill(c, e.what(), !(c->said_bye || c->close_after_flush));
    return;
  }
  loop_.srv->bytes_received += res.bytes;
  if (c->group) c->group->bytes_received += res.bytes;
}

}  // namespace rs::server
