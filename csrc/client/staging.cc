#include "client/staging.h"

namespace rs::client {

void convert(const net::Segments& buf, DType wire, uint64_t off, uint64_t len, uint8_t* chunk, bool narrow) {
  for_each_piece(buf, off * 2, len * 2, [&](const iovec& piece) {
    const size_t elems = piece.iov_len / sizeof(float);
    float* f = static_cast<float*>(piece.iov_base);
    if (narrow) kernels::narrow(wire, chunk, f, elems);
    else kernels::widen(wire, f, chunk, elems);
    chunk += elems * 2;
  });
}

void Staging::ensure(size_t slots, uint32_t chunk_bytes) {
  if (!tx_.empty()) return;
  slots_ = slots;
  chunk_bytes_ = chunk_bytes;
  tx_.resize(slots * chunk_bytes);
  rx_.resize(chunk_bytes);
}

const uint8_t* Staging::narrow_next(const net::Segments& buf, DType wire, uint64_t off, uint64_t len) {
  uint8_t* slot = tx_.data() + (pushed_++ % slots_) * chunk_bytes_;
  convert(buf, wire, off, len, slot, true);
  return slot;
}

}  // namespace rs::client
