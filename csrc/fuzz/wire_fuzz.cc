// libFuzzer target for the parsers of everything a reducer or a worker reads from
// the network (csrc/protocol/wire.cc): CHALLENGE, HELLO (fixed part and names), REPLY
// and frame headers. Built by scripts/fuzz.sh, never by setup.py (csrc/fuzz is
// excluded from the extension's sources).
//
// Input: byte 0 picks the parser, the rest is what the peer sent. Besides "no crash,
// no sanitizer report", every accepted message is checked against the documented
// invariants (docs/protocol.md), and re-encoding what was decoded must give back the
// same bytes: a parser that accepts something it should not, or loses a field, aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz/fuzz_input.h"
#include "kernels/kernels.h"
#include "protocol/wire.h"
#include "server/handshake.h"

namespace {

namespace proto = rs::proto;

void fuzz_challenge(const uint8_t* p, size_t n) {
  if (n < proto::kChallengeBytes) return;
  proto::Challenge c;
  if (!proto::decode(p, &c).empty()) return;
  uint8_t again[proto::kChallengeBytes];
  proto::encode(c, again);
  // Reserved bytes are written as zero; everything the decoder kept must round-trip.
  FUZZ_CHECK(std::memcmp(again, p, 7) == 0);
  FUZZ_CHECK(std::memcmp(again + 8, p + 8, 4) == 0);
  FUZZ_CHECK(std::memcmp(again + 16, p + 16, proto::kNonceBytes) == 0);
}

void fuzz_hello(const uint8_t* p, size_t n) {
  if (n < proto::kHelloFixedBytes) return;
  proto::Hello h;
  size_t job_len = 0, group_len = 0;
  std::string err = proto::decode_fixed(p, &h, &job_len, &group_len);
  if (!err.empty() || h.version != proto::kVersion) return;
  // Accepted: every documented range holds.
  FUZZ_CHECK(h.world_size >= 1 && h.world_size <= proto::kMaxWorldSize);
  FUZZ_CHECK(h.rank < h.world_size);
  FUZZ_CHECK(h.num_streams >= 1 && h.num_streams <= proto::kMaxStreams);
  FUZZ_CHECK(h.stream_index < h.num_streams);
  FUZZ_CHECK(h.chunk_bytes >= proto::kMinChunkBytes && h.chunk_bytes <= proto::kMaxChunkBytes);
  FUZZ_CHECK(h.chunk_bytes % 8 == 0);
  FUZZ_CHECK(job_len <= proto::kMaxNameBytes && group_len <= proto::kMaxNameBytes);
  const size_t names = job_len + group_len;
  if (n - proto::kHelloFixedBytes < names) return;  // the reducer would keep reading
  h.job_id.assign(reinterpret_cast<const char*>(p + proto::kHelloFixedBytes), job_len);
  h.group.assign(reinterpret_cast<const char*>(p + proto::kHelloFixedBytes + job_len), group_len);
  // Re-encoding gives the same bytes (the reserved field is written as zero).
  std::string again = proto::encode(h);
  FUZZ_CHECK(again.size() == proto::kHelloFixedBytes + names);
  std::string orig(reinterpret_cast<const char*>(p), proto::kHelloFixedBytes + names);
  std::memset(&orig[28], 0, 4);
  FUZZ_CHECK(again == orig);
  // What the MAC covers is the whole hello with the MAC zeroed.
  std::string unsigned_bytes = proto::encode_unsigned(h);
  FUZZ_CHECK(unsigned_bytes.size() == again.size());
  FUZZ_CHECK(std::memcmp(unsigned_bytes.data() + 64, std::string(proto::kMacBytes, '\0').data(), proto::kMacBytes) ==
             0);
  // Names the reducer accepts contain only the documented characters (they reach logs and keys).
  for (const std::string* name : {&h.job_id, &h.group}) {
    if (!proto::check_name("name", *name).empty()) continue;
    FUZZ_CHECK(!name->empty() && name->size() <= proto::kMaxNameBytes);
    for (char ch : *name) FUZZ_CHECK(ch > 32 && ch < 127 && ch != '\\' && ch != '"' && ch != '\'');
  }
}

void fuzz_reply(const uint8_t* p, size_t n) {
  if (n < proto::kReplyFixedBytes) return;
  proto::Reply r;
  size_t msg_len = 0;
  if (!proto::decode_reply_fixed(p, &r, &msg_len).empty()) return;
  FUZZ_CHECK(msg_len <= proto::kMaxMessageBytes);
  (void)proto::status_name(r.status);
  if (n - proto::kReplyFixedBytes < msg_len) return;
  r.message.assign(reinterpret_cast<const char*>(p + proto::kReplyFixedBytes), msg_len);
  std::string again = proto::encode(r);
  FUZZ_CHECK(again.size() == proto::kReplyFixedBytes + msg_len);
  FUZZ_CHECK(std::memcmp(again.data(), p, proto::kReplyFixedBytes + msg_len) == 0);
}

void fuzz_frame(const uint8_t* p, size_t n) {
  if (n < 4 + proto::kFrameHeaderBytes) return;
  // The first four bytes choose the connection's chunk size (a valid one, as after a hello).
  uint32_t chunk = proto::get_u32(p);
  chunk = proto::kMinChunkBytes + (chunk % (proto::kMaxChunkBytes - proto::kMinChunkBytes + 1));
  chunk -= chunk % 8;
  p += 4;
  proto::FrameHeader h;
  if (!proto::decode(p, &h, chunk).empty()) return;
  uint8_t again[proto::kFrameHeaderBytes];
  proto::encode(h, again);
  FUZZ_CHECK(std::memcmp(again, p, proto::kFrameHeaderBytes) == 0);
  if (h.type == proto::FrameType::Error || h.type == proto::FrameType::Bye) {
    FUZZ_CHECK(h.length <= proto::kMaxMessageBytes);
    return;
  }
  if (h.type == proto::FrameType::Done || h.type == proto::FrameType::Clear) {
    FUZZ_CHECK(h.length == 0);  // header only
    return;
  }
  // An accepted DATA/RESULT header never lets a payload land outside its shard.
  FUZZ_CHECK(rs::valid_dtype(h.dtype) && rs::valid_op(h.op));
  const uint64_t es = rs::dtype_size(rs::DType(h.dtype));
  FUZZ_CHECK(h.length > 0 && h.length <= chunk && h.length % es == 0);
  FUZZ_CHECK(h.shard_bytes <= h.total_bytes);
  FUZZ_CHECK(h.offset <= h.shard_bytes && uint64_t(h.length) <= h.shard_bytes - h.offset);
  FUZZ_CHECK(h.offset + h.length <= h.shard_bytes);  // no wrap-around
  FUZZ_CHECK(h.offset % es == 0);
}

// The reducer's whole decision on a hello (server/handshake.h), with a secret configured: an
// accepted hello has valid names and a MAC made with the job's key.
void fuzz_server_hello(const uint8_t* p, size_t n) {
  if (n < proto::kHelloFixedBytes) return;
  proto::Hello h;
  size_t job_len = 0, group_len = 0;
  rs::server::Verdict v = rs::server::check_hello_fixed(p, &h, &job_len, &group_len, "peer");
  if (!v.ok() || n - proto::kHelloFixedBytes < job_len + group_len) return;
  std::string names(reinterpret_cast<const char*>(p + proto::kHelloFixedBytes), job_len + group_len);
  std::array<uint8_t, proto::kNonceBytes> nonce{};
  proto::Key key{};
  bool authenticated = false;
  v = rs::server::check_hello_names(&h, names, job_len, "secret", nonce, "peer", &key, &authenticated);
  if (!v.ok()) return;
  FUZZ_CHECK(authenticated);
  FUZZ_CHECK(proto::check_name("job", h.job_id).empty() && proto::check_name("group", h.group).empty());
  FUZZ_CHECK(proto::hello_mac(proto::job_key("secret", h.job_id), h, nonce) == h.mac);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 5) {
    case 0: fuzz_challenge(p, n); break;
    case 1: fuzz_hello(p, n); break;
    case 2: fuzz_reply(p, n); break;
    case 3: fuzz_frame(p, n); break;
    default: fuzz_server_hello(p, n); break;
  }
  return 0;
}
