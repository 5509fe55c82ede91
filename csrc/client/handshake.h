// The worker's side of the handshake (docs/protocol.md section 1): connect, read the reducer's
// challenge, send an authenticated hello, then read the reply, which arrives only when the whole
// group has connected (a rendezvous) and, with a credential, must prove the reducer knows the key.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "net/frame_io.h"
#include "net/socket.h"
#include "protocol/auth.h"
#include "protocol/wire.h"

namespace rs::client {

// A connection whose hello is sent and whose reply is still to come.
struct PendingLink {
  net::Fd fd;
  std::string peer;  // for messages, e.g. "reducer 10.0.0.5:2222 (stream 1)"
  bool authenticated = false;
  proto::Key key{};
  std::array<uint8_t, proto::kNonceBytes> worker_nonce{};
  std::array<uint8_t, proto::kNonceBytes> challenge_nonce{};
  bool integrity = false;  // the hello asked for frame integrity: an Ok reply means it is on
};

// After an Ok reply: turns on frame integrity on the link's writer and reader if it was asked for.
void protect_link(const PendingLink& link, net::FrameWriter* out, net::FrameReader* in);

// Phase 1: `hello` says who this worker is; its nonce and MAC are filled in here.
// Throws Error(Connect/Protocol/Auth/Timeout) naming `peer`; Error(Config) when the hello asks
// for frame integrity (proto::kHelloIntegrity) without a credential. `intr` may end every wait
// early (it throws: net/deadline.h).
PendingLink begin_handshake(const net::HostPort& addr, const std::string& peer, proto::Hello hello,
                            const proto::Credential& cred, int socket_buffer, net::Clock::time_point deadline,
                            const net::Interrupt& intr = net::Interrupt());

// Phase 2: returns Status::Ok, or Status::RankTaken (retryable); throws for every other status,
// for a reply that is not authentic, and at the deadline.
proto::Status finish_handshake(PendingLink& link, net::Clock::time_point deadline,
                               const net::Interrupt& intr = net::Interrupt());

// Phase 2 without the socket: the verdict on a complete reply (its message is quoted through
// peer_text() in the exception), as finish_handshake() gives it.
proto::Status judge_reply(const PendingLink& link, const proto::Reply& reply);

}  // namespace rs::client
