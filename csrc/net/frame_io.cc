#include "net/frame_io.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <cstring>

namespace rs::net {

// ---- Segments ---------------------------------------------------------------------------

void Segments::assign(uint8_t* data, size_t len) {
  iovec one{data, len};
  assign(&one, 1);
}

void Segments::assign(const iovec* segs, size_t n) {
  clear();
  for (size_t i = 0; i < n; ++i) {
    if (segs[i].iov_len == 0) continue;
    segs_.push_back(segs[i]);
    start_.push_back(total_);
    total_ += segs[i].iov_len;
  }
}

void Segments::clear() {
  segs_.clear();
  start_.clear();
  total_ = 0;
}

size_t Segments::find(uint64_t off) const {
  // The last segment starting at or before `off`.
  auto it = std::upper_bound(start_.begin(), start_.end(), off);
  return size_t(it - start_.begin()) - 1;
}

uint64_t Segments::gather(uint64_t off, uint64_t len, iovec* out, int* n, int max) const {
  uint64_t covered = 0;
  if (len == 0) return 0;
  for (size_t i = find(off); i < segs_.size() && covered < len && *n < max; ++i) {
    uint64_t in_seg = off + covered - start_[i];
    uint64_t take = std::min<uint64_t>(segs_[i].iov_len - in_seg, len - covered);
    out[(*n)++] = {static_cast<uint8_t*>(segs_[i].iov_base) + in_seg, size_t(take)};
    covered += take;
  }
  return covered;
}

// ---- FrameWriter ------------------------------------------------------------------------

void FrameWriter::reserve(size_t capacity) {
  if (capacity <= items_.size()) return;
  std::vector<Item> bigger(capacity);
  for (size_t i = 0; i < count_; ++i) bigger[i] = std::move(items_[(head_ + i) % items_.size()]);
  items_ = std::move(bigger);
  head_ = 0;
}

void FrameWriter::clear() {
  while (count_ > 0) pop();
  sent_ = 0;
}

bool FrameWriter::push(const uint8_t* hdr, size_t hdr_len, Payload payload, uint64_t token) {
  if (full() || hdr_len > kMaxHeaderBytes) return false;
  Item& it = items_[(head_ + count_) % items_.size()];
  std::memcpy(it.hdr, hdr, hdr_len);
  it.hdr_len = uint8_t(hdr_len);
  it.payload = payload;
  it.token = token;
  ++count_;
  return true;
}

void FrameWriter::push_copy(std::string bytes, uint64_t token) {
  if (full()) reserve(std::max<size_t>(1, items_.size() * 2));
  Item& it = items_[(head_ + count_) % items_.size()];
  it.hdr_len = 0;
  it.payload = Payload::none();
  it.owned = std::move(bytes);
  it.token = token;
  ++count_;
}

void FrameWriter::pop() {
  Item& it = items_[head_];
  it.owned.clear();
  it.payload = Payload::none();
  head_ = (head_ + 1) % items_.size();
  --count_;
  sent_ = 0;
}

int FrameWriter::build_iov(iovec* iov, size_t max_bytes) const {
  int n = 0;
  uint64_t want = 0;
  for (size_t k = 0; k < count_ && n < kMaxIov && want < max_bytes; ++k) {
    const Item& it = items_[(head_ + k) % items_.size()];
    uint64_t skip = k == 0 ? sent_ : 0;
    auto add = [&](const uint8_t* p, uint64_t len) {
      if (skip >= len) {
        skip -= len;
        return;
      }
      uint64_t take = std::min<uint64_t>(len - skip, max_bytes - want);
      if (take == 0 || n >= kMaxIov) return;
      iov[n++] = {const_cast<uint8_t*>(p + skip), size_t(take)};
      want += take;
      skip = 0;
    };
    add(it.hdr, it.hdr_len);
    add(reinterpret_cast<const uint8_t*>(it.owned.data()), it.owned.size());
    const Payload& p = it.payload;
    if (p.ptr) {
      add(p.ptr + p.off, p.len);
    } else if (p.src && p.len > skip && want < max_bytes && n < kMaxIov) {
      uint64_t take = std::min<uint64_t>(p.len - skip, max_bytes - want);
      want += p.src->gather(p.off + skip, take, iov, &n, kMaxIov);
    }
    // A frame not fully covered (iovecs or budget ran out) ends the batch.
    if (n >= kMaxIov || want >= max_bytes) break;
  }
  return n;
}

// ---- reading ----------------------------------------------------------------------------

uint64_t read_into(int fd, const std::string& peer, uint8_t* dst, size_t len, size_t* got, IoResult* res,
                   IoBudget* budget) {
  uint64_t total = 0;
  while (*got < len) {
    ssize_t n = recv_some(fd, dst + *got, len - *got, peer);
    if (n < 0) {
      res->blocked = true;
      break;
    }
    *got += size_t(n);
    total += uint64_t(n);
    if (budget) budget->bytes(size_t(n));
  }
  res->bytes += total;
  return total;
}

void FrameReader::read_payload(int fd, const std::string& peer, IoResult* res, IoBudget* budget) {
  while (got_ < h_.length) {
    const uint64_t want = h_.length - got_;
    ssize_t n;
    switch (sink_.kind) {
      case Sink::Kind::Memory:
        n = recv_some(fd, sink_.ptr + got_, size_t(want), peer);
        break;
      case Sink::Kind::Text:
        n = recv_some(fd, &(*sink_.text)[size_t(got_)], size_t(want), peer);
        break;
      case Sink::Kind::Scatter: {
        if (sink_.align > 1) {
          n = read_aligned(fd, peer);
          break;
        }
        iovec iov[FrameWriter::kMaxIov];
        int k = 0;
        sink_.segs->gather(sink_.off + got_, want, iov, &k, FrameWriter::kMaxIov);
        n = recv_some(fd, iov, k, peer);
        break;
      }
      default: {  // Discard
        uint8_t junk[4096];
        n = recv_some(fd, junk, size_t(std::min<uint64_t>(want, sizeof junk)), peer);
        break;
      }
    }
    if (n < 0) {
      res->blocked = true;
      return;
    }
    got_ += uint64_t(n);
    res->bytes += uint64_t(n);
    if (budget) budget->bytes(size_t(n));
  }
}

void FrameReader::place_carry() {
  const uint64_t at = got_ - carry_n_;
  iovec iov[kMaxAlign];
  int k = 0;
  sink_.segs->gather(sink_.off + at, carry_n_, iov, &k, int(kMaxAlign));
  const uint8_t* p = carry_;
  for (int i = 0; i < k; ++i) {
    std::memcpy(iov[i].iov_base, p, iov[i].iov_len);
    p += iov[i].iov_len;
  }
  carry_n_ = 0;
  torn_ = false;
}

ssize_t FrameReader::read_aligned(int fd, const std::string& peer) {
  const uint32_t a = std::min<uint32_t>(sink_.align, kMaxAlign);
  const uint64_t want = h_.length - got_;
  if (carry_n_ > 0) {  // finish the unit in the carry first
    ssize_t n = recv_some(fd, carry_ + carry_n_, size_t(std::min<uint64_t>(a - carry_n_, want)), peer);
    if (n < 0) return n;
    carry_n_ += uint32_t(n);
    got_ += uint64_t(n);
    if (carry_n_ == a || got_ == h_.length) place_carry();
    got_ -= uint64_t(n);  // the caller adds n
    return n;
  }
  int queued = 0;
  uint64_t body = 0;
  if (::ioctl(fd, FIONREAD, &queued) == 0 && queued > 0) {
    const uint64_t take = std::min<uint64_t>(uint64_t(queued), want);
    body = take == want ? take : take - take % a;
  }
  if (body == 0) {  // less than a unit queued (or nothing: then recv reports EAGAIN / EOF)
    ssize_t n = recv_some(fd, carry_, size_t(std::min<uint64_t>(a, want)), peer);
    if (n <= 0) return n;
    carry_n_ = uint32_t(n);
    got_ += uint64_t(n);
    if (carry_n_ == a || got_ == h_.length) place_carry();
    got_ -= uint64_t(n);
    return n;
  }
  iovec iov[FrameWriter::kMaxIov];
  int k = 0;
  const uint64_t covered = sink_.segs->gather(sink_.off + got_, body, iov, &k, FrameWriter::kMaxIov);
  (void)covered;
  ssize_t n = recv_some(fd, iov, k, peer);
  if (n <= 0) return n;
  const uint64_t end = got_ + uint64_t(n);
  const uint32_t tail = uint32_t(end % a);
  if (tail != 0 && end != h_.length) {
    // Fewer bytes than queued arrived and the read ended mid-unit: keep that unit's new bytes in
    // the carry (they are already in place too; the unit is whole again once the carry is).
    iovec piece[kMaxAlign];
    int m = 0;
    sink_.segs->gather(sink_.off + end - tail, tail, piece, &m, int(kMaxAlign));
    uint8_t* p = carry_;
    for (int i = 0; i < m; ++i) {
      std::memcpy(p, piece[i].iov_base, piece[i].iov_len);
      p += piece[i].iov_len;
    }
    carry_n_ = tail;
    torn_ = true;
  }
  return n;
}

}  // namespace rs::net
