#include "nccl_plugin/collnet_rounds.h"

#include <cstring>

namespace rs::nccl {

namespace {
enum RoundState : int { kFree = 0, kQueued = 1, kDone = 2, kFailed = 3 };
}

struct CollNetRounds::Round {
  static constexpr uint32_t kMagic = 0x44524e52u;  // "RNRD"
  uint32_t magic = kMagic;
  CollNetRounds* owner = nullptr;
  std::atomic<int> state{kFree};
  void* data = nullptr;
  size_t nbytes = 0;
  DType dtype = DType::F32;
  Op op = Op::Sum;
  ErrorKind kind = ErrorKind::Internal;  // when failed
  std::string error;
};

CollNetRounds::CollNetRounds(client::ClientOptions opts, int max_in_flight) : opts_(std::move(opts)) {
  if (max_in_flight < 1) throw Error(ErrorKind::Config, "max_in_flight must be at least 1");
  client_ = std::make_unique<client::Client>(opts_);
  for (int i = 0; i < max_in_flight; ++i) {
    slots_.push_back(std::make_unique<Round>());
    slots_.back()->owner = this;
  }
  thread_ = std::thread([this] { run(); });
}

CollNetRounds::~CollNetRounds() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& r : slots_) r->magic = 0;
  client_.reset();  // goodbye to every reducer
}

CollNetRounds::Round* CollNetRounds::try_start(const void* send, void* recv, size_t nbytes, DType dtype, Op op) {
  Round& r = *slots_[issued_ % slots_.size()];
  if (r.state.load(std::memory_order_acquire) != kFree) return nullptr;
  {
    // After a failure the group is out of step: the round fails at once, reported by test()
    // (where NCCL expects a lost peer to show up).
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) {
      r.kind = fail_kind_;
      r.error = "an earlier all-reduce round failed: " + fail_text_;
      r.nbytes = nbytes;
      r.state.store(kFailed, std::memory_order_release);
      ++issued_;
      return &r;
    }
  }
  if (send != recv && nbytes) std::memmove(recv, send, nbytes);  // the client reduces in place
  r.data = recv;
  r.nbytes = nbytes;
  r.dtype = dtype;
  r.op = op;
  r.state.store(kQueued, std::memory_order_release);
  ++issued_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_ = issued_;
  }
  cv_.notify_one();
  return &r;
}

bool CollNetRounds::test(void* request, size_t* nbytes) {
  auto* r = static_cast<Round*>(request);
  if (!r || r->magic != Round::kMagic) throw Error(ErrorKind::Internal, "test: not a CollNet request of this plugin");
  int st = r->state.load(std::memory_order_acquire);
  if (st == kDone) {
    if (nbytes) *nbytes = r->nbytes;
    r->state.store(kFree, std::memory_order_release);
    return true;
  }
  if (st == kFailed) {
    Error e(r->kind, r->error);
    r->state.store(kFree, std::memory_order_release);
    throw e;
  }
  if (st == kFree) throw Error(ErrorKind::Internal, "test: CollNet request already completed");
  return false;
}

void CollNetRounds::run() {
  uint64_t next = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || queued_ > next; });
      if (stop_) return;
    }
    Round& r = *slots_[next % slots_.size()];
    ++next;
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed = failed_;
      if (failed) {
        r.kind = fail_kind_;
        r.error = "an earlier all-reduce round failed: " + fail_text_;
      }
    }
    if (!failed) {
      try {
        client_->allreduce(r.data, r.nbytes, r.dtype, r.op, 0);
      } catch (const Error& e) {
        failed = true;
        r.kind = e.kind();
        r.error = e.what();
      } catch (const std::exception& e) {
        failed = true;
        r.kind = ErrorKind::Internal;
        r.error = e.what();
      }
      if (failed) {
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = true;
        fail_kind_ = r.kind;
        fail_text_ = r.error;
      }
    }
    r.state.store(failed ? kFailed : kDone, std::memory_order_release);
  }
}

}  // namespace rs::nccl
