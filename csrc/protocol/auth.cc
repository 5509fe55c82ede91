#include "protocol/auth.h"

#include "common/error.h"
#include "common/text.h"

namespace rs::proto {

namespace {

constexpr const char* kJobTokenPrefix = "rsjob1:";

std::string key_bytes(const Key& k) { return std::string(reinterpret_cast<const char*>(k.data()), k.size()); }

std::string nonce_bytes(const std::array<uint8_t, kNonceBytes>& n) {
  return std::string(reinterpret_cast<const char*>(n.data()), n.size());
}

}  // namespace

Key job_key(const std::string& secret, const std::string& job) {
  std::string label = "reduction-server job key v1";
  label.push_back('\0');
  return hmac_sha256(secret, label + job);
}

Credential Credential::parse(const std::string& token) {
  Credential c;
  if (token.empty()) return c;
  if (!is_job_credential(token)) {
    c.kind_ = Kind::Secret;
    c.secret_ = token;
    return c;
  }
  const size_t colon = token.rfind(':');
  const std::string hex = token.substr(colon + 1);
  c.job_ = colon > 7 ? token.substr(7, colon - 7) : "";
  if (hex.size() != 2 * c.key_.size() || c.job_.empty())
    throw Error(ErrorKind::Config,
                "malformed job credential: expected rsjob1:<job id>:<64 hex digits> "
                "(made by `reduction-server job-token --job ID`)");
  for (size_t i = 0; i < c.key_.size(); ++i) {
    const int hi = rs::hex_value(hex[2 * i]), lo = rs::hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) throw Error(ErrorKind::Config, "malformed job credential: the key is not hexadecimal");
    c.key_[i] = uint8_t(hi * 16 + lo);
  }
  c.kind_ = Kind::JobToken;
  return c;
}

Key Credential::key_for(const std::string& job) const {
  switch (kind_) {
    case Kind::Secret: return job_key(secret_, job);
    case Kind::JobToken:
      if (job != job_)
        throw Error(ErrorKind::Auth,
                    "authentication failed: the job credential is for job '" + job_ + "', not for job '" + job +
                        "' (set RS_JOB_ID to the credential's job, or make a credential for this job)");
      return key_;
    case Kind::None: break;
  }
  throw Error(ErrorKind::Config, "no credential");
}

bool is_job_credential(const std::string& token) { return token.compare(0, 7, kJobTokenPrefix) == 0; }

std::string format_job_token(const std::string& job, const Key& key) {
  return kJobTokenPrefix + job + ":" + rs::hex_bytes(key.data(), key.size());
}

Digest hello_mac(const Key& key, const Hello& h, const std::array<uint8_t, kNonceBytes>& challenge_nonce) {
  return hmac_sha256(key_bytes(key), "RSV2-HELLO" + nonce_bytes(challenge_nonce) + encode_unsigned(h));
}

Digest reply_mac(const Key& key, const Reply& r, const std::array<uint8_t, kNonceBytes>& worker_nonce,
                 const std::array<uint8_t, kNonceBytes>& challenge_nonce) {
  return hmac_sha256(key_bytes(key),
                     "RSV2-REPLY" + nonce_bytes(worker_nonce) + nonce_bytes(challenge_nonce) + encode_unsigned(r));
}

Key frame_key(const Key& job_key, Direction dir, const std::array<uint8_t, kNonceBytes>& worker_nonce,
              const std::array<uint8_t, kNonceBytes>& challenge_nonce) {
  std::string label = "RSV2-FRAME-KEY";
  label.push_back(char(dir));
  return hmac_sha256(key_bytes(job_key), label + nonce_bytes(worker_nonce) + nonce_bytes(challenge_nonce));
}

}  // namespace rs::proto
