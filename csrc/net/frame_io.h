// Non-blocking frame transport: the one place where partial header + payload writes,
// partial reads and per-wakeup fairness are handled. The algorithms above it (the worker
// client's rounds, the ring's schedule, the reducer's connections) only decide WHICH
// frames to send and WHERE a received payload goes.
//
//   Segments     caller-owned memory as one logical byte range (a contiguous buffer is one
//                segment; a scatter-gather round is several). Payloads are written straight
//                from it with writev and read straight into it with readv: no copies.
//   IoBudget     bytes one connection may move per wakeup. Every frame costs at least its
//                header plus kFrameCharge, so a peer cannot monopolise a loop with floods of
//                empty frames.
//   FrameWriter  fixed-capacity FIFO of outgoing frames (header bytes + payload range + a
//                caller token). flush() writes as much as the socket takes (several frames per
//                writev) and calls done(token) for each frame once its last byte is written.
//                No heap allocation per frame: the ring of slots is allocated once.
//   FrameReader  reads 48-byte protocol headers, validates them with proto::decode, asks the
//                caller where the payload goes (Sink: memory, a Segments range, a text buffer,
//                discard; or pause/stop before the payload), reads it in place and reports the
//                complete frame.
//   read_into    the byte-level primitive under the reader, for streams without per-frame
//                headers (the ring).
//
// All calls are for non-blocking sockets: they never wait. "Would block" is reported in
// IoResult::blocked (the caller then polls for POLLOUT / POLLIN); a closed or reset
// connection throws Error(PeerLost) naming the peer. Waiting and timeouts are the caller's
// (net/deadline.h).
//
// How the reducer's connections map onto it (csrc/server/server.cc): OutQueue/flush() become
// a FrameWriter per connection (results: push(header, Payload::bytes(slot data), token =
// the slot's address), control messages: push_copy(bytes)); read_data() becomes
// FrameReader::pump with an 8 MiB IoBudget, on_header = on_header() + try_claim() returning
// Sink::memory(contribution) or Sink::pause() while the slot is busy (the next pump() offers
// the same header again), Sink::discard() for BYE, Sink::stop() after a decode error.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "net/socket.h"
#include "protocol/wire.h"

namespace rs::net {

// ---- memory -----------------------------------------------------------------------------

// Caller-owned memory segments seen as one byte range [0, size()). Building one allocates
// (once per round); gather() does not.
class Segments {
 public:
  void assign(uint8_t* data, size_t len);    // one contiguous segment
  void assign(const iovec* segs, size_t n);  // several, in order; empty ones are dropped
  void clear();
  uint64_t size() const { return total_; }
  size_t count() const { return segs_.size(); }
  // Appends iovecs for [off, off + len) to out[*n .. max) and returns the bytes they cover
  // (fewer than len when max is reached). Requires off + len <= size().
  uint64_t gather(uint64_t off, uint64_t len, iovec* out, int* n, int max) const;

 private:
  size_t find(uint64_t off) const;  // the segment holding byte `off` (binary search)
  std::vector<iovec> segs_;
  std::vector<uint64_t> start_;     // start_[i] = offset of segs_[i] in the range
  uint64_t total_ = 0;
};

// The payload of an outgoing frame: [off, off + len) of a Segments, or len bytes at ptr.
// The memory must stay valid until the frame's done() callback.
struct Payload {
  const Segments* src = nullptr;
  const uint8_t* ptr = nullptr;
  uint64_t off = 0;
  uint64_t len = 0;
  static Payload none() { return {}; }
  static Payload bytes(const void* p, uint64_t n) { return {nullptr, static_cast<const uint8_t*>(p), 0, n}; }
  static Payload range(const Segments& s, uint64_t off, uint64_t n) { return {&s, nullptr, off, n}; }
};

// ---- fairness ---------------------------------------------------------------------------

class IoBudget {
 public:
  static constexpr size_t kFrameCharge = 4096;  // the fixed cost of any frame, beyond its bytes
  explicit IoBudget(size_t bytes) : left_(bytes) {}
  bool spent() const { return left_ == 0; }
  size_t left() const { return left_; }
  void bytes(size_t n) { left_ -= n < left_ ? n : left_; }
  void frame() { bytes(kFrameCharge); }

