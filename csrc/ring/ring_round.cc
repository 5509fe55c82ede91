#include "ring/ring_round.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "net/tcp_path.h"
#include "protocol/plan.h"
#include "protocol/wire.h"

namespace rs::ring {

namespace {

constexpr uint32_t kRoundMagic = 0x47525352u;  // "RSRG": ring round header
constexpr uint16_t kRoundVersion = 1;

// round header: magic u32 | version u16 | dtype u8 | op u8 | round u64 | nbytes u64 | session u64
void encode_header(uint8_t* b, uint64_t round, uint64_t nbytes, DType t, Op op, uint64_t session) {
  std::memset(b, 0, kRoundHeaderBytes);
  proto::put_u32(b, kRoundMagic);
  proto::put_u16(b + 4, kRoundVersion);
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

RingRound::RingRound(const RingOptions& opts, RoundLinks links, uint64_t round, uint8_t* data, size_t nbytes,
                     DType dtype, Op op)
    : opts_(opts),
      links_(links),
      round_(round),
      data_(data),
      dtype_(dtype),
      op_(op),
      n_(opts.world_size),
      r_(opts.rank),
      T_(2 * (int64_t(opts.world_size) - 1)),
      es_(dtype_size(dtype)),
      chunk_(opts.chunk_bytes - opts.chunk_bytes % dtype_size(dtype)),
      wire_acc_(acc_is_wire_type(dtype)),
      timer_(opts.timeout) {
  if (links_.scratch.size() < chunk_) links_.scratch.resize(chunk_);
  if (!wire_acc_ && links_.acc.size() < chunk_ / es_ * acc_elem_size(dtype))
    links_.acc.resize(chunk_ / es_ * acc_elem_size(dtype));
  proto::ShardPlan split = proto::even_split(nbytes / es_, size_t(n_));
  seg_off_ = std::move(split.offset);
  seg_len_ = std::move(split.count);
  for (size_t j = 0; j < size_t(n_); ++j) {
    seg_off_[j] *= es_;
    seg_len_[j] *= es_;
  }
  encode_header(hdr_out_, round, nbytes, dtype, op, opts.session);
  skip_empty(&qs_, &qdone_, true);
  skip_empty(&rs_, &rdone_, false);
  links_.out.clear();
  links_.out.push(hdr_out_, kRoundHeaderBytes, net::Payload::none(), uint64_t(qs_));
}

size_t RingRound::send_seg(int64_t s) const {
  const int64_t x = s < n_ - 1 ? r_ - s : r_ + 1 - (s - (n_ - 1));
  return size_t(((x % n_) + n_) % n_);
}

size_t RingRound::recv_seg(int64_t s) const {
  const int64_t x = s < n_ - 1 ? r_ - s - 1 : r_ - (s - (n_ - 1));
  return size_t(((x % n_) + n_) % n_);
}

void RingRound::skip_empty(int64_t* s, uint64_t* done, bool sending) const {
  while (*s < T_ && *done >= seg_len_[sending ? send_seg(*s) : recv_seg(*s)]) {
    ++*s;
    *done = 0;
  }
}

// Bytes of send step `s` that may be sent: its segment was finished by receive step s-1 up to
// the last complete chunk (receive step s-1 and send step s use the same segment).
uint64_t RingRound::send_limit(int64_t s) const {
  const uint64_t len = seg_len_[send_seg(s)];
  if (s == 0 || rs_ > s - 1) return len;
  if (rs_ < s - 1) return 0;
  return std::min(len, rdone_ / chunk_ * chunk_);
}

// Every range as soon as it may be sent, as frames without headers; a frame's token is the
// number of steps completely sent once it is written.
void RingRound::queue_ready() {
  while (!links_.out.full() && sendable()) {
    const uint64_t lim = send_limit(qs_);
    net::Payload p = net::Payload::bytes(data_ + seg_off_[send_seg(qs_)] + qdone_, lim - qdone_);
    qdone_ = lim;
    skip_empty(&qs_, &qdone_, true);
    links_.out.push(nullptr, 0, p, uint64_t(qs_));
  }
}

void RingRound::send() {
  queue_ready();
  net::IoResult w = links_.out.flush(links_.right, links_.right_name, nullptr,
                                     [this](uint64_t steps) { sent_steps_ = int64_t(steps); });
  if (w.bytes) {
    timer_.progress();
    links_.stats.bytes_sent += w.bytes;
  }
}

void RingRound::count_received(const net::IoResult& rd) {
  if (!rd.bytes) return;
  timer_.progress();
  links_.stats.bytes_received += rd.bytes;
}

bool RingRound::read_header() {
  net::IoResult rd;
  net::read_into(links_.left, links_.left_name, hdr_in_, kRoundHeaderBytes, &hdr_got_, &rd);
  count_received(rd);
  if (hdr_got_ < kRoundHeaderBytes) return false;
  check_header();
  return true;
}

void RingRound::check_header() const {
  const std::string who = "ring rank " + std::to_string(r_) + ": " + links_.left_name;
  if (proto::get_u32(hdr_in_) != kRoundMagic || proto::get_u16(hdr_in_ + 4) != kRoundVersion ||
      proto::get_u64(hdr_in_ + 24) != opts_.session)
    throw Error(ErrorKind::Protocol, who + " sent a bad round header");
  if (std::memcmp(hdr_in_, hdr_out_, kRoundHeaderBytes) != 0)
    throw Error(ErrorKind::Mismatch, who + " is reducing " + describe_header(hdr_in_) + " but this rank is reducing " +
                                         describe_header(hdr_out_));
}

// One chunk at a time: reduce-scatter chunks into scratch (reduced once whole), all-gather
// chunks straight into place. False when the socket would block.
bool RingRound::read_chunk(bool* more_sendable) {
  const bool reducing = rs_ < n_ - 1;
  const uint64_t len = seg_len_[recv_seg(rs_)];
  const uint64_t cstart = rdone_ / chunk_ * chunk_, clen = std::min(chunk_, len - cstart);
  size_t have = size_t(rdone_ - cstart);
  uint8_t* dst = reducing ? links_.scratch.data() : data_ + seg_off_[recv_seg(rs_)] + cstart;
  net::IoResult rd;
  net::read_into(links_.left, links_.left_name, dst, size_t(clen), &have, &rd);
  count_received(rd);
  rdone_ = cstart + have;
  if (have < clen) return false;
  if (reducing) reduce_chunk(rs_, cstart, clen);
  skip_empty(&rs_, &rdone_, false);
  *more_sendable = sendable();
  return true;
}

bool RingRound::receive() {
  while (hdr_got_ < kRoundHeaderBytes)
    if (!read_header()) return false;
  bool more_sendable = false;
  while (rs_ < T_ && read_chunk(&more_sendable))
    if (more_sendable) return true;  // go send before draining more
  return false;
}

void RingRound::reduce_chunk(int64_t s, uint64_t off_in_seg, uint64_t len) {
  uint8_t* dst = data_ + seg_off_[recv_seg(s)] + off_in_seg;
  const size_t m = len / es_;
  const bool last = s == n_ - 2;
  if (wire_acc_) {
    kernels::accumulate(dtype_, op_, dst, links_.scratch.data(), m);
    if (last && op_ == Op::Avg) kernels::finalize(dtype_, op_, dst, dst, m, uint32_t(n_));
  } else {
    kernels::init(dtype_, links_.acc.data(), dst, m);
    kernels::accumulate(dtype_, op_, links_.acc.data(), links_.scratch.data(), m);
    const Op fin = last ? op_ : (op_ == Op::Avg ? Op::Sum : op_);
    kernels::finalize(dtype_, fin, dst, links_.acc.data(), m, last ? uint32_t(n_) : 1u);
  }
}

void RingRound::wait() {
  if (timer_.expired()) {
    throw Error(ErrorKind::Timeout,
                "ring all-reduce round " + std::to_string(round_) + " on rank " + std::to_string(r_) +
                    " made no progress for " + net::duration_text(uint64_t(opts_.timeout * 1e6)) + ": sent " +
                    std::to_string(sent_steps_) + "/" + std::to_string(T_) + " steps to the " + links_.right_name +
                    ", received " + std::to_string(rs_) + "/" + std::to_string(T_) + " steps from the " +
                    links_.left_name + " (a rank may be missing, slow or reducing something else); to the right, " +
                    net::tcp_stall_text(net::tcp_path(links_.right), "the right neighbour"));
  }
  // While we still have to send, watch the right link for input too: it never carries data to
  // us, so readable means the neighbour closed or failed (recv_some then throws PeerLost). Once
  // our part is sent, the right neighbour may finish and leave.
  pollfd pfd[2];
  nfds_t np = 0;
  int ri = -1;
  if (receiving()) pfd[np++] = {links_.left, short(POLLIN), 0};
  if (sending()) {
    ri = int(np);
    pfd[np++] = {links_.right, short(POLLIN | (links_.out.empty() ? 0 : POLLOUT)), 0};
  }
  const int pr = ::poll(pfd, np, timer_.poll_ms(200));
  if (pr < 0) {
    if (errno == EINTR) return;
    throw Error(ErrorKind::Internal, std::string("poll failed: ") + errno_text(errno));
  }
  if (pr > 0 && ri >= 0 && (pfd[ri].revents & (POLLIN | POLLHUP | POLLERR))) {
    uint8_t junk;
    const ssize_t got = net::recv_some(links_.right, &junk, 1, links_.right_name);
    if (got > 0)
      throw Error(ErrorKind::Protocol,
                  "ring rank " + std::to_string(r_) + ": unexpected data from " + links_.right_name);
  }
}

}  // namespace rs::ring
