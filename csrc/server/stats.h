// A loop's part of Server::group_stats(): a snapshot of its groups, refreshed by the loop every
// sweep and at once when another thread asks, plus the last few groups that ended.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "server/server.h"

namespace rs::server {

class Group;
class GroupTable;

class GroupStatsBoard {
 public:
  GroupStatsBoard() = default;
  GroupStatsBoard(const GroupStatsBoard&) = delete;
  GroupStatsBoard& operator=(const GroupStatsBoard&) = delete;

  static GroupStat stat_of(const Group& g);
  // On the loop: a group ended (it stays visible among the last few).
  void record_ended(const Group& g);
  // On the loop: whether another thread waits for a fresh snapshot.
  bool requested() const { return requested_.load() != done_.load(); }
  // On the loop: takes a snapshot of the table's groups and wakes those waiting for it.
  void refresh(const GroupTable& table);
  // From another thread: asks for a snapshot (`wake` wakes the loop) and appends it, at most
  // one wakeup old (or the last one after `wait`), and the ended groups to *out.
  template <class Wake>
  void fresh(std::vector<GroupStat>* out, std::chrono::milliseconds wait, Wake&& wake) {
    const uint64_t want = ++requested_;
    wake();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, [&] { return done_ >= want; });
    out->insert(out->end(), snapshot_.begin(), snapshot_.end());
    out->insert(out->end(), ended_.begin(), ended_.end());
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> requested_{0};
  std::atomic<uint64_t> done_{0};  // written under mu_ (for cv_)
  std::vector<GroupStat> snapshot_;
  std::deque<GroupStat> ended_;
};

}  // namespace rs::server
