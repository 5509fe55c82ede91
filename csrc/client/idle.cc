// Client::progress_while_idle(): a thread that passes over an idle client's links (client.h).
//
// Rounds move only inside calls (start/test/wait). A process may hold two clients of one job
// (the fusion engine's data group and its probe group): when a reducer dies, rank 1 may wait in
// its data client's failover exchange for rank 0's data client while rank 0 waits in its probe
// client's exchange for rank 1's probe client. Each exchange needs a client that no call drives,
// so both would wait until the connect timeout. This thread's passes read the lost connection or
// the reducer's ERROR Failover and join the exchange (Recovery::after_pass -> recover(), which
// works with no round in flight, as at a start()).
//
// The thread is C++ only: it never takes Python's GIL itself (a log line does, through the log
// sink, and close() joins it with the GIL released: bindings/client.cc), so an interpreter that
// finalizes while it runs cannot stop it inside C++ code.
#include <unistd.h>

#include <cmath>
#include <memory>

#include "client/client.h"
#include "client/recovery.h"

namespace rs::client {

void Client::progress_while_idle(double period_s) {
  if (!(period_s > 0) || !std::isfinite(period_s) || period_s > 3600)
    throw Error(ErrorKind::Config,
                "idle progress period must be in (0, 3600] seconds, got " + std::to_string(period_s));
  std::lock_guard<std::mutex> lock(mu_);
  if (!opts_.failover || idle_stop_) return;  // only failover needs it; closed: never again
  idle_period_ = std::max(std::chrono::milliseconds(1),
                          std::chrono::milliseconds(static_cast<int64_t>(std::llround(period_s * 1000))));
  if (!idle_thread_) {
    idle_thread_ = std::make_unique<std::thread>([this] { idle_loop(); });
    idle_pid_ = ::getpid();
  }
  idle_cv_.notify_all();
}

void Client::idle_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!idle_stop_) {
    idle_cv_.wait_for(lk, idle_period_);
    if (idle_stop_) break;
    if (callers_ > 0 || links_.empty()) continue;  // a call drives it, or there is no session
    Driving driving(this);                         // a pass counts as driving: idle time before it is not "no progress"
    idle_pass();
  }
}

void Client::idle_pass() {
  try {
    recovery_->check_probes();
    pump(nullptr, true);
  } catch (const Error& e) {  // pump() fails the rounds itself; anything left is handled here
    fail_all(e.kind(), e.what());
  } catch (const std::exception& e) {
    fail_all(ErrorKind::Internal, std::string("idle progress: ") + e.what());
  }
  // An error dropped the session: the caller learns it at its next start(), as it would have
  // there (not a silent reconnect that would wait for a group that is gone). Only the loss of
  // every reducer with no round in flight lost nothing: the next start() reconnects.
  if (links_.empty() && !idle_error_ && !recovery_->lost_all_idle()) idle_error_.emplace(dropped_kind_, dropped_why_);
}

void Client::stop_idle_thread() {
  std::unique_ptr<std::thread> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_stop_ = true;
    t = std::move(idle_thread_);
  }
  if (!t) return;
  if (idle_pid_ != ::getpid()) {  // a forked child: the thread is its parent's; nothing to join
    (void)t.release();            // (its std::thread must not be destroyed joinable: left as it is)
    return;
  }
  idle_cv_.notify_all();
  if (t->get_id() == std::this_thread::get_id()) t->detach();  // never: the thread calls no close()
  else t->join();
}

}  // namespace rs::client
