// What a worker accepts from a reducer after the handshake (docs/protocol.md sections 2 and 6):
// each RESULT and CLEAR is checked against what this worker itself has in flight on that link
// before a byte of it is used, and every text a reducer sends is quoted through peer_text().
// Pure functions (no sockets), so csrc/fuzz/reducer_frames_fuzz.cc runs them as client.cc does.
#pragma once

#include <cstdint>
#include <string>

#include "protocol/wire.h"

namespace rs::client {

// A round's share on one link as this worker planned and sent it (wire bytes; client/round.h's
// Round::Part extends it).
struct LinkShare {
  uint64_t shard_bytes = 0;  // this link's reducer's shard of the round
  uint64_t chunk = 0;        // chunk size of this round on this shard
  uint64_t nchunks = 0;      // chunks of this shard (all streams)
  uint64_t expected = 0;     // chunks of this stream
  uint64_t written = 0;      // chunks of this stream completely written
  uint64_t received = 0;     // results received (they arrive in chunk order)
};

// The round a RESULT names, as this worker started it.
struct SentRound {
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint64_t nbytes = 0;  // on the wire
};

// "" when `h` (a RESULT header that proto::decode accepted) is the next result stream `stream`
// of `streams` awaits from its reducer for `round` with share `share`; else a sentence saying
// why not. `round` null: the header names no round in flight. An accepted result lands in
// [h.offset, h.offset + h.length) of the shard, a chunk this worker has written, in chunk order.
std::string check_result(const proto::FrameHeader& h, const SentRound* round, const LinkShare& share, uint64_t stream,
                         uint64_t streams);

// "" when CLEAR(`upto`) is one this worker can take: it asked for one (failover) and `upto` is at
// most the round its last DONE named (`done_sent`); else why not.
std::string check_clear(uint64_t upto, uint64_t done_sent, bool failover);

// The exception text for an ERROR frame of reducer `reducer` ("host:port") carrying `text`:
// "reducer host:port: " + peer_text(text).
std::string reducer_error_text(const std::string& reducer, const std::string& text);

}  // namespace rs::client
