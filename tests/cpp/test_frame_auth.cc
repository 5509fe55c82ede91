// Unit tests of frame integrity in the transport (csrc/net/frame_auth.h, frame_io.h), over a
// socketpair: protected frames survive partial writes and reads, any flipped byte, a replayed or
// a dropped frame is refused, and a frame costs no allocation in libcrypto. Built and run by
// tests/protocol/test_integrity.py.
#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "net/frame_io.h"

using namespace rs;

static std::atomic<long> allocations{0};
static void* counting_malloc(size_t n, const char*, int) {
  allocations++;
  return std::malloc(n);
}
static void* counting_realloc(void* p, size_t n, const char*, int) {
  allocations++;
  return std::realloc(p, n);
}
static void counting_free(void* p, const char*, int) { std::free(p); }

static const std::array<uint8_t, proto::kNonceBytes> kWorkerNonce = {1, 2, 3};
static const std::array<uint8_t, proto::kNonceBytes> kChallengeNonce = {4, 5, 6};

static proto::Key job_key() {
  proto::Key k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = uint8_t(i * 7 + 1);
  return k;
}

static void data_header(uint32_t len, uint64_t round, uint8_t out[proto::kFrameHeaderBytes]) {
  proto::FrameHeader h;
  h.type = proto::FrameType::Data;
  h.dtype = 0;  // float32
  h.length = len;
  h.round = round;
  h.total_bytes = h.shard_bytes = len;
  proto::encode(h, out);
}

struct Pair {
  int fd[2] = {-1, -1};
  Pair() {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fd) != 0) std::abort();
    for (int f : fd) {
      fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK);
      int small = 4096;  // many partial writes and reads, also inside tags
      setsockopt(f, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
      setsockopt(f, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    }
  }
  ~Pair() {
    for (int f : fd) ::close(f);
  }
};

// The worker's writer and the reducer's reader of the worker -> reducer direction.
struct Link {
  net::FrameWriter out{16};
  net::FrameReader in;
  net::FrameWriter unused_out;
  net::FrameReader unused_in;
  Link() {
    net::protect(&out, &unused_in, job_key(), kWorkerNonce, kChallengeNonce, proto::Direction::WorkerToReducer);
    net::protect(&unused_out, &in, job_key(), kWorkerNonce, kChallengeNonce, proto::Direction::ReducerToWorker);
  }
};

