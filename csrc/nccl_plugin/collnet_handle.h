// The CollNet handle: what a head's listen() gives NCCL and NCCL all-gathers to every head's
// connect() (NCCL_NET_HANDLE_MAXSIZE = 128 bytes, opaque to NCCL). The one place that knows its
// layout; little-endian, fixed offsets:
//
//   [0,4) magic "RNCH"   [4,6) version (1)   [6,8) zero   [8,24) nonce (random, per listen)
//   [24,32) NCCL communicator id (0 before v11, which has none)
//   [32,40) fingerprint of (job id, reducer list)   [40,44) number of reducers
//   [44,108) host name, NUL-padded (for log lines only)   [108,128) zero
//
// Every head of a job runs the same plugin, so a handle that does not decode is another plugin's
// or version's, or a corrupted one: connect() then fails on every head alike.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "nccl_plugin/nccl_abi.h"

namespace rs::nccl::collnet {

constexpr size_t kHandleBytes = NCCL_NET_HANDLE_MAXSIZE;
constexpr size_t kHandleNonceBytes = 16;
constexpr size_t kHandleHostBytes = 64;

struct Handle {
  std::array<uint8_t, kHandleNonceBytes> nonce{};
  uint64_t comm_id = 0;
  uint64_t pool_fingerprint = 0;
  uint32_t reducers = 0;
  std::string host;  // cut to kHandleHostBytes (and at a NUL) when encoded; a peer's: quote it with
                     // client::peer_text (raw bytes, any of them)
};

// Writes `h` over out[0, kHandleBytes) (zeros where nothing is stored). Throws
// Error(Internal) when `out` is null or `out_len` is less than kHandleBytes.
void encode_handle(const Handle& h, uint8_t* out, size_t out_len);

// Reads a handle from in[0, len). Throws Error(Protocol), naming `whose` ("the handle of head 3"),
// for a null or short buffer, another magic or version, or a non-zero reserved byte.
Handle decode_handle(const uint8_t* in, size_t len, const std::string& whose);

}  // namespace rs::nccl::collnet
