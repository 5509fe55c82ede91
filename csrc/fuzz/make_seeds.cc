// Writes the fuzzer's seed corpus: one valid message of each kind, made with the
// reducer's own encoders (so the seeds follow the protocol version being fuzzed).
// Usage: make_seeds DIR   (file names: <kind>-<n>; byte 0 selects the parser, see wire_fuzz.cc)
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "protocol/auth.h"
#include "protocol/wire.h"

namespace proto = rs::proto;

static bool write_seed(const std::string& dir, const std::string& name, char selector, const std::string& body) {
  std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  std::fputc(selector, f);
  std::fwrite(body.data(), 1, body.size(), f);
  return std::fclose(f) == 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = true;

  proto::Challenge c;
  c.auth_required = 1;
  for (size_t i = 0; i < c.nonce.size(); ++i) c.nonce[i] = uint8_t(i * 7 + 1);
  std::string cb(proto::kChallengeBytes, '\0');
  proto::encode(c, reinterpret_cast<uint8_t*>(&cb[0]));
  ok &= write_seed(dir, "challenge-0", 0, cb);

  proto::Hello h;
  h.world_size = 4;
  h.rank = 3;
  h.num_streams = 2;
  h.stream_index = 1;
  h.chunk_bytes = 1 << 20;
  h.job_id = "job-1";
  h.group = "grad.bucket:0";
  ok &= write_seed(dir, "hello-0", 1, proto::encode(h));
  h.world_size = 1;
  h.rank = 0;
  h.num_streams = 1;
  h.stream_index = 0;
  h.chunk_bytes = 64;
  h.job_id = "j";
  h.group = "g";
  ok &= write_seed(dir, "hello-1", 1, proto::encode(h));
  // An authenticated hello as the reducer's decision sees it (secret "secret", zero challenge nonce).
  h.mac = proto::hello_mac(proto::job_key("secret", h.job_id), h, std::array<uint8_t, proto::kNonceBytes>{});
  ok &= write_seed(dir, "server-hello-0", 4, proto::encode(h));

  proto::Reply reply;
  reply.message = "welcome";
  ok &= write_seed(dir, "reply-0", 2, proto::encode(reply));
  reply.status = proto::Status::GroupConflict;
  reply.message = "world size 3 differs";
  for (size_t k = 0; k < reply.mac.size(); ++k) reply.mac[k] = uint8_t(k + 3);
  ok &= write_seed(dir, "reply-1", 2, proto::encode(reply));

  struct F { proto::FrameType t; uint8_t dtype; uint32_t len; uint64_t total, shard, off; std::string text; };
  std::vector<F> frames = {
      {proto::FrameType::Data, 0, 4096, 1 << 20, 1 << 19, 8192, ""},
      {proto::FrameType::Data, 5, 8, 8, 8, 0, ""},
      {proto::FrameType::Result, 3, 2, 1000, 1000, 998, ""},
      {proto::FrameType::Error, 0, 0, 0, 0, 0, "rank 1 disconnected"},
      {proto::FrameType::Bye, 0, 0, 0, 0, 0, "done"},
  };
  int i = 0;
  for (const F& f : frames) {
    proto::FrameHeader fh;
    fh.type = f.t;
    fh.dtype = f.dtype;
    fh.flags = 1;
    fh.round = 7;
    fh.total_bytes = f.total;
    fh.shard_bytes = f.shard;
    fh.offset = f.off;
    fh.length = f.text.empty() ? f.len : uint32_t(f.text.size());
    std::string body(4 + proto::kFrameHeaderBytes, '\0');
    proto::put_u32(reinterpret_cast<uint8_t*>(&body[0]), 1u << 20);  // chunk size of the connection
    proto::encode(fh, reinterpret_cast<uint8_t*>(&body[4]));
    body += f.text;
    ok &= write_seed(dir, "frame-" + std::to_string(i++), 3, body);
  }
  if (!ok) {
    std::fprintf(stderr, "make_seeds: cannot write into %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
