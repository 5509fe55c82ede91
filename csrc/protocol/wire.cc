#include "protocol/wire.h"

#include <algorithm>
#include <cstring>

#include "common/dtype.h"
#include "common/text.h"
#include "protocol/plan.h"

namespace rs::proto {

void encode(const Challenge& c, uint8_t out[kChallengeBytes]) {
  std::memset(out, 0, kChallengeBytes);
  put_u32(out + 0, kMagic);
  put_u16(out + 4, c.version);
  put_u8(out + 6, c.auth_required);
  put_u8(out + 7, 0);
  put_u32(out + 8, c.max_chunk_bytes);
  put_u32(out + 12, 0);
  std::memcpy(out + 16, c.nonce.data(), kNonceBytes);
}

std::string decode(const uint8_t in[kChallengeBytes], Challenge* c) {
  if (get_u32(in) != kMagic) return "not a reduction-server reducer (bad magic in challenge)";
  c->version = get_u16(in + 4);
  c->auth_required = in[6];
  c->max_chunk_bytes = get_u32(in + 8);
  std::memcpy(c->nonce.data(), in + 16, kNonceBytes);
  return "";
}

static void encode_hello_fixed(const Hello& h, uint8_t* out, bool zero_mac) {
  std::memset(out, 0, kHelloFixedBytes);
  put_u32(out + 0, kMagic);
  put_u16(out + 4, h.version);
  put_u16(out + 6, h.flags);
  put_u32(out + 8, h.world_size);
  put_u32(out + 12, h.rank);
  put_u16(out + 16, h.stream_index);
  put_u16(out + 18, h.num_streams);
  put_u32(out + 20, h.chunk_bytes);
  put_u16(out + 24, uint16_t(h.job_id.size()));
  put_u16(out + 26, uint16_t(h.group.size()));
  put_u32(out + 28, 0);
  std::memcpy(out + 32, h.nonce.data(), kNonceBytes);
  if (!zero_mac) std::memcpy(out + 64, h.mac.data(), kMacBytes);
}

static std::string encode_hello(const Hello& h, bool zero_mac) {
  std::string out(kHelloFixedBytes + h.job_id.size() + h.group.size(), '\0');
  encode_hello_fixed(h, reinterpret_cast<uint8_t*>(&out[0]), zero_mac);
  std::memcpy(&out[kHelloFixedBytes], h.job_id.data(), h.job_id.size());
  std::memcpy(&out[kHelloFixedBytes + h.job_id.size()], h.group.data(), h.group.size());
  return out;
}

std::string encode(const Hello& h) { return encode_hello(h, false); }
std::string encode_unsigned(const Hello& h) { return encode_hello(h, true); }

std::string decode_fixed(const uint8_t in[kHelloFixedBytes], Hello* h, size_t* job_len, size_t* group_len) {
  if (get_u32(in) != kMagic) return "bad magic in hello (not a reduction-server worker)";
  h->version = get_u16(in + 4);
  h->flags = get_u16(in + 6);
  h->world_size = get_u32(in + 8);
  h->rank = get_u32(in + 12);
  h->stream_index = get_u16(in + 16);
  h->num_streams = get_u16(in + 18);
  h->chunk_bytes = get_u32(in + 20);
  *job_len = get_u16(in + 24);
  *group_len = get_u16(in + 26);
  std::memcpy(h->nonce.data(), in + 32, kNonceBytes);
  std::memcpy(h->mac.data(), in + 64, kMacBytes);
  if (h->version != kVersion) return "";  // the caller reports the version mismatch first
  if (h->flags & ~kHelloKnownFlags) return "unknown hello flags " + std::to_string(h->flags);
  if (*job_len == 0 || *group_len == 0) return "empty job id or group name";
  if (*job_len > kMaxNameBytes || *group_len > kMaxNameBytes) return "job id or group name longer than 256 bytes";
  if (h->world_size == 0 || h->world_size > kMaxWorldSize)
    return "world size " + std::to_string(h->world_size) + " out of range 1..65536";
  if (h->rank >= h->world_size)
    return "rank " + std::to_string(h->rank) + " out of range for world size " + std::to_string(h->world_size);
  if (h->num_streams == 0 || h->num_streams > kMaxStreams)
    return "streams " + std::to_string(h->num_streams) + " out of range 1..64";
  if (h->stream_index >= h->num_streams) return "stream index out of range";
  return check_chunk_bytes(h->chunk_bytes);
}

const char* const kNameRule = "1 to 256 bytes of ASCII letters, digits and ._-:/@+=#";

std::string check_name(const char* what, const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes) return std::string(what) + " must be " + kNameRule;
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(name[i]);
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                    std::strchr("._-:/@+=#", ch) != nullptr;
    if (!ok || ch == 0) {
      return std::string(what) + " has byte 0x" + rs::hex_byte(ch) + " at position " + std::to_string(i) +
             ": it must be " + kNameRule;
    }
  }
  return "";
}

