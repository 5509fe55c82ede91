#include "nccl_plugin/collnet_handle.h"

#include <cstring>

#include "common/error.h"
#include "protocol/wire.h"

namespace rs::nccl::collnet {

namespace {

constexpr uint32_t kMagic = 0x48434e52u;  // "RNCH"
constexpr uint16_t kVersion = 1;

// Offsets (see the header).
constexpr size_t kVersionAt = 4, kReservedAt = 6, kNonceAt = 8, kCommIdAt = 24, kFingerprintAt = 32, kReducersAt = 40,
                 kHostAt = 44, kEnd = kHostAt + kHandleHostBytes;
static_assert(kReservedAt + 2 == kNonceAt && kNonceAt + kHandleNonceBytes == kCommIdAt, "handle layout");
static_assert(kEnd <= kHandleBytes, "the handle fits NCCL's buffer");

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}

}  // namespace

void encode_handle(const Handle& h, uint8_t* out, size_t out_len) {
  if (!out || out_len < kHandleBytes)
    throw Error(ErrorKind::Internal, "CollNet handle: a buffer of " + std::to_string(out_len) + " bytes, " +
                                         std::to_string(kHandleBytes) + " needed");
  std::memset(out, 0, kHandleBytes);
  proto::put_u32(out, kMagic);
  proto::put_u16(out + kVersionAt, kVersion);
  std::memcpy(out + kNonceAt, h.nonce.data(), kHandleNonceBytes);
  proto::put_u64(out + kCommIdAt, h.comm_id);
  proto::put_u64(out + kFingerprintAt, h.pool_fingerprint);
  proto::put_u32(out + kReducersAt, h.reducers);
  std::memcpy(out + kHostAt, h.host.data(), strnlen(h.host.c_str(), kHandleHostBytes));
}

Handle decode_handle(const uint8_t* in, size_t len, const std::string& whose) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorKind::Protocol, whose + " is not a CollNet handle of this plugin version (" + why +
                                          "; mixed plugin versions in one job?)");
  };
  if (!in) throw bad("no handle");
  if (len < kHandleBytes) throw bad(std::to_string(len) + " bytes, " + std::to_string(kHandleBytes) + " expected");
  if (proto::get_u32(in) != kMagic) throw bad("bad magic");
  const uint16_t version = proto::get_u16(in + kVersionAt);
  if (version != kVersion) throw bad("version " + std::to_string(version) + ", expected " + std::to_string(kVersion));
  if (!all_zero(in + kReservedAt, kNonceAt - kReservedAt) || !all_zero(in + kEnd, kHandleBytes - kEnd))
    throw bad("reserved bytes set");
  Handle h;
  std::memcpy(h.nonce.data(), in + kNonceAt, kHandleNonceBytes);
  h.comm_id = proto::get_u64(in + kCommIdAt);
  h.pool_fingerprint = proto::get_u64(in + kFingerprintAt);
  h.reducers = proto::get_u32(in + kReducersAt);
  const char* host = reinterpret_cast<const char*>(in + kHostAt);
  h.host.assign(host, strnlen(host, kHandleHostBytes));
  return h;
}

}  // namespace rs::nccl::collnet
