// The state the worker client's parts share (client.cc, schedule, staging, recovery): a round
// with its progress on every link, and a link (one connection to one stream of one reducer).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/failover.h"
#include "client/reducer_frames.h"
#include "client/staging.h"
#include "client/types.h"
#include "common/error.h"
#include "net/frame_io.h"
#include "net/socket.h"

namespace rs::client {

// With failover, a round of at most this many buffer bytes is handed back as soon as its
// results are in, before the reducers' CLEAR (one more worker -> reducer -> worker trip, which
// cost 64 KiB rounds 30-40%): its results are copied aside first, and until the CLEARs the copy
// stands in for the caller's buffer (a failover repairs from it), so the caller may reuse its
// memory at once. Larger rounds wait for the CLEAR: the trip is a small share of their time, and
// the copy would cost memory (docs/protocol.md section 6, "Early release of small rounds").
constexpr uint64_t kEarlyReleaseBytes = 512u << 10;
// A link's path window follows the largest of its last results-rate samples (Schedule::sample_rate).
constexpr size_t kRateSamples = 8;

// A round: its buffer, and its progress on every link.
struct Round {
  using Role = RoundRole;
  Role role = Role::User;
  RoundId id = 0;
  // User: its number in the group's sequence of rounds since the session was last (re)connected
  // from scratch: the same on every worker (RoundId is not: a restarted worker counts from 0).
  // Failover exchanges and rejoin checks name rounds by it.
  uint64_t seq = 0;
  uint64_t wire = 0;  // round number on the wire (per session)
  DType dtype = DType::F32;
  Op op = Op::Sum;
  uint64_t tag = 0;
  uint64_t nbytes = 0;                   // on the wire (compressed: half the buffer's)
  Compression comp = Compression::None;  // comp != None: dtype is the 16-bit wire type, buf float32
  net::Segments buf;
  // Offsets and sizes below are wire bytes; in the buffer they are twice that when compressed.
  struct Part : LinkShare {  // this round on one link: the link's share of its reducer's shard
    uint64_t shard_off = 0;  // of the shard in the buffer
    uint64_t next_send = 0;  // next chunk index to queue (stream, stream + S, ...)
    uint64_t window = 1;     // chunks this link keeps in flight while it queues this round's
    bool cleared = false;    // the reducer said CLEAR for this round (failover)
  };
  std::vector<Part> parts;  // by link
  size_t parts_left = 0;    // parts still waiting for results
  size_t clears_left = 0;   // parts still waiting for CLEAR (failover)
  bool in_session = false;  // in the session's rounds, planned on the current links
  enum class State { Running, Done, Failed } state = State::Running;
  bool collected = false;  // done (or released) and reported, freed when it leaves the session
  // Released (failover, small rounds): every result is in, the CLEARs are not. The caller has it
  // back (test() true); `buf` points at `copy`, a copy of the results, until the round is done.
  bool released = false;
  std::vector<uint8_t> copy;
  ErrorKind kind = ErrorKind::Internal;
  std::string error;
  // Failover (client/failover.h).
  failover::Intervals held;  // User: wire bytes known to hold results (as of the last failover)
  size_t children = 0;       // User: repair rounds not yet done
  Round* parent = nullptr;   // Repair: the user round whose bytes it completes
  struct Span {
    uint64_t at, pos, len;  // Repair: its wire bytes [at, at + len) are the parent's [pos, pos + len)
  };
  std::vector<Span> map;
  std::vector<int64_t> store;                                           // Exchange: the table being all-reduced
  uint64_t scale() const { return comp != Compression::None ? 2 : 1; }  // buffer bytes per wire byte
  // Released early when its results are in (pool of copies permitting): a small user round.
  bool small_user() const { return role == Role::User && buf.size() <= kEarlyReleaseBytes; }
};

struct Link {
  net::Fd fd;
  std::string peer;  // "reducer host:port (stream s)"
  size_t reducer = 0;
  int stream = 0;
  net::FrameWriter out;
  net::FrameReader in;
  uint64_t send_wire = 0;    // the round whose chunks this link queues next
  uint64_t in_flight = 0;    // chunks queued or sent whose result is not back (all rounds)
  Round* reading = nullptr;  // the round of the result frame being read
  std::string error_text;    // payload of an Error frame being read
  bool closed = false;       // lost, or the reducer sent an error: nothing more is read or written
  // Releases (failover): DONE sent, CLEAR received.
  uint64_t done_next = 0;  // rounds below this one are complete on this link
  uint64_t done_sent = 0;
  bool done_owed = false;      // a round with a part on this link completed since the last DONE
  bool done_queued = false;    // a DONE is in `out`, not yet written (one at a time: they are cumulative)
  bool cork = false;           // `out` holds only a DONE that may wait in the kernel (Schedule::fill)
  bool corked = false;         // a DONE written with MSG_MORE may still wait there
  bool write_blocked = false;  // the last write left frames queued, not for the byte budget: wait until writable
  uint64_t cleared = 0;        // rounds below this one are cleared on this link
  Staging staging;             // compressed rounds' chunks
  // What its window is widened from (protocol/plan.h path_window; Schedule::window_of): the path's
  // round trip without queueing (tcpi_min_rtt, read with each new rate sample; 0: not yet) and the
  // rate below; when it was last checked (steady clock, ns); the window when it last was the limit
  // (stats: link_window_max).
  uint64_t rtt_us = 0;
  int64_t path_checked_ns = 0;
  uint64_t window_used = 0;
  // The rate its results come back at (buffer bytes per second; 0: not measured yet): `got_bytes`
  // of results since `rate_from_ns` (0: no sample running), measured while the window is the
  // limit and restarted when the link runs dry (Schedule::window_of, Client::on_frame).
  uint64_t got_bytes = 0;
  int64_t rate_from_ns = 0;
  uint64_t rate_Bps = 0;                       // the largest of `rates`
  std::array<uint64_t, kRateSamples> rates{};  // the last samples (a ring)
  size_t rate_next = 0;
};

}  // namespace rs::client
