// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for the handshake's
// challenge-response authentication, plus a constant-time comparison.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rs::proto {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t len);
Digest hmac_sha256(const std::string& key, const std::string& message);
bool digest_equal(const Digest& a, const Digest& b);  // constant time
void random_bytes(uint8_t* out, size_t n);            // from the OS (getrandom / urandom)

}  // namespace rs::proto
