#include "server/handshake.h"

#include "protocol/hmac.h"

namespace rs::server {

Verdict check_hello_fixed(const uint8_t fixed[proto::kHelloFixedBytes], proto::Hello* h, size_t* job_len,
                          size_t* group_len, const std::string& peer) {
  Verdict v;
  if (proto::get_u32(fixed) != proto::kMagic) {
    v.garbage = true;
    v.message = "garbage from " + peer + " (no reduction-server hello): connection closed";
    return v;
  }
  std::string err = proto::decode_fixed(fixed, h, job_len, group_len);
  if (h->version != proto::kVersion) {
    v.status = proto::Status::BadVersion;
    v.message = "protocol version mismatch: reducer speaks version " + std::to_string(proto::kVersion) + ", worker " +
                peer + " sent version " + std::to_string(h->version);
  } else if (!err.empty()) {
    v.status = proto::Status::BadHello;
    v.message = "bad hello from " + peer + ": " + err;
  }
  return v;
}

Verdict check_hello_names(proto::Hello* h, const std::string& names, size_t job_len, const std::string& secret,
                          const std::array<uint8_t, proto::kNonceBytes>& challenge_nonce, const std::string& peer,
                          proto::Key* key, bool* authenticated) {
  Verdict v;
  h->job_id = names.substr(0, job_len);
  h->group = names.substr(job_len);
  for (const std::string& why : {proto::check_name("job id", h->job_id), proto::check_name("group name", h->group)}) {
    if (why.empty()) continue;
    v.status = proto::Status::BadHello;
    v.message = "bad hello from " + peer + ": " + why;
    return v;
  }
  *authenticated = false;
  if (secret.empty()) return v;
  *key = proto::job_key(secret, h->job_id);
  proto::Digest got;
  std::copy(h->mac.begin(), h->mac.end(), got.begin());
  if (!proto::digest_equal(proto::hello_mac(*key, *h, challenge_nonce), got)) {
    v.status = proto::Status::AuthFailed;
    v.message = "authentication failed for " + peer + " (job " + h->job_id +
                "): the worker holds neither the reducer's secret nor a credential for this job " +
                "(RS_AUTH_TOKEN / `reduction-server job-token`)";
    return v;
  }
  *authenticated = true;
  return v;
}

Verdict check_integrity(const proto::Hello& h, IntegrityMode mode, const std::string& peer) {
  Verdict v;
  const bool asked = (h.flags & proto::kHelloIntegrity) != 0;
  if (asked && mode == IntegrityMode::Off) {
    v.status = proto::Status::IntegrityMismatch;
    v.message = "worker " + peer + " asks for frame integrity, which this reducer does not offer " +
                "(start it with a shared secret and --integrity on, or RS_INTEGRITY=on)";
  } else if (!asked && mode == IntegrityMode::Required) {
    v.status = proto::Status::IntegrityMismatch;
    v.message = "this reducer requires frame integrity and worker " + peer +
                " did not ask for it: set RS_INTEGRITY=on (or integrity='on') on the workers";
  }
  return v;
}

std::string make_reply(proto::Status status, const std::string& message, bool authenticated, const proto::Key& key,
                       const std::array<uint8_t, proto::kNonceBytes>& worker_nonce,
                       const std::array<uint8_t, proto::kNonceBytes>& challenge_nonce) {
  proto::Reply r;
  r.status = status;
  r.message = message.substr(0, proto::kMaxMessageBytes);
  if (authenticated) r.mac = proto::reply_mac(key, r, worker_nonce, challenge_nonce);
  return proto::encode(r);
}

}  // namespace rs::server
