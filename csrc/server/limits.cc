#include "server/limits.h"

namespace rs::server {

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    release();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.budget_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void MemoryBudget::Reservation::release() {
  if (budget_) budget_->used_ -= bytes_;
  budget_ = nullptr;
  bytes_ = 0;
}

bool MemoryBudget::reserve(uint64_t bytes, Reservation* out) {
  uint64_t cur = used_.load();
  do {
    if (bytes > limit_ || cur > limit_ - bytes) return false;
  } while (!used_.compare_exchange_weak(cur, cur + bytes));
  out->release();
  out->budget_ = this;
  out->bytes_ = bytes;
  return true;
}

PeerTable::Ticket& PeerTable::Ticket::operator=(Ticket&& o) noexcept {
  if (this != &o) {
    release();
    table_ = o.table_;
    kind_ = o.kind_;
    ip_ = std::move(o.ip_);
    o.table_ = nullptr;
  }
  return *this;
}

void PeerTable::Ticket::release() {
  if (!table_) return;
  std::lock_guard<std::mutex> lock(table_->mu_);
  auto it = table_->counts_.find(ip_);
  if (it != table_->counts_.end()) {
    it->second.n[int(kind_)]--;
    if (it->second.n[0] == 0 && it->second.n[1] == 0) table_->counts_.erase(it);
  }
  table_ = nullptr;
}

bool PeerTable::acquire(Kind kind, const std::string& ip, uint32_t limit, Ticket* out) {
  out->release();
  std::lock_guard<std::mutex> lock(mu_);
  Counts& c = counts_[ip];
  if (c.n[int(kind)] >= limit) {
    if (c.n[0] == 0 && c.n[1] == 0) counts_.erase(ip);
    return false;
  }
  c.n[int(kind)]++;
  out->table_ = this;
  out->kind_ = kind;
  out->ip_ = ip;
  return true;
}

uint32_t PeerTable::count(Kind kind, const std::string& ip) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(ip);
  return it == counts_.end() ? 0 : it->second.n[int(kind)];
}

bool LogLimiter::allow(uint64_t* suppressed) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start_ >= period_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++dropped_;
    return false;
  }
  ++in_window_;
  *suppressed = dropped_;
  dropped_ = 0;
  return true;
}

}  // namespace rs::server
