// The reducer's side of the handshake as pure functions (docs/protocol.md section 1): from the
// bytes a worker sent and the reducer's secret to an accept/refuse decision, and the reply.
// The event loop only moves bytes; it never decides here.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "protocol/auth.h"
#include "protocol/wire.h"
#include "server/server.h"

namespace rs::server {

struct Verdict {
  proto::Status status = proto::Status::Ok;
  std::string message;   // why the hello is refused (for the reply and the log)
  bool garbage = false;  // not a reduction-server hello at all: close without a reply
  bool ok() const { return !garbage && status == proto::Status::Ok; }
};

// The fixed part of a hello; on success *job_len/*group_len say how many name bytes follow.
Verdict check_hello_fixed(const uint8_t fixed[proto::kHelloFixedBytes], proto::Hello* h, size_t* job_len,
                          size_t* group_len, const std::string& peer);

// The names (job id then group name, `job_len` bytes of `names` for the job) and, with a secret,
// the hello's MAC under the job's key. On success with a secret, *key is the job's key (the
// reply is authenticated with it) and *authenticated is true.
Verdict check_hello_names(proto::Hello* h, const std::string& names, size_t job_len, const std::string& secret,
                          const std::array<uint8_t, proto::kNonceBytes>& challenge_nonce, const std::string& peer,
                          proto::Key* key, bool* authenticated);

// Whether the hello's frame integrity flag agrees with the reducer's mode (resolved, not Auto).
Verdict check_integrity(const proto::Hello& h, IntegrityMode mode, const std::string& peer);

// The reply bytes; authenticated with `key` when `authenticated` (else a zero MAC).
std::string make_reply(proto::Status status, const std::string& message, bool authenticated, const proto::Key& key,
                       const std::array<uint8_t, proto::kNonceBytes>& worker_nonce,
                       const std::array<uint8_t, proto::kNonceBytes>& challenge_nonce);

}  // namespace rs::server
