// Unit tests of the reducer's membership rules (csrc/server/group_table.h), without sockets:
// members are opaque handles. Built and run by tests/server/test_group_table.py.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "check.h"
#include "server/group_table.h"

using namespace rs;
using namespace rs::server;

static proto::Hello hello(uint32_t world, uint32_t rank, uint32_t chunk = 4096, uint16_t streams = 1) {
  proto::Hello h;
  h.world_size = world;
  h.rank = rank;
  h.chunk_bytes = chunk;
  h.num_streams = streams;
  h.job_id = "job";
  h.group = "g";
  return h;
}

static Conn* handle(uintptr_t i) { return reinterpret_cast<Conn*>(i * 64); }  // never dereferenced

struct Fixture {
  MemoryBudget budget;
  PeerTable peers;
  std::atomic<uint64_t> live{0};
  GroupLimits limits;
  std::unique_ptr<GroupTable> table;
  explicit Fixture(uint64_t budget_bytes = uint64_t(1) << 30, uint32_t groups_per_peer = 4) {
    budget.set_limit(budget_bytes);
    limits.slots = 4;
    limits.max_group_bytes = uint64_t(1) << 30;
    limits.max_groups_per_peer = groups_per_peer;
    table = std::make_unique<GroupTable>(limits, &budget, &peers, &live);
  }
};

static const GroupKey kKey{"job", "g", 0};

static void completes_and_reserves_memory() {
  Fixture f;
  JoinOutcome a = f.table->join(handle(1), hello(2, 0), kKey, "10.0.0.1", "10.0.0.1:1");
  CHECK(a.kind == JoinOutcome::Kind::Waiting && a.created);
  CHECK(f.live == 1 && f.budget.used() == 0);  // nothing reserved before the group is complete
  JoinOutcome b = f.table->join(handle(2), hello(2, 1), kKey, "10.0.0.2", "10.0.0.2:1");
  CHECK(b.kind == JoinOutcome::Kind::Completed && !b.created && b.group == a.group);
  CHECK(f.budget.used() == Group::bytes_needed(2, 4096, 4));
  CHECK(b.group->member(0) == handle(1) && b.group->member(1) == handle(2));
  a.group.reset();
  b.group.reset();
  f.table->clear();  // the last reference goes: memory and the creator's group ticket come back
  CHECK(f.budget.used() == 0 && f.live == 0 && f.peers.count(PeerTable::Kind::Group, "10.0.0.1") == 0);
}

static void refusals() {
  Fixture f;
  f.table->join(handle(1), hello(3, 0), kKey, "10.0.0.1", "p");
  CHECK(f.table->join(handle(2), hello(3, 0), kKey, "10.0.0.1", "p").status == proto::Status::RankTaken);
  CHECK(f.table->join(handle(3), hello(4, 1), kKey, "10.0.0.1", "p").status == proto::Status::GroupConflict);
  CHECK(f.table->join(handle(4), hello(3, 1, 8192), kKey, "10.0.0.1", "p").status == proto::Status::GroupConflict);
  CHECK(f.table->join(handle(5), hello(3, 1, 4096, 2), kKey, "10.0.0.1", "p").status == proto::Status::GroupConflict);
  // max_group_bytes: 4 slots x (world + 2) x 64 MiB > 1 GiB
  JoinOutcome big = f.table->join(handle(6), hello(4, 0, 64u << 20), GroupKey{"job", "big", 0}, "10.0.0.1", "p");
  CHECK(big.kind == JoinOutcome::Kind::Rejected && big.status == proto::Status::GroupConflict);
  CHECK(big.message.find("max_group_bytes") != std::string::npos);
  CHECK(f.table->size() == 1);
}

static void groups_per_peer_are_capped() {
  Fixture f(uint64_t(1) << 30, 2);
  for (int i = 0; i < 2; ++i)
    CHECK(
        f.table->join(handle(i + 1), hello(2, 0), GroupKey{"job", "g" + std::to_string(i), 0}, "10.0.0.9", "p").kind ==
        JoinOutcome::Kind::Waiting);
  JoinOutcome third = f.table->join(handle(9), hello(2, 0), GroupKey{"job", "g9", 0}, "10.0.0.9", "p");
  CHECK(third.kind == JoinOutcome::Kind::Rejected && third.status == proto::Status::OverLimit);
  CHECK(third.message.find("max_groups_per_peer") != std::string::npos);
  // another address is not affected
  CHECK(f.table->join(handle(10), hello(2, 0), GroupKey{"job", "g9", 0}, "10.0.0.8", "p").kind ==
        JoinOutcome::Kind::Waiting);
}

