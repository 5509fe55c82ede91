// Time limits for network waits: an absolute deadline (handshakes, connects) and a
// "no progress for T seconds" timer (data transfers: a transfer may take long as a
// whole, but it fails once no byte has moved for T seconds).
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>

#include "common/defaults.h"

namespace rs::net {

using Clock = std::chrono::steady_clock;

// `seconds` as a clock duration, saturated to [0, kMaxSeconds] (NaN: 0): every conversion of a
// seconds value goes through here, so none overflows whatever it is given (the settings and
// arguments are refused above kMaxSeconds already: settings::check_seconds).
inline Clock::duration duration_of(double seconds) {
  const double s = seconds > 0 ? std::min(seconds, kMaxSeconds) : 0.0;  // (NaN > 0 is false)
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// The point `seconds` from now.
inline Clock::time_point deadline_after(double seconds) { return Clock::now() + duration_of(seconds); }

// Milliseconds left until `deadline` for poll(): 0 once it has passed, at most `cap_ms`.
inline int ms_until(Clock::time_point deadline, int cap_ms = 1 << 30) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::max<int64_t>(0, std::min<int64_t>(ms, cap_ms)));
}

// A blocking wait's way out before its deadline: a wait given one (not empty) sleeps in slices
// of at most kInterruptSliceMs and calls it before each; it throws to end the wait (the worker
// client's close(), or a call that may not wait any longer for its idle thread: client.h).
using Interrupt = std::function<void()>;
constexpr int kInterruptSliceMs = 50;

// poll() for up to `ms` (-1: no limit), in slices when `intr` is set (called before each).
// What poll() returns; 0 once `ms` passed with nothing ready.
int poll_interruptible(pollfd* fds, nfds_t n, int ms, const Interrupt& intr);
// Sleeps `d`, in slices when `intr` is set.
void pause_interruptible(Clock::duration d, const Interrupt& intr);

// Fails a transfer after `seconds` without progress. Call progress() whenever a byte
// moves (or a new transfer starts after an idle period); expired() says when to give up;
// poll_ms() is how long a poll() may sleep (at least 1 ms, at most cap_ms and the time left).
class ProgressTimer {
 public:
  explicit ProgressTimer(double seconds) : limit_(duration_of(seconds)), last_(Clock::now()) {}
  void progress() { last_ = Clock::now(); }
  // Time that must not count (nobody was waiting for progress then).
  void exclude(Clock::duration d) { last_ += d; }
  bool expired() const { return Clock::now() - last_ > limit_; }
  // Seconds since the last progress, and when that was (a stall's identity: warned of once).
  double idle_seconds() const { return std::chrono::duration<double>(Clock::now() - last_).count(); }
  Clock::time_point last() const { return last_; }
  double seconds() const { return std::chrono::duration<double>(limit_).count(); }
  int poll_ms(int cap_ms = 200) const { return std::max(1, ms_until(last_ + limit_, cap_ms)); }

 private:
  Clock::duration limit_;
  Clock::time_point last_;
};

}  // namespace rs::net
