#include "server/limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.h"
#include "common/settings.h"
#include "server/server.h"

namespace rs::server {

namespace {

std::string size_text(uint64_t bytes) {
  constexpr uint64_t kMiB = uint64_t(1) << 20;
  if (bytes < kMiB) return std::to_string(bytes) + " bytes";
  const uint64_t tenths = bytes % kMiB * 10 / kMiB;
  return std::to_string(bytes / kMiB) + (tenths ? "." + std::to_string(tenths) : "") + " MiB";
}

// Whether `held` + `more` stays within `limit` (no wrap-around).
bool fits(uint64_t held, uint64_t more, uint64_t limit) { return more <= limit && held <= limit - more; }

uint64_t held_in(const std::unordered_map<std::string, uint64_t>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}

void give(std::unordered_map<std::string, uint64_t>& m, const std::string& k, uint64_t bytes) {
  auto it = m.find(k);
  if (it == m.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) m.erase(it);
}

}  // namespace

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    release();
    budget_ = o.budget_;
    claim_ = std::move(o.claim_);
    o.budget_ = nullptr;
  }
  return *this;
}

void MemoryBudget::Reservation::release() {
  if (budget_) budget_->give_back(claim_);
  budget_ = nullptr;
}

uint64_t MemoryBudget::used_by_job(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_in(jobs_, job);
}

uint64_t MemoryBudget::used_by_peer(const std::string& ip) const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_in(peers_, ip);
}

std::string MemoryBudget::take(const Claim& c) {
  // A share of at least the whole budget is no limit of its own: the server budget is the one hit.
  const uint64_t job_held = held_in(jobs_, c.job);
  if (per_job_ < limit_ && !fits(job_held, c.bytes, per_job_))
    return "job " + c.job + " would exceed its job share of this reducer's memory: its group streams hold " +
           size_text(job_held) + " and one job may hold " + size_text(per_job_) +
           " (max_memory_per_job, RS_MAX_MEMORY_PER_JOB)";
  for (const auto& p : c.peers) {
    if (p.first.empty()) continue;  // authenticated members: their job share bounds them
    const uint64_t peer_held = held_in(peers_, p.first);
    if (per_peer_ < limit_ && !fits(peer_held, p.second, per_peer_))
      return "address " + p.first + " would exceed its address share of this reducer's memory: its workers' part of " +
             "the group streams is " + size_text(peer_held) + ", this one adds " + size_text(p.second) +
             ", and one address may hold " + size_text(per_peer_) + " (max_memory_per_peer, RS_MAX_MEMORY_PER_PEER)";
  }
  const uint64_t total = used_.load();
  if (!fits(total, c.bytes, limit_))
    return "the reducer's server budget (max_memory_bytes = " + size_text(limit_) + ", RS_MAX_MEMORY) has " +
           size_text(limit_ - std::min(limit_, total)) + " left";
  if (c.bytes == 0) return "";
  jobs_[c.job] += c.bytes;
  for (const auto& p : c.peers)
    if (p.second && !p.first.empty()) peers_[p.first] += p.second;
  used_ += c.bytes;
  return "";
}

void MemoryBudget::give_back(const Claim& c) {
  std::lock_guard<std::mutex> lock(mu_);
  give(jobs_, c.job, c.bytes);
  for (const auto& p : c.peers) give(peers_, p.first, p.second);
  used_ -= std::min(used_.load(), c.bytes);
}

std::string MemoryBudget::reserve(Claim claim, Reservation* out) {
  out->release();
  uint64_t parts = 0;
  for (const auto& p : claim.peers) parts += p.second;
  if (parts != claim.bytes) return "internal error: a memory claim's parts do not add up to its whole";
  std::lock_guard<std::mutex> lock(mu_);
  std::string why = take(claim);
  if (!why.empty()) return why;
  out->budget_ = this;
  out->claim_ = std::move(claim);
  return "";
}

std::string MemoryBudget::renew(Reservation* r) {
  if (r->held()) return "";
  std::lock_guard<std::mutex> lock(mu_);
  std::string why = take(r->claim_);
  if (why.empty()) r->budget_ = this;
  return why;
}

std::string job_account(const std::string& job) { return "job " + job; }

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

void resolve_limits(ServerOptions& o) {
  if (o.group_slots < 1 || o.group_slots > kMaxGroupSlots)
    throw Error(ErrorKind::Config, "group_slots must be in 1.." + std::to_string(kMaxGroupSlots));
  settings::check_seconds(o.handshake_timeout, "handshake_timeout");
  settings::check_seconds(o.group_timeout, "group_timeout");
  settings::check_seconds(o.memory_idle_timeout, "memory_idle_timeout", true);  // 0 = never
  if (o.max_connections < 1 || o.max_connections_per_peer < 1 || o.max_groups_per_peer < 1)
    throw Error(ErrorKind::Config,
                "max_connections, max_connections_per_peer and max_groups_per_peer must be positive");
  if (o.max_memory_bytes == 0) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    o.max_memory_bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) / 2 : uint64_t(8) << 30;
  }
  // Half each: a greedy job (or address) leaves at least half of the budget to the others.
  if (o.max_memory_per_job == 0) o.max_memory_per_job = o.max_memory_bytes / 2;
  if (o.max_memory_per_peer == 0) o.max_memory_per_peer = o.max_memory_bytes / 2;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rlimit up = rl;
      up.rlim_cur = rl.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    if (rl.rlim_cur != RLIM_INFINITY) {
      const uint64_t cap = rl.rlim_cur > 128 ? uint64_t(rl.rlim_cur) - 64 : uint64_t(rl.rlim_cur) / 2;
      if (o.max_connections > cap) o.max_connections = uint32_t(cap);
    }
  }
}

}  // namespace rs::server
