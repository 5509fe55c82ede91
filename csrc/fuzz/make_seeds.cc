// Writes a fuzzer's seed corpus: valid inputs of each kind, made with the project's own encoders
// (so the seeds follow the protocol version being fuzzed).
// Usage: make_seeds DIR [TARGET]   (TARGET: wire (default), failover or reducer_frames; file names:
// <kind>-<n>; byte 0 selects what the target runs, see csrc/fuzz/<TARGET>_fuzz.cc)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

static std::string u64_bytes(uint64_t v) {
  std::string b(8, '\0');
  proto::put_u64(reinterpret_cast<uint8_t*>(&b[0]), v);
  return b;
}

static std::string header_bytes(const proto::FrameHeader& h) {
  std::string b(proto::kFrameHeaderBytes, '\0');
  proto::encode(h, reinterpret_cast<uint8_t*>(&b[0]));
  return b;
}

// csrc/fuzz/failover_fuzz.cc: an honest exchange of two workers (this worker: rounds 6 and 8
// unfinished, 6 with bytes [0, 8) in; rank 1 reports the same rounds), and the unbounded form.
static bool failover_seeds(const std::string& dir) {
  const std::string honest = {1, 0,  5, 2,        // world 2, rank 0, rounds from 5, two unfinished rounds:
                              0, 9,  1, 0, 1,     //   round 6 of 40 bytes, one span [0, 8)
                              1, 19, 0,           //   round 8 of 80 bytes, nothing in
                              1,                  // next round 10
                              0, 0,  0, 0,        // row 0 as sent; row 1: oldest, next and entries as this worker's
                              0,                  // this worker's entries as sent; rank 1's three:
                              0, 1,               //   (6, -1, -1)
                              0, 0,  0, 0, 3, 0,  //   (6, 0, 16)
                              2, 1};              //   (8, -1, -1)
  std::string raw = std::string(1, '\x01') + std::string(3, '\0');
  for (int i = 0; i < 6; ++i) raw += '\x80' + u64_bytes(i == 5 ? (~uint64_t(0)) / 6 + 1 : uint64_t(i));
  return write_seed(dir, "exchange-0", 0, honest) && write_seed(dir, "unbounded-0", 1, raw);
}

// csrc/fuzz/reducer_frames_fuzz.cc: a refusal, an authentic-looking Ok, frames for a round in
// flight (RESULT, CLEAR, ERROR), and text to quote.
static bool reducer_frame_seeds(const std::string& dir) {
  proto::Reply reply;
  reply.status = proto::Status::OverLimit;
  reply.message = "over the memory budget\n\x1b[31m";
  bool ok = write_seed(dir, "reply-0", 0, std::string(1, '\0') + proto::encode(reply));
  reply.status = proto::Status::Ok;
  reply.message = "";
  ok &= write_seed(dir, "reply-1", 0, std::string(1, '\x01') + proto::encode(reply) + '\x01');
  // chunk size 64, 1 stream, float32 round 7 of 1024 bytes (shard 1024, 16 chunks written),
  // failover on, last DONE 5; then RESULT chunk 0, CLEAR 3 and an ERROR.
  std::string f = u64_bytes(0) + std::string{0, 0, 0, 7, 0} + u64_bytes(255) + u64_bytes(255) + std::string{16, 1} +
                  u64_bytes(5) + std::string(1, '\0');
  proto::FrameHeader h;
  h.type = proto::FrameType::Result;
  h.round = 7;
  h.total_bytes = h.shard_bytes = 1024;
  h.length = 64;
  f += header_bytes(h);
  h = proto::FrameHeader{};
  h.type = proto::FrameType::Clear;
  h.round = 3;
  f += header_bytes(h);
  const std::string text = "reducer shutting down\r\n";
  h.type = proto::FrameType::Error;
  h.flags = 4;
  h.length = uint32_t(text.size());
  f += header_bytes(h) + text;
  ok &= write_seed(dir, "frames-0", 1, f);
  return ok && write_seed(dir, "text-0", 2, std::string("a\0b\x7f\xff\\\x1b[2J", 10) + std::string(300, 'x'));
}

// The plugin's environment (csrc/fuzz/plugin_env_fuzz.cc): selector = what is parsed.
static bool plugin_env_seeds(const std::string& dir) {
  const std::string spec =
      R"({"cluster":{"workerpool0":["w0:2222"],"workerpool1":["w1:2222"],"workerpool2":["r0:2222","[::1]:2222"]},)"
      R"("task":{"type":"workerpool0","index":0},"job":{"workerPoolSpecs":[]}})";
  const std::string tf =
      R"({"cluster":{"chief":["c:1"],"ps":["p0:2222","p1:2222"]},"task":{"type":"chief","index":0}})";
  const std::string nul(1, '\0');
  bool ok = write_seed(dir, "json-0", 0, R"({"a":[1,2.5e3,-0.0,true,false,null,"\u00e9\n"],"b":{}})");
  ok &= write_seed(dir, "cluster_spec-0", 1, spec);
  ok &= write_seed(dir, "tf_config-0", 2, tf);
  ok &= write_seed(dir, "rs_reducers-0", 3, "10.0.0.1:2222, [fe80::1]:2223,host:1");
  ok &= write_seed(dir, "worker-0", 4,
                   "30" + nul + "300" + nul + "4" + nul + "1M" + nul + "8" + nul + "False" + nul + "4M" + nul +
                       "secret" + nul + "Required");
  ok &= write_seed(dir, "p2p-0", 5, "4" + nul + "2" + nul + "2" + nul + "10");
  // Seconds at the bound and past it (they overflowed the core's clock arithmetic before issue 28).
  ok &= write_seed(dir, "worker-1", 4, "1e9" + nul + "1e10");
  ok &= write_seed(dir, "p2p-1", 5, "1" + nul + "1" + nul + "1" + nul + "1e10");
  for (const double s : {1e9, 1e10, 1e300}) {
    std::string bytes(sizeof s, '\0');
    std::memcpy(&bytes[0], &s, sizeof s);
    ok &= write_seed(dir, "seconds-" + std::to_string(int(std::log10(s))), 6, bytes);
  }
  return ok;
}

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [wire|failover|reducer_frames|plugin_env]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::string target = argc == 3 ? argv[2] : "wire";
  bool ok = true;
  if (target == "failover") ok = failover_seeds(dir);
  else if (target == "reducer_frames") ok = reducer_frame_seeds(dir);
  else if (target == "plugin_env") ok = plugin_env_seeds(dir);
  if (target != "wire") {
    if (!ok) std::fprintf(stderr, "make_seeds: cannot write into %s\n", dir.c_str());
    return ok ? 0 : 1;
  }

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

  struct F {
    proto::FrameType t;
    uint8_t dtype;
    uint32_t len;
    uint64_t total, shard, off;
    std::string text;
  };
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
