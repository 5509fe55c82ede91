// Server-wide resource limits of the reducer (docs/security.md): a memory budget for the groups'
// reduction buffers, connection and group counts per peer address, and rate-limited log lines.
// All of them are shared by the event loops, so they are thread-safe; holdings are RAII tickets
// that give their share back when the connection or group that holds them goes away.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace rs::server {

// Bytes of reduction buffers the reducer may hold in all groups together.
class MemoryBudget {
 public:
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.budget_ = nullptr; o.bytes_ = 0; }
    Reservation& operator=(Reservation&& o) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { release(); }
    uint64_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    void release();
    MemoryBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  void set_limit(uint64_t limit) { limit_ = limit; }
  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(); }
  // A reservation of `bytes`, or false (nothing reserved) if it would exceed the limit.
  bool reserve(uint64_t bytes, Reservation* out);

 private:
  uint64_t limit_ = 0;
  std::atomic<uint64_t> used_{0};
};

// Open connections (any state) and live group streams created, per peer IP address.
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
