// The worker client's vocabulary, shared by its parts (client.h, round.h, schedule.h,
// recovery.h): its options and counters, how a round is named, and what a round is for. Kept
// apart from client.h so that the parts see these types without the whole public Client.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/compression.h"
#include "common/defaults.h"
#include "common/dtype.h"

namespace rs::client {

// 16-bit wire compression of a float32 round: its names live in common/compression.h.
using Compression = rs::WireCompression;

// The defaults are the settings table's (common/settings.h); client_settings.h reads RS_* into one.
struct ClientOptions {
  std::vector<std::string> reducers;  // "host:port" / "[v6]:port"
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string group = "default";
  std::string job_id = "local";
  double timeout = kDefaultTimeout;                 // seconds without progress before an all-reduce fails
  double connect_timeout = kDefaultConnectTimeout;  // bound on connect retries + waiting for the whole group
  std::string auth_token;                           // the shared secret or a job credential (protocol/auth.h)
  int streams = kDefaultStreams;
  uint32_t chunk_bytes = kDefaultChunkBytes;  // the largest chunk; a round uses smaller ones for smaller shards
  int window = kDefaultWindow;  // chunks in flight per connection (sent, result not yet back), across rounds
  int socket_buffer = kDefaultSocketBuffer;
  bool failover = kDefaultFailover;                      // finish rounds on the surviving reducers when one is lost
  int max_rounds_in_flight = kDefaultMaxRoundsInFlight;  // unfinished rounds before start() waits / try_start() refuses
  bool integrity = false;  // frame integrity (needs auth_token; docs/security.md): asked of every reducer
};

struct ClientStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t rounds = 0;  // user rounds handed back (done, or released: see early_releases)
  uint64_t reconnects = 0;
  uint64_t reducer_failovers = 0;  // sessions moved to surviving reducers
  uint64_t reducers_active = 0;    // reducers the current session uses
  uint64_t repaired_bytes = 0;     // bytes of unfinished rounds copied or reduced again after failovers
  uint64_t reducer_rejoins = 0;    // lost reducers taken back (restarted at their address)
  uint64_t rejoin_probes = 0;      // non-blocking connects to lost reducers started by rejoin checks
  uint64_t early_releases = 0;     // small rounds handed back before their CLEARs (a copy stands in)
  uint64_t link_window_max = 0;    // chunks in flight the session's widest link last allowed (0: none yet)
};

// Identifies a round for test()/wait(); unique for the life of the Client (not reset when
// the session reconnects).
using RoundId = uint64_t;

// What a round is for: a caller's, a failover's repair of one, or an exchange among the workers
// (the failover exchange, a rejoin check).
enum class RoundRole : uint8_t { User, Repair, Exchange };

struct Link;                                       // one connection to one stream of one reducer (client/round.h)
using Links = std::vector<std::unique_ptr<Link>>;  // a session's, reducer-major: [i * streams + s]

}  // namespace rs::client
