#include "server/output.h"

#include <sys/epoll.h>

#include "common/error.h"
#include "server/conn.h"
#include "server/handshake.h"
#include "server/loop.h"
#include "server/server_impl.h"

namespace rs::server {

std::string error_frame(proto::ErrorCode code, const std::string& msg, uint64_t tag) {
  std::string text = msg.substr(0, proto::kMaxMessageBytes);
  proto::FrameHeader h;
  h.type = proto::FrameType::Error;
  h.flags = uint8_t(code);
  h.tag = tag;
  h.length = uint32_t(text.size());
  std::string bytes(proto::kFrameHeaderBytes, '\0');
  proto::encode(h, reinterpret_cast<uint8_t*>(&bytes[0]));
  bytes += text;
  return bytes;
}

void Output::update_mask(Conn* c) {
  if (c->dead) return;
  uint32_t want = EPOLLRDHUP;
  bool reading = !c->paused && !c->close_after_flush && c->state != ConnState::Leaving;
  if (reading) want |= EPOLLIN;
  if (!c->out.empty()) want |= EPOLLOUT;
  if (c->registered && want == c->epoll_mask) return;
  epoll_event e{};
  e.events = want;
  e.data.fd = c->fd.get();
  epoll_ctl(loop_.ep.get(), c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd.get(), &e);
  c->registered = true;
  c->epoll_mask = want;
}

void Output::send_ctl(Conn* c, std::string bytes) {
  c->out.push_copy(std::move(bytes), 0);
  flush(c);
}

void Output::send_error(Conn* c, proto::ErrorCode code, const std::string& msg, uint64_t tag) {
  std::string bytes = error_frame(code, msg, tag);
  // Results already queued are complete and correct: they go out before the error.
  c->close_after_flush = true;
  send_ctl(c, std::move(bytes));
}

void Output::send_reply(Conn* c, proto::Status status, const std::string& msg) {
  send_ctl(c, make_reply(status, msg, c->authenticated, c->key, c->hello.nonce, c->nonce));
}

void Output::flush(Conn* c) {
  if (c->dead) return;
  // A CLEAR owed goes in the same write as whatever else is queued (a result, most often).
  if (Releases::owes_clear(c)) loop_.releases.queue_clear(c);
  std::vector<Slot*>& delivered = delivered_;
  const size_t mark = delivered.size();  // flush() may nest through result_delivered()
  try {
    net::IoResult res = c->out.flush(c->fd.get(), c->peer, nullptr, [&](uint64_t token) {
      if (token == kClearToken) c->clear_queued = false;
      else if (token) delivered.push_back(reinterpret_cast<Slot*>(token));
    });
    loop_.srv->bytes_sent += res.bytes;
    if (c->group) c->group->bytes_sent += res.bytes;
  } catch (const Error& e) {
    delivered.resize(mark);
    loop_.kill(c, e.what(), true);
    return;
  }
  for (size_t i = mark; i < delivered.size() && !c->dead; ++i) loop_.data.result_delivered(c, delivered[i]);
  delivered.resize(mark);
  if (c->dead) return;
  if (Releases::owes_clear(c)) {
    loop_.releases.queue_clear(c);  // CLEARs are cumulative: the newest one replaces those not sent
    return flush(c);
  }
  if (c->out.empty() && c->close_after_flush) {
    loop_.kill(c, c->why.empty() ? "closed after error" : c->why, false, true);
    return;
  }
  update_mask(c);
}

}  // namespace rs::server
