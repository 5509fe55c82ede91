#include "net/frame_auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include <climits>

#include "common/error.h"

namespace rs::net {

namespace {

constexpr uint8_t kPartHeader = 'H';
constexpr uint8_t kPartFrame = 'P';
constexpr int kIvBytes = 12;

[[noreturn]] void crypto_failed(const char* what) {
  char buf[256] = "no detail";
  if (unsigned long e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  throw Error(ErrorKind::Internal, std::string("frame integrity: libcrypto ") + what + " failed: " + buf);
}

}  // namespace

void FrameAuth::CtxFree::operator()(evp_cipher_ctx_st* c) const { EVP_CIPHER_CTX_free(c); }

FrameAuth::FrameAuth(const proto::Key& key, proto::Direction direction)
    : ctx_(EVP_CIPHER_CTX_new()), dir_(uint8_t(direction)) {
  static_assert(std::tuple_size<proto::Key>::value == 32, "AES-256 takes a 32-byte key");
  if (!ctx_) crypto_failed("EVP_CIPHER_CTX_new");
  if (EVP_EncryptInit_ex(ctx_.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_GCM_SET_IVLEN, kIvBytes, nullptr) != 1 ||
      EVP_EncryptInit_ex(ctx_.get(), nullptr, nullptr, key.data(), nullptr) != 1)
    crypto_failed("AES-256-GCM set-up");
}

FrameAuth::~FrameAuth() = default;

void FrameAuth::start(uint8_t part) {
  uint8_t iv[kIvBytes] = {dir_, part, 0, 0};
  for (int i = 0; i < 8; ++i) iv[4 + i] = uint8_t(counter_ >> (8 * i));
  if (EVP_EncryptInit_ex(ctx_.get(), nullptr, nullptr, nullptr, iv) != 1) crypto_failed("GCM IV set-up");
}

void FrameAuth::update(const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (len > 0) {
    const int n = len > size_t(INT_MAX / 2) ? INT_MAX / 2 : int(len);
    int outl = 0;
    if (EVP_EncryptUpdate(ctx_.get(), nullptr, &outl, p, n) != 1) crypto_failed("GMAC update");
    p += n;
    len -= size_t(n);
  }
}

namespace {

FrameAuth::Tag final_tag(evp_cipher_ctx_st* ctx) {
  unsigned char none[16];
  int outl = 0;
  FrameAuth::Tag tag;
  if (EVP_EncryptFinal_ex(ctx, none, &outl) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, int(tag.size()), tag.data()) != 1)
    crypto_failed("GMAC final");
  return tag;
}

}  // namespace

FrameAuth::Tag FrameAuth::header_tag(const uint8_t* hdr, size_t len) {
  start(kPartHeader);
  update(hdr, len);
  return final_tag(ctx_.get());
}

void FrameAuth::begin(const uint8_t* hdr, size_t len) {
  start(kPartFrame);
  update(hdr, len);
}

FrameAuth::Tag FrameAuth::finish() {
  Tag tag = final_tag(ctx_.get());
  counter_++;
  return tag;
}

bool FrameAuth::equal(const Tag& a, const uint8_t* b) { return CRYPTO_memcmp(a.data(), b, a.size()) == 0; }

std::string integrity_failure(const std::string& peer, uint64_t frame, bool header) {
  return "frame integrity check failed from " + peer + " (" + (header ? "header" : "payload") + " of frame " +
         std::to_string(frame) + "): the frame was modified, replayed, reordered or dropped on the way";
}

}  // namespace rs::net
