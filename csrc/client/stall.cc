// Client::describe_stall(): what a round that made no progress waits for, link by link, with what
// TCP says of each (net/tcp_path.h): the ReductionTimeout's message and the warning half way to it
// (Recovery::warn_stall).

#include <string>

#include "client/client.h"
#include "client/round.h"
#include "client/schedule.h"
#include "net/tcp_path.h"

namespace rs::client {

std::string Client::stall_text(double seconds) const {
  if (inherited()) return "";
  Lock lock = enter();
  return sched_->rounds.empty() ? "" : describe_stall(seconds);
}

std::string Client::describe_stall(double seconds) const {
  // The oldest round still owed results on some link; else the oldest (owed only CLEARs).
  const Round* r = sched_->rounds.front();
  for (const Round* x : sched_->rounds)
    if (x->state == Round::State::Running && x->parts_left > 0) {
      r = x;
      break;
    }
  std::string waiting;
  for (size_t li = 0; li < links_.size() && li < r->parts.size(); ++li) {
    const Round::Part& p = r->parts[li];
    const bool results = p.received < p.expected;
    if (!results && !(opts_.failover && p.expected > 0 && !p.cleared)) continue;
    if (!waiting.empty()) waiting += "; ";
    // What TCP says of the link: backoff after losses, the reducer's zero window, or nothing owed.
    const Link& l = *links_[li];
    waiting += l.peer + ": sent " + std::to_string(p.written) + "/" + std::to_string(p.expected) + " chunks, got " +
               std::to_string(p.received) + "/" + std::to_string(p.expected) + " results" +
               (results ? "" : ", no CLEAR yet") + ", " +
               net::tcp_stall_text(net::tcp_path(l.closed ? -1 : l.fd.get()), "the reducer");
  }
  std::string more = running_ > 1 ? " (" + std::to_string(running_) + " rounds in flight)" : "";
  return "all-reduce round " + std::to_string(r->wire) + " made no progress for " +
         net::duration_text(uint64_t(seconds * 1e6)) + " (a worker of the group may be missing or slow): " + waiting +
         more;
}

}  // namespace rs::client
