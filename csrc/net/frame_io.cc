#include "net/frame_io.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"

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
  // Frames never (completely) written give their numbers back: the next frame sent takes the
  // number the reader expects.
  if (auth_) auth_->rewind(count_ - (sent_ > 0 ? 1 : 0));
  while (count_ > 0) pop();
  sent_ = 0;
}

void FrameWriter::seal(Item& it) {
  it.sealed = auth_ != nullptr;
  if (!auth_) return;
  if (it.hdr_len != proto::kFrameHeaderBytes)
    throw Error(ErrorKind::Internal, "a protected connection can only send whole frames");
  it.htag = auth_->header_tag(it.hdr, it.hdr_len);
  auth_->begin(it.hdr, it.hdr_len);
  auth_->update(it.owned.data(), it.owned.size());
  const Payload& p = it.payload;
  if (p.ptr) {
    auth_->update(p.ptr + p.off, p.len);
  } else if (p.src) {
    for (uint64_t done = 0; done < p.len;) {
      iovec iov[kMaxIov];
      int n = 0;
      done += p.src->gather(p.off + done, p.len - done, iov, &n, kMaxIov);
      for (int i = 0; i < n; ++i) auth_->update(iov[i].iov_base, iov[i].iov_len);
    }
  }
  it.trailer = auth_->finish();
}

bool FrameWriter::push(const uint8_t* hdr, size_t hdr_len, Payload payload, uint64_t token) {
  if (full() || hdr_len > kMaxHeaderBytes) return false;
  Item& it = items_[(head_ + count_) % items_.size()];
  std::memcpy(it.hdr, hdr, hdr_len);
  it.hdr_len = uint8_t(hdr_len);
  it.payload = payload;
  it.token = token;
  seal(it);
  ++count_;
  return true;
}

void FrameWriter::push_copy(std::string bytes, uint64_t token) {
  if (full()) reserve(std::max<size_t>(1, items_.size() * 2));
  Item& it = items_[(head_ + count_) % items_.size()];
  it.hdr_len = 0;
  it.payload = Payload::none();
  if (auth_ && bytes.size() >= proto::kFrameHeaderBytes) {  // a frame: its header is sealed separately
    std::memcpy(it.hdr, bytes.data(), proto::kFrameHeaderBytes);
    it.hdr_len = uint8_t(proto::kFrameHeaderBytes);
    bytes.erase(0, proto::kFrameHeaderBytes);
  }
  it.owned = std::move(bytes);
  it.token = token;
  seal(it);
  ++count_;
}

void FrameWriter::send_now(int fd, const std::string& peer, const uint8_t* frame, size_t len) {
  if (mid_frame()) return;
  clear();
  push_copy(std::string(reinterpret_cast<const char*>(frame), len), 0);
  try {
    flush(fd, peer, nullptr, [](uint64_t) {});
  } catch (const Error&) {
    // best effort: the connection is closing anyway
  }
  clear();
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
    if (it.sealed) add(it.htag.data(), it.htag.size());
    add(reinterpret_cast<const uint8_t*>(it.owned.data()), it.owned.size());
    const Payload& p = it.payload;
    if (p.ptr) {
      add(p.ptr + p.off, p.len);
    } else if (p.src && skip >= p.len) {
      skip -= p.len;
    } else if (p.src) {
      if (want < max_bytes && n < kMaxIov) {
        uint64_t take = std::min<uint64_t>(p.len - skip, max_bytes - want);
        // Covers less than `take` only when the iovecs run out: then nothing more is added.
        want += p.src->gather(p.off + skip, take, iov, &n, kMaxIov);
      }
      skip = 0;
    }
    if (it.sealed) add(it.trailer.data(), it.trailer.size());
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
    // The payload's GMAC is fed with the bytes just received (still in cache).
    switch (sink_.kind) {
      case Sink::Kind::Memory:
        n = recv_some(fd, sink_.ptr + got_, size_t(want), peer);
        if (n > 0 && auth_) auth_->update(sink_.ptr + got_, size_t(n));
        break;
      case Sink::Kind::Text:
        n = recv_some(fd, &(*sink_.text)[size_t(got_)], size_t(want), peer);
        if (n > 0 && auth_) auth_->update(&(*sink_.text)[size_t(got_)], size_t(n));
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
        if (n > 0 && auth_) {
          size_t left = size_t(n);
          for (int i = 0; i < k && left > 0; ++i) {
            const size_t take = std::min<size_t>(iov[i].iov_len, left);
            auth_->update(iov[i].iov_base, take);
            left -= take;
          }
        }
        break;
      }
      default: {  // Discard
        uint8_t junk[4096];
        n = recv_some(fd, junk, size_t(std::min<uint64_t>(want, sizeof junk)), peer);
        if (n > 0 && auth_) auth_->update(junk, size_t(n));
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
    if (n > 0 && auth_) auth_->update(carry_ + carry_n_, size_t(n));  // the GMAC takes bytes in arrival order
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
    if (auth_) auth_->update(carry_, size_t(n));
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
  if (auth_) {
    size_t left = size_t(n);
    for (int i = 0; i < k && left > 0; ++i) {
      const size_t take = std::min<size_t>(iov[i].iov_len, left);
      auth_->update(iov[i].iov_base, take);
      left -= take;
    }
  }
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

void FrameReader::check_header(const std::string& peer) {
  if (!FrameAuth::equal(auth_->header_tag(hdr_, proto::kFrameHeaderBytes), hdr_ + proto::kFrameHeaderBytes))
    throw Error(ErrorKind::Protocol, integrity_failure(peer, auth_->frame(), true));
}

void FrameReader::check_trailer(const std::string& peer) {
  tr_got_ = 0;
  const uint64_t frame = auth_->frame();
  if (!FrameAuth::equal(auth_->finish(), tr_)) throw Error(ErrorKind::Protocol, integrity_failure(peer, frame, false));
}

// ---- integrity ---------------------------------------------------------------------------

void protect(FrameWriter* out, FrameReader* in, const proto::Key& job_key,
             const std::array<uint8_t, proto::kNonceBytes>& worker_nonce,
             const std::array<uint8_t, proto::kNonceBytes>& challenge_nonce, proto::Direction sending) {
  const proto::Direction receiving = sending == proto::Direction::WorkerToReducer ? proto::Direction::ReducerToWorker
                                                                                  : proto::Direction::WorkerToReducer;
  out->protect(std::make_unique<FrameAuth>(proto::frame_key(job_key, sending, worker_nonce, challenge_nonce), sending));
  in->protect(
      std::make_unique<FrameAuth>(proto::frame_key(job_key, receiving, worker_nonce, challenge_nonce), receiving));
}

}  // namespace rs::net
