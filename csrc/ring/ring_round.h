// One ring all-reduce round: its schedule, its cursors, and the steps of the event loop that
// drives it (Ring::run). The algorithm and the wire format are described in ring/ring.h.
//
// The round is one continuous byte stream per direction: a 32-byte round header, then every
// range of the 2(n-1) steps as soon as it may be sent. Send step s carries the segment that
// receive step s-1 finished (the same segment), so a chunk travels on as soon as it has been
// received and reduced.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "net/frame_io.h"
#include "ring/ring.h"

namespace rs::ring {

constexpr size_t kRoundHeaderBytes = 32;

// What a round borrows from its Ring: the two links and the buffers kept across rounds (so a
// warm ring allocates nothing per round).
struct RoundLinks {
  int left = -1, right = -1;  // we receive from left and send to right
  const std::string& left_name;
  const std::string& right_name;
  net::FrameWriter& out;          // to the right neighbour
  std::vector<uint8_t>& scratch;  // one received reduce-scatter chunk
  std::vector<uint8_t>& acc;      // float32 accumulator for 16-bit dtypes
  RingStats& stats;
};

class RingRound {
 public:
  RingRound(const RingOptions& opts, RoundLinks links, uint64_t round, uint8_t* data, size_t nbytes, DType dtype,
            Op op);
  // Queues whatever the schedule allows and writes as much as the right link takes.
  void send();
  // Reads the header and chunks from the left link until it would block; reduce-scatter chunks
  // are reduced into place. True when what it received made more sendable (send again first).
  bool receive();
  bool finished() const { return !receiving() && !sending(); }
  // Sleeps until a link is ready; throws Timeout after `timeout` s without progress.
  void wait();

 private:
  bool receiving() const { return hdr_got_ < kRoundHeaderBytes || rs_ < T_; }
  bool sending() const { return !links_.out.empty() || qs_ < T_; }
  size_t send_seg(int64_t s) const;
  size_t recv_seg(int64_t s) const;
  void skip_empty(int64_t* s, uint64_t* done, bool sending) const;
  uint64_t send_limit(int64_t s) const;
  bool sendable() const { return qs_ < T_ && send_limit(qs_) > qdone_; }
  void queue_ready();
  bool read_header();
  void check_header() const;
  bool read_chunk(bool* more_sendable);
  void reduce_chunk(int64_t s, uint64_t off_in_seg, uint64_t len);
  void count_received(const net::IoResult& rd);

  const RingOptions& opts_;
  RoundLinks links_;
  const uint64_t round_;
  uint8_t* const data_;
  const DType dtype_;
  const Op op_;
  const int64_t n_, r_, T_;  // world, rank, steps: [0, n-1) reduce-scatter, [n-1, T) all-gather
  const size_t es_;
  const uint64_t chunk_;  // whole elements
  const bool wire_acc_;
  std::vector<uint64_t> seg_off_, seg_len_;  // segments: n element-aligned pieces in rank order
  // Cursors: sending, bytes queued on the frame writer (qs_, qdone_) and steps completely
  // written (sent_steps_); receiving, (rs_, rdone_).
  int64_t qs_ = 0, rs_ = 0, sent_steps_ = 0;
  uint64_t qdone_ = 0, rdone_ = 0;
  size_t hdr_got_ = 0;
  uint8_t hdr_out_[kRoundHeaderBytes], hdr_in_[kRoundHeaderBytes];
  net::ProgressTimer timer_;
};

}  // namespace rs::ring