static std::string encode_reply(const Reply& r, bool zero_mac) {
  const size_t mlen = std::min(r.message.size(), kMaxMessageBytes);
  std::string out(kReplyFixedBytes + mlen, '\0');
  auto* p = reinterpret_cast<uint8_t*>(&out[0]);
  put_u32(p, kMagic);
  put_u16(p + 4, uint16_t(r.status));
  put_u16(p + 6, uint16_t(mlen));
  if (!zero_mac) std::memcpy(p + 8, r.mac.data(), kMacBytes);
  std::memcpy(p + kReplyFixedBytes, r.message.data(), mlen);
  return out;
}

std::string encode(const Reply& r) { return encode_reply(r, false); }
std::string encode_unsigned(const Reply& r) { return encode_reply(r, true); }

std::string decode_reply_fixed(const uint8_t in[kReplyFixedBytes], Reply* r, size_t* msg_len) {
  if (get_u32(in) != kMagic) return "bad magic in reply";
  r->status = Status(get_u16(in + 4));
  *msg_len = get_u16(in + 6);
  std::memcpy(r->mac.data(), in + 8, kMacBytes);
  if (*msg_len > kMaxMessageBytes) return "reply message too long";
  return "";
}

const char* status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::BadVersion: return "protocol version mismatch";
    case Status::AuthFailed: return "authentication failed";
    case Status::BadHello: return "bad hello";
    case Status::GroupConflict: return "group conflict";
    case Status::RankTaken: return "rank already connected";
    case Status::ShuttingDown: return "reducer shutting down";
    case Status::OverLimit: return "over a reducer limit";
    case Status::GroupIncomplete: return "group incomplete";
    case Status::IntegrityMismatch: return "frame integrity mismatch";
  }
  return "unknown status";
}

void encode(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]) {
  put_u8(out + 0, uint8_t(h.type));
  put_u8(out + 1, h.dtype);
  put_u8(out + 2, h.op);
  put_u8(out + 3, h.flags);
  put_u32(out + 4, h.length);
  put_u64(out + 8, h.round);
  put_u64(out + 16, h.total_bytes);
  put_u64(out + 24, h.shard_bytes);
  put_u64(out + 32, h.offset);
  put_u64(out + 40, h.tag);
}

std::string decode(const uint8_t in[kFrameHeaderBytes], FrameHeader* h, uint32_t max_payload) {
  uint8_t type = in[0];
  if (type < 1 || type > 6) return "unknown frame type " + std::to_string(type);
  h->type = FrameType(type);
  h->dtype = in[1];
  h->op = in[2];
  h->flags = in[3];
  h->length = get_u32(in + 4);
  h->round = get_u64(in + 8);
  h->total_bytes = get_u64(in + 16);
  h->shard_bytes = get_u64(in + 24);
  h->offset = get_u64(in + 32);
  h->tag = get_u64(in + 40);
  if (h->type == FrameType::Done || h->type == FrameType::Clear) {
    if (h->length != 0) return "DONE/CLEAR frame with a payload";
    return "";
  }
  if (h->type == FrameType::Error || h->type == FrameType::Bye) {
    if (h->length > kMaxMessageBytes) return "error message length " + std::to_string(h->length) + " exceeds 4096";
    return "";
  }
  if (!valid_dtype(h->dtype)) return "unknown dtype code " + std::to_string(h->dtype);
  if (!valid_op(h->op)) return "unknown op code " + std::to_string(h->op);
  if (h->length > max_payload)
    return "payload length " + std::to_string(h->length) + " exceeds the chunk size " + std::to_string(max_payload);
  size_t es = dtype_size(DType(h->dtype));
  if (h->length == 0 || h->length % es)
    return "payload length " + std::to_string(h->length) + " is not a positive multiple of the element size";
  if (h->shard_bytes > h->total_bytes) return "shard larger than the whole buffer";
  if (h->offset > h->shard_bytes || h->length > h->shard_bytes - h->offset)
    return "payload [" + std::to_string(h->offset) + ", +" + std::to_string(h->length) + ") outside the shard of " +
           std::to_string(h->shard_bytes) + " bytes";
  if (h->offset % es) return "offset not aligned to the element size";
  return "";
}

}  // namespace rs::proto
