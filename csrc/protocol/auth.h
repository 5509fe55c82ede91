// Authentication of the handshake (docs/security.md, docs/protocol.md section 1).
//
// Keys: the reducers hold a shared secret. Every job has its own key,
//   K_job = HMAC-SHA256(secret, "reduction-server job key v1" || 0x00 || job id),
// so a worker given only its job's credential ("rsjob1:<job>:<hex K_job>") can join that job's
// groups and no other's. A worker given the secret itself derives K_job.
// Both directions are authenticated with K_job:
//   hello MAC = HMAC(K_job, "RSV2-HELLO" || challenge nonce || hello with zero mac || names)
//   reply MAC = HMAC(K_job, "RSV2-REPLY" || worker nonce || challenge nonce || reply with zero mac || message)
// Fresh nonces on both sides make a recorded hello or reply useless on another connection.
// Frame integrity (a hello with kHelloIntegrity, accepted by the reducer) keys each direction of
// the connection with its own key from K_job and both nonces (frame_key; net/frame_auth.h).
#pragma once

#include <string>

#include "protocol/hmac.h"
#include "protocol/wire.h"

namespace rs::proto {

using Key = Digest;

Key job_key(const std::string& secret, const std::string& job);

// What a worker was given as its token: nothing, the shared secret, or a job credential.
class Credential {
 public:
  Credential() = default;
  // Throws Error(Config) for a malformed "rsjob1:" credential.
  static Credential parse(const std::string& token);
  bool present() const { return kind_ != Kind::None; }
  // The key for `job`; throws Error(Auth) if this is a credential for another job.
  Key key_for(const std::string& job) const;

 private:
  enum class Kind { None, Secret, JobToken };
  Kind kind_ = Kind::None;
  std::string secret_;  // Kind::Secret
  std::string job_;     // Kind::JobToken
  Key key_{};           // Kind::JobToken
};

std::string format_job_token(const std::string& job, const Key& key);
// Whether `token` is a job credential ("rsjob1:..."), not a shared secret.
bool is_job_credential(const std::string& token);

Digest hello_mac(const Key& key, const Hello& h, const std::array<uint8_t, kNonceBytes>& challenge_nonce);
Digest reply_mac(const Key& key, const Reply& r, const std::array<uint8_t, kNonceBytes>& worker_nonce,
                 const std::array<uint8_t, kNonceBytes>& challenge_nonce);

// The two directions of a connection (the byte is part of the frame key and of every frame nonce).
enum class Direction : uint8_t { WorkerToReducer = 0, ReducerToWorker = 1 };

//   K_dir = HMAC-SHA256(K_job, "RSV2-FRAME-KEY" || dir || worker nonce || challenge nonce)
// Fresh nonces give every connection (and each of its directions) keys of its own.
Key frame_key(const Key& job_key, Direction dir, const std::array<uint8_t, kNonceBytes>& worker_nonce,
              const std::array<uint8_t, kNonceBytes>& challenge_nonce);

}  // namespace rs::proto
