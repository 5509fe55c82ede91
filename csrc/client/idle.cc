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
//
// A pass holds the client's lock, and a failover it joins waits for the network (the new
// session's handshakes, the exchange). Those waits never keep anyone else waiting beyond their own
// bounds: they run in slices (net::poll_interruptible) and end with an error (the session is
// dropped, as for any error of a pass) when close() runs, or when a call has waited for the lock
// for its own timeout (enter()). A worker whose reducer (or an impostor, where no secret is set)
// says "failover" and never answers the new session's hello therefore closes within a slice, and
// its next call raises after its timeout, not after the connect timeout.
//
// fork(): a child gets a copy of every client, but not the parent's threads, and the connections
// stay the parent's. At-fork handlers (ForkRegistration) mark every client of the child
// inherited() while no client is being made or freed: the child never sends on them, never shuts
// them down, and never takes their lock (a thread of the parent may have held it at the fork).
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "client/client.h"
#include "client/recovery.h"
#include "common/raised.h"

namespace rs::client {

void Client::progress_while_idle(double period_s) {
  if (!(period_s > 0) || !std::isfinite(period_s) || period_s > 3600)
    throw Error(ErrorKind::Config,
                "idle progress period must be in (0, 3600] seconds, got " + std::to_string(period_s));
  if (inherited()) return;  // the parent's thread is not here; this process starts none for it
  Lock lock = enter();
  if (!opts_.failover || idle_stop_) return;  // only failover needs it; closed: never again
  idle_period_ = std::max(std::chrono::milliseconds(1),
                          std::chrono::milliseconds(static_cast<int64_t>(std::llround(period_s * 1000))));
  if (!idle_thread_) idle_thread_ = std::make_unique<std::thread>([this, ms = idle_period_] { idle_loop(ms); });
  uint64_t one = 1;  // a new period applies now
  ssize_t n = ::write(idle_wake_.get(), &one, sizeof one);
  (void)n;
}

// Sleeps a period (on idle_wake_, without the lock), then makes a pass if no call drives the
// client or waits to.
void Client::idle_loop(std::chrono::milliseconds period) {
  while (!idle_stop_) {
    pollfd p{idle_wake_.get(), POLLIN, 0};
    if (::poll(&p, 1, int(std::min<int64_t>(period.count(), 3600 * 1000))) > 0) {
      uint64_t v;
      ssize_t n = ::read(idle_wake_.get(), &v, sizeof v);
      (void)n;
    }
    if (idle_stop_ || entering_ > 0) continue;
    Lock lk(mu_);
    period = idle_period_;
    if (idle_stop_ || entering_ > 0 || callers_ > 0 || links_.empty()) continue;  // a call drives it, or no session
    Driving driving(this);  // a pass counts as driving: idle time before it is not "no progress"
    Raised mine(idle_driving_);
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

// (close() has raised closing_: a pass in a network wait ends within a slice, so the lock comes soon.)
void Client::stop_idle_thread() {
  idle_stop_ = true;
  uint64_t one = 1;
  ssize_t n = ::write(idle_wake_.get(), &one, sizeof one);
  (void)n;
  std::unique_ptr<std::thread> t;
  {
    Lock lock(mu_);
    t = std::move(idle_thread_);
  }
  if (!t) return;
  if (t->get_id() == std::this_thread::get_id()) t->detach();  // never: the thread calls no close()
  else t->join();
}

Client::Lock Client::enter() const {
  Lock lk(mu_, std::try_to_lock);
  if (lk.owns_lock()) return lk;
  entering_++;  // (the idle thread starts no pass meanwhile)
  const auto deadline = net::deadline_after(opts_.timeout);
  bool yielding = false;
  while (!lk.try_lock_for(std::chrono::milliseconds(net::kInterruptSliceMs))) {
    if (!yielding && net::Clock::now() >= deadline) {
      yielding = true;  // an idle pass that holds the lock now gives up at its next slice
      idle_yield_++;
    }
  }
  if (yielding) idle_yield_--;
  entering_--;
  return lk;
}

void Client::check_interrupt() const {
  if (closing_ > 0) throw Error(ErrorKind::Config, "the client was closed while it waited for its reducers");
  if (idle_driving_ && idle_yield_ > 0)
    throw Error(ErrorKind::Timeout,
                "a reducer failover joined while the client was idle was still waiting for its reducers after a "
                "call had waited " +
                    std::to_string(opts_.timeout) + " s (the timeout) for it: given up");
}

void Client::refuse_inherited() const {
  if (inherited())
    throw Error(ErrorKind::Config,
                "this client was made by the parent of this forked process: its connections are the parent's "
                "(make a new client or Communicator in the child)");
}

// ---- fork ------------------------------------------------------------------------------------

namespace {

// Every client of the process (never destroyed: clients may outlive static destruction).
std::mutex& registry_mu() {
  static auto* m = new std::mutex;
  return *m;
}

std::vector<Client*>& registry() {
  static auto* v = new std::vector<Client*>;
  return *v;
}

}  // namespace

Client::ForkRegistration::ForkRegistration(Client* c) : c_(c) {
  static std::once_flag once;
  std::call_once(once, [] { ::pthread_atfork(&prepare, &parent, &child); });
  std::lock_guard<std::mutex> lock(registry_mu());
  registry().push_back(c);
}

Client::ForkRegistration::~ForkRegistration() {
  std::lock_guard<std::mutex> lock(registry_mu());
  auto& v = registry();
  v.erase(std::remove(v.begin(), v.end(), c_), v.end());
}

// The list is held across fork(), so the child's copy is whole; nothing else is waited for
// (a client's own lock may be held for a network wait: the child never takes it).
void Client::ForkRegistration::prepare() { registry_mu().lock(); }
void Client::ForkRegistration::parent() { registry_mu().unlock(); }
void Client::ForkRegistration::child() {
  for (Client* c : registry()) c->inherited_ = true;  // (the child has one thread)
  registry_mu().unlock();
}

}  // namespace rs::client
