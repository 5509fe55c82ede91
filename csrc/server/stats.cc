#include "server/stats.h"

#include "server/group.h"
#include "server/group_table.h"

namespace rs::server {

namespace {

constexpr size_t kEndedGroupsKept = 16;  // ended groups still shown by group_stats()

}  // namespace

GroupStat GroupStatsBoard::stat_of(const Group& g) {
  GroupStat s;
  s.job = g.key().job;
  s.group = g.key().group;
  s.stream = g.key().stream;
  s.world_size = g.world();
  s.connected = g.joined();
  s.complete = g.complete() && !g.ended();
  s.rounds = g.rounds;
  s.bytes_received = g.bytes_received;
  s.bytes_sent = g.bytes_sent;
  s.last_error = g.last_error();
  s.age_s = std::chrono::duration<double>(Group::Clock::now() - g.created()).count();
  return s;
}

void GroupStatsBoard::record_ended(const Group& g) {
  GroupStat s = stat_of(g);
  s.ended = true;
  std::lock_guard<std::mutex> lock(mu_);
  ended_.push_back(std::move(s));
  if (ended_.size() > kEndedGroupsKept) ended_.pop_front();
}

void GroupStatsBoard::refresh(const GroupTable& table) {
  const uint64_t wanted = requested_.load();
  std::vector<GroupStat> rows;
  rows.reserve(table.size());
  // A group that failed or that a member left is already listed among the ended ones
  // (record_ended): listed once, as ended, while its last members drain away.
  table.for_each([&](const Group& g) {
    if (!g.ended()) rows.push_back(stat_of(g));
  });
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot_.swap(rows);
    done_ = wanted;
  }
  cv_.notify_all();
}

}  // namespace rs::server