static void budget_exhaustion_fails_the_whole_group() {
  const uint64_t need = Group::bytes_needed(2, 4096, 4);
  Fixture f(need + need / 2);  // room for one group, not two
  f.table->join(handle(1), hello(2, 0), kKey, "a", "p");
  CHECK(f.table->join(handle(2), hello(2, 1), kKey, "a", "p").kind == JoinOutcome::Kind::Completed);
  GroupKey k2{"job", "other", 0};
  f.table->join(handle(3), hello(2, 0), k2, "b", "p");
  JoinOutcome o = f.table->join(handle(4), hello(2, 1), k2, "b", "p");
  CHECK(o.kind == JoinOutcome::Kind::CompletionFailed && o.status == proto::Status::OverLimit);
  CHECK(o.group->failed() && o.message.find("max_memory_bytes") != std::string::npos);
  CHECK(f.budget.used() == need && f.table->size() == 1);
}

static void sparse_membership_before_completion() {
  Fixture f;
  JoinOutcome o = f.table->join(handle(1), hello(65536, 0, 64), kKey, "a", "p");
  CHECK(o.kind == JoinOutcome::Kind::Waiting);
  if (!o.group) return;
  std::vector<uint32_t> missing = o.group->missing_ranks(3);
  CHECK(missing.size() == 3 && missing[0] == 1 && missing[2] == 3);
  CHECK(o.group->member(65535) == nullptr && o.group->joined() == 1);
}

static void leaving() {
  {  // before completion: the rank is free again; the last one out removes the group
    Fixture f;
    JoinOutcome o = f.table->join(handle(1), hello(2, 0), kKey, "a", "p");
    CHECK(f.table->leave(o.group, 0, "rank 0", false, "closed").kind == LeaveOutcome::Kind::Quiet);
    CHECK(f.table->size() == 0 && f.live == 0);
  }
  {  // between rounds: a normal end; the group is closed for the others
    Fixture f;
    f.table->join(handle(1), hello(2, 0), kKey, "a", "p");
    JoinOutcome o = f.table->join(handle(2), hello(2, 1), kKey, "a", "p");
    LeaveOutcome l = f.table->leave(o.group, 1, "rank 1", true, "bye");
    CHECK(l.kind == LeaveOutcome::Kind::Left && l.message.find("has left") != std::string::npos);
    CHECK(!o.group->left().empty() && !o.group->failed() && f.table->size() == 0);
    CHECK(f.table->leave(o.group, 0, "rank 0", true, "bye").kind == LeaveOutcome::Kind::Left);
  }
  {  // in the middle of a round: the group fails
    Fixture f;
    f.table->join(handle(1), hello(2, 0), kKey, "a", "p");
    JoinOutcome o = f.table->join(handle(2), hello(2, 1), kKey, "a", "p");
    Slot& s = o.group->slot_for(0);
    s.seq = 0;  // a chunk that still waits for contributions
    LeaveOutcome l = f.table->leave(o.group, 0, "rank 0", false, "reset");
    CHECK(l.kind == LeaveOutcome::Kind::Failed && o.group->failed());
    CHECK(l.message.find("middle of a round") != std::string::npos);
    CHECK(!f.table->fail(o.group, "again"));  // failing twice is a no-op
  }
}

static void expiry() {
  Fixture f;
  f.table->join(handle(1), hello(3, 0), kKey, "a", "p");
  f.table->join(handle(2), hello(2, 0), GroupKey{"job", "done", 0}, "a", "p");
  f.table->join(handle(3), hello(2, 1), GroupKey{"job", "done", 0}, "a", "p");
  CHECK(f.table->take_expired(Group::Clock::now(), std::chrono::milliseconds(60000)).empty());
  auto expired =
      f.table->take_expired(Group::Clock::now() + std::chrono::seconds(61), std::chrono::milliseconds(60000));
  CHECK(expired.size() == 1 && expired[0]->key() == kKey);  // complete groups never expire
  CHECK(f.table->size() == 1 && f.live == 1);
}

