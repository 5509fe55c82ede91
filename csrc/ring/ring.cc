#include "ring/ring.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "protocol/wire.h"

namespace rs::ring {

using net::Clock;

namespace {

constexpr uint32_t kHelloMagic = 0x48525352u;  // "RSRH": ring hello (connect time)
constexpr uint32_t kRoundMagic = 0x47525352u;  // "RSRG": ring round header
constexpr uint16_t kRingVersion = 1;
constexpr size_t kHelloBytes = 32;
constexpr size_t kHeaderBytes = 32;

// hello: magic u32 | version u16 | pad u16 | rank u32 | world u32 | session u64 | pad 8
void encode_hello(uint8_t* b, uint32_t rank, uint32_t world, uint64_t session) {
  std::memset(b, 0, kHelloBytes);
  proto::put_u32(b, kHelloMagic);
  proto::put_u16(b + 4, kRingVersion);
  proto::put_u32(b + 8, rank);
  proto::put_u32(b + 12, world);
  proto::put_u64(b + 16, session);
}

// round header: magic u32 | version u16 | dtype u8 | op u8 | round u64 | nbytes u64 | session u64
void encode_header(uint8_t* b, uint64_t round, uint64_t nbytes, DType t, Op op, uint64_t session) {
  std::memset(b, 0, kHeaderBytes);
  proto::put_u32(b, kRoundMagic);
  proto::put_u16(b + 4, kRingVersion);
  proto::put_u8(b + 6, uint8_t(t));
  proto::put_u8(b + 7, uint8_t(op));
  proto::put_u64(b + 8, round);
  proto::put_u64(b + 16, nbytes);
  proto::put_u64(b + 24, session);
}

std::string describe_header(const uint8_t* b) {
  uint8_t t = b[6], o = b[7];
  std::string dt = valid_dtype(t) ? dtype_name(DType(t)) : "dtype#" + std::to_string(t);
  std::string op = valid_op(o) ? op_name(Op(o)) : "op#" + std::to_string(o);
  return "round " + std::to_string(proto::get_u64(b + 8)) + ", " + std::to_string(proto::get_u64(b + 16)) +
         " bytes of " + dt + ", op " + op;
}

int ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::max<int64_t>(0, std::min<int64_t>(ms, 1 << 30)));
}

}  // namespace

