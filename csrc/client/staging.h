// Compressed rounds' staging (Compression::BF16 / F16, float32 buffers; see client/client.h):
// the wire carries 16-bit values, so each chunk a link sends is narrowed into a slot of the
// link's small staging ring as it is queued, and each result chunk is read into the link's
// staging chunk and widened straight into the float32 buffer. Also the walk over a round's
// buffer piece by piece, which the conversions and the failover repairs share.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "kernels/kernels.h"
#include "net/frame_io.h"

namespace rs::client {

// Narrowed chunks one link may have queued and not yet written (its staging ring), at most.
constexpr size_t kMaxStagingSlots = 4;

// Calls f(piece) for each contiguous piece of bytes [off, off + len) of `buf`, in order.
template <class F>
void for_each_piece(const net::Segments& buf, uint64_t off, uint64_t len, F&& f) {
  constexpr int kPieces = 16;
  while (len > 0) {
    iovec piece[kPieces];
    int n = 0;
    const uint64_t got = buf.gather(off, len, piece, &n, kPieces);
    for (int i = 0; i < n; ++i) f(piece[i]);
    off += got;
    len -= got;
  }
}

// Converts between the 16-bit wire chunk `chunk` and bytes [2 off, 2 (off + len)) of a
// compressed round's float32 buffer (off, len: wire bytes): narrow (buffer -> wire) or widen
// (wire -> buffer). Segments hold whole floats (Client::start checks it), so every piece does too.
void convert(const net::Segments& buf, DType wire, uint64_t off, uint64_t len, uint8_t* chunk, bool narrow);

// One link's staging, allocated at the session's first compressed round on the link.
class Staging {
 public:
  // Sizes the ring (`slots` chunks of `chunk_bytes`) and the result chunk, once.
  void ensure(size_t slots, uint32_t chunk_bytes);
  // Every slot holds a narrowed chunk not yet written.
  bool full() const { return pushed_ - written_ >= slots_; }
  // Narrows wire bytes [off, off + len) of `buf` into the next slot and returns it (valid until
  // its frame is written: written()).
  const uint8_t* narrow_next(const net::Segments& buf, DType wire, uint64_t off, uint64_t len);
  void written() { written_++; }  // the oldest narrowed frame is written: its slot is free
  // The chunk a 16-bit result is read into; widen() moves it into place once complete.
  uint8_t* result_chunk() { return rx_.data(); }
  void widen(const net::Segments& buf, DType wire, uint64_t off, uint64_t len) {
    convert(buf, wire, off, len, rx_.data(), false);
  }

 private:
  std::vector<uint8_t> tx_;  // slots_ chunks: narrowed payloads queued, not yet written
  size_t slots_ = 0;
  uint32_t chunk_bytes_ = 0;
  uint64_t pushed_ = 0;      // narrowed frames queued (slot = pushed_ % slots_)
  uint64_t written_ = 0;     // narrowed frames written (they free their slots in order)
  std::vector<uint8_t> rx_;  // one chunk: the 16-bit result being read
};

}  // namespace rs::client
