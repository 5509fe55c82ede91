// Unit tests of the frame reader without integrity tags (csrc/net/frame_io.h), over a socketpair:
// a random stream of frames of every size reaches every kind of sink intact, whatever the socket
// buffers, the write splits and the read budgets. The tests drive the reader only as the
// reducer's epoll and the worker's poll do: pump() when the socket is readable, or again after a
// pause. A frame left complete in the reader's memory with nothing in the socket would never be
// read (a reader that reads ahead must not stop on a spent budget with the next frame in hand):
// the "stuck" checks below catch it. Built and run by tests/protocol/test_protocol.py.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "net/frame_io.h"

using namespace rs;

struct Pair {
  int fd[2] = {-1, -1};
  explicit Pair(int buf) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fd) != 0) std::abort();
    for (int f : fd) {
      fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK);
      setsockopt(f, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
      setsockopt(f, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    }
  }
  ~Pair() {
    close_writer();
    close_reader();
  }
  void close_writer() {
    if (fd[0] >= 0) ::close(fd[0]);
    fd[0] = -1;
  }
  void close_reader() {
    if (fd[1] >= 0) ::close(fd[1]);
    fd[1] = -1;
  }
};

struct Rng {  // deterministic: a failure is reproducible
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint32_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return uint32_t(s >> 11);
  }
  uint32_t below(uint32_t n) { return n ? next() % n : 0; }
};

// Which sink a frame's payload goes to: chosen by the writer, told to the reader in the header.
enum Kind : uint8_t { kMemory = 0, kScatter = 1, kAligned4 = 2, kAligned8 = 3, kText = 4, kDiscard = 5, kKinds = 6 };

struct Frame {
  Kind kind;
  std::vector<uint8_t> payload;
};

static bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) > 0;
}

// Writes `frames` to one end and reads them at the other, pumping only when poll() says the
// socket is readable (plus once more after each pause, as the reducer resumes a paused member).
// `budget_max` > 0: each pump gets a random budget up to it. `pause_every` > 0: every that many
// headers are paused once. Checks every payload, header and the frame count.
static void stream(uint64_t seed, int sockbuf, uint32_t budget_max, int pause_every, bool close_early = false) {
  Rng rng(seed);
  Pair p(sockbuf);
  std::vector<Frame> frames(300);
  const size_t n_expected = close_early ? frames.size() / 2 : frames.size();
  net::FrameWriter out(frames.size() + 1);
  for (size_t i = 0; i < frames.size(); ++i) {
    Frame& f = frames[i];
    f.kind = Kind(rng.below(kKinds));
    const uint32_t r = rng.below(10);
    uint32_t len = r < 2 ? 0 : r < 5 ? 1 + rng.below(200) : r < 8 ? 1 + rng.below(20000) : 40000 + rng.below(30000);
    if (len) len = len < 8 ? 8 : len - len % 8;  // data: whole float32 elements (and whole 8-byte units)
    f.payload.resize(len);
    for (auto& b : f.payload) b = uint8_t(rng.next());
    proto::FrameHeader h;
    h.type = len ? proto::FrameType::Data : proto::FrameType::Done;  // (the frames without a payload)
    h.dtype = 0;
    h.length = len;
    h.round = i;
    h.tag = f.kind;
    h.total_bytes = h.shard_bytes = len;
    uint8_t hdr[proto::kFrameHeaderBytes];
    proto::encode(h, hdr);
    if (i < n_expected) CHECK(out.push(hdr, sizeof hdr, net::Payload::bytes(f.payload.data(), len), i));
  }

  // The reader's side: each frame's destination, by kind.
  net::FrameReader in(1u << 20);
  std::vector<uint8_t> mem, seg_a, seg_b, seg_c;
  net::Segments segs;
  std::string text;
  size_t got = 0, headers = 0, paused = 0;
  bool pause_pending = false;
  std::string error;
  auto on_header = [&](const proto::FrameHeader& h, const std::string& err) {
    if (!err.empty()) {
      error = err;
      return net::Sink::stop();
    }
    CHECK(h.round == got);
    if (pause_every > 0 && !pause_pending && ++headers % size_t(pause_every) == 0) {
      pause_pending = true;
      paused++;
      return net::Sink::pause();
    }
    pause_pending = false;
    const uint32_t len = h.length;
    switch (Kind(h.tag)) {
      case kMemory:
        mem.assign(len, 0);
        return net::Sink::memory(mem.data());
      case kScatter:
      case kAligned4:
      case kAligned8: {
        // three segments of uneven sizes (an empty one is dropped by Segments)
        const uint32_t a = len / 3, b = len / 4;
        seg_a.assign(a, 0), seg_b.assign(b, 0), seg_c.assign(len - a - b, 0);
        iovec v[3] = {{seg_a.data(), seg_a.size()}, {seg_b.data(), seg_b.size()}, {seg_c.data(), seg_c.size()}};
        segs.assign(v, 3);
        const uint32_t align = h.tag == kAligned4 ? 4 : h.tag == kAligned8 ? 8 : 1;
        return net::Sink::scatter(segs, 0, align);
      }
      case kText:
        return net::Sink::text_into(&text);
      default:
        return net::Sink::discard();
    }
  };
  auto on_frame = [&](const proto::FrameHeader& h) {
    const Frame& f = frames[got];
    CHECK(h.length == f.payload.size());
    std::vector<uint8_t> seen;
    switch (Kind(h.tag)) {
      case kMemory:
        seen = mem;
        break;
      case kScatter:
      case kAligned4:
      case kAligned8:
        seen = seg_a;
        seen.insert(seen.end(), seg_b.begin(), seg_b.end());
        seen.insert(seen.end(), seg_c.begin(), seg_c.end());
        break;
      case kText:
        seen.assign(text.begin(), text.end());
        break;
      default:
        seen = f.payload;  // dropped by design
    }
    if (seen != f.payload) {
      std::fprintf(stderr, "seed %llu: frame %zu (kind %d, %zu bytes) arrived changed\n", (unsigned long long)seed, got,
                   int(h.tag), f.payload.size());
      ++failures;
    }
    ++got;
    return true;
  };

  bool writer_open = true;
  for (int spins = 0; got < n_expected && spins < 200000; ++spins) {
    if (writer_open) {
      out.flush(p.fd[0], "writer", nullptr, [](uint64_t) {});
      if (close_early && out.empty()) {  // the writer leaves with half of the next header sent
        uint8_t half[proto::kFrameHeaderBytes / 2] = {};
        CHECK(::send(p.fd[0], half, sizeof half, MSG_NOSIGNAL) == ssize_t(sizeof half));
        p.close_writer();
        writer_open = false;
      }
    }
    const bool all_written = !writer_open || out.empty();
    if (!pause_pending && !readable(p.fd[1], all_written ? 200 : 0)) {
      if (all_written) {
        std::fprintf(stderr, "seed %llu: stuck after %zu of %zu frames: the socket is empty\n",
                     (unsigned long long)seed, got, n_expected);
        ++failures;
        return;
      }
      continue;
    }
    net::IoBudget budget(budget_max ? 1 + rng.below(budget_max) : 1);
    try {
      net::IoResult r = in.pump(p.fd[1], "peer", budget_max ? &budget : nullptr, on_header, on_frame);
      CHECK(!r.stopped);
      // It stops for a reason: the socket is empty, the budget is spent or a header is paused.
      CHECK(r.blocked || r.paused || (budget_max && budget.spent()));
    } catch (const Error& e) {
      error = e.what();
      break;
    }
    if (!error.empty()) break;
  }
  CHECK(got == n_expected);
  if (close_early) {
    // The rest: the half header, then end of stream, reported as the peer's loss.
    std::string lost;
    for (int i = 0; i < 100 && lost.empty(); ++i) {
      try {
        if (readable(p.fd[1], 100)) in.pump(p.fd[1], "peer", nullptr, on_header, on_frame);
      } catch (const Error& e) {
        lost = e.what();
        CHECK(e.kind() == ErrorKind::PeerLost);
      }
    }
    CHECK(lost.find("closed the connection") != std::string::npos);
    CHECK(got == n_expected);
  } else {
    if (!error.empty()) std::fprintf(stderr, "seed %llu: %s\n", (unsigned long long)seed, error.c_str());
    CHECK(error.empty());
  }
  if (pause_every > 0) CHECK(paused > 0);
}

