#include "protocol/plan.h"

#include <algorithm>
#include <cmath>

#include "protocol/wire.h"

namespace rs::proto {

std::string check_chunk_bytes(uint64_t chunk_bytes) {
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes || chunk_bytes % 8)
    return "chunk size " + std::to_string(chunk_bytes) + " must be a multiple of 8 in 64..64 MiB";
  return "";
}

ShardPlan even_split(uint64_t units, size_t parts) {
  ShardPlan p;
  p.offset.resize(parts);
  p.count.resize(parts);
  uint64_t base = units / parts, rem = units % parts, off = 0;
  for (size_t j = 0; j < parts; ++j) {
    p.offset[j] = off;
    p.count[j] = base + (j < rem ? 1 : 0);
    off += p.count[j];
  }
  return p;
}

size_t reducers_for(uint64_t nbytes, size_t reducers, size_t workers) {
  if (reducers <= 1 || nbytes >= uint64_t(reducers) * kMinShardBytes) return std::max<size_t>(reducers, 1);
  const auto ceil_div = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
  const uint64_t want = std::max(ceil_div(nbytes, kMinShardBytes),
                                 ceil_div(uint64_t(std::max<size_t>(workers, 1)) * nbytes, kMaxSmallIncastBytes));
  const uint64_t cap = std::max<uint64_t>(1, nbytes / kMinSplitShardBytes);
  return size_t(std::max<uint64_t>(1, std::min<uint64_t>({want, cap, uint64_t(reducers)})));
}

ShardPlan plan_round(uint64_t elems, size_t elem_size, size_t reducers, size_t workers, uint64_t round) {
  const size_t used = reducers_for(elems * elem_size, reducers, workers);
  ShardPlan dense = even_split(elems, used);
  if (used == reducers) return dense;
  ShardPlan p;
  p.offset.assign(reducers, 0);
  p.count.assign(reducers, 0);
  const size_t rot = size_t(round % reducers);
  for (size_t j = 0; j < used; ++j) {
    p.offset[(j + rot) % reducers] = dense.offset[j];
    p.count[(j + rot) % reducers] = dense.count[j];
  }
  return p;
}

uint64_t chunk_for(uint64_t shard_bytes, uint64_t max_chunk) {
  auto per = [&](uint64_t chunks) { return (shard_bytes / chunks + 4095) / 4096 * 4096; };
  uint64_t c = per(kChunksPerShard);
  if (c > kFineChunkMin) c = std::max(kFineChunkMin, per(kChunksPerLargeShard));
  const bool small = shard_bytes >= kSmallChunkShardMin;
  c = std::max(c, small ? kMinSmallChunk : kMinPipelineChunk);
  return std::min(c, max_chunk);
}

Pipeline pipeline_for(uint64_t shard_bytes, uint64_t max_chunk, uint64_t workers, uint64_t reducers, uint64_t window) {
  Pipeline p;
  const uint64_t shard_chunk = chunk_for(shard_bytes, max_chunk);  // (within max_chunk)
  const bool large = shard_bytes >= kSmallChunkShardMin;
  p.chunk = shard_chunk;
  window = std::max<uint64_t>(window, 1);
  uint64_t floor = 1;  // the least a halving leaves
  if (large) {
    const uint64_t w = std::max<uint64_t>(workers, 1);
    const uint64_t fan_in = kFanInBytes / (w * kFanInDepth) / 4096 * 4096;
    p.chunk = std::min({p.chunk, std::max(fan_in, kMinFanInChunk), max_chunk});
    const uint64_t depth = std::min(shard_bytes / (kFillChunks * p.chunk), kFanInBytes / (w * p.chunk));
    window = std::min(window, std::max(depth, kMinDepth));
    // Not below two when halved (see plan.h): the cap above already bounds the bytes every worker
    // keeps in flight toward one reducer, whatever R.
    floor = kMinDepth;
  }
  p.window = reducers < workers && window > floor ? std::max(window / 2, floor) : window;
  if (large) {  // the same bytes in flight in fewer frames (plan.h)
    while (p.window >= 2 * kMinDepth && p.window % 2 == 0 && 2 * p.chunk <= shard_chunk) {
      p.chunk *= 2;
      p.window /= 2;
    }
  }
  return p;
}

uint64_t path_window(uint64_t window, uint64_t chunk, uint64_t rtt_us, uint64_t rate_Bps) {
  window = std::max<uint64_t>(window, 1);
  if (chunk == 0 || rtt_us == 0 || rate_Bps == 0) return window;
  // rate x rtt in bytes without overflow (rate < 2^64 B/s, rtt < 2^32 us in TCP_INFO).
  const long double bdp = static_cast<long double>(rate_Bps) * static_cast<long double>(rtt_us) / 1e6L;
  const long double want = std::ceil(bdp * kPathHeadroom / static_cast<long double>(chunk));
  const uint64_t cap = std::max<uint64_t>(std::min(kMaxPathWindow, kMaxPathBytes / chunk), 1);
  const uint64_t need = want >= static_cast<long double>(cap) ? cap : static_cast<uint64_t>(want);
  return std::max(window, need);
}

}  // namespace rs::proto
