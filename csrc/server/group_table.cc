#include "server/group_table.h"

namespace rs::server {

std::shared_ptr<Group> GroupTable::create(const proto::Hello& h, const GroupKey& key, const Joiner& who,
                                          JoinOutcome* out) {
  const uint64_t need = Group::bytes_needed(h.world_size, h.chunk_bytes, limits_.slots);
  if (need > limits_.max_group_bytes) {
    out->status = proto::Status::GroupConflict;  // the group's own parameters ask too much: a configuration error
    out->message = "group " + key.label() + " would need " + std::to_string(need >> 20) +
                   " MiB of reduction buffers (slots x (world size + 2) x chunk size); this reducer allows " +
                   std::to_string(limits_.max_group_bytes >> 20) +
                   " MiB per group stream (max_group_bytes): use a smaller chunk size";
    return nullptr;
  }
  // An authenticated job's groups count against the job, not the address it connects from.
  const std::string account = who.authenticated ? job_account(key.job) : who.ip;
  PeerTable::Ticket ticket;
  if (!peers_->acquire(PeerTable::Kind::Group, account, limits_.max_groups_per_peer, &ticket)) {
    out->status = proto::Status::OverLimit;
    out->message = (who.authenticated ? "job " + key.job : "address " + who.ip) + " already created " +
                   std::to_string(limits_.max_groups_per_peer) +
                   " live group streams on this reducer (max_groups_per_peer)";
    return nullptr;
  }
  auto g = std::make_shared<Group>(key, h.world_size, h.chunk_bytes, h.num_streams, limits_.slots, std::move(ticket));
  g->set_flags(h.flags & proto::kHelloFailover);
  groups_.emplace(key, g);
  if (key.stream == 0) (*live_groups_)++;
  out->created = true;
  return g;
}

// Why a joiner cannot be a member of the existing group `g`, or "".
static std::string conflict_with(const Group& g, const proto::Hello& h) {
  if (g.world() != h.world_size)
    return "world size " + std::to_string(h.world_size) + " differs from the group's " + std::to_string(g.world());
  if (g.num_streams() != h.num_streams)
    return "streams " + std::to_string(h.num_streams) + " differ from the group's " + std::to_string(g.num_streams());
  if (g.chunk() != h.chunk_bytes)
    return "chunk size " + std::to_string(h.chunk_bytes) + " differs from the group's " + std::to_string(g.chunk());
  if ((h.flags & proto::kHelloFailover) != g.flags())
    return std::string("reducer failover is ") + ((h.flags & proto::kHelloFailover) ? "on" : "off") +
           " for this worker and " + (g.flags() ? "on" : "off") + " for the group's first member (RS_FAILOVER)";
  return "";
}

JoinOutcome GroupTable::join(Conn* c, const proto::Hello& h, const GroupKey& key, const Joiner& who) {
  JoinOutcome out;
  auto it = groups_.find(key);
  std::shared_ptr<Group> g = it == groups_.end() ? nullptr : it->second;
  if (g) {
    const std::string conflict = conflict_with(*g, h);
    if (!conflict.empty()) {
      out.status = proto::Status::GroupConflict;
      out.message = "group " + key.label() + ": rank " + std::to_string(h.rank) + " (" + who.peer + "): " + conflict;
      return out;
    }
    if (Conn* old = g->member(h.rank)) {
      if (!who.may_replace) {
        out.status = proto::Status::RankTaken;
        out.message = "group " + key.label() + ": rank " + std::to_string(h.rank) + " is already connected";
        return out;
      }
      // The rank reconnected: its old connection is stale (a link that came back, a host that
      // vanished and was replaced). The new one takes the slot; a complete group cannot go on
      // with a new member in the middle of its stream, so it ends and its members reconnect.
      out.replaced = old;
      out.replaced_message = "group " + key.label() + ": rank " + std::to_string(h.rank) + " reconnected from " +
                             who.peer + ": its earlier connection is closed as stale";
      if (g->complete()) {
        out.replaced_message += "; the group ends (any round in progress is abandoned) and its members reconnect";
        out.replaced_group = g;
        fail(g, out.replaced_message);
        g = nullptr;
      } else {
        g->remove_member(h.rank);
      }
    }
  }
  if (!g) g = create(h, key, who, &out);
  if (!g) return out;
  g->add_member(h.rank, c, who.authenticated ? std::string() : who.ip);
  out.group = g;
  if (g->joined() < g->world()) {
    out.kind = JoinOutcome::Kind::Waiting;
    return out;
  }
  std::string why = g->complete(*budget_);
  if (!why.empty()) {
    fail(g, why);
    out.kind = JoinOutcome::Kind::CompletionFailed;
    out.status = proto::Status::OverLimit;
    out.message = why;
    return out;
  }
  out.kind = JoinOutcome::Kind::Completed;
  return out;
}

LeaveOutcome GroupTable::leave(const std::shared_ptr<Group>& g, uint32_t rank, const std::string& who, bool said_bye,
                               const std::string& why) {
  LeaveOutcome out;
  g->remove_member(rank);
  if (g->failed()) return out;
  if (!g->complete()) {
    // Still gathering: the rank is simply free again.
    if (g->joined() == 0) detach(g);
    return out;
  }
  if (g->busy()) {
    out.kind = LeaveOutcome::Kind::Failed;
    out.message =
        who + (said_bye ? " left in the middle of a round (" : " disconnected in the middle of a round (") + why + ")";
    // A member that gave up waiting is not the one missing: name the ranks whose data did not
    // arrive (a silent host), first.
    const std::vector<uint32_t> stalled = g->stalled_ranks(rank, 8);
    if (!stalled.empty()) {
      std::string list;
      for (uint32_t r : stalled) list += (list.empty() ? "" : ", ") + std::to_string(r);
      out.message = "group " + g->key().label() + ": the round in progress never got the data of rank" +
                    (stalled.size() > 1 ? "s " : " ") + list + " (stopped, or cut off from this reducer); " +
                    out.message;
    }
    fail(g, out.message);
    return out;
  }
  // Between rounds: a normal end of training (with or without a goodbye). The group is closed;
  // a member that still sends a round learns why.
  out.kind = LeaveOutcome::Kind::Left;
  out.message = who + (said_bye ? " has left the group" : " closed its connection between rounds (" + why + ")");
  if (g->left().empty()) g->mark_left(out.message);
  detach(g);
  return out;
}

bool GroupTable::fail(const std::shared_ptr<Group>& g, const std::string& why) {
  if (g->failed()) return false;
  g->mark_failed(why);
  detach(g);
  return true;
}

void GroupTable::detach(const std::shared_ptr<Group>& g) {
  auto it = groups_.find(g->key());
  if (it == groups_.end() || it->second != g) return;
  if (g->key().stream == 0) (*live_groups_)--;
  groups_.erase(it);
}

void GroupTable::clear() {
  for (const auto& kv : groups_)
    if (kv.first.stream == 0) (*live_groups_)--;
  groups_.clear();
}

std::vector<std::shared_ptr<Group>> GroupTable::take_expired(Group::Clock::time_point now,
                                                             std::chrono::milliseconds timeout) {
  std::vector<std::shared_ptr<Group>> out;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (!it->second->complete() && now - it->second->created() > timeout) {
      out.push_back(it->second);
      if (it->first.stream == 0) (*live_groups_)--;
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

size_t GroupTable::release_idle(Group::Clock::time_point now, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return 0;
  size_t released = 0;
  for (const auto& kv : groups_) {
    Group& g = *kv.second;
    if (!g.complete() || g.failed() || !g.memory_held() || !g.idle(now, timeout)) continue;
    g.release_memory();
    ++released;
  }
  return released;
}

}  // namespace rs::server
