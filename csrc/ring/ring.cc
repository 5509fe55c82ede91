#include "ring/ring.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "net/address.h"
#include "net/frame_io.h"
#include "protocol/plan.h"
#include "protocol/wire.h"
#include "ring/ring_round.h"

namespace rs::ring {

using net::Clock;

namespace {

constexpr uint32_t kHelloMagic = 0x48525352u;  // "RSRH": ring hello (connect time)
constexpr uint16_t kRingVersion = 1;
constexpr size_t kHelloBytes = 32;

// hello: magic u32 | version u16 | pad u16 | rank u32 | world u32 | session u64 | pad 8
void encode_hello(uint8_t* b, uint32_t rank, uint32_t world, uint64_t session) {
  std::memset(b, 0, kHelloBytes);
  proto::put_u32(b, kHelloMagic);
  proto::put_u16(b + 4, kRingVersion);
  proto::put_u32(b + 8, rank);
  proto::put_u32(b + 12, world);
  proto::put_u64(b + 16, session);
}

}  // namespace

Ring::Ring(RingOptions opts) : opts_(std::move(opts)) {
  if (opts_.world_size < 1) throw Error(ErrorKind::Config, "ring: world_size must be at least 1");
  if (opts_.rank >= opts_.world_size)
    throw Error(ErrorKind::Config, "ring: rank " + std::to_string(opts_.rank) + " out of range for world size " +
                                       std::to_string(opts_.world_size));
  std::string bad_chunk = proto::check_chunk_bytes(opts_.chunk_bytes);
  if (!bad_chunk.empty()) throw Error(ErrorKind::Config, "ring: chunk_bytes: " + bad_chunk);
  if (opts_.timeout <= 0) throw Error(ErrorKind::Config, "ring: timeout must be positive");
  if (opts_.world_size > 1) {
    listen_fd_ = net::listen_on(opts_.listen_host, opts_.port, &port_);
  } else {
    connected_ = true;
  }
}

Ring::~Ring() { close(); }

void Ring::close() {
  if (right_.valid()) ::shutdown(right_.get(), SHUT_RDWR);
  if (left_.valid()) ::shutdown(left_.get(), SHUT_RDWR);
  right_.reset();
  left_.reset();
  listen_fd_.reset();
  if (opts_.world_size > 1) {
    connected_ = false;
    if (!broken_) {
      broken_ = true;
      broken_why_ = "the ring was closed";
    }
  }
}

std::string Ring::left_name() const {
  uint32_t n = opts_.world_size;
  return "left neighbour rank " + std::to_string((opts_.rank + n - 1) % n) + " (" + left_addr_ + ")";
}

std::string Ring::right_name() const {
  uint32_t n = opts_.world_size;
  return "right neighbour rank " + std::to_string((opts_.rank + 1) % n) + " (" + right_addr_ + ")";
}

void Ring::connect(const std::vector<std::string>& addresses, double connect_timeout) {
  const uint32_t n = opts_.world_size, r = opts_.rank;
  if (addresses.size() != n)
    throw Error(ErrorKind::Config,
                "ring: got " + std::to_string(addresses.size()) + " addresses for world size " + std::to_string(n));
  if (n == 1) return;
  if (connected_ || broken_) throw Error(ErrorKind::Config, "ring: connect() may be called once");
  const uint32_t right = (r + 1) % n, left = (r + n - 1) % n;
  net::HostPort raddr = net::parse_host_port(addresses[right]);
  right_addr_ = raddr.str();
  left_addr_ = net::parse_host_port(addresses[left]).str();
  const auto deadline = net::deadline_after(connect_timeout);
  try {
    // 1. connect to the right neighbour (every rank listens before anyone connects,
    //    and the kernel completes the handshake from the listen backlog, so this
    //    cannot deadlock) and introduce ourselves.
    try {
      right_ = net::connect_with_retry(raddr, deadline);
    } catch (const Error& e) {
      throw Error(e.kind(), "ring rank " + std::to_string(r) + ": cannot reach " + right_name() + ": " + e.what());
    }
    net::tune_socket(right_.get(), opts_.socket_buffer);
    uint8_t hello[kHelloBytes];
    encode_hello(hello, r, n, opts_.session);
    net::send_all(right_.get(), hello, sizeof hello, deadline, right_name());
    // 2. accept the left neighbour; anything else that connects is turned away.
    while (!left_.valid()) {
      pollfd p{listen_fd_.get(), POLLIN, 0};
      int pr = ::poll(&p, 1, net::ms_until(deadline));
      if (pr < 0 && errno == EINTR) continue;
      if (pr <= 0)
        throw Error(ErrorKind::Timeout, "ring rank " + std::to_string(r) + ": " + left_name() +
                                            " did not connect to port " + std::to_string(port_) + " within " +
                                            std::to_string(connect_timeout) + " s");
      net::Fd c(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) continue;
      std::string who = net::peer_name(c.get());
      uint8_t h[kHelloBytes];
      try {
        net::recv_all(c.get(), h, sizeof h, std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                      "ring peer " + who);
      } catch (const Error& e) {
        log_warn(std::string("ring: dropped a connection that sent no hello: ") + e.what());
        continue;
      }
      uint32_t prank = proto::get_u32(h + 8), pworld = proto::get_u32(h + 12);
      uint64_t psession = proto::get_u64(h + 16);
      if (proto::get_u32(h) != kHelloMagic || proto::get_u16(h + 4) != kRingVersion || prank != left || pworld != n ||
          psession != opts_.session) {
        log_warn("ring rank " + std::to_string(r) + ": turned away " + who + " (rank " + std::to_string(prank) +
                 " of " + std::to_string(pworld) + ", session " + std::to_string(psession) + "; expected rank " +
                 std::to_string(left) + " of " + std::to_string(n) + ", session " + std::to_string(opts_.session) +
                 ")");
        continue;
      }
      net::tune_socket(c.get(), opts_.socket_buffer);
      left_ = std::move(c);
    }
    listen_fd_.reset();
    net::set_nonblocking(right_.get(), true);
    net::set_nonblocking(left_.get(), true);
    connected_ = true;
  } catch (const Error& e) {
    broken_ = true;
    broken_why_ = e.what();
    right_.reset();
    left_.reset();
    throw;
  }
}

void Ring::allreduce(void* data, size_t nbytes, DType dtype, Op op) {
  size_t es = dtype_size(dtype);
  if (nbytes % es)
    throw Error(ErrorKind::Config, "buffer of " + std::to_string(nbytes) + " bytes is not a whole number of " +
                                       dtype_name(dtype) + " elements");
  if (opts_.world_size == 1) {
    stats_.rounds++;
    return;  // sum/avg/min/max of one contribution is the contribution itself
  }
  if (broken_) throw Error(ErrorKind::PeerLost, "ring is broken (" + broken_why_ + "); create a new Ring");
  if (!connected_) throw Error(ErrorKind::Config, "ring: call connect() before allreduce()");
  try {
    run(static_cast<uint8_t*>(data), nbytes, dtype, op);
    stats_.rounds++;
  } catch (const Error& e) {
    broken_ = true;
    broken_why_ = e.what();
    // Closing both links makes the neighbours fail fast instead of waiting for the timeout.
    right_.reset();
    left_.reset();
    throw;
  }
}

// Like gloo's AllreduceRing: send what the schedule allows, receive (and reduce) what has
// arrived, wait for the links; ring/ring_round.h holds the schedule and each step.
void Ring::run(uint8_t* data, size_t nbytes, DType dtype, Op op) {
  const std::string lname = left_name(), rname = right_name();
  RingRound round(opts_, RoundLinks{left_.get(), right_.get(), lname, rname, out_, scratch_, acc_, stats_}, round_++,
                  data, nbytes, dtype, op);
  for (;;) {
    round.send();
    const bool more_to_send = round.receive();
    if (round.finished()) return;
    if (!more_to_send) round.wait();
  }
}

}  // namespace rs::ring
