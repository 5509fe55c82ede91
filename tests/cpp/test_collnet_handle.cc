// The CollNet handle codec (csrc/nccl_plugin/collnet_handle.*): the layout byte by byte
// (little-endian), a round trip, and every way a handle from a peer can be wrong: null, short,
// another magic or version, reserved bytes set, a host name with no NUL.
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "nccl_plugin/collnet_handle.h"

using rs::Error;
using rs::ErrorKind;
using rs::nccl::collnet::decode_handle;
using rs::nccl::collnet::encode_handle;
using rs::nccl::collnet::Handle;
using rs::nccl::collnet::kHandleBytes;

namespace {

Handle sample() {
  Handle h;
  for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = uint8_t(0xa0 + i);
  h.comm_id = 0x0102030405060708ull;
  h.pool_fingerprint = 0x1122334455667788ull;
  h.reducers = 0x00000203u;
  h.host = "node-7";
  return h;
}

// decode must refuse `bytes` with a Protocol error whose message contains `want`.
bool refused(const uint8_t* bytes, size_t len, const std::string& want) {
  try {
    decode_handle(bytes, len, "the handle of head 2");
  } catch (const Error& e) {
    const std::string m = e.what();
    return e.kind() == ErrorKind::Protocol && m.find("the handle of head 2") != std::string::npos &&
           m.find(want) != std::string::npos;
  }
  return false;
}

void layout_is_little_endian_at_fixed_offsets() {
  std::vector<uint8_t> b(kHandleBytes, 0xee);
  encode_handle(sample(), b.data(), b.size());
  const uint8_t head[] = {0x52, 0x4e, 0x43, 0x48, 0x01, 0x00, 0x00, 0x00};  // "RNCH", version 1, zero
  CHECK(std::memcmp(b.data(), head, sizeof head) == 0);
  CHECK(b[8] == 0xa0 && b[23] == 0xaf);
  const uint8_t comm[] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
  CHECK(std::memcmp(b.data() + 24, comm, 8) == 0);
  CHECK(b[32] == 0x88 && b[39] == 0x11);
  CHECK(b[40] == 0x03 && b[41] == 0x02 && b[42] == 0 && b[43] == 0);
  CHECK(std::memcmp(b.data() + 44, "node-7", 6) == 0);
  for (size_t i = 50; i < kHandleBytes; ++i) CHECK(b[i] == 0);  // host padding and the tail
}

void round_trip() {
  std::vector<uint8_t> b(kHandleBytes);
  const Handle in = sample();
  encode_handle(in, b.data(), b.size());
  const Handle out = decode_handle(b.data(), b.size(), "x");
  CHECK(out.nonce == in.nonce && out.comm_id == in.comm_id && out.pool_fingerprint == in.pool_fingerprint);
  CHECK(out.reducers == in.reducers && out.host == in.host);
  // A host name longer than its field is cut to 64 bytes; one of exactly 64 has no NUL and reads back whole.
  Handle longer = in;
  longer.host = std::string(100, 'h');
  encode_handle(longer, b.data(), b.size());
  CHECK(decode_handle(b.data(), b.size(), "x").host == std::string(64, 'h'));
}

void corrupted_and_short_handles_are_refused() {
  std::vector<uint8_t> good(kHandleBytes);
  encode_handle(sample(), good.data(), good.size());
  CHECK(refused(nullptr, kHandleBytes, "no handle"));
  CHECK(refused(good.data(), 0, "0 bytes, 128 expected"));
  CHECK(refused(good.data(), kHandleBytes - 1, "127 bytes, 128 expected"));
  auto with = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> b = good;
    b[at] = value;
    return b;
  };
  CHECK(refused(with(0, 0x53).data(), kHandleBytes, "bad magic"));
  CHECK(refused(with(3, 0x00).data(), kHandleBytes, "bad magic"));
  CHECK(refused(with(4, 0x02).data(), kHandleBytes, "version 2, expected 1"));
  CHECK(refused(with(5, 0x01).data(), kHandleBytes, "version 257, expected 1"));
  CHECK(refused(with(6, 0x01).data(), kHandleBytes, "reserved bytes set"));
  CHECK(refused(with(108, 0x01).data(), kHandleBytes, "reserved bytes set"));
  CHECK(refused(with(127, 0xff).data(), kHandleBytes, "reserved bytes set"));
  std::vector<uint8_t> zeros(kHandleBytes, 0);
  CHECK(refused(zeros.data(), kHandleBytes, "bad magic"));
  // Every other byte is data: flipping one changes a field, never the verdict.
  for (size_t at : {8u, 23u, 24u, 31u, 32u, 39u, 40u, 43u, 44u, 107u})
    CHECK(!refused(with(at, uint8_t(good[at] ^ 0x5a)).data(), kHandleBytes, ""));
}

void a_small_output_buffer_is_an_internal_error() {
  std::vector<uint8_t> b(kHandleBytes - 1);
  bool threw = false;
  try {
    encode_handle(sample(), b.data(), b.size());
  } catch (const Error& e) {
    threw = e.kind() == ErrorKind::Internal;
  }
  CHECK(threw);
  threw = false;
  try {
    encode_handle(sample(), nullptr, kHandleBytes);
  } catch (const Error& e) {
    threw = e.kind() == ErrorKind::Internal;
  }
  CHECK(threw);
}

}  // namespace

int main() {
  layout_is_little_endian_at_fixed_offsets();
  round_trip();
  corrupted_and_short_handles_are_refused();
  a_small_output_buffer_is_an_internal_error();
  return finish("test_collnet_handle");
}