 private:
  size_t left_;
};

struct IoResult {
  uint64_t bytes = 0;    // bytes moved by this call
  uint64_t frames = 0;   // frames completed by this call
  bool blocked = false;  // stopped because the socket would block
  bool paused = false;   // reader: the header callback returned Sink::pause()
  bool stopped = false;  // reader: a callback asked to stop
};

// ---- writer -----------------------------------------------------------------------------

class FrameWriter {
 public:
  static constexpr size_t kMaxHeaderBytes = proto::kFrameHeaderBytes;
  static constexpr int kMaxIov = 64;  // iovecs per writev (several small frames go out together)

  explicit FrameWriter(size_t capacity = 16) { reserve(capacity); }
  // Capacity in frames. Growing allocates: do it at set-up, not per frame.
  void reserve(size_t capacity);
  size_t capacity() const { return items_.size(); }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  bool full() const { return count_ == items_.size(); }
  // The front frame is partly written: nothing else may be written on the socket until it is done.
  bool mid_frame() const { return count_ > 0 && sent_ > 0; }
  // Forgets every queued frame (after an error; their done() is never called).
  void clear();

  // Queues a frame: `hdr_len` (0..48) header bytes, copied, then the payload. Returns false
  // (and queues nothing) when full.
  bool push(const uint8_t* hdr, size_t hdr_len, Payload payload, uint64_t token);
  // Queues a control message whose bytes the writer owns (rare: may allocate); grows if full.
  void push_copy(std::string bytes, uint64_t token);

  // Writes queued frames until the queue is empty, the socket would block or `budget`
  // (may be null) is spent; calls done(token) for each frame completely written, in order.
  template <class Done>
  IoResult flush(int fd, const std::string& peer, IoBudget* budget, Done&& done) {
    IoResult res;
    while (count_ > 0 && !(budget && budget->spent())) {
      iovec iov[kMaxIov];
      int n = build_iov(iov, budget ? budget->left() : ~size_t(0));
      ssize_t w = n > 0 ? send_some(fd, iov, n, peer) : 0;
      if (w < 0) {
        res.blocked = true;
        break;
      }
      res.bytes += uint64_t(w);
      if (budget) budget->bytes(size_t(w));
      uint64_t left = uint64_t(w);
      // Retire every frame the write finished (zero-byte frames finish at once).
      while (count_ > 0) {
        uint64_t rest = total(front()) - sent_;
        if (left < rest) {
          sent_ += left;
          break;
        }
        left -= rest;
        uint64_t token = front().token;
        pop();
        res.frames++;
        if (budget) budget->frame();
        done(token);
      }
      if (w == 0 && n > 0) break;  // the kernel took nothing without EAGAIN: try later
    }
    return res;
  }

 private:
  struct Item {
    uint8_t hdr[kMaxHeaderBytes];
    uint8_t hdr_len = 0;
    Payload payload;
    std::string owned;  // push_copy's bytes (then hdr_len = 0 and payload = none)
    uint64_t token = 0;
  };
  static uint64_t total(const Item& it) { return it.hdr_len + it.owned.size() + it.payload.len; }
  Item& front() { return items_[head_]; }
  void pop();
  int build_iov(iovec* iov, size_t max_bytes) const;

  std::vector<Item> items_;
  size_t head_ = 0, count_ = 0;
  uint64_t sent_ = 0;  // bytes of the front frame written
};

// ---- reader -----------------------------------------------------------------------------

// Reads into dst[*got, len) until complete or the socket would block; *got advances.
// Returns bytes read (0 with res->blocked set when nothing was available).
uint64_t read_into(int fd, const std::string& peer, uint8_t* dst, size_t len, size_t* got, IoResult* res,
                   IoBudget* budget = nullptr);

// Where the payload of a frame goes: the header callback's answer.
struct Sink {
  enum class Kind : uint8_t { Memory, Scatter, Text, Discard, Pause, Stop };
  Kind kind = Kind::Discard;
  uint8_t* ptr = nullptr;
  const Segments* segs = nullptr;
  uint64_t off = 0;
  std::string* text = nullptr;
  uint32_t align = 1;  // Scatter: the memory only ever holds whole units of `align` bytes of the payload
  static Sink memory(void* p) { return {Kind::Memory, static_cast<uint8_t*>(p), nullptr, 0, nullptr}; }
  // With align > 1 the payload is read so that, between calls, the destination holds a whole
  // number of align-byte units of it (the rest waits in a small carry): an element is either
  // still what it was or already the new value, never half of each. The reader asks the kernel
  // how much is queued (FIONREAD) to read whole units in place.
  static Sink scatter(const Segments& s, uint64_t off, uint32_t align = 1) {
    return {Kind::Scatter, nullptr, &s, off, nullptr, align};
  }
  static Sink text_into(std::string* t) { return {Kind::Text, nullptr, nullptr, 0, t}; }  // resized to the payload
  static Sink discard() { return {}; }
  static Sink pause() { return {Kind::Pause, nullptr, nullptr, 0, nullptr}; }
  static Sink stop() { return {Kind::Stop, nullptr, nullptr, 0, nullptr}; }
};

class FrameReader {
 public:
  explicit FrameReader(uint32_t max_payload = proto::kMaxChunkBytes) : max_payload_(max_payload) {}
  void set_max_payload(uint32_t n) { max_payload_ = n; }
  // Part of a frame has been read (a header, or a header and part of its payload).
  bool mid_frame() const { return hdr_got_ > 0; }
  void reset() { hdr_got_ = 0; reading_payload_ = false; carry_n_ = 0; torn_ = false; }
  // The frame being read: its header (valid while mid_frame() and reading its payload) and the
  // payload bytes already in the sink's memory (for an aligned Scatter sink: whole units only).
  bool reading_payload() const { return reading_payload_; }
  const proto::FrameHeader& header() const { return h_; }
  uint64_t payload_in_place() const { return got_ - carry_n_; }
  // An aligned Scatter read ended mid-unit because the kernel returned less than it had
  // queued (not expected): the unit after payload_in_place() is then neither old nor new.
  bool torn() const { return torn_ && carry_n_ > 0; }

