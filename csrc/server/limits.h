// Server-wide resource limits of the reducer (docs/security.md): a memory budget for the groups'
// reduction buffers with per-job and per-address shares, connection and group counts per peer
// address, rate-limited log lines, and the defaults of the limits that depend on the machine.
// All of them are shared by the event loops, so they are thread-safe; holdings are RAII tickets
// that give their share back when the connection or group that holds them goes away.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rs::server {

struct ServerOptions;  // server/server.h

// Checks the limits of `o` (throws Error(Config) naming a bad one) and fills in the defaults that
// depend on the machine: the memory budget (half of the physical memory), the job and address
// shares (half of the budget each), max_connections (below the descriptor limit, which it
// raises to its maximum).
void resolve_limits(ServerOptions& o);

// Bytes of reduction buffers the reducer may hold (docs/security.md, "Memory"): in all groups
// together (the server budget) and, within it, per job id (the job share) and per peer IP
// address (the address share). A group stream's bytes count in full against its job, and in
// parts against the addresses of its members: slots x chunk for each rank an address connected,
// plus the float32 accumulator (2 x slots x chunk) for the address of rank 0; the parts add up
// to the whole. With a shared secret a job's credential only opens that job's groups, so the job
// share bounds what its holders can take from any number of addresses; without one, job ids
// cost nothing and the address share is what bounds one address. An authenticated member's part
// is charged to no address (its address is "" in the claim): tenants behind one address (NAT,
// one host) do not share one address share, each job has its own share (issue 28.5).
//
// Reserved when a group completes (so a job that cannot fit learns it at connect time), given
// back by a group that stays idle (GroupTable::release_idle) and taken again by its next chunk.
// Never touched per chunk: the locked maps are used at those transitions only.
class MemoryBudget {
 public:
  // What one group stream holds.
  struct Claim {
    std::string job;
    std::vector<std::pair<std::string, uint64_t>> peers;  // address -> bytes, one entry per address
    uint64_t bytes = 0;                                   // the whole (= the sum of the parts)
  };
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept : budget_(o.budget_), claim_(std::move(o.claim_)) { o.budget_ = nullptr; }
    Reservation& operator=(Reservation&& o) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { release(); }
    bool held() const { return budget_ != nullptr; }
    uint64_t bytes() const { return held() ? claim_.bytes : 0; }
    // Gives the bytes back; the claim stays, for MemoryBudget::renew.
    void release();

   private:
    friend class MemoryBudget;
    MemoryBudget* budget_ = nullptr;  // set while held
    Claim claim_;
  };

  void set_limit(uint64_t limit) { limit_ = limit; }
  // The job and address shares (unset: no share limit, the server budget only).
  void set_shares(uint64_t per_job, uint64_t per_peer) {
    per_job_ = per_job;
    per_peer_ = per_peer;
  }
  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(); }
  uint64_t used_by_job(const std::string& job) const;
  uint64_t used_by_peer(const std::string& ip) const;
  // Takes `claim` into *out (giving back what *out held) if its job, each of its addresses and
  // the whole reducer stay within their limits. Otherwise takes nothing and returns why, naming
  // the limit hit ("job share", "address share" or "server budget") and its setting.
  std::string reserve(Claim claim, Reservation* out);
  // Takes the claim of a released reservation again, by the same rules; "" if held already.
  std::string renew(Reservation* r);

 private:
  std::string take(const Claim& c);  // with mu_ held
  void give_back(const Claim& c);
  mutable std::mutex mu_;
  uint64_t limit_ = 0;
  uint64_t per_job_ = ~uint64_t(0);
  uint64_t per_peer_ = ~uint64_t(0);
  std::atomic<uint64_t> used_{0};
  std::unordered_map<std::string, uint64_t> jobs_, peers_;  // only non-zero holdings
};

// Open connections and live group streams created, per account: a peer IP address for what has
// not authenticated (and for everything without a secret), job_account(job) once a connection
// authenticated with a secret, so that jobs behind one address do not share its caps.
std::string job_account(const std::string& job);  // "job <id>": never an address (no spaces)
class PeerTable {
 public:
  enum class Kind { Connection = 0, Group = 1 };
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& o) noexcept : table_(o.table_), kind_(o.kind_), ip_(std::move(o.ip_)) { o.table_ = nullptr; }
    Ticket& operator=(Ticket&& o) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { release(); }
    bool valid() const { return table_ != nullptr; }

   private:
    friend class PeerTable;
    void release();
    PeerTable* table_ = nullptr;
    Kind kind_ = Kind::Connection;
    std::string ip_;
  };

  // Takes one unit of `kind` for `ip` if it holds fewer than `limit`; false otherwise.
  bool acquire(Kind kind, const std::string& ip, uint32_t limit, Ticket* out);
  uint32_t count(Kind kind, const std::string& ip) const;

 private:
  struct Counts {
    uint32_t n[2] = {0, 0};
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Counts> counts_;
};

// Lets a repeated log line through at most `burst` times per `period`; then counts what it
// dropped and reports the count with the next line let through.
class LogLimiter {
 public:
  explicit LogLimiter(int burst = 5, std::chrono::seconds period = std::chrono::seconds(10))
      : burst_(burst), period_(period) {}
  // Whether to log now; *suppressed receives how many lines were dropped since the last one logged.
  bool allow(uint64_t* suppressed);

 private:
  std::mutex mu_;
  int burst_;
  std::chrono::seconds period_;
  std::chrono::steady_clock::time_point window_start_{};
  int in_window_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace rs::server
