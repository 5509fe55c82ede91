// Ring all-reduce: the baseline the reduction server is benchmarked against.
//
// It uses the same net layer (csrc/net) and reduction kernels (csrc/kernels) as the
// reduction server, so a benchmark of the two isolates the algorithm.
//
// Algorithm (as in gloo / NCCL / Horovod): the buffer is cut into n element-aligned
// segments (rank order, sizes differ by at most one element). Reduce-scatter takes
// n-1 steps: at step s rank r sends segment (r-s) mod n to its right neighbour and
// adds segment (r-s-1) mod n received from its left neighbour into its buffer; rank
// r then owns the reduced segment (r+1) mod n. All-gather takes n-1 more steps in
// which the reduced segments travel once around the ring and are received straight
// into the buffer. Each worker therefore sends (and receives) 2(n-1)/n x S bytes.
//
// Pipelining: a segment is streamed in chunks of `chunk_bytes`; chunk k of step s+1
// is sent as soon as chunk k of step s has arrived and been reduced, so every link is
// busy all the time and the whole all-reduce is one continuous byte stream per
// direction, with no per-chunk header (both ends know the schedule). One 32-byte
// header per all-reduce carries size, dtype, op and the round number, so ranks that
// disagree get a Mismatch error instead of mixing data.
//
// The send to the right and the receive from the left run concurrently in one poll
// loop on non-blocking sockets (TCP_NODELAY, large buffers via net::tune_socket).
// An all-reduce that makes no progress for `timeout` seconds fails with a Timeout
// error naming the neighbours and how far it got; a lost neighbour gives PeerLost.
// After any error the ring is broken (every later call fails at once): create a new one.
//
// Numerics: float32/float64/int32/int64 accumulate in their own type. float16 and
// bfloat16 are converted to float32, reduced, and rounded back to 16 bits at every
// reduce-scatter step (the partial sums travel in the wire type, as in gloo and NCCL),
// so a 16-bit result can differ from the reduction server's, which rounds only once.
// Avg divides once, after the last reduce-scatter step (integers: truncating). All
// ranks end with the same bytes (the all-gather hands one reduced copy of each segment
// around), but a segment's summation order follows the ring, so float results can
// differ in the last bits from the reduction server's fixed rank order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/defaults.h"
#include "kernels/kernels.h"
#include "net/frame_io.h"
#include "net/socket.h"

namespace rs::ring {

struct RingOptions {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string listen_host = "0.0.0.0";        // where this rank accepts its left neighbour
  uint16_t port = 0;                          // 0 = any free port (read it back with Ring::port())
  double timeout = 30.0;                      // seconds without progress before an all-reduce fails
  uint32_t chunk_bytes = kDefaultChunkBytes;  // pipeline chunk (multiple of 8, 64 B .. 64 MiB)
  int socket_buffer = kDefaultSocketBuffer;
  uint64_t session = 0;  // all ranks must agree (guards against stale peers)
};

struct RingStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t rounds = 0;
};

class Ring {
 public:
  // Listens (world_size > 1); call connect() with every rank's address next.
  explicit Ring(RingOptions opts);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  uint16_t port() const { return port_; }
  uint32_t rank() const { return opts_.rank; }
  uint32_t world_size() const { return opts_.world_size; }
  bool connected() const { return connected_; }

  // addresses[i] = "host:port" of rank i. Connects to the right neighbour and accepts
  // the left one (retrying refused connections) within `connect_timeout` seconds.
  void connect(const std::vector<std::string>& addresses, double connect_timeout);

  // Reduces `nbytes` at `data` in place across the ring.
  void allreduce(void* data, size_t nbytes, DType dtype, Op op);
  void close();
  RingStats stats() const { return stats_; }

 private:
  void run(uint8_t* data, size_t nbytes, DType dtype, Op op);
  std::string left_name() const;
  std::string right_name() const;

  RingOptions opts_;
  uint16_t port_ = 0;
  net::Fd listen_fd_;
  net::Fd right_;  // we send to it
  net::Fd left_;   // we receive from it
  std::string right_addr_, left_addr_;
  bool connected_ = false;
  bool broken_ = false;
  std::string broken_why_;
  uint64_t round_ = 0;
  RingStats stats_;
  std::vector<uint8_t> scratch_;  // one received chunk (reduce-scatter)
  std::vector<uint8_t> acc_;      // float32 accumulator for 16-bit dtypes
  net::FrameWriter out_{16};      // to the right neighbour: the round header, then ready ranges
};

}  // namespace rs::ring
