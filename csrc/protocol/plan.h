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
// `elem_size` bytes over `reducers`, from `workers` workers. Buffers of reducers x kMinShardBytes
// and more use every reducer. Smaller ones use fewer, rotated by round number so that small
// rounds spread over all reducers (unused reducers get count 0); a reducer receives W x shard
// bytes per round (incast), so the count is the larger of
//  - nbytes / kMinShardBytes (64 KiB shards need no more reducers), and
//  - W x nbytes / kMaxSmallIncastBytes (a reducer's link carries at most 128 KiB of a small
//    round each way: one reducer for a 64 KiB round of 8 workers carried 512 KiB, 8.4 ms at
//    0.5 Gbit/s, where the worker's own link needs 1 ms),
// but shards stay at least kMinSplitShardBytes (32 KiB): every extra reducer costs each worker
// a message each way and wakes one more process (docs/performance.md, "Small rounds").
// Every worker derives the same plan from (size, W, round), so no coordination is needed.
constexpr uint64_t kMinShardBytes = 64 << 10;
constexpr uint64_t kMaxSmallIncastBytes = 128 << 10;
constexpr uint64_t kMinSplitShardBytes = 32 << 10;
size_t reducers_for(uint64_t nbytes, size_t reducers, size_t workers);
ShardPlan plan_round(uint64_t elems, size_t elem_size, size_t reducers, size_t workers, uint64_t round);

// Chunk size for a shard. Pipeline model (docs/performance.md, "Theory"): a reducer returns
// chunk k once it has chunk k from every worker, so one chunk of fill and one of drain are
// added to a shard's time: overhead 2 x chunk / shard. The rule keeps that a few percent:
// about shard / kChunksPerShard (3%), a multiple of 4 KiB, at most max_chunk, and at least
//  - kMinPipelineChunk (64 KiB) for shards under kSmallChunkShardMin (128 KiB): such rounds
//    are latency-bound, and the NCCL plugin's stream of 256 KiB calls (64 KiB shards) keeps its
//    pipeline full across calls, where smaller chunks only cost CPU (2-9 points of its bound);
//  - kMinSmallChunk (16 KiB) for larger shards: at 1 Gbit/s a 1 MiB shard in 64 KiB chunks
//    spends 12% filling and draining (4 MiB rounds at 96% of the bound instead of 100%), a
//    256 KiB shard half its time (rs 0.68x the ring at 512 KiB).
// Shards whose shard / 64 would exceed kFineChunkMin (64 KiB), i.e. of more than 4 MiB, get
// about shard / kChunksPerLargeShard (128) instead, at least 64 KiB: fill and drain 1.5% where the
// chunk is large enough that twice the frames cost nothing (measured 2026-11-25: 32-128 MiB rounds
// at W = 4, 96.5-97.4% -> 97.1-98.3% of the bound; 16-64 MiB at W = 2, 96.3-97.5% -> 97.1-99.1%),
// while 16-32 KiB chunks stay as they are (halving them cost a CPU-bound host 6 points at 8 MiB).
// Every worker of a group derives the same size from the round.
constexpr uint64_t kChunksPerShard = 64;
constexpr uint64_t kChunksPerLargeShard = 128;
constexpr uint64_t kFineChunkMin = 64 << 10;
constexpr uint64_t kMinPipelineChunk = 64 << 10;
constexpr uint64_t kMinSmallChunk = 16 << 10;
constexpr uint64_t kSmallChunkShardMin = 128 << 10;
uint64_t chunk_for(uint64_t shard_bytes, uint64_t max_chunk);

