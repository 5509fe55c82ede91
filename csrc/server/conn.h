// A worker connection on the reducer. Its frames go through net/frame_io: a FrameWriter queues
// results (pointing into group slots, no copy) and control messages; a FrameReader reads data
// frames straight into the group's receive buffers.
//
// Ownership rule (the reducer's threading model, see server.cc and loop.h): a Conn is owned by exactly one
// event loop, through that loop's connection table. Loop 0 owns every connection while it runs
// the handshake; handing a validated connection to the loop that owns its group MOVES it into
// that loop's inbox, after which loop 0 holds no pointer to it and must not touch it again.
// Only the owning loop reads or writes a Conn, so no Conn field needs a lock.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/frame_io.h"
#include "net/socket.h"
#include "protocol/auth.h"
#include "protocol/wire.h"
#include "server/group.h"
#include "server/limits.h"

namespace rs::server {

enum class ConnState {
  Hello,    // reading the fixed part of the hello
  Names,    // reading the job id and group name
  Waiting,  // joined a group that is still gathering its ranks
  Active,   // the group is complete: data frames flow
  Leaving,  // said goodbye: nothing more is read
  Closing,  // refused or expired: its last reply is being written, then it is closed
};

struct Conn {
  net::Fd fd;
  std::string peer;               // "ip:port"
  std::string peer_ip;            // for the per-address limits
  PeerTable::Ticket peer_ticket;  // this connection's share of max_connections_per_peer
  ConnState state = ConnState::Hello;
  net::Clock::time_point deadline;  // end of the handshake
  uint32_t epoll_mask = 0;
  bool registered = false;
  // handshake
  std::array<uint8_t, proto::kNonceBytes> nonce{};  // the challenge's
  uint8_t fixed[proto::kHelloFixedBytes] = {};
  size_t got = 0;
  size_t job_len = 0, group_len = 0;
  std::string names;
  proto::Hello hello;
  bool authenticated = false;
  proto::Key key{};  // the job's key (replies are authenticated with it)
  GroupKey gkey;
  // membership
  std::shared_ptr<Group> group;
  uint32_t rank = 0;
  bool member = false;  // counted in group's members
  // frames
  net::FrameReader reader;
  proto::FrameHeader cur;  // the frame being read
  Slot* cur_slot = nullptr;
  bool paused = false;  // a header was read but its slot is busy: reading stops until it frees
  std::string text;     // payload of a BYE frame (rare)
  int64_t seq_next = 0;
  uint64_t last_round = 0;
  bool said_bye = false;
  bool bye_failover = false;  // the goodbye said reducers were lost (ByeFlags::kByeFailover)
  uint64_t bye_lost = 0;      // ... which ones (bit mask, the BYE's tag)
  // releases (failover groups): DONE received from this member, CLEAR sent to it
  uint64_t done_round = 0;
  uint64_t clear_sent = 0;
  bool clear_queued = false;  // a CLEAR is in `out`, not yet written (one at a time: they are cumulative)
  bool clear_due = false;     // in its loop's Releases: flushed, with its CLEAR, by Releases::flush_due()
  // lifecycle
  net::FrameWriter out;  // tokens: the Slot* of a result, kClearToken, 0 for other control messages
  bool close_after_flush = false;
  bool dead = false;
  // Lingering close: after its last frame (an error, a refusal) went out, the connection is shut
  // for writing and its input is read and dropped until the peer closes or `linger_until`, so
  // that input still in flight cannot make the kernel reset the connection and destroy that
  // frame before the peer reads it. It is no longer a group member then.
  bool linger = false;     // set by the graceful close: Loop::reap() starts the linger instead of closing
  bool lingering = false;  // shut for writing, draining input
  net::Clock::time_point linger_until;
  bool counted = false;        // in stats.connections
  bool error_counted = false;  // in stats.errors
  std::string why;

  std::string who() const { return "rank " + std::to_string(rank) + " (" + peer + ")"; }
};

}  // namespace rs::server
