// The one place where CollNet's iallreduce/test meet the worker client: each iallreduce is a
// round on the reducers, several rounds are in flight, requests finish in issue order.
//
// This implementation drives today's synchronous rs::client::Client from ONE progress thread
// that runs the queued rounds in order (try_start/test never block: they only touch a fixed
// ring of round slots). With the asynchronous client (Client::try_start/test/wait and
// ClientOptions::max_rounds_in_flight) the thread, queue and condition variable go away and
// try_start/test call the client directly (docs/nccl-plugin.md, "Rounds").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "common/error.h"
#include "kernels/kernels.h"

namespace rs::nccl {

class CollNetRounds {
 public:
  struct Round;  // what iallreduce hands NCCL as its request

  // Connects to the reducers and waits for the whole group (bounded by opts.connect_timeout).
  CollNetRounds(client::ClientOptions opts, int max_in_flight);
  // Lets the round in progress finish (bounded by opts.timeout), drops queued ones, says goodbye.
  ~CollNetRounds();
  CollNetRounds(const CollNetRounds&) = delete;
  CollNetRounds& operator=(const CollNetRounds&) = delete;

  // Starts reducing `nbytes` of `send` into `recv` (may be the same buffer) across the group.
  // nullptr when max_in_flight rounds are unfinished (NCCL calls again later). Once a round has
  // failed, every later round fails too (the group is out of step), reported by test().
  Round* try_start(const void* send, void* recv, size_t nbytes, DType dtype, Op op);

  // Non-blocking. true once the round is done (its request is released then); throws rs::Error
  // if it failed. `request` must come from try_start of any live CollNetRounds.
  static bool test(void* request, size_t* nbytes);

 private:
  void run();

  client::ClientOptions opts_;
  std::unique_ptr<client::Client> client_;
  std::vector<std::unique_ptr<Round>> slots_;
  uint64_t issued_ = 0;  // NCCL-thread side
  // Shared with the progress thread:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t queued_ = 0;
  bool stop_ = false;
  bool failed_ = false;
  ErrorKind fail_kind_ = ErrorKind::Internal;
  std::string fail_text_;
  std::thread thread_;
};

}  // namespace rs::nccl
