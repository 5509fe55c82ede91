// The client's side of its recovery coordinator's interface (client/recovery_host.h): each
// member forwards to the Client's own state. A nested class, so it alone reaches that state.
#include <algorithm>

#include "client/client.h"
#include "client/recovery.h"
#include "client/recovery_host.h"
#include "client/round.h"
#include "client/schedule.h"

namespace rs::client {

class Client::Host final : public RecoveryHost {
 public:
  explicit Host(Client& c) : c_(c) {}

  const ClientOptions& options() const override { return c_.opts_; }
  const std::vector<net::HostPort>& addresses() const override { return c_.addrs_; }

  const std::vector<size_t>& active() const override { return c_.active_; }
  void set_active(std::vector<size_t> reducers) override { c_.active_ = std::move(reducers); }
  Links& links() override { return c_.links_; }
  Schedule& schedule() override { return *c_.sched_; }
  void connect(std::vector<size_t>* refused) override { c_.connect_all(refused); }
  void drop_links() override { c_.disconnect(false); }
  uint64_t next_seq() const override { return c_.seq_next_; }

  std::vector<Round*>& parents() override { return c_.parents_; }
  void clear_session(std::vector<Round*> pending) override {
    c_.parents_ = std::move(pending);  // not in a session until re-planned (fail_all finds them here)
    c_.sched_->rounds.clear();
    c_.internal_.clear();
    c_.open_ = 0;
  }
  Round* new_internal(RoundRole role) override {
    c_.internal_.push_back(std::make_unique<Round>());
    Round* r = c_.internal_.back().get();
    r->role = role;
    r->id = ~RoundId(0);  // never in the client's rounds_
    return r;
  }
  void free_exchanges() override {
    auto& in = c_.internal_;
    in.erase(std::remove_if(in.begin(), in.end(),
                            [](const auto& p) { return p->role == RoundRole::Exchange && !p->in_session; }),
             in.end());
  }
  void enqueue(Round* r) override { c_.enqueue(r); }
  void settle(Round& r) override { c_.settle(r); }
  size_t open_rounds() const override { return c_.open_; }

  bool pump() override { return c_.pump(); }
  void poll_and_pump(std::vector<pollfd>* pfds, int ms) override { c_.poll_and_pump(pfds, ms); }
  void wake_waiters() override { c_.wake_waiters(); }
  net::ProgressTimer& timer() override { return c_.timer_; }
  std::string describe_stall(double seconds) const override { return c_.describe_stall(seconds); }
  bool& force_dones() override { return c_.force_dones_; }

  void fail_all(ErrorKind kind, const std::string& why) override { c_.fail_all(kind, why); }
  Error dropped() const override { return Error(c_.dropped_kind_, c_.dropped_why_); }
  ClientStats& stats() override { return c_.stats_; }

 private:
  Client& c_;
};

std::unique_ptr<RecoveryHost> Client::recovery_host() { return std::make_unique<Host>(*this); }

}  // namespace rs::client
