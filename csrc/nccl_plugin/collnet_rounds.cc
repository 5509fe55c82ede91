#include "nccl_plugin/collnet_rounds.h"

#include <cstring>

#include "net/tcp_path.h"

namespace rs::nccl {

struct CollNetRounds::Round {
  static constexpr uint32_t kMagic = 0x44524e52u;  // "RNRD"
  uint32_t magic = kMagic;
  CollNetRounds* owner = nullptr;
  bool busy = false;       // handed to NCCL, not yet reported done or failed by test()
  bool prefailed = false;  // started after the communicator failed: test() reports that
  client::RoundId id = 0;
  size_t nbytes = 0;
};

namespace {

client::ClientOptions with_rounds(client::ClientOptions opts, int max_in_flight) {
  if (max_in_flight < 1) throw Error(ErrorKind::Config, "max_in_flight must be at least 1");
  opts.max_rounds_in_flight = max_in_flight;
  return opts;
}

}  // namespace

CollNetRounds::CollNetRounds(client::ClientOptions opts, int max_in_flight)
    : client_(with_rounds(std::move(opts), max_in_flight)), stall_(client_.options().timeout) {
  for (int i = 0; i < max_in_flight; ++i) {
    slots_.push_back(std::make_unique<Round>());
    slots_.back()->owner = this;
  }
}

CollNetRounds::~CollNetRounds() {
  for (auto& r : slots_) r->magic = 0;
  // client_'s destructor closes it: rounds in flight fail, every reducer gets a goodbye
  // (links in the middle of a frame are just closed); nothing waits for the network.
}

CollNetRounds::Round* CollNetRounds::try_start(const void* send, void* recv, size_t nbytes, DType dtype, Op op) {
  std::lock_guard<std::mutex> lock(mu_);
  Round& r = *slots_[issued_ % slots_.size()];
  if (r.busy) return nullptr;  // the request ring is full: NCCL calls again later
  if (!failed_ && !client_.connected()) {
    // The client dropped its session inside an earlier call (the round that failed reports
    // why); starting a round now would reconnect, which blocks and would be out of step.
    failed_ = true;
    fail_kind_ = ErrorKind::PeerLost;
  }
  if (!failed_) {
    if (send != recv && nbytes) std::memmove(recv, send, nbytes);  // the client reduces in place
    bool started;
    try {
      started = client_.try_start(recv, nbytes, dtype, op, 0, &r.id);
    } catch (const Error& e) {
      // This head skipped a round the others may have started: out of step for good.
      failed_ = true;
      fail_kind_ = e.kind();
      fail_text_ = e.what();
      client_.close();  // the reducers fail the group for every head now, not after a timeout
      throw;
    }
    if (!started) {  // max_in_flight rounds unfinished on the network, or a rejoin check under way
      // With none of this communicator's rounds in flight it is a rejoin check waiting for the
      // other heads (docs/protocol.md section 6): NCCL has no request to test() meanwhile, so
      // the wall-clock stall timer runs here, from the first refusal.
      if (running_ == 0) {
        if (!refusing_) {
          refusing_ = true;
          stall_.progress();
        } else if (stalled()) {
          time_out("a rejoin check (the other heads must reach it too)");
        }
      }
      return nullptr;
    }
    refusing_ = false;
    if (running_ == 0) stall_.progress();  // the wall-clock stall timer starts with the first round
  }
  r.prefailed = failed_;
  r.nbytes = nbytes;
  r.busy = true;
  ++running_;
  ++issued_;
  return &r;
}

void CollNetRounds::release(Round& r) {
  r.busy = false;
  r.prefailed = false;
  --running_;
}

void CollNetRounds::fail(Round& r, ErrorKind kind, const std::string& why) {
  release(r);
  if (!failed_ || fail_text_.empty()) {  // the first error seen names the cause
    failed_ = true;
    fail_kind_ = kind;
    fail_text_ = why;
    throw Error(kind, why);
  }
  throw Error(fail_kind_, "an earlier all-reduce round failed: " + fail_text_);
}

bool CollNetRounds::test(void* request, size_t* nbytes) {
  auto* r = static_cast<Round*>(request);
  if (!r || r->magic != Round::kMagic) throw Error(ErrorKind::Internal, "test: not a CollNet request of this plugin");
  return r->owner->test_round(*r, nbytes);
}

bool CollNetRounds::test_round(Round& r, size_t* nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!r.busy) throw Error(ErrorKind::Internal, "test: CollNet request already completed");
  if (r.prefailed) {
    release(r);
    throw Error(fail_kind_, fail_text_.empty()
                                ? "an earlier all-reduce round failed and dropped the session with the reducers"
                                : "an earlier all-reduce round failed: " + fail_text_);
  }
  bool done;
  try {
    done = client_.test(r.id);  // one non-blocking pass over the sockets; never reconnects
  } catch (const Error& e) {
    fail(r, e.kind(), e.what());
  }
  if (done) {
    stall_.progress();
    release(r);
    if (nbytes) *nbytes = r.nbytes;
    return true;
  }
  if (stalled()) {
    const std::string what = std::to_string(running_) + " round(s) in flight";
    release(r);
    time_out(what);
  }
  return false;
}

// True once RS_TIMEOUT of wall time passed without a byte moving (the client's counters).
bool CollNetRounds::stalled() {
  const client::ClientStats s = client_.stats();
  const uint64_t moved = s.bytes_sent + s.bytes_received;
  if (moved == bytes_seen_) return stall_.expired();
  bytes_seen_ = moved;
  stall_.progress();
  return false;
}

void CollNetRounds::time_out(const std::string& what) {
  // The client's own account of the stall: each link that owes results, with its TCP state.
  const std::string links = client_.stall_text(stall_.seconds());
  const std::string why = "all-reduce made no progress for " + net::duration_text(uint64_t(stall_.seconds() * 1e6)) +
                          " (RS_TIMEOUT; a head of the group may be missing or slow, or a reducer stalled): " + what +
                          (links.empty() ? "" : "; " + links);
  failed_ = true;
  fail_kind_ = ErrorKind::Timeout;
  fail_text_ = why;
  client_.close();  // abandons every round in flight without waiting
  throw Error(ErrorKind::Timeout, why);
}

}  // namespace rs::nccl