Ring::Ring(RingOptions opts) : opts_(std::move(opts)) {
  if (opts_.world_size < 1) throw Error(ErrorKind::Config, "ring: world_size must be at least 1");
  if (opts_.rank >= opts_.world_size)
    throw Error(ErrorKind::Config, "ring: rank " + std::to_string(opts_.rank) + " out of range for world size " +
                                       std::to_string(opts_.world_size));
  if (opts_.chunk_bytes < proto::kMinChunkBytes || opts_.chunk_bytes > proto::kMaxChunkBytes || opts_.chunk_bytes % 8)
    throw Error(ErrorKind::Config, "ring: chunk_bytes must be a multiple of 8 between 64 and 64 MiB");
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
    throw Error(ErrorKind::Config, "ring: got " + std::to_string(addresses.size()) + " addresses for world size " +
                                       std::to_string(n));
  if (n == 1) return;
  if (connected_ || broken_) throw Error(ErrorKind::Config, "ring: connect() may be called once");
  const uint32_t right = (r + 1) % n, left = (r + n - 1) % n;
  net::HostPort raddr = net::parse_host_port(addresses[right]);
  right_addr_ = raddr.str();
  left_addr_ = net::parse_host_port(addresses[left]).str();
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(connect_timeout * 1000));
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
      int pr = ::poll(&p, 1, ms_until(deadline));
      if (pr < 0 && errno == EINTR) continue;
      if (pr <= 0)
        throw Error(ErrorKind::Timeout, "ring rank " + std::to_string(r) + ": " + left_name() + " did not connect to port " +
                                            std::to_string(port_) + " within " + std::to_string(connect_timeout) + " s");
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
      if (proto::get_u32(h) != kHelloMagic || proto::get_u16(h + 4) != kRingVersion || prank != left ||
          pworld != n || psession != opts_.session) {
        log_warn("ring rank " + std::to_string(r) + ": turned away " + who + " (rank " + std::to_string(prank) +
                 " of " + std::to_string(pworld) + ", session " + std::to_string(psession) + "; expected rank " +
                 std::to_string(left) + " of " + std::to_string(n) + ", session " + std::to_string(opts_.session) + ")");
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

void Ring::run(uint8_t* data, size_t nbytes, DType dtype, Op op) {
  const uint64_t round = round_++;
  const int64_t n = opts_.world_size, r = opts_.rank;
  const size_t es = dtype_size(dtype);
  const uint64_t elems = nbytes / es;
  const uint64_t chunk = opts_.chunk_bytes - opts_.chunk_bytes % es;  // whole elements
  const bool wire_acc = acc_is_wire_type(dtype);
  if (scratch_.size() < chunk) scratch_.resize(chunk);
  if (!wire_acc && acc_.size() < chunk / es * acc_elem_size(dtype)) acc_.resize(chunk / es * acc_elem_size(dtype));

  // Segments: n element-aligned pieces in rank order.
  std::vector<uint64_t> seg_off(static_cast<size_t>(n)), seg_len(static_cast<size_t>(n));
  {
    uint64_t base = elems / uint64_t(n), rem = elems % uint64_t(n), off = 0;
    for (int64_t j = 0; j < n; ++j) {
      uint64_t c = base + (uint64_t(j) < rem ? 1 : 0);
      seg_off[size_t(j)] = off * es;
      seg_len[size_t(j)] = c * es;
      off += c;
    }
  }
  const int64_t T = 2 * (n - 1);  // steps: [0, n-1) reduce-scatter, [n-1, T) all-gather
  auto mod = [n](int64_t x) { return size_t(((x % n) + n) % n); };
  auto send_seg = [&](int64_t s) { return s < n - 1 ? mod(r - s) : mod(r + 1 - (s - (n - 1))); };
  auto recv_seg = [&](int64_t s) { return s < n - 1 ? mod(r - s - 1) : mod(r - (s - (n - 1))); };

  // Cursors: step and bytes done within that step's segment.
  int64_t ss = 0, rs_ = 0;
  uint64_t sdone = 0, rdone = 0;
  size_t hdr_sent = 0, hdr_got = 0;
  uint8_t hdr_out[kHeaderBytes], hdr_in[kHeaderBytes];
  encode_header(hdr_out, round, nbytes, dtype, op, opts_.session);
  auto skip_empty = [&](int64_t& s, uint64_t& done, bool sending) {
    while (s < T && done >= seg_len[sending ? send_seg(s) : recv_seg(s)]) {
      ++s;
      done = 0;
    }
  };
  skip_empty(ss, sdone, true);
  skip_empty(rs_, rdone, false);

  // Bytes of send step `ss` that may be sent: its segment was finished by recv step ss-1
  // up to the last complete chunk (recv step ss-1 and send step ss use the same segment).
  auto send_limit = [&]() -> uint64_t {
    uint64_t len = seg_len[send_seg(ss)];
    if (ss == 0 || rs_ > ss - 1) return len;
    if (rs_ < ss - 1) return 0;
    return std::min(len, rdone / chunk * chunk);
  };

  // Reduce a received chunk (reduce-scatter step s) into the buffer.
  auto reduce_chunk = [&](int64_t s, uint64_t off_in_seg, uint64_t len) {
    uint8_t* dst = data + seg_off[recv_seg(s)] + off_in_seg;
    size_t m = len / es;
    bool last = s == n - 2;
    if (wire_acc) {
      kernels::accumulate(dtype, op, dst, scratch_.data(), m);
      if (last && op == Op::Avg) kernels::finalize(dtype, op, dst, dst, m, uint32_t(n));
    } else {
      kernels::init(dtype, acc_.data(), dst, m);
      kernels::accumulate(dtype, op, acc_.data(), scratch_.data(), m);
      Op fin = last ? op : (op == Op::Avg ? Op::Sum : op);
      kernels::finalize(dtype, fin, dst, acc_.data(), m, last ? uint32_t(n) : 1u);
    }
  };

  const auto timeout = std::chrono::milliseconds(int64_t(opts_.timeout * 1000));
  auto last_progress = Clock::now();
  const std::string lname = left_name(), rname = right_name();
  pollfd pfd[2];
  for (;;) {
    const bool send_hdr_left = hdr_sent < kHeaderBytes;
    const bool recv_all_done = hdr_got == kHeaderBytes && rs_ >= T;
    const bool send_all_done = !send_hdr_left && ss >= T;
    if (recv_all_done && send_all_done) return;
    bool want_send = send_hdr_left || (ss < T && send_limit() > sdone);

    // ---- send to the right: header, then as much of the ready range as the socket takes ----
    if (want_send) {
      for (;;) {
        iovec iov[2];
        int k = 0;
        if (hdr_sent < kHeaderBytes) iov[k++] = {hdr_out + hdr_sent, kHeaderBytes - hdr_sent};
        uint64_t lim = ss < T ? send_limit() : 0;
        if (ss < T && lim > sdone) iov[k++] = {data + seg_off[send_seg(ss)] + sdone, size_t(lim - sdone)};
        if (k == 0) break;
        ssize_t w = net::send_some(right_.get(), iov, k, rname);
        if (w <= 0) break;
        last_progress = Clock::now();
        stats_.bytes_sent += uint64_t(w);
        size_t hw = std::min(size_t(w), kHeaderBytes - hdr_sent);
        hdr_sent += hw;
        sdone += uint64_t(size_t(w) - hw);
        skip_empty(ss, sdone, true);
      }
    }

    // ---- receive from the left: header, then reduce-scatter chunks or all-gather bytes ----
    bool unblocked = false;
    for (;;) {
      if (hdr_got < kHeaderBytes) {
        ssize_t got = net::recv_some(left_.get(), hdr_in + hdr_got, kHeaderBytes - hdr_got, lname);
        if (got < 0) break;
        last_progress = Clock::now();
        stats_.bytes_received += uint64_t(got);
        hdr_got += size_t(got);
        if (hdr_got < kHeaderBytes) continue;
        if (proto::get_u32(hdr_in) != kRoundMagic || proto::get_u16(hdr_in + 4) != kRingVersion ||
            proto::get_u64(hdr_in + 24) != opts_.session)
          throw Error(ErrorKind::Protocol, "ring rank " + std::to_string(r) + ": " + lname + " sent a bad round header");
        if (std::memcmp(hdr_in, hdr_out, kHeaderBytes) != 0)
          throw Error(ErrorKind::Mismatch, "ring rank " + std::to_string(r) + ": " + lname + " is reducing " +
                                               describe_header(hdr_in) + " but this rank is reducing " +
                                               describe_header(hdr_out));
        continue;
      }
      if (rs_ >= T) break;
      const uint64_t len = seg_len[recv_seg(rs_)];
      if (rs_ < n - 1) {
        // reduce-scatter: one chunk at a time into scratch, reduced as soon as it is whole
        uint64_t cstart = rdone / chunk * chunk, clen = std::min(chunk, len - cstart);
        uint64_t have = rdone - cstart;
        ssize_t got = net::recv_some(left_.get(), scratch_.data() + have, size_t(clen - have), lname);
        if (got < 0) break;
        last_progress = Clock::now();
        stats_.bytes_received += uint64_t(got);
        rdone += uint64_t(got);
        if (rdone - cstart == clen) reduce_chunk(rs_, cstart, clen);
      } else {
        // all-gather: straight into place
        ssize_t got = net::recv_some(left_.get(), data + seg_off[recv_seg(rs_)] + rdone, size_t(len - rdone), lname);
        if (got < 0) break;
        last_progress = Clock::now();
        stats_.bytes_received += uint64_t(got);
        rdone += uint64_t(got);
      }
      skip_empty(rs_, rdone, false);
      // new data may have unblocked sends: go send before draining more
      if (ss < T && send_limit() > sdone) {
        unblocked = true;
        break;
      }
    }

    if (hdr_got == kHeaderBytes && rs_ >= T && hdr_sent == kHeaderBytes && ss >= T) return;
    want_send = hdr_sent < kHeaderBytes || (ss < T && send_limit() > sdone);
    if (want_send && unblocked) continue;  // received data made more sendable: no need to wait
    auto idle = Clock::now() - last_progress;
    if (idle > timeout) {
      throw Error(ErrorKind::Timeout,
                  "ring all-reduce round " + std::to_string(round) + " on rank " + std::to_string(r) +
                      " made no progress for " + std::to_string(opts_.timeout) + " s: sent " + std::to_string(ss) + "/" +
                      std::to_string(T) + " steps to the " + rname + ", received " + std::to_string(rs_) + "/" +
                      std::to_string(T) + " steps from the " + lname + " (a rank may be missing, slow or reducing "
                      "something else)");
    }
    int wait_ms = int(std::max<int64_t>(
        1, std::min<int64_t>(200, std::chrono::duration_cast<std::chrono::milliseconds>(timeout - idle).count())));
    // While we still have to send, watch the right link for input too: it never carries
    // data to us, so readable means the neighbour closed or failed (recv_some then
    // throws PeerLost). Once our part is sent, the right neighbour may finish and leave.
    const bool sending = hdr_sent < kHeaderBytes || ss < T;
    const bool receiving = hdr_got < kHeaderBytes || rs_ < T;
    nfds_t np = 0;
    int ri = -1;
    if (receiving) pfd[np++] = {left_.get(), short(POLLIN), 0};
    if (sending) {
      ri = int(np);
      pfd[np++] = {right_.get(), short(POLLIN | (want_send ? POLLOUT : 0)), 0};
    }
    int pr = ::poll(pfd, np, wait_ms);
    if (pr < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::Internal, std::string("poll failed: ") + errno_text(errno));
    }
    if (pr > 0 && ri >= 0 && (pfd[ri].revents & (POLLIN | POLLHUP | POLLERR))) {
      uint8_t junk;
      ssize_t got = net::recv_some(right_.get(), &junk, 1, rname);
      if (got > 0) throw Error(ErrorKind::Protocol, "ring rank " + std::to_string(r) + ": unexpected data from " + rname);
    }
  }
}

}  // namespace rs::ring