// The pipeline of one worker's link to one reducer for a round: the chunk size and the chunks
// the worker keeps in flight on it. The one place the worker client (and the simulator,
// through reducer._core.pipeline_for) takes them from.
//  - chunk: chunk_for(shard_bytes, max_chunk), and for shards of kSmallChunkShardMin and more at
//    most kFanInBytes / (workers x kFanInDepth) (a multiple of 4 KiB, at least kMinFanInChunk):
//    a reducer hears from every worker at once, and W senders that each keep kFanInDepth chunks
//    in flight put W x kFanInDepth x chunk on its link in one burst (incast: 16 workers x 4 x
//    16 KiB = 1 MiB into an emulated 0.05 Gbit/s port that queues 125 KiB; docs/performance.md,
//    "Fan-in"). The rule depends on (shard, W) only, so every worker of a group derives the same
//    chunk (the window is each sender's own).
//  - window: `window` (RS_WINDOW), and for those shards no more than shard / (kFillChunks x chunk)
//    nor kFanInBytes / (W x chunk), at least kMinDepth. A reducer's port queues the W senders'
//    windows first-come first-served, so the first results wait for about W x window x chunk
//    bytes and the last chunks drain as long: a round pays about window x chunk / shard of its
//    time for it (W = R = 16, 4 MiB rounds: 256 KiB shards in 8 KiB chunks, a window of 4 cost 12%
//    and the rounds ran at 75-82% of the link bound; 2: 87-93%). Two at least: with one a link's
//    next chunk waits for the previous result, and links in step would use each direction half
//    the time. From W = 17 the chunk stops shrinking at kMinFanInChunk (8 KiB) and the window
//    shrinks instead (W = 32: 8 KiB x 2, not 4 KiB x 4: the same bytes in flight in half the
//    frames, which the 2-core emulation's CPU felt: 1.77x the ring instead of 1.69-1.75x).
//  - window halved when fewer reducers than workers serve the round (after a failover from
//    R = W each reducer's link is oversubscribed W/R times: half the window keeps the bytes
//    queued toward it within a switch queue's reach; docs/performance.md "Reducer failover":
//    1.04x the R = W - 1 bound instead of 1.07x), from 128 KiB shards not below kMinDepth.
//  - then, from kSmallChunkShardMin shards, the window's bytes in as few frames as they fit: while
//    the window is an even number of at least 2 x kMinDepth chunks and twice the chunk is within
//    chunk_for's size (and max_chunk), the chunk doubles and the window halves. The bytes in flight
//    (what the fan-in and fill-and-drain rules above bound) stay what they were; the frames, each
//    a send, a wake-up and a read on both hosts, halve (W = R = 8, 0.5 Gbit/s, 16-64 MiB: 16 KiB
//    x 4 -> 32 KiB x 2, the 2 cores 93-97% -> 51-52% busy, 98.0-99.0% -> 99.5% of the bound;
//    W = R = 16, 16 MiB: 8 KiB x 4 -> 16 KiB x 2, 49% -> 33%; docs/performance.md "Fewer frames
//    for the same bytes"). Not below kMinDepth chunks: see the window above.
constexpr uint64_t kFanInBytes = 512 << 10;
constexpr uint64_t kFanInDepth = 4;
constexpr uint64_t kMinFanInChunk = 8 << 10;
constexpr uint64_t kFillChunks = 32;  // window x chunk at most shard / 32: about 3% of a round filling and draining
constexpr uint64_t kMinDepth = 2;
struct Pipeline {
  uint64_t chunk = 0;   // bytes per chunk (buffer bytes of the shard's chunk_for rule)
  uint64_t window = 1;  // chunks in flight on the link (sent, result not back), across rounds
};
Pipeline pipeline_for(uint64_t shard_bytes, uint64_t max_chunk, uint64_t workers, uint64_t reducers, uint64_t window);

// The window a link's path needs (issue 31 point 2): chunks in flight =
//   max(window, ceil(kPathHeadroom x rate x rtt / chunk)), at most kMaxPathBytes / chunk and kMaxPathWindow,
// `window` being pipeline_for's; rtt_us the path's round trip without queueing (TCP_INFO tcpi_min_rtt)
// and rate_Bps the rate the link's results come back at (buffer bytes per second over at least a window's
// worth of them, the largest of the last few such samples: client/schedule.cc sample_rate; not
// tcpi_delivery_rate, whose single samples read bursts as the link's rate), 0 when unknown (then `window`).
// A window of N chunks carries at most N x chunk / rtt' (rtt' the round trip packets really take:
// at least the minimum): with the window the limit the measured rate is that, and kPathHeadroom = 4
// makes the next window 4 x rtt_min / rtt' times this one, so it grows while the typical round trip
// is under twice the minimum (a jittery path: 20 +- 10 ms each way) until the path (or the reducer)
// is the limit. A queue never grows it: rtt_min does not count queueing (net/tcp_path.cc). On a LAN (rtt ~0.1 ms) the
// product is a few KiB and the configured window stands. Per link and per sender: workers need not agree on it (the
// reducer reads a member's chunks in order; its group slots fill and TCP holds the rest in the socket buffers:
// docs/protocol.md).
constexpr uint64_t kPathHeadroom = 4;
constexpr uint64_t kMaxPathWindow = 1024;               // RS_WINDOW's own upper bound
constexpr uint64_t kMaxPathBytes = uint64_t(64) << 20;  // bytes in flight per link at most
uint64_t path_window(uint64_t window, uint64_t chunk, uint64_t rtt_us, uint64_t rate_Bps);

}  // namespace rs::proto
