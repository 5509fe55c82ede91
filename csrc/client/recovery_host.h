// What the worker client's recovery coordinator (client/recovery.h) may see and do of the client
// it belongs to: the session (its reducers, links and rounds), the rounds the client owns for it,
// and the driving of the links. The client implements it (client/host.cc); nothing else of the
// client (its callers' rounds, locking, idle thread, handshakes) is reachable from recovery.
#pragma once

#include <poll.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "client/types.h"
#include "common/error.h"
#include "net/address.h"
#include "net/deadline.h"

namespace rs::client {

struct Round;    // client/round.h
class Schedule;  // client/schedule.h

class RecoveryHost {
 public:
  virtual ~RecoveryHost() = default;

  // ---- what the client was configured with ----
  virtual const ClientOptions& options() const = 0;
  virtual const std::vector<net::HostPort>& addresses() const = 0;  // every configured reducer

  // ---- the session ----
  virtual const std::vector<size_t>& active() const = 0;      // its reducers (indices into addresses())
  virtual void set_active(std::vector<size_t> reducers) = 0;  // the next session's (sorted)
  virtual Links& links() = 0;                                 // reducer-major: [i * streams + s], i indexes active()
  virtual Schedule& schedule() = 0;  // the session's rounds in round order, and how they go on the links
  // Connects a session on active(); a reducer that refuses it is added to `refused` (then the
  // links are not complete: the caller drops them and starts again).
  virtual void connect(std::vector<size_t>* refused) = 0;
  virtual void drop_links() = 0;  // the links were closed (or said goodbye): forget them
  // The group-agreed number the next user round gets (Round::seq): the same on every worker.
  virtual uint64_t next_seq() const = 0;

  // ---- rounds ----
  virtual std::vector<Round*>& parents() = 0;  // user rounds out of the session: repairs owed, or re-planning
  // Takes every round out of the session (before a new one): `pending` become parents().
  virtual void clear_session(std::vector<Round*> pending) = 0;
  virtual Round* new_internal(RoundRole role) = 0;  // a repair or exchange round, owned by the client
  virtual void free_exchanges() = 0;                // exchange rounds no longer in a session
  virtual void enqueue(Round* r) = 0;               // plans it on the links and appends it to the session
  virtual void settle(Round& r) = 0;                // done once its results are in and cleared
  virtual size_t open_rounds() const = 0;           // rounds in the session not finished

  // ---- driving the links ----
  virtual bool pump() = 0;  // one non-blocking pass (client.h)
  virtual void poll_and_pump(std::vector<pollfd>* pfds, int ms) = 0;
  virtual void wake_waiters() = 0;
  virtual net::ProgressTimer& timer() = 0;  // no progress while some thread drives the rounds
  virtual std::string describe_stall(double seconds) const = 0;
  virtual bool& force_dones() = 0;  // while set every round must end: no DONE may wait in the kernel

  // ---- failure and counters ----
  virtual void fail_all(ErrorKind kind, const std::string& why) = 0;  // drops the session
  virtual Error dropped() const = 0;                                  // the error that last dropped it
  virtual ClientStats& stats() = 0;
};

}  // namespace rs::client
