#include "client/handshake.h"

#include "client/peer_text.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/log.h"
#include "protocol/hmac.h"

namespace rs::client {

namespace {

[[noreturn]] void throw_reply(const std::string& peer, proto::Status st, const std::string& msg) {
  std::string text = peer + " refused the connection (" + proto::status_name(st) + "): " + msg;  // msg: quoted
  switch (st) {
    case proto::Status::AuthFailed: throw Error(ErrorKind::Auth, text);
    case proto::Status::BadVersion:
    case proto::Status::BadHello: throw Error(ErrorKind::Protocol, text);
    case proto::Status::GroupConflict: throw Error(ErrorKind::Mismatch, text);
    case proto::Status::GroupIncomplete: throw Error(ErrorKind::Timeout, text);
    case proto::Status::IntegrityMismatch: throw Error(ErrorKind::Config, text);
    default: throw Error(ErrorKind::Connect, text);
  }
}

}  // namespace

PendingLink begin_handshake(const net::HostPort& addr, const std::string& peer, proto::Hello h,
                            const proto::Credential& cred, int socket_buffer, net::Clock::time_point deadline,
                            const net::Interrupt& intr) {
  PendingLink l;
  l.peer = peer;
  l.integrity = (h.flags & proto::kHelloIntegrity) != 0;
  if (l.integrity && !cred.present())
    throw Error(ErrorKind::Config,
                "frame integrity (RS_INTEGRITY) needs authentication: give the worker the shared "
                "secret or its job's credential (RS_AUTH_TOKEN / RS_AUTH_TOKEN_FILE)");
  uint8_t chbuf[proto::kChallengeBytes];
  // A reducer at its connection cap closes new connections before its challenge: it is busy,
  // not gone, so retry with back-off until the deadline (then the last error stands).
  for (auto backoff = std::chrono::milliseconds(50);;
       backoff = std::min(backoff * 2, std::chrono::milliseconds(1000))) {
    l.fd = net::connect_with_retry(addr, deadline, intr);
    net::tune_socket(l.fd.get(), socket_buffer);
    try {
      net::recv_all(l.fd.get(), chbuf, sizeof chbuf, deadline, peer, intr);
      break;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::PeerLost || net::Clock::now() + backoff >= deadline) throw;
      log_debug(peer + " closed the connection before its challenge (at its connection cap?): retrying");
      net::pause_interruptible(backoff, intr);
    }
  }
  proto::Challenge ch;
  std::string err = proto::decode(chbuf, &ch);
  if (!err.empty()) throw Error(ErrorKind::Protocol, addr.str() + ": " + err);
  if (ch.version != proto::kVersion)
    throw Error(ErrorKind::Protocol, peer + " speaks protocol version " + std::to_string(ch.version) +
                                         ", this worker speaks version " + std::to_string(proto::kVersion));
  // A worker without a credential still sends its hello to a reducer that requires one: the
  // reducer refuses it with AuthFailed and logs the attempt, which is what an operator looks for.
  if (!ch.auth_required && cred.present())
    throw Error(ErrorKind::Auth, "authentication failed: " + peer +
                                     " does not authenticate (it has no secret) but this worker has a credential: "
                                     "refusing to send gradients to a reducer that cannot prove who it is");
  l.challenge_nonce = ch.nonce;
  proto::random_bytes(l.worker_nonce.data(), l.worker_nonce.size());
  h.nonce = l.worker_nonce;
  if (cred.present()) {
    l.authenticated = true;
    l.key = cred.key_for(h.job_id);
    h.mac = proto::hello_mac(l.key, h, ch.nonce);
  }
  std::string bytes = proto::encode(h);
  net::send_all(l.fd.get(), bytes.data(), bytes.size(), deadline, peer, intr);
  return l;
}

proto::Status finish_handshake(PendingLink& l, net::Clock::time_point deadline, const net::Interrupt& intr) {
  uint8_t rb[proto::kReplyFixedBytes];
  net::recv_all(l.fd.get(), rb, sizeof rb, deadline, l.peer + " (waiting for all workers of the group)", intr);
  proto::Reply reply;
  size_t mlen = 0;
  std::string err = proto::decode_reply_fixed(rb, &reply, &mlen);
  if (!err.empty()) throw Error(ErrorKind::Protocol, l.peer + ": " + err);
  reply.message.assign(mlen, '\0');
  if (mlen) net::recv_all(l.fd.get(), &reply.message[0], mlen, deadline, l.peer, intr);
  return judge_reply(l, reply);
}

proto::Status judge_reply(const PendingLink& l, const proto::Reply& reply) {
  std::string quoted = peer_text(reply.message);
  if (l.authenticated) {
    proto::Digest got;
    std::copy(reply.mac.begin(), reply.mac.end(), got.begin());
    const bool authentic = proto::digest_equal(proto::reply_mac(l.key, reply, l.worker_nonce, l.challenge_nonce), got);
    if (!authentic && reply.status == proto::Status::Ok)
      throw Error(ErrorKind::Auth, "authentication failed: " + l.peer +
                                       " could not prove that it knows the secret (bad reply MAC): "
                                       "not a reducer of this job, or the reducer has another secret");
    if (!authentic) quoted += " [unauthenticated reply]";
  }
  if (reply.status == proto::Status::Ok || reply.status == proto::Status::RankTaken) return reply.status;
  throw_reply(l.peer, reply.status, quoted);
}

void protect_link(const PendingLink& l, net::FrameWriter* out, net::FrameReader* in) {
  if (!l.integrity) return;
  net::protect(out, in, l.key, l.worker_nonce, l.challenge_nonce, proto::Direction::WorkerToReducer);
}

}  // namespace rs::client
