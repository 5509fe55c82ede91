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
//   protect()    turns on frame integrity (net/frame_auth.h) for a connection's writer and
//                reader: from then on every frame carries a header tag and a trailer, computed
//                when a frame is queued and checked as it is read (the payload's GMAC is fed as
//                its bytes arrive); a frame that fails its check throws Error(Protocol)
//                "frame integrity check failed from <peer> ..." before the header or the frame
//                is reported to the caller.
//
// All calls are for non-blocking sockets: they never wait. "Would block" is reported in
// IoResult::blocked (the caller then polls for POLLOUT / POLLIN); a closed or reset
// connection throws Error(PeerLost) naming the peer. Waiting and timeouts are the caller's
// (net/deadline.h).
//
// Users: the reducer's connections (server/conn.h: a FrameWriter and a FrameReader each), the
// worker client's links (client/) and the ring (ring/: a FrameWriter to its right neighbour,
// read_into for the stream from its left).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "net/frame_auth.h"
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
  std::vector<uint64_t> start_;  // start_[i] = offset of segs_[i] in the range
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

  // Every frame queued from now on carries its integrity tags (computed here, at push time:
  // the payload must not change until it is written, which the callers guarantee anyway).
  void protect(std::unique_ptr<FrameAuth> auth) { auth_ = std::move(auth); }
  bool is_protected() const { return auth_ != nullptr; }

  // Queues a frame: `hdr_len` (0..48) header bytes, copied, then the payload. Returns false
  // (and queues nothing) when full. Protected: the header must be a whole frame header.
  bool push(const uint8_t* hdr, size_t hdr_len, Payload payload, uint64_t token);
  // Queues a control message whose bytes the writer owns (rare: may allocate); grows if full.
  // Protected: the bytes must be one frame (header, then payload).
  void push_copy(std::string bytes, uint64_t token);
  // A last frame (header, then payload) sent at once, past the queue, for a connection about to
  // close (BYE, ERROR Shutdown): best effort, never blocks, errors ignored. Frames still queued
  // are dropped (their done() is never called). Does nothing while a frame is partly written.
  void send_now(int fd, const std::string& peer, const uint8_t* frame, size_t len);

  // Writes queued frames until the queue is empty, the socket would block or `budget`
  // (may be null) is spent; calls done(token) for each frame completely written, in order.
  // `more`: the frames may wait in the kernel for the next write (send_some's MSG_MORE).
  template <class Done>
  IoResult flush(int fd, const std::string& peer, IoBudget* budget, Done&& done, bool more = false) {
    IoResult res;
    while (count_ > 0 && !(budget && budget->spent())) {
      iovec iov[kMaxIov];
      int n = build_iov(iov, budget ? budget->left() : ~size_t(0));
      ssize_t w = n > 0 ? send_some(fd, iov, n, peer, more) : 0;
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
  // On the wire: hdr, [htag], owned, payload, [trailer] (the tags when sealed).
  struct Item {
    uint8_t hdr[kMaxHeaderBytes];
    uint8_t hdr_len = 0;
    Payload payload;
    std::string owned;  // push_copy's bytes (unprotected: hdr_len = 0 and payload = none)
    uint64_t token = 0;
    bool sealed = false;
    FrameAuth::Tag htag{}, trailer{};
  };
  static uint64_t total(const Item& it) {
    return it.hdr_len + it.owned.size() + it.payload.len + (it.sealed ? 2 * FrameAuth::kTagBytes : 0);
  }
  void seal(Item& it);
  Item& front() { return items_[head_]; }
  void pop();
  int build_iov(iovec* iov, size_t max_bytes) const;

  std::vector<Item> items_;
  size_t head_ = 0, count_ = 0;
  uint64_t sent_ = 0;  // bytes of the front frame written
  std::unique_ptr<FrameAuth> auth_;
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
  // Every frame read from now on must carry valid integrity tags (between frames only).
  void protect(std::unique_ptr<FrameAuth> auth) {
    auth_ = std::move(auth);
    hdr_need_ = proto::kFrameHeaderBytes + (auth_ ? FrameAuth::kTagBytes : 0);
  }
  bool is_protected() const { return auth_ != nullptr; }
  // Part of a frame has been read (a header, or a header and part of its payload).
  bool mid_frame() const { return hdr_got_ > 0; }
  void reset() {
    hdr_got_ = 0;
    tr_got_ = 0;
    reading_payload_ = false;
    carry_n_ = 0;
    torn_ = false;
  }
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
  // Protected: on_header sees only headers whose tag is valid, on_frame only frames whose
  // trailer is; a bad tag throws Error(Protocol) (the connection is unusable).
  template <class OnHeader, class OnFrame>
  IoResult pump(int fd, const std::string& peer, IoBudget* budget, OnHeader&& on_header, OnFrame&& on_frame) {
    IoResult res;
    while (!(budget && budget->spent())) {
      if (!reading_payload_) {
        if (hdr_got_ < hdr_need_) {
          read_into(fd, peer, hdr_, hdr_need_, &hdr_got_, &res, budget);
          if (hdr_got_ < hdr_need_) break;  // would block
          if (auth_) check_header(peer);
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
        if (auth_) auth_->begin(hdr_, proto::kFrameHeaderBytes);
        reading_payload_ = true;
        got_ = 0;
        carry_n_ = 0;
        torn_ = false;
      }
      if (got_ < h_.length) {
        read_payload(fd, peer, &res, budget);
        if (got_ < h_.length) break;  // would block
      }
      if (auth_) {
        read_into(fd, peer, tr_, sizeof tr_, &tr_got_, &res, budget);
        if (tr_got_ < sizeof tr_) break;  // would block
        check_trailer(peer);
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
  void place_carry();                                     // a complete carry unit goes to the sink

  static constexpr uint32_t kMaxAlign = 16;
  uint8_t carry_[kMaxAlign];
  uint32_t carry_n_ = 0;  // payload bytes read into carry_, not yet in the sink
  bool torn_ = false;

  void check_header(const std::string& peer);   // throws Error(Protocol)
  void check_trailer(const std::string& peer);  // throws Error(Protocol); resets tr_got_

  uint32_t max_payload_;
  uint8_t hdr_[proto::kFrameHeaderBytes + FrameAuth::kTagBytes];  // header, then its tag when protected
  size_t hdr_need_ = proto::kFrameHeaderBytes;
  size_t hdr_got_ = 0;
  uint8_t tr_[FrameAuth::kTagBytes];  // the trailer being read
  size_t tr_got_ = 0;
  std::unique_ptr<FrameAuth> auth_;
  bool reading_payload_ = false;
  proto::FrameHeader h_;
  std::string error_;
  Sink sink_;
  uint64_t got_ = 0;  // payload bytes read
};

// Turns on frame integrity on both directions of a connection: the writer's key is that of
// `sending`, the reader's that of the other direction (proto::frame_key).
void protect(FrameWriter* out, FrameReader* in, const proto::Key& job_key,
             const std::array<uint8_t, proto::kNonceBytes>& worker_nonce,
             const std::array<uint8_t, proto::kNonceBytes>& challenge_nonce, proto::Direction sending);

}  // namespace rs::net
