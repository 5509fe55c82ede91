// Transport defaults shared by the worker client, the ring, the reducer and the NCCL plugin, in
// one place. The settings table (common/settings.h) states them as the defaults of RS_CHUNK_BYTES,
// RS_WINDOW, RS_STREAMS, RS_SOCKET_BUFFER, RS_GROUP_SLOTS, RS_MAX_CONNECTIONS, ...; the options
// structs (client/types.h ClientOptions, server/server.h ServerOptions) start from the same
// constants, and reducer/config.py reads that table (reducer._core.SETTINGS), so Python states no
// default of its own for them.
#pragma once

#include <cstdint>

namespace rs {

constexpr uint32_t kDefaultChunkBytes = 1u << 20;  // the largest pipeline chunk (RS_CHUNK_BYTES)
constexpr int kDefaultSocketBuffer = 4 << 20;      // SO_SNDBUF/SO_RCVBUF of data connections (RS_SOCKET_BUFFER)
constexpr int kDefaultWindow = 4;                  // worker chunks in flight per reducer connection (RS_WINDOW)
constexpr int kDefaultStreams = 1;                 // TCP connections per reducer per worker (RS_STREAMS)
constexpr double kDefaultTimeout = 30.0;           // seconds without progress before a round fails (RS_TIMEOUT)
constexpr double kDefaultConnectTimeout = 300.0;   // connect retries + waiting for the group (RS_CONNECT_TIMEOUT)
constexpr int kDefaultMaxRoundsInFlight = 8;       // unfinished rounds before start() waits (RS_MAX_ROUNDS_IN_FLIGHT)
constexpr bool kDefaultFailover = true;            // finish rounds on the surviving reducers (RS_FAILOVER)
constexpr double kDefaultHandshakeTimeout = 10.0;  // seconds a new connection has for its hello (RS_HANDSHAKE_TIMEOUT)
constexpr int kDefaultP2pSockets = 2;  // NCCL plugin: sockets per point-to-point connection (RS_NCCL_NSOCKS)

// The reducer node (server/server.h ServerOptions; RS_HOST, RS_THREADS, RS_GROUP_SLOTS, ...).
inline constexpr const char* kDefaultReducerHost = "0.0.0.0";  // all interfaces (RS_HOST)
constexpr int kDefaultReducerThreads = 0;           // event loops; 0: the number of CPUs, at most 8 (RS_THREADS)
constexpr int kMaxReducerThreads = 256;             // more event loops are refused
constexpr int kDefaultGroupSlots = 4;               // chunk slots per group stream (RS_GROUP_SLOTS)
constexpr int kMaxGroupSlots = 64;                  // group_slots is 1..64
constexpr double kDefaultGroupTimeout = 300.0;      // seconds for a group stream to gather its ranks (RS_GROUP_TIMEOUT)
constexpr double kDefaultMemoryIdleTimeout = 60.0;  // seconds without data before a group gives its memory back
constexpr uint64_t kDefaultMaxGroupBytes = uint64_t(4) << 30;  // reduction buffers per group stream
constexpr uint32_t kDefaultMaxConnections = 4096;              // open connections (RS_MAX_CONNECTIONS)
constexpr uint32_t kDefaultMaxConnectionsPerPeer = 256;        // per peer IP address, any state
constexpr uint32_t kDefaultMaxGroupsPerPeer = 64;              // live group streams created from one address

// Bounds the client enforces (csrc/client/client.cc) and the settings table states.
constexpr int kMaxWindow = 1024;
constexpr int kMaxClientRoundsInFlight = 4096;
constexpr int kMaxP2pSockets = 16;  // the NCCL handle has room for 16 socket ports

// The largest value of every seconds setting and argument (timeouts: about 31 years, "forever" in
// practice): a deadline computed from one fits a steady_clock time point (int64 nanoseconds) and an
// int millisecond count of poll() with room to spare. One rule: settings::parse and
// settings::check_seconds refuse more, net::duration_of (every conversion) saturates at it.
constexpr double kMaxSeconds = 1e9;

}  // namespace rs
