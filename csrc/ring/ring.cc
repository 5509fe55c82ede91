#include "ring/ring.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "net/frame_io.h"
#include "protocol/plan.h"
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
    throw Error(ErrorKind::Config, "ring: got " + std::to_string(addresses.size()) + " addresses for world size " +
                                       std::to_string(n));
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
  proto::ShardPlan split = proto::even_split(elems, size_t(n));
  std::vector<uint64_t>& seg_off = split.offset;
  std::vector<uint64_t>& seg_len = split.count;
  for (size_t j = 0; j < size_t(n); ++j) {
    seg_off[j] *= es;
    seg_len[j] *= es;
  }
  const int64_t T = 2 * (n - 1);  // steps: [0, n-1) reduce-scatter, [n-1, T) all-gather
  auto mod = [n](int64_t x) { return size_t(((x % n) + n) % n); };
  auto send_seg = [&](int64_t s) { return s < n - 1 ? mod(r - s) : mod(r + 1 - (s - (n - 1))); };
  auto recv_seg = [&](int64_t s) { return s < n - 1 ? mod(r - s - 1) : mod(r - (s - (n - 1))); };

  // Cursors: step and bytes done within that step's segment. Sending: bytes queued on the
  // frame writer (qs, qdone) and steps completely written (sent_steps); receiving: (rs_, rdone).
  int64_t qs = 0, rs_ = 0, sent_steps = 0;
  uint64_t qdone = 0, rdone = 0;
  size_t hdr_got = 0;
  uint8_t hdr_out[kHeaderBytes], hdr_in[kHeaderBytes];
  encode_header(hdr_out, round, nbytes, dtype, op, opts_.session);
  auto skip_empty = [&](int64_t& s, uint64_t& done, bool sending) {
    while (s < T && done >= seg_len[sending ? send_seg(s) : recv_seg(s)]) {
      ++s;
      done = 0;
    }
  };
  skip_empty(qs, qdone, true);
  skip_empty(rs_, rdone, false);

  // Bytes of send step `s` that may be sent: its segment was finished by recv step s-1
  // up to the last complete chunk (recv step s-1 and send step s use the same segment).
  auto send_limit = [&](int64_t s) -> uint64_t {
    uint64_t len = seg_len[send_seg(s)];
    if (s == 0 || rs_ > s - 1) return len;
    if (rs_ < s - 1) return 0;
    return std::min(len, rdone / chunk * chunk);
  };
  auto sendable = [&] { return qs < T && send_limit(qs) > qdone; };

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

  // The schedule: the round header, then every range as soon as it may be sent, as one
  // continuous byte stream (frames without headers). A frame's token is the number of
  // steps completely sent once it is written.
  out_.clear();
  out_.push(hdr_out, kHeaderBytes, net::Payload::none(), uint64_t(qs));
  auto queue_ready = [&] {
    while (!out_.full() && sendable()) {
      const uint64_t lim = send_limit(qs);
      net::Payload p = net::Payload::bytes(data + seg_off[send_seg(qs)] + qdone, lim - qdone);
      qdone = lim;
      skip_empty(qs, qdone, true);
      out_.push(nullptr, 0, p, uint64_t(qs));
    }
  };
  auto written = [&](uint64_t steps) { sent_steps = int64_t(steps); };

  net::ProgressTimer timer(opts_.timeout);
  const std::string lname = left_name(), rname = right_name();
  pollfd pfd[2];
  for (;;) {
    // ---- send to the right: whatever the schedule allows, as much as the socket takes ----
    queue_ready();
    net::IoResult w = out_.flush(right_.get(), rname, nullptr, written);
    if (w.bytes) {
      timer.progress();
      stats_.bytes_sent += w.bytes;
    }

    // ---- receive from the left: header, then reduce-scatter chunks or all-gather bytes ----
    bool unblocked = false;
    for (;;) {
      net::IoResult rd;
      if (hdr_got < kHeaderBytes) {
        net::read_into(left_.get(), lname, hdr_in, kHeaderBytes, &hdr_got, &rd);
        if (rd.bytes) {
          timer.progress();
          stats_.bytes_received += rd.bytes;
        }
        if (hdr_got < kHeaderBytes) break;
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
      // One chunk at a time: reduce-scatter chunks into scratch (reduced once whole),
      // all-gather chunks straight into place.
      const bool reducing = rs_ < n - 1;
      const uint64_t len = seg_len[recv_seg(rs_)];
      const uint64_t cstart = rdone / chunk * chunk, clen = std::min(chunk, len - cstart);
      size_t have = size_t(rdone - cstart);
      uint8_t* dst = reducing ? scratch_.data() : data + seg_off[recv_seg(rs_)] + cstart;
      net::read_into(left_.get(), lname, dst, size_t(clen), &have, &rd);
      if (rd.bytes) {
        timer.progress();
        stats_.bytes_received += rd.bytes;
      }
      rdone = cstart + have;
      if (have < clen) break;  // would block
      if (reducing) reduce_chunk(rs_, cstart, clen);
      skip_empty(rs_, rdone, false);
      // new data may have unblocked sends: go send before draining more
      if (sendable()) {
        unblocked = true;
        break;
      }
    }

    const bool receiving = hdr_got < kHeaderBytes || rs_ < T;
    const bool sending = !out_.empty() || qs < T;
    if (!receiving && !sending) return;
    if (unblocked) continue;  // received data made more sendable: no need to wait
    if (timer.expired()) {
      throw Error(ErrorKind::Timeout,
                  "ring all-reduce round " + std::to_string(round) + " on rank " + std::to_string(r) +
                      " made no progress for " + std::to_string(opts_.timeout) + " s: sent " +
                      std::to_string(sent_steps) + "/" + std::to_string(T) + " steps to the " + rname + ", received " +
                      std::to_string(rs_) + "/" + std::to_string(T) + " steps from the " + lname +
                      " (a rank may be missing, slow or reducing something else)");
    }
    // While we still have to send, watch the right link for input too: it never carries
    // data to us, so readable means the neighbour closed or failed (recv_some then
    // throws PeerLost). Once our part is sent, the right neighbour may finish and leave.
    nfds_t np = 0;
    int ri = -1;
    if (receiving) pfd[np++] = {left_.get(), short(POLLIN), 0};
    if (sending) {
      ri = int(np);
      pfd[np++] = {right_.get(), short(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0};
    }
    int pr = ::poll(pfd, np, timer.poll_ms(200));
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
