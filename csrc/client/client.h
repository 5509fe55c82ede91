// The worker transport: splits a buffer into one contiguous shard per reducer,
// streams each shard in chunks over `streams` TCP connections per reducer, and
// receives the reduced chunks straight back into the buffer (in place, no copy).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "net/socket.h"
#include "protocol/auth.h"

namespace rs::client {

struct HelloParams;  // client/handshake.h

struct ClientOptions {
  std::vector<std::string> reducers;  // "host:port" / "[v6]:port"
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string group = "default";
  std::string job_id = "local";
  double timeout = 30.0;           // seconds without progress before an all-reduce fails
  double connect_timeout = 300.0;  // bound on connect retries + waiting for the whole group
  std::string auth_token;          // the shared secret or a job credential (protocol/auth.h)
  int streams = 1;
  uint32_t chunk_bytes = 1u << 20;  // the largest chunk; a round uses smaller ones for smaller shards
  int window = 4;                   // chunks in flight per connection (sent, result not yet back)
  int socket_buffer = 4 << 20;
};

struct ClientStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t rounds = 0;
  uint64_t reconnects = 0;
};

// How a buffer of `elems` elements is cut: shard r is [offset[r], offset[r] + count[r]) elements.
struct ShardPlan {
  std::vector<uint64_t> offset;
  std::vector<uint64_t> count;
};
ShardPlan plan_shards(uint64_t elems, size_t reducers);

// Buffers smaller than reducers x kMinShardBytes use fewer reducers (at least this much each),
// rotated by round number so that small rounds spread over all reducers. Every worker derives
// the same plan from (size, round), so no coordination is needed.
constexpr uint64_t kMinShardBytes = 64 << 10;
ShardPlan plan_round(uint64_t elems, size_t elem_size, size_t reducers, uint64_t round);

// Chunk size for a shard: about shard / kChunksPerShard (so pipeline fill and drain cost a few
// percent), at least kMinPipelineChunk, at most max_chunk; a multiple of 4 KiB (or all of max_chunk).
constexpr uint64_t kChunksPerShard = 64;
constexpr uint64_t kMinPipelineChunk = 64 << 10;
uint64_t chunk_for(uint64_t shard_bytes, uint64_t max_chunk);

class Client {
 public:
  explicit Client(ClientOptions opts);  // connects and waits until the whole group is there
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Reduces `nbytes` at `data` in place across the group. Thread-safe (serialised).
  void allreduce(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag = 0);
  void close();  // says goodbye to every reducer; idempotent
  bool connected() const { return !links_.empty(); }
  ClientStats stats() const;
  const ClientOptions& options() const { return opts_; }

 private:
  struct Link;
  void connect_all();
  HelloParams hello_for(int stream) const;
  void disconnect(bool say_bye);
  void run_round(uint8_t* data, size_t nbytes, DType dtype, Op op, uint64_t tag);

  ClientOptions opts_;
  std::vector<net::HostPort> addrs_;
  proto::Credential credential_;
  std::vector<std::unique_ptr<Link>> links_;  // reducer-major: links_[r * streams + s]
  uint64_t round_ = 0;
  ClientStats stats_;
  mutable std::mutex mu_;
};

}  // namespace rs::client
