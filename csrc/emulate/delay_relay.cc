#include "emulate/delay_relay.h"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <deque>
#include <map>
#include <random>

#include "common/error.h"
#include "net/socket.h"

namespace rs::emulate {
namespace {

constexpr size_t kVnet = 10;                      // struct virtio_net_hdr (PACKET_VNET_HDR), passed through unchanged
constexpr size_t kMaxFrame = kVnet + 65536 + 64;  // a GSO frame of up to 64 KiB with its headers
constexpr int kSocketBuffer = 64 << 20;
constexpr size_t kMaxQueued = 16384;  // frames per port (then drops, like a full switch queue)

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Frame {
  int64_t due = 0;
  std::vector<uint8_t> buf;
};

struct Port {
  net::Fd fd;
  std::deque<Frame> q;
  int64_t last_due = 0;
};

net::Fd open_port(const std::string& name) {
  const unsigned idx = if_nametoindex(name.c_str());
  if (idx == 0) throw Error(ErrorKind::Config, "delay relay: no interface " + name);
  net::Fd fd(socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL)));
  if (fd.get() < 0) throw Error(ErrorKind::Config, "delay relay: packet socket: " + errno_text(errno));
  int one = 1;
  if (setsockopt(fd.get(), SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0 ||
      setsockopt(fd.get(), SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) != 0)
    throw Error(ErrorKind::Config, "delay relay: packet options on " + name + ": " + errno_text(errno));
  // Deep socket buffers (root may exceed rmem_max): the default 208 KiB holds three GSO frames, and
  // a port's burst beyond them was dropped here, not by the link's tbf (retransmissions, and
  // timeouts that made the emulated path look far worse than it was).
  int bytes = kSocketBuffer;
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes);
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes);
  sockaddr_ll a{};
  a.sll_family = AF_PACKET;
  a.sll_protocol = htons(ETH_P_ALL);
  a.sll_ifindex = int(idx);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw Error(ErrorKind::Config, "delay relay: bind " + name + ": " + errno_text(errno));
  return fd;
}

class Relay {
 public:
  explicit Relay(const RelayOptions& o) : o_(o), rng_(o.seed) {
    for (const std::string& n : o.ifaces) ports_.push_back(Port{open_port(n), {}, 0});
  }

  void run() {
    std::vector<pollfd> pfd(ports_.size());
    for (size_t i = 0; i < ports_.size(); ++i) pfd[i] = pollfd{ports_[i].fd.get(), POLLIN, 0};
    const int64_t end = o_.run_for_s > 0 ? now_ns() + int64_t(o_.run_for_s * 1e9) : 0;
    while (end == 0 || now_ns() < end) {
      const int64_t wait = next_due() - now_ns();
      timespec ts{0, 100'000'000};
      if (wait < 100'000'000) ts = timespec{0, long(std::max<int64_t>(wait, 0))};
      if (ppoll(pfd.data(), nfds_t(pfd.size()), &ts, nullptr) < 0 && errno != EINTR)
        throw Error(ErrorKind::Internal, "delay relay: poll: " + errno_text(errno));
      for (size_t i = 0; i < ports_.size(); ++i)
        if (pfd[i].revents & POLLIN) receive(i);
      send_due();
    }
  }

 private:
  int64_t next_due() const {
    int64_t t = now_ns() + 100'000'000;
    for (const Port& p : ports_)
      if (!p.q.empty()) t = std::min(t, p.q.front().due);
    return t;
  }

  std::vector<uint8_t> take_buffer() {
    if (free_.empty()) return std::vector<uint8_t>(kMaxFrame);
    std::vector<uint8_t> b = std::move(free_.back());
    free_.pop_back();
    b.resize(kMaxFrame);
    return b;
  }

  void receive(size_t in) {
    for (int n = 0; n < 64; ++n) {
      std::vector<uint8_t> b = take_buffer();
      const ssize_t got = recv(ports_[in].fd.get(), b.data(), b.size(), 0);
      if (got < ssize_t(kVnet + 14)) {
        free_.push_back(std::move(b));
        return;  // EAGAIN, or a runt
      }
      b.resize(size_t(got));
      route(in, std::move(b));
    }
  }

  void route(size_t in, std::vector<uint8_t> b) {
    std::array<uint8_t, 6> dst{}, src{};
    std::copy_n(b.data() + kVnet, 6, dst.begin());
    std::copy_n(b.data() + kVnet + 6, 6, src.begin());
    if (!(src[0] & 1)) macs_[src] = in;
    if (o_.loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < o_.loss) {
      free_.push_back(std::move(b));
      return;
    }
    const auto it = (dst[0] & 1) ? macs_.end() : macs_.find(dst);
    if (it != macs_.end()) {
      if (it->second != in) enqueue(it->second, std::move(b));
      else free_.push_back(std::move(b));
      return;
    }
    for (size_t o = 0; o < ports_.size(); ++o)
      if (o != in) enqueue(o, b);  // a flood: one copy each (ARP, and frames to unknown hosts)
    free_.push_back(std::move(b));
  }

  void enqueue(size_t out, std::vector<uint8_t> b) {
    Port& p = ports_[out];
    if (p.q.size() >= kMaxQueued) return;
    int64_t d = int64_t(o_.delay_us) * 1000;
    if (o_.jitter_us > 0) {
      const int64_t j = int64_t(o_.jitter_us);
      d += std::uniform_int_distribution<int64_t>(-j, j)(rng_) * 1000;
    }
    p.last_due = std::max(p.last_due, now_ns() + d);  // in arrival order: no reordering
    p.q.push_back(Frame{p.last_due, std::move(b)});
  }

  void send_due() {
    const int64_t now = now_ns();
    for (Port& p : ports_) {
      while (!p.q.empty() && p.q.front().due <= now) {
        Frame& f = p.q.front();
        // A full queue behind the port (its tbf) drops the frame, as a switch would.
        (void)send(p.fd.get(), f.buf.data(), f.buf.size(), MSG_DONTWAIT);
        free_.push_back(std::move(f.buf));
        p.q.pop_front();
      }
    }
  }

  RelayOptions o_;
  std::mt19937_64 rng_;
  std::vector<Port> ports_;
  std::map<std::array<uint8_t, 6>, size_t> macs_;
  std::vector<std::vector<uint8_t>> free_;
};

}  // namespace

void run_delay_relay(const RelayOptions& o) {
  if (o.ifaces.size() < 2) throw Error(ErrorKind::Config, "delay relay: needs at least 2 interfaces");
  if (o.jitter_us > o.delay_us) throw Error(ErrorKind::Config, "delay relay: jitter must not exceed the delay");
  if (!(o.loss >= 0 && o.loss < 1)) throw Error(ErrorKind::Config, "delay relay: loss must be in [0, 1)");
  Relay(o).run();
}

}  // namespace rs::emulate
