// The wire format (docs/protocol.md is the prose version of this file).
// Everything is little-endian and encoded/decoded byte by byte, so the layout does
// not depend on the host's endianness or struct padding. Every length read from
// the network is checked against the limits below before it is used.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rs::proto {

constexpr uint32_t kMagic = 0x56525352u;  // bytes "RSRV" on the wire
constexpr uint16_t kVersion = 2;

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr size_t kMaxNameBytes = 256;      // job id, group name
constexpr size_t kMaxMessageBytes = 4096;  // error / reject text
constexpr uint32_t kMinChunkBytes = 64;
constexpr uint32_t kMaxChunkBytes = 64u << 20;
constexpr uint32_t kMaxWorldSize = 65536;
constexpr uint16_t kMaxStreams = 64;

// ---- little-endian primitives ------------------------------------------------
inline void put_u8(uint8_t* p, uint8_t v) { p[0] = v; }
inline void put_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
}
inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline uint16_t get_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---- handshake -------------------------------------------------------------
// 1. reducer -> worker, right after accept: CHALLENGE (48 bytes)
struct Challenge {
  uint16_t version = kVersion;
  uint8_t auth_required = 0;
  uint32_t max_chunk_bytes = kMaxChunkBytes;
  std::array<uint8_t, kNonceBytes> nonce{};
};
constexpr size_t kChallengeBytes = 48;
void encode(const Challenge& c, uint8_t out[kChallengeBytes]);
// Returns "" on success, else why the bytes are not a challenge.
std::string decode(const uint8_t in[kChallengeBytes], Challenge* c);

// 2. worker -> reducer: HELLO (96 fixed bytes, then job id and group name bytes)
// Flags: kHelloIntegrity asks for frame integrity (net/frame_auth.h); it needs authentication.
// A reducer that accepts such a hello (REPLY Ok) protects every frame of the connection in both
// directions; one that does not offer it refuses with IntegrityMismatch.
// kHelloFailover: the worker sends DONE frames and waits for CLEAR before it releases a round
// (reducer failover); every member of a group must send the same bit (GroupConflict otherwise).
// Other bits: BadHello.
constexpr uint16_t kHelloIntegrity = 1;
constexpr uint16_t kHelloFailover = 1u << 8;
constexpr uint16_t kHelloKnownFlags = kHelloIntegrity | kHelloFailover;
struct Hello {
  uint16_t version = kVersion;
  uint16_t flags = 0;  // kHello* bits
  uint32_t world_size = 0;
  uint32_t rank = 0;
  uint16_t stream_index = 0;
  uint16_t num_streams = 1;
  uint32_t chunk_bytes = 0;
  std::string job_id;
  std::string group;
  std::array<uint8_t, kNonceBytes> nonce{};  // the worker's nonce: the reducer's reply MAC covers it
  std::array<uint8_t, kMacBytes> mac{};      // see protocol/auth.h
};
constexpr size_t kHelloFixedBytes = 96;
// Encodes the whole hello (fixed part + names); the mac field is written as given.
std::string encode(const Hello& h);
// The fixed part with a zero mac followed by the names: what the hello MAC covers (after the nonce).
std::string encode_unsigned(const Hello& h);
// Decodes the fixed part; *job_len / *group_len receive the number of name bytes that follow.
// Checks every field's range; names are checked by check_name once they have arrived.
std::string decode_fixed(const uint8_t in[kHelloFixedBytes], Hello* h, size_t* job_len, size_t* group_len);

// Job ids and group names: 1..256 bytes of ASCII letters, digits and "._-:/@+=#". They appear
// in logs and keys, so nothing else is accepted. Returns "" or why `name` is refused.
std::string check_name(const char* what, const std::string& name);
extern const char* const kNameRule;  // the rule in words, for messages and docs

// 3. reducer -> worker: REPLY (40 bytes + message)
enum class Status : uint16_t {
  Ok = 0,
  BadVersion = 1,
  AuthFailed = 2,
  BadHello = 3,
  GroupConflict = 4,  // world size / streams / chunk size differ from the group's
  RankTaken = 5,      // retryable: the previous connection of this rank is still closing
  ShuttingDown = 6,
  OverLimit = 7,          // a memory, connection or group cap of the reducer (the message names the setting)
  GroupIncomplete = 8,    // the group did not complete within the reducer's group timeout
  IntegrityMismatch = 9,  // frame integrity asked for but not offered, or required but not asked for
};
struct Reply {
  Status status = Status::Ok;
  std::string message;                   // <= kMaxMessageBytes
  std::array<uint8_t, kMacBytes> mac{};  // zeros unless the reducer has a secret (protocol/auth.h)
};
constexpr size_t kReplyFixedBytes = 40;
std::string encode(const Reply& r);
// The fixed part with a zero mac followed by the message: what the reply MAC covers.
std::string encode_unsigned(const Reply& r);
std::string decode_reply_fixed(const uint8_t in[kReplyFixedBytes], Reply* r, size_t* msg_len);
const char* status_name(Status s);

// ---- frames ------------------------------------------------------------------
// DONE (worker -> reducer, header only): `round` = R, this member holds the results of every
// round < R on this stream. CLEAR (reducer -> worker, header only): `round` = R, every member
// of the group sent DONE >= R, so every worker holds those results (reducer failover relies on
// it: a worker hands a round back to its caller only once it is cleared everywhere).
enum class FrameType : uint8_t { Data = 1, Result = 2, Error = 3, Bye = 4, Done = 5, Clear = 6 };
enum FrameFlags : uint8_t { kLastInStream = 1 };
// BYE flags: the worker leaves because reducers were lost (failover); `tag` = bit mask of the
// lost reducers' indices (< 64) in the job's reducer list. The reducer tells the others with
// ErrorCode::Failover and the same tag.
enum ByeFlags : uint8_t { kByeFailover = 1 };
enum class ErrorCode : uint8_t { Mismatch = 1, PeerLost = 2, Protocol = 3, Shutdown = 4, Internal = 5, Failover = 6 };

constexpr size_t kFrameHeaderBytes = 48;
struct FrameHeader {
  FrameType type = FrameType::Data;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t flags = 0;         // Data/Result: FrameFlags; Error: ErrorCode; Bye: ByeFlags
  uint32_t length = 0;       // payload bytes following the header
  uint64_t round = 0;        // all-reduce sequence number of the communicator
  uint64_t total_bytes = 0;  // size of the whole buffer being reduced (all shards)
  uint64_t shard_bytes = 0;  // size of this reducer's shard
  uint64_t offset = 0;       // byte offset of the payload inside the shard
  uint64_t tag = 0;          // opaque value all ranks must agree on (fusion fingerprint)
};
void encode(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]);
// Structural checks only (type known, lengths within limits); "" if fine.
std::string decode(const uint8_t in[kFrameHeaderBytes], FrameHeader* h, uint32_t max_payload);

}  // namespace rs::proto
