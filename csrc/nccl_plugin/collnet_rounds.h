// The one place where CollNet's iallreduce/test meet the worker client: each iallreduce is a
// round of the asynchronous client (rs::client::Client::try_start/test), up to `max_in_flight`
// rounds stream at once, and neither call ever blocks NCCL's proxy thread:
//  - try_start copies send -> recv (the client reduces in place) and calls Client::try_start,
//    which only queues frames and writes what the sockets take; false -> a NULL request;
//  - test calls Client::test, one non-blocking pass over the sockets.
// The client reconnects inside start() after an error, which would block: so after the first
// error this communicator is failed for good (every later iallreduce/test reports it) and the
// client is never started again. Rounds only move inside calls, and the client's no-progress
// timer ignores the time between calls; NCCL polls test() from its proxy thread with other work
// in between, so a wall-clock no-progress timer here turns a stalled group into an error from
// test() within RS_TIMEOUT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/error.h"
#include "kernels/kernels.h"
#include "net/deadline.h"

namespace rs::nccl {

class CollNetRounds {
 public:
  struct Round;  // what iallreduce hands NCCL as its request

  // Connects to the reducers and waits for the whole group (bounded by opts.connect_timeout).
  // opts.max_rounds_in_flight is set to max_in_flight.
  CollNetRounds(client::ClientOptions opts, int max_in_flight);
  // Abandons the rounds in flight (the client says goodbye to every reducer; nothing waits).
  ~CollNetRounds();
  CollNetRounds(const CollNetRounds&) = delete;
  CollNetRounds& operator=(const CollNetRounds&) = delete;

  // Starts reducing `nbytes` of `send` into `recv` (may be the same buffer) across the group.
  // nullptr when max_in_flight rounds are unfinished or a rejoin check waits for the other heads
  // (NCCL calls again later; after RS_TIMEOUT of wall time without progress at a check, it throws
  // a Timeout). Once a round has failed, every later round fails too (the group is out of step),
  // reported by test().
  Round* try_start(const void* send, void* recv, size_t nbytes, DType dtype, Op op);

  // Non-blocking. true once the round is done (its request is released then); throws rs::Error
  // if it failed (the request is released too). `request` must come from try_start of any live
  // CollNetRounds.
  static bool test(void* request, size_t* nbytes);

 private:
  bool test_round(Round& r, size_t* nbytes);
  [[noreturn]] void fail(Round& r, ErrorKind kind, const std::string& why);
  bool stalled();                                       // RS_TIMEOUT of wall time without a byte moving
  [[noreturn]] void time_out(const std::string& what);  // fails the communicator for good (Timeout)
  void release(Round& r);

  client::Client client_;
  std::vector<std::unique_ptr<Round>> slots_;  // the request ring, in issue order
  uint64_t issued_ = 0;
  size_t running_ = 0;        // requests handed to NCCL and not yet released
  net::ProgressTimer stall_;  // wall-clock: no byte moved while NCCL waited for a round
  uint64_t bytes_seen_ = 0;   // client bytes sent + received at the last progress
  bool refusing_ = false;     // the client refused rounds with none in flight (a rejoin check)
  bool failed_ = false;       // sticky: the group is out of step
  ErrorKind fail_kind_ = ErrorKind::Internal;
  std::string fail_text_;
  std::mutex mu_;  // NCCL calls from its proxy thread; only held for non-blocking work
};

}  // namespace rs::nccl