static bool has(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

static void job_and_address_shares() {
  const uint64_t need = Group::bytes_needed(2, 4096, 4), per_rank = 4 * 4096;
  Fixture f(need * 10);
  f.budget.set_shares(need * 2, need * 3);
  // Each member's address is charged its part: rank 0 its buffers plus the accumulator.
  f.table->join(handle(1), hello(2, 0), GroupKey{"job", "g0", 0}, "10.0.0.1", "p");
  CHECK(f.table->join(handle(2), hello(2, 1), GroupKey{"job", "g0", 0}, "10.0.0.2", "p").kind ==
        JoinOutcome::Kind::Completed);
  CHECK(f.budget.used_by_job("job") == need && f.budget.used() == need);
  CHECK(f.budget.used_by_peer("10.0.0.1") == 3 * per_rank && f.budget.used_by_peer("10.0.0.2") == per_rank);
  // The job share: a second group of the job fits, a third does not (from fresh addresses too).
  f.table->join(handle(3), hello(2, 0), GroupKey{"job", "g1", 0}, "10.0.0.3", "p");
  CHECK(f.table->join(handle(4), hello(2, 1), GroupKey{"job", "g1", 0}, "10.0.0.4", "p").kind ==
        JoinOutcome::Kind::Completed);
  f.table->join(handle(5), hello(2, 0), GroupKey{"job", "g2", 0}, "10.0.0.5", "p");
  JoinOutcome o = f.table->join(handle(6), hello(2, 1), GroupKey{"job", "g2", 0}, "10.0.0.6", "p");
  CHECK(o.kind == JoinOutcome::Kind::CompletionFailed && o.status == proto::Status::OverLimit);
  CHECK(has(o.message, "job share") && has(o.message, "max_memory_per_job") && !has(o.message, "address share"));
  CHECK(f.budget.used_by_job("job") == 2 * need && f.budget.used_by_peer("10.0.0.5") == 0);
  // The address share: other jobs, all from one address, until 3 x need.
  uint64_t ok = 0;
  std::string why;
  for (int i = 0; i < 5 && why.empty(); ++i) {
    proto::Hello h = hello(1, 0, 8192);  // world 1: 4 x 3 x 8 KiB = 1.5 x need
    const GroupKey k{"other-" + std::to_string(i), "g", 0};
    JoinOutcome j = f.table->join(handle(10 + i), h, k, "10.0.0.9", "p");
    if (j.kind == JoinOutcome::Kind::Completed) ++ok;
    else why = j.message;
  }
  CHECK(ok == 2 && has(why, "address share") && has(why, "max_memory_per_peer") && has(why, "10.0.0.9"));
  CHECK(f.budget.used_by_peer("10.0.0.9") == 3 * need);
  // The server budget, with room in both shares.
  Fixture g(need * 2);
  g.budget.set_shares(need * 2, need * 2);
  for (int i = 0; i < 3; ++i) {
    const GroupKey k{"j" + std::to_string(i), "g", 0};
    g.table->join(handle(20 + i), hello(2, 0), k, "a" + std::to_string(i), "p");
    JoinOutcome j = g.table->join(handle(30 + i), hello(2, 1), k, "b" + std::to_string(i), "p");
    CHECK((j.kind == JoinOutcome::Kind::Completed) == (i < 2));
    if (i == 2) CHECK(has(j.message, "server budget") && has(j.message, "max_memory_bytes"));
  }
  g.table->clear();
  CHECK(g.budget.used() == 0 && g.budget.used_by_job("j0") == 0 && g.budget.used_by_peer("a0") == 0);
}

static void idle_groups_give_their_memory_back() {
  const uint64_t need = Group::bytes_needed(1, 4096, 4);
  Fixture f(need + need / 2);
  const auto t0 = Group::Clock::now();
  const std::chrono::milliseconds idle(60000);
  JoinOutcome a = f.table->join(handle(1), hello(1, 0), kKey, "10.0.0.1", "p");
  CHECK(a.kind == JoinOutcome::Kind::Completed && f.budget.used() == need);
  CHECK(f.table->release_idle(t0 + std::chrono::seconds(61), std::chrono::milliseconds(0)) == 0);  // 0: never
  a.group->bytes_received += 48;  // traffic: the idle clock restarts at the sweep that sees it
  CHECK(f.table->release_idle(t0 + std::chrono::seconds(61), idle) == 0);
  CHECK(f.table->release_idle(t0 + std::chrono::seconds(100), idle) == 0);
  a.group->slot_for(0).seq = 0;  // a chunk in flight: never released under it
  CHECK(f.table->release_idle(t0 + std::chrono::seconds(200), idle) == 0 && a.group->memory_held());
  a.group->slot_for(0).seq = -1;
  CHECK(f.table->release_idle(t0 + std::chrono::seconds(200), idle) == 1);
  CHECK(!a.group->memory_held() && f.budget.used() == 0 && f.budget.used_by_job("job") == 0);
  CHECK(f.table->renew(a.group).empty() && a.group->memory_held() && f.budget.used() == need);
  CHECK(f.budget.used_by_peer("10.0.0.1") == need);
  // Released again; meanwhile another job takes the room: the renewal says which limit.
  CHECK(f.table->release_idle(t0 + std::chrono::seconds(400), idle) == 1);
  JoinOutcome b = f.table->join(handle(2), hello(1, 0), GroupKey{"job2", "g", 0}, "10.0.0.2", "p");
  CHECK(b.kind == JoinOutcome::Kind::Completed);
  const std::string why = f.table->renew(a.group);
  CHECK(has(why, "idle") && has(why, "server budget") && !a.group->memory_held() && f.budget.used() == need);
  b.group.reset();
  f.table->clear();
  CHECK(f.budget.used() == 0);
  a.group.reset();
  CHECK(f.budget.used() == 0);
}

// Issue 28.5: authenticated joiners count against their job (groups, memory), not their address.
static void authenticated_joiners_count_against_their_job() {
  const uint64_t need = Group::bytes_needed(1, 4096, 4);
  Fixture f(need * 8, 2);
  f.budget.set_shares(need * 2, need * 2);
  auto signed_join = [&](uintptr_t h, const std::string& job, const std::string& group) {
    return f.table->join(handle(h), hello(1, 0), GroupKey{job, group, 0}, Joiner{"10.0.0.1", "10.0.0.1:1", true, true});
  };
  CHECK(signed_join(1, "a", "g0").kind == JoinOutcome::Kind::Completed);
  CHECK(signed_join(2, "a", "g1").kind == JoinOutcome::Kind::Completed);
  JoinOutcome third = signed_join(3, "a", "g2");  // job a's group cap, not the address's
  CHECK(third.status == proto::Status::OverLimit && has(third.message, "job a already created"));
  CHECK(signed_join(4, "b", "g0").kind == JoinOutcome::Kind::Completed);  // same address, another job
  CHECK(signed_join(5, "b", "g1").kind == JoinOutcome::Kind::Completed);
  CHECK(f.budget.used_by_peer("10.0.0.1") == 0 && f.budget.used_by_job("a") == 2 * need);
  CHECK(f.peers.count(PeerTable::Kind::Group, job_account("a")) == 2);
  CHECK(f.peers.count(PeerTable::Kind::Group, "10.0.0.1") == 0);
}

// Issue 29.3/29.4: a joiner that may replace takes the place of its rank's stale connection.
static void a_rank_that_reconnects_replaces_its_stale_connection() {
  Fixture f;
  const Joiner again{"10.0.0.9", "10.0.0.9:7", true, true};
  {  // still gathering: the new connection takes the slot
    JoinOutcome a = f.table->join(handle(1), hello(2, 0), kKey, "10.0.0.1", "p");
    JoinOutcome b = f.table->join(handle(2), hello(2, 0), kKey, again);
    CHECK(b.kind == JoinOutcome::Kind::Waiting && b.replaced == handle(1) && !b.replaced_group);
    CHECK(b.group == a.group && a.group->member(0) == handle(2) && a.group->joined() == 1);
    CHECK(has(b.replaced_message, "rank 0 reconnected from 10.0.0.9:7"));
    CHECK(f.table->join(handle(3), hello(2, 1), kKey, "10.0.0.2", "p").kind == JoinOutcome::Kind::Completed);
  }
  {  // complete: the group fails and the new connection starts it afresh
    JoinOutcome b = f.table->join(handle(4), hello(2, 1), kKey, again);
    CHECK(b.replaced == handle(3) && b.replaced_group && b.replaced_group->failed());
    CHECK(b.kind == JoinOutcome::Kind::Waiting && b.created && b.group != b.replaced_group);
    CHECK(has(b.replaced_group->last_error(), "the group ends"));
  }
  // Without may_replace: RankTaken, as before.
  CHECK(f.table->join(handle(5), hello(2, 1), kKey, "10.0.0.3", "p").status == proto::Status::RankTaken);
}

// Issue 29.4: a member that gives up is not the one missing: the ranks whose data did not arrive are.
static void the_ranks_whose_data_never_came_are_named() {
  Fixture f;
  f.table->join(handle(1), hello(3, 0), kKey, "a", "p");
  f.table->join(handle(2), hello(3, 1), kKey, "a", "p");
  JoinOutcome o = f.table->join(handle(3), hello(3, 2), kKey, "a", "p");
  Slot& s = o.group->slot_for(0);
  s.seq = 0;
  s.arrived[0] = s.arrived[2] = 1;              // rank 1's data never came
  CHECK(o.group->stalled_ranks(1, 8).empty());  // the leaver itself is missing: nothing to add
  LeaveOutcome l = f.table->leave(o.group, 2, "rank 2 (a:1)", true, "timeout");
  CHECK(l.kind == LeaveOutcome::Kind::Failed && has(l.message, "never got the data of rank 1 "));
  CHECK(l.message.find("rank 1") < l.message.find("rank 2"));
}

int main() {
  job_and_address_shares();
  idle_groups_give_their_memory_back();
  completes_and_reserves_memory();
  refusals();
  groups_per_peer_are_capped();
  budget_exhaustion_fails_the_whole_group();
  sparse_membership_before_completion();
  leaving();
  expiry();
  authenticated_joiners_count_against_their_job();
  a_rank_that_reconnects_replaces_its_stale_connection();
  the_ranks_whose_data_never_came_are_named();
  return finish("group table");
}
