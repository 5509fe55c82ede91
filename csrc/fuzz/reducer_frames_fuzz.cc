// libFuzzer target for the worker's parsing of everything a reducer sends it: the handshake
// reply (client/handshake.h judge_reply, with and without authentication), and after it RESULT,
// CLEAR, ERROR and BYE frames as client.cc takes them (proto::decode with the link's chunk size,
// then client/reducer_frames.h against a round in flight that the input describes). Built by
// scripts/fuzz.sh.
//
// Besides "no crash, no sanitizer report": an accepted RESULT lands inside its shard, in a chunk
// this worker has written, in chunk order, never longer than the chunk; an accepted CLEAR never
// names a round beyond the last DONE; every text a reducer sends reaches an exception or a log
// line as printable ASCII of bounded length (peer_text).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "client/handshake.h"
#include "client/peer_text.h"
#include "client/reducer_frames.h"
#include "common/error.h"
#include "fuzz/fuzz_input.h"
#include "protocol/auth.h"
#include "protocol/plan.h"
#include "protocol/wire.h"

namespace {

namespace proto = rs::proto;
using namespace rs::client;

using rs::fuzz::Input;

bool printable(const std::string& s) {
  for (char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

// Quoted peer text: printable, and at most the cap plus the "... (N bytes)" suffix.
void check_quoted(const std::string& raw) {
  const std::string q = peer_text(raw);
  FUZZ_CHECK(printable(q));
  FUZZ_CHECK(q.size() <= kPeerTextChars + 5 + 20 + 7);
  const std::string e = reducer_error_text("127.0.0.1:1", raw);
  FUZZ_CHECK(printable(e) && e.size() == std::string("reducer 127.0.0.1:1: ").size() + q.size());
}

// The reply to a hello: a refusal's exception never carries raw peer text; an Ok from a reducer
// that must authenticate itself is accepted only with the right MAC.
void fuzz_reply(Input in) {
  PendingLink link;
  link.peer = "reducer 127.0.0.1:1";
  link.authenticated = in.byte() & 1;
  link.key = proto::job_key("secret", "job");
  std::string fixed = in.bytes(proto::kReplyFixedBytes);
  if (fixed.size() < proto::kReplyFixedBytes) return;
  proto::Reply reply;
  size_t mlen = 0;
  if (!proto::decode_reply_fixed(reinterpret_cast<const uint8_t*>(fixed.data()), &reply, &mlen).empty()) return;
  FUZZ_CHECK(mlen <= proto::kMaxMessageBytes);
  reply.message = in.bytes(mlen);
  check_quoted(reply.message);
  if (link.authenticated && (in.byte() & 1))  // the real MAC: an authentic reply
    reply.mac = proto::reply_mac(link.key, reply, link.worker_nonce, link.challenge_nonce);
  try {
    const proto::Status st = judge_reply(link, reply);
    FUZZ_CHECK(st == proto::Status::Ok || st == proto::Status::RankTaken);
    if (link.authenticated && st == proto::Status::Ok)
      FUZZ_CHECK(proto::digest_equal(proto::reply_mac(link.key, reply, link.worker_nonce, link.challenge_nonce), [&] {
        proto::Digest d;
        std::memcpy(d.data(), reply.mac.data(), d.size());
        return d;
      }()));
  } catch (const rs::Error& e) {
    FUZZ_CHECK(printable(e.what()));
    FUZZ_CHECK(std::strlen(e.what()) <= 200 + kPeerTextChars + 32 + 24);
  }
}

// Frames after the handshake, against one round in flight on one link.
void fuzz_frames(Input in) {
  const uint32_t chunk_bytes = uint32_t(proto::kMinChunkBytes + 8 * (in.u64() % 4096));
  const uint64_t streams = 1 + in.byte() % 4, stream = in.byte() % streams;
  const uint8_t dtype = in.byte() % 6;
  const uint64_t es = dtype == 0 || dtype == 4 ? 4 : dtype == 2 || dtype == 3 ? 2 : 8;
  const uint64_t round_no = in.byte();
  SentRound sent{dtype, uint8_t(in.byte() % 4), es * (1 + in.u64() % (1u << 22))};
  LinkShare share;
  share.shard_bytes = es * ((in.u64() % (sent.nbytes / es)) + 1);
  share.chunk = proto::chunk_for(share.shard_bytes, chunk_bytes);
  share.nchunks = (share.shard_bytes + share.chunk - 1) / share.chunk;
  share.expected = share.nchunks > stream ? (share.nchunks - stream + streams - 1) / streams : 0;
  share.written = in.byte() % (share.expected + 1);
  const bool failover = in.byte() & 1;
  const uint64_t done_sent = in.u64() >> (in.byte() % 64);
  for (int frames = 0; frames < 16 && in.n >= proto::kFrameHeaderBytes; ++frames) {
    const std::string raw = in.bytes(proto::kFrameHeaderBytes);
    proto::FrameHeader h;
    if (!proto::decode(reinterpret_cast<const uint8_t*>(raw.data()), &h, chunk_bytes).empty()) return;
    switch (h.type) {
      case proto::FrameType::Result: {
        const std::string why = check_result(h, h.round == round_no ? &sent : nullptr, share, stream, streams);
        FUZZ_CHECK(printable(why));
        if (!why.empty()) return;  // the worker drops the session
        FUZZ_CHECK(h.round == round_no && h.total_bytes == sent.nbytes && h.shard_bytes == share.shard_bytes);
        FUZZ_CHECK(share.received < share.written && share.received < share.expected);
        FUZZ_CHECK(h.offset == (stream + share.received * streams) * share.chunk);
        FUZZ_CHECK(h.length <= share.chunk && h.length <= chunk_bytes && h.offset + h.length <= share.shard_bytes);
        share.received++;
        share.written += in.byte() % 2 && share.written < share.expected ? 1 : 0;
        break;
      }
      case proto::FrameType::Clear: {
        const std::string why = check_clear(h.round, done_sent, failover);
        FUZZ_CHECK(printable(why));
        if (why.empty()) FUZZ_CHECK(failover && h.round <= done_sent);
        break;
      }
      case proto::FrameType::Error:
      case proto::FrameType::Bye:
        FUZZ_CHECK(h.length <= proto::kMaxMessageBytes);
        check_quoted(in.bytes(h.length));
        break;
      default: return;  // DATA / DONE from a reducer: the worker refuses them
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Input in{data + 1, size - 1};
  switch (data[0] % 3) {
    case 0: fuzz_reply(in); break;
    case 1: fuzz_frames(in); break;
    default: check_quoted(in.bytes(in.n)); break;
  }
  return 0;
}
