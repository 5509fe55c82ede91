// Frame integrity (docs/protocol.md section 2, "Frame integrity"): AES-256-GCM from OpenSSL's
// libcrypto used authenticate-only (GMAC: everything is additional authenticated data, nothing
// is encrypted), one FrameAuth per direction of a connection.
//
// A protected frame is   header (48) || header tag (16) || payload || trailer (16)
//   header tag = GMAC(K_dir, nonce(dir, 'H', n), header)
//   trailer    = GMAC(K_dir, nonce(dir, 'P', n), header || payload)
// where n counts the frames of this direction of this connection from 0, and the 12-byte nonce
// is  dir (1) || part (1) || 0 (2) || n (8, little-endian). The header tag lets a reader check a
// header before it acts on it (claims a slot, compares it with other ranks, reads `length` bytes);
// the trailer covers the whole frame. As n is implicit, a frame replayed, reordered or dropped
// on the way fails the next check, as does any flipped bit.
//
// The GCM context is created (and the key expanded) once per connection; a frame costs one IV
// set-up, the GHASH of its bytes and two AES blocks per tag, and allocates nothing.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "protocol/auth.h"

struct evp_cipher_ctx_st;  // OpenSSL's EVP_CIPHER_CTX (kept out of this header)

namespace rs::net {

class FrameAuth {
 public:
  static constexpr size_t kTagBytes = 16;
  using Tag = std::array<uint8_t, kTagBytes>;

  // `key`: this direction's key (proto::frame_key); `direction`: proto::Direction as a byte.
  // Throws Error(Internal) if libcrypto cannot set up AES-256-GCM.
  FrameAuth(const proto::Key& key, proto::Direction direction);
  ~FrameAuth();
  FrameAuth(const FrameAuth&) = delete;
  FrameAuth& operator=(const FrameAuth&) = delete;

  // The header tag of the current frame (does not advance).
  Tag header_tag(const uint8_t* hdr, size_t len);
  // The trailer of the current frame, fed in pieces: begin() with the header, update() with
  // the payload bytes in order, finish() returns the tag and moves on to the next frame.
  void begin(const uint8_t* hdr, size_t len);
  void update(const void* data, size_t len);
  Tag finish();

  uint64_t frame() const { return counter_; }  // number of the current frame
  // The writer forgets `n` frames it numbered but never sent: their numbers are used again.
  void rewind(uint64_t n) { counter_ -= n < counter_ ? n : counter_; }

  // Constant-time comparison.
  static bool equal(const Tag& a, const uint8_t* b);

 private:
  void start(uint8_t part);
  struct CtxFree {
    void operator()(evp_cipher_ctx_st* c) const;
  };
  std::unique_ptr<evp_cipher_ctx_st, CtxFree> ctx_;
  uint8_t dir_;
  uint64_t counter_ = 0;
};

// "frame integrity check failed from <peer> ...": the Error(Protocol) a reader throws.
std::string integrity_failure(const std::string& peer, uint64_t frame, bool header);

}  // namespace rs::net