// A data frame and a frame without payload (a DONE) in the socket at once, read with every budget
// from 1 byte to past both frames: the DONE must never be left complete in the reader's memory
// when the budget runs out with the socket empty (no poll would report it).
static void budget_edges() {
  for (uint32_t b = 1; b < 12000; b += 3) {
    Pair p(1 << 20);
    std::vector<uint8_t> payload(1000, 7), got;
    uint8_t frames[2][proto::kFrameHeaderBytes];
    proto::FrameHeader h;
    h.type = proto::FrameType::Data;
    h.length = 1000;
    h.total_bytes = h.shard_bytes = 1000;
    proto::encode(h, frames[0]);
    h = proto::FrameHeader{};
    h.type = proto::FrameType::Done;
    h.round = 1;
    proto::encode(h, frames[1]);
    std::string wire(reinterpret_cast<char*>(frames[0]), sizeof frames[0]);
    wire.append(payload.begin(), payload.end());
    wire.append(reinterpret_cast<char*>(frames[1]), sizeof frames[1]);
    CHECK(::send(p.fd[0], wire.data(), wire.size(), 0) == ssize_t(wire.size()));
    net::FrameReader in;
    size_t n = 0;
    while (n < 2 && readable(p.fd[1], 0)) {
      net::IoBudget budget(b);
      in.pump(
          p.fd[1], "peer", &budget,
          [&](const proto::FrameHeader& hh, const std::string& err) {
            CHECK(err.empty());
            got.resize(hh.length);
            return net::Sink::memory(got.data());
          },
          [&](const proto::FrameHeader&) {
            ++n;
            return true;
          });
    }
    if (n != 2) {
      std::fprintf(stderr, "budget %u: %zu of 2 frames, then nothing readable\n", b, n);
      ++failures;
    }
  }
}

int main() {
  budget_edges();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    stream(seed, 4096, 0, 0);             // small buffers: many partial reads and writes
    stream(seed, 1 << 20, 0, 0);          // large buffers: many frames queued, read ahead at work
    stream(seed, 1 << 20, 30000, 0);      // random budgets: never stuck with a header in memory
    stream(seed, 1 << 20, 6000, 0);       // budgets below one frame
    stream(seed, 1 << 20, 30000, 3);      // pauses, also of headers read ahead
    stream(seed, 65536, 0, 0, true);      // the writer leaves mid-header
  }
  return finish("test_frame_io");
}