  // Reads frames until the socket would block, `budget` (may be null) is spent or a callback
  // stops it.
  //   Sink on_header(const proto::FrameHeader& h, const std::string& error)
  //     `error` is non-empty when the 48 bytes are not a valid header (proto::decode with
  //     this reader's max payload); the callback must then return Sink::stop() (the
  //     connection is unusable). Pause: nothing more is read; the next pump() calls
  //     on_header again with the same header. The memory of Memory/Scatter must hold
  //     h.length bytes and stay valid until on_frame.
  //   bool on_frame(const proto::FrameHeader& h)
  //     the payload is complete; return false to stop pumping.
  template <class OnHeader, class OnFrame>
  IoResult pump(int fd, const std::string& peer, IoBudget* budget, OnHeader&& on_header, OnFrame&& on_frame) {
    IoResult res;
    while (!(budget && budget->spent())) {
      if (!reading_payload_) {
        if (hdr_got_ < proto::kFrameHeaderBytes) {
          read_into(fd, peer, hdr_, proto::kFrameHeaderBytes, &hdr_got_, &res, budget);
          if (hdr_got_ < proto::kFrameHeaderBytes) break;  // would block
          error_ = proto::decode(hdr_, &h_, max_payload_);
        }
        sink_ = on_header(static_cast<const proto::FrameHeader&>(h_), static_cast<const std::string&>(error_));
        if (sink_.kind == Sink::Kind::Pause) {
          res.paused = true;
          break;
        }
        if (sink_.kind == Sink::Kind::Stop || !error_.empty()) {
          res.stopped = true;
          break;
        }
        if (sink_.kind == Sink::Kind::Text) sink_.text->assign(h_.length, '\0');
        reading_payload_ = true;
        got_ = 0;
        carry_n_ = 0;
        torn_ = false;
      }
      if (got_ < h_.length) {
        read_payload(fd, peer, &res, budget);
        if (got_ < h_.length) break;  // would block
      }
      reading_payload_ = false;
      hdr_got_ = 0;
      res.frames++;
      if (budget) budget->frame();
      if (!on_frame(static_cast<const proto::FrameHeader&>(h_))) {
        res.stopped = true;
        break;
      }
    }
    return res;
  }

 private:
  void read_payload(int fd, const std::string& peer, IoResult* res, IoBudget* budget);
  ssize_t read_aligned(int fd, const std::string& peer);  // one read of an aligned Scatter payload
  void place_carry();                                    // a complete carry unit goes to the sink

  static constexpr uint32_t kMaxAlign = 16;
  uint8_t carry_[kMaxAlign];
  uint32_t carry_n_ = 0;  // payload bytes read into carry_, not yet in the sink
  bool torn_ = false;

  uint32_t max_payload_;
  uint8_t hdr_[proto::kFrameHeaderBytes];
  size_t hdr_got_ = 0;
  bool reading_payload_ = false;
  proto::FrameHeader h_;
  std::string error_;
  Sink sink_;
  uint64_t got_ = 0;  // payload bytes read
};

}  // namespace rs::net