// Moves frames from `w` to `r` until `want` frames arrived (or an error); the payloads go to `sink`.
static std::string transfer(net::FrameWriter& w, int wfd, net::FrameReader& r, int rfd, size_t want,
                            std::vector<uint8_t>* sink, size_t* got_frames) {
  try {
    for (int spins = 0; *got_frames < want && spins < 100000; ++spins) {
      w.flush(wfd, "writer", nullptr, [](uint64_t) {});
      r.pump(
          rfd, "peer", nullptr,
          [&](const proto::FrameHeader& h, const std::string& err) {
            if (!err.empty()) return net::Sink::stop();
            sink->resize(sink->size() + h.length);
            return net::Sink::memory(sink->data() + sink->size() - h.length);
          },
          [&](const proto::FrameHeader&) {
            ++*got_frames;
            return true;
          });
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

static void round_trip() {
  Pair p;
  Link l;
  // A scatter-gather payload over three segments, and plain ones of several sizes.
  std::vector<uint8_t> a(1000), b(3000), c(5000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint8_t(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(i * 3);
  for (size_t i = 0; i < c.size(); ++i) c[i] = uint8_t(i * 5);
  iovec segs[3] = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  net::Segments s;
  s.assign(segs, 3);
  std::vector<uint8_t> expect;
  uint8_t hdr[proto::kFrameHeaderBytes];
  const uint32_t sizes[] = {4, 996, 4000, 4000};  // 9000 bytes: crosses every segment boundary
  uint64_t off = 0;
  for (uint32_t len : sizes) {
    data_header(len, 0, hdr);
    CHECK(l.out.push(hdr, sizeof hdr, net::Payload::range(s, off, len), 0));
    for (uint32_t i = 0; i < len; ++i) {
      const uint64_t at = off + i;
      expect.push_back(at < 1000 ? a[at] : at < 4000 ? b[at - 1000] : c[at - 4000]);
    }
    off += len;
  }
  std::vector<uint8_t> got;
  size_t frames = 0;
  std::string err = transfer(l.out, p.fd[0], l.in, p.fd[1], 4, &got, &frames);
  CHECK(err.empty());
  CHECK(frames == 4);
  CHECK(got == expect);
}

// Captures the bytes of `n` protected frames as the writer sends them.
static std::string sealed_bytes(int n, uint32_t len) {
  Pair p;
  Link l;
  std::vector<uint8_t> payload(len, 0x5a);
  uint8_t hdr[proto::kFrameHeaderBytes];
  for (int i = 0; i < n; ++i) {
    data_header(len, uint64_t(i), hdr);
    CHECK(l.out.push(hdr, sizeof hdr, net::Payload::bytes(payload.data(), len), 0));
  }
  std::string wire;
  const size_t total = size_t(n) * (proto::kFrameHeaderBytes + 2 * net::FrameAuth::kTagBytes + len);
  for (int spins = 0; wire.size() < total && spins < 100000; ++spins) {
    l.out.flush(p.fd[0], "writer", nullptr, [](uint64_t) {});
    char buf[8192];
    ssize_t k = ::recv(p.fd[1], buf, sizeof buf, 0);
    if (k > 0) wire.append(buf, size_t(k));
  }
  CHECK(wire.size() == total);
  return wire;
}

// Feeds raw bytes to a fresh protected reader; returns its error ("" if all frames passed).
static std::string read_raw(const std::string& wire, size_t frames_expected) {
  Pair p;
  Link l;
  std::vector<uint8_t> got;
  size_t frames = 0;
  std::string err;
  size_t sent = 0;
  try {
    for (int spins = 0; spins < 100000 && err.empty() && (sent < wire.size() || frames < frames_expected); ++spins) {
      if (sent < wire.size()) {
        ssize_t k = ::send(p.fd[0], wire.data() + sent, wire.size() - sent, MSG_DONTWAIT);
        if (k > 0) sent += size_t(k);
      }
      l.in.pump(
          p.fd[1], "peer", nullptr,
          [&](const proto::FrameHeader& h, const std::string& e) {
            if (!e.empty()) return net::Sink::stop();
            got.resize(got.size() + h.length);
            return net::Sink::memory(got.data() + got.size() - h.length);
          },
          [&](const proto::FrameHeader&) {
            ++frames;
            return true;
          });
      if (sent == wire.size() && frames >= frames_expected) break;
    }
  } catch (const Error& e) {
    err = e.what();
    CHECK(e.kind() == ErrorKind::Protocol);
  }
  return err;
}

static void tampering() {
  const uint32_t len = 256;
  const size_t frame = proto::kFrameHeaderBytes + 2 * net::FrameAuth::kTagBytes + len;
  const std::string wire = sealed_bytes(3, len);
  CHECK(read_raw(wire, 3).empty());  // untouched: all three pass
  // Every byte of frame 1 matters: header, header tag, payload, trailer.
  for (size_t at = frame; at < 2 * frame; at += 7) {
    std::string t = wire;
    t[at] = char(t[at] ^ 0x20);
    const std::string err = read_raw(t, 3);
    CHECK(err.find("frame integrity check failed from peer") != std::string::npos);
    CHECK(err.find("frame 1") != std::string::npos);
  }
  // Replayed (frame 0 twice), dropped (frame 1 missing), reordered (2 before 1).
  const std::string f0 = wire.substr(0, frame), f1 = wire.substr(frame, frame), f2 = wire.substr(2 * frame);
  for (const std::string& t : {f0 + f0 + f1, f0 + f2, f0 + f2 + f1}) {
    const std::string err = read_raw(t, 3);
    CHECK(err.find("frame integrity check failed") != std::string::npos);
    CHECK(err.find("header of frame 1") != std::string::npos);
  }
}

static void no_allocation_per_frame() {
  const long at_start = allocations.load();
  net::FrameAuth auth(job_key(), proto::Direction::ReducerToWorker);
  CHECK(allocations.load() > at_start);  // the counter sees libcrypto's allocations (the context's)
  std::vector<uint8_t> payload(1 << 16, 3);
  uint8_t hdr[proto::kFrameHeaderBytes] = {2};
  auth.header_tag(hdr, sizeof hdr);
  auth.begin(hdr, sizeof hdr);
  auth.update(payload.data(), payload.size());
  auth.finish();
  const long before = allocations.load();
  for (int i = 0; i < 1000; ++i) {
    auth.header_tag(hdr, sizeof hdr);
    auth.begin(hdr, sizeof hdr);
    auth.update(payload.data(), payload.size() - size_t(i));
    auth.finish();
  }
  CHECK(allocations.load() == before);
  std::printf("libcrypto allocations over 1000 frames: %ld\n", allocations.load() - before);
}

int main() {
  CHECK(CRYPTO_set_mem_functions(counting_malloc, counting_realloc, counting_free) == 1);
  no_allocation_per_frame();
  round_trip();
  tampering();
  return finish("frame integrity");
}
