// The worker client's recovery coordinator: what happens when a reducer is lost, and when a lost
// one comes back (docs/protocol.md, "Reducer failover" and section 6). It notes losses (a link
// that closes, an ERROR Shutdown or Failover, a stall on one reducer), moves the session to the
// survivors and sets up the repair of every unfinished round (the exchange and its decisions are
// client/failover.h), and at every rejoin check agrees with the other workers on the lost
// reducers they all reach again and takes those back. It drives the session through the client
// it belongs to, which it sees only through a RecoveryHost (client/recovery_host.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/failover.h"
#include "client/recovery_host.h"
#include "client/round.h"
#include "net/deadline.h"
#include "net/socket.h"
#include "protocol/wire.h"

namespace rs::client {

class Recovery {
 public:
  explicit Recovery(std::unique_ptr<RecoveryHost> host);

  // ---- losses, noted while the links are pumped ----
  void note_lost(size_t reducer, const std::string& why);
  // An ERROR frame `code` (tag `tag`, text `msg`) from link `l`'s reducer: with failover a
  // reducer shutting down, reducers another worker lost, or a worker that left are noted (the
  // link is closed); anything else, or any error without failover, throws.
  void on_reducer_error(Link& l, proto::ErrorCode code, uint64_t tag, const std::string& msg);
  // After a pass over the links: true if a loss moved the session (recover()); throws when a
  // worker left (unless a reducer loss explains it in time) or the rounds stalled.
  bool after_pass();
  // Moves the session to the surviving reducers and sets up the repair of every unfinished round.
  void recover();
  bool recovering() const { return recovering_; }
  int poll_ms() const;  // how long a wait for the links may sleep (shorter while a worker left)

  // ---- rejoin checks, at round starts ----
  // False if try_start() (`may_wait` false) would have to wait for a check (see try_rejoin).
  bool before_start(bool may_wait) { return !(check_open_ || check_due()) || try_rejoin(may_wait); }
  bool check_open() const { return check_open_; }
  void check_probes();  // notes probes that finished (never waits)

  // ---- the session ends ----
  void reset();  // fail_all(): every loss, check and restart count is over
  // A reconnect from scratch (Client::reconnect): reset(), and nothing of the last session's
  // rounds or reducer set is kept (no rejoin check pending, round numbers from 0).
  void restart();
  // The session was dropped because every reducer was lost while no caller waited for a round:
  // nothing is lost, the next start() reconnects instead of raising (an idle pass saw it).
  bool lost_all_idle() const { return lost_all_idle_; }
  void drop_probes() { probes_.clear(); }     // the links are dropped (close, error, failover)
  void round_finished() { recoveries_ = 0; }  // a user round finished

 private:
  bool stall_is_one_reducer(size_t* reducer) const;
  void warn_stall();  // a WARNING once per stall, half way to the timeout (each stuck link's TCP state)
  std::vector<Round*> unfinished_rounds();
  void collect_held();
  void say_failover_bye();
  bool move_session(const std::vector<Round*>& pending);
  void log_move(const std::string& lost_names, const std::string& why, size_t pending) const;
  bool exchange(const std::vector<Round*>& pending, std::optional<failover::Table>* table);
  void plan_repairs(const std::vector<Round*>& pending, const failover::Table& table);
  void repair(Round* r, const failover::Table& table);
  void seal_exchange(Round* x, Op op);
  bool run_internal(Round* r);
  bool drain(bool may_wait);
  // While reducers are lost: every kRejoinEvery rounds the workers drain, agree (a MIN
  // all-reduce) on the lost reducers every worker reached with the probe started at the
  // previous check (never waited for), take those back, and start the next probes.
  // With `may_wait` false it never waits for the other workers: false until the check is over.
  bool try_rejoin(bool may_wait);
  bool finish_check(bool may_wait, bool agreed, Round* x);
  bool check_due() const;  // a rejoin check is due at the next round number
  void open_check();       // enqueues the check's MIN all-reduce (check_)
  void start_probes();     // a probe per reducer not in the session

  std::unique_ptr<RecoveryHost> host_;
  RecoveryHost& c_;            // *host_: the client
  std::vector<uint8_t> lost_;  // by reducer: lost and not yet handled
  bool loss_pending_ = false;
  std::string loss_why_;
  bool recovering_ = false;
  int recoveries_ = 0;           // failover sessions started since a user round last finished
  uint64_t rejoin_checked_ = 0;  // the round boundary (Round::seq) last checked for rejoins
  // A rejoin check under way (try_start() does not wait for it): its MIN all-reduce round, owned
  // by the client's internal rounds (null once recover() dropped it: the check is then over,
  // without a rejoin; reset() closes the check).
  bool check_open_ = false;
  Round* check_ = nullptr;
  uint64_t rejoin_from_ = 0;  // checks start here: a Round::seq no worker had started at the last failover
  bool lost_all_idle_ = false;
  // The connects to lost reducers started at the last rejoin check, by reducer; the next check
  // reads them. Closed when the links are dropped (close, error, failover, rejoin).
  std::vector<std::pair<size_t, net::ConnectProbe>> probes_;
  std::string peer_left_;  // a reducer said a worker left: fails unless a reducer loss explains it
  net::Clock::time_point peer_left_until_{};
  net::Clock::time_point stall_warned_{};  // the last progress before the stall last warned of
};

}  // namespace rs::client
