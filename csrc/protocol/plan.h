// How a buffer is cut up: rules every party of a reduction derives the same answer from,
// so they live once. The even split is used by the worker client (shards over reducers)
// and the ring (segments over ranks); the chunk-size rule by the client, the ring and the
// hello check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rs::proto {

// "" if `chunk_bytes` is a valid chunk size (a multiple of 8 in kMinChunkBytes..kMaxChunkBytes),
// else a sentence saying why not.
std::string check_chunk_bytes(uint64_t chunk_bytes);

// `units` cut into `parts` consecutive pieces in order, sizes differing by at most one (the
// first `units % parts` pieces get the extra unit): piece j is [offset[j], offset[j] + count[j]).
struct ShardPlan {
  std::vector<uint64_t> offset;
  std::vector<uint64_t> count;
};
ShardPlan even_split(uint64_t units, size_t parts);

// The worker client's shards for round number `round` of a session: `elems` elements of
// `elem_size` bytes over `reducers`. Buffers smaller than reducers x kMinShardBytes use fewer
// reducers (at least this much each), rotated by round number so that small rounds spread
// over all reducers; unused reducers get count 0. Every worker derives the same plan from
// (size, round), so no coordination is needed.
constexpr uint64_t kMinShardBytes = 64 << 10;
ShardPlan plan_round(uint64_t elems, size_t elem_size, size_t reducers, uint64_t round);

// Chunk size for a shard: about shard / kChunksPerShard (so pipeline fill and drain cost a few
// percent), at least kMinPipelineChunk (kMinSmallChunk for a shard of at least
// kSmallChunkShardMin and under kSmallChunkShardEnd bytes), at most max_chunk; a multiple of 4 KiB (or all of max_chunk). The smaller
// floor: on a link-bound network a 256 KiB shard in 64 KiB chunks spends half its time filling
// and draining the pipeline (rs 0.68x the ring at 512 KiB, 1 Gbit/s), in 16 KiB chunks an
// eighth (1.4x). Shards of 1 MiB and more keep 64 KiB chunks, which cost less CPU per byte; so
// do shards under 128 KiB, the NCCL plugin's (its stream of calls keeps the pipeline full
// across calls, and 16 KiB chunks there cost it 2-9 points of the bound: docs/performance.md).
constexpr uint64_t kChunksPerShard = 64;
constexpr uint64_t kMinPipelineChunk = 64 << 10;
constexpr uint64_t kMinSmallChunk = 16 << 10;
constexpr uint64_t kSmallChunkShardMin = 128 << 10;
constexpr uint64_t kSmallChunkShardEnd = 1 << 20;
uint64_t chunk_for(uint64_t shard_bytes, uint64_t max_chunk);

}  // namespace rs::proto
