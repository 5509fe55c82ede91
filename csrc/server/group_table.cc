#include "server/group_table.h"

namespace rs::server {

JoinOutcome GroupTable::join(Conn* c, const proto::Hello& h, const GroupKey& key, const std::string& peer_ip,
                             const std::string& peer) {
  JoinOutcome out;
  const std::string who = "rank " + std::to_string(h.rank) + " (" + peer + ")";
  auto it = groups_.find(key);
  std::shared_ptr<Group> g;
  if (it == groups_.end()) {
    const uint64_t need = Group::bytes_needed(h.world_size, h.chunk_bytes, limits_.slots);
    if (need > limits_.max_group_bytes) {
      out.status = proto::Status::GroupConflict;  // the group's own parameters ask too much: a configuration error
      out.message = "group " + key.label() + " would need " + std::to_string(need >> 20) +
                    " MiB of reduction buffers (slots x (world size + 2) x chunk size); this reducer allows " +
                    std::to_string(limits_.max_group_bytes >> 20) +
                    " MiB per group stream (max_group_bytes): use a smaller chunk size";
      return out;
    }
    PeerTable::Ticket ticket;
    if (!peers_->acquire(PeerTable::Kind::Group, peer_ip, limits_.max_groups_per_peer, &ticket)) {
      out.status = proto::Status::OverLimit;
      out.message = "address " + peer_ip + " already created " + std::to_string(limits_.max_groups_per_peer) +
                    " live group streams on this reducer (max_groups_per_peer)";
      return out;
    }
    g = std::make_shared<Group>(key, h.world_size, h.chunk_bytes, h.num_streams, limits_.slots, std::move(ticket));
    g->set_flags(h.flags & proto::kHelloFailover);
    groups_.emplace(key, g);
    if (key.stream == 0) (*live_groups_)++;
    out.created = true;
  } else {
    g = it->second;
    std::string conflict;
    if (g->world() != h.world_size)
      conflict =
          "world size " + std::to_string(h.world_size) + " differs from the group's " + std::to_string(g->world());
    else if (g->num_streams() != h.num_streams)
      conflict =
          "streams " + std::to_string(h.num_streams) + " differ from the group's " + std::to_string(g->num_streams());
    else if (g->chunk() != h.chunk_bytes)
      conflict =
          "chunk size " + std::to_string(h.chunk_bytes) + " differs from the group's " + std::to_string(g->chunk());
    else if ((h.flags & proto::kHelloFailover) != g->flags())
      conflict = std::string("reducer failover is ") + ((h.flags & proto::kHelloFailover) ? "on" : "off") +
                 " for this worker and " + (g->flags() ? "on" : "off") + " for the group's first member (RS_FAILOVER)";
    if (!conflict.empty()) {
      out.status = proto::Status::GroupConflict;
      out.message = "group " + key.label() + ": " + who + ": " + conflict;
      return out;
    }
    if (g->member(h.rank)) {
      out.status = proto::Status::RankTaken;
      out.message = "group " + key.label() + ": rank " + std::to_string(h.rank) + " is already connected";
      return out;
    }
  }
  g->add_member(h.rank, c, peer_ip);
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
