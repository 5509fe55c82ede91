// The worker transport: splits a buffer into one contiguous shard per reducer,
// streams each shard in chunks over `streams` TCP connections per reducer, and
// receives the reduced chunks straight back into the buffer (in place, no copy).
//
// Rounds are asynchronous: start() queues a round and returns; test() / wait() drive every
// round in flight and report one. Several rounds stream at once (round n+1 starts while
// round n drains). On each connection a round's chunks follow the previous round's, and
// every worker starts the same rounds in the same order, so the reducer (which keys chunks
// by their sequence number on the stream) pairs them up; results are matched back to rounds
// by round number and offset. The byte moving is csrc/net/frame_io.h. The implementation is in
// parts: client.cc (rounds, links, the pump over them), schedule.{h,cc} (which chunk goes next on
// which connection), staging.{h,cc} (compression), recovery.{h,cc} (failover and rejoin; its
// pure decisions are failover.{h,cc}; it sees the client only through recovery_host.h, which
// host.cc implements), idle.cc (passes while no call drives the client), waits.cc (the waits for
// the links: an epoll set in step with them, net::ReadySet), round.h (the state they share),
// types.h (the options, counters and names every part uses).
//
// Compressed rounds (Compression::BF16 / F16, float32 buffers only): the wire carries the
// buffer as 16-bit values. Each chunk is narrowed (kernels::narrow, round to nearest even)
// into a slot of a small per-link staging ring as it is queued, and each result chunk is read
// into a per-link staging chunk and widened (kernels::widen) straight into the float32 buffer.
// The reducers see an ordinary 16-bit round (they accumulate in float32 in rank order and
// round once), so the result is: each input rounded once, summed in float32 in rank order,
// rounded once, widened. Shards are planned on the wire bytes (half the buffer); chunks carry
// as many wire bytes as the uncompressed round's would (twice the elements), so the bytes in
// flight per link stay what the reducers' chunk slots allow.
//
// Reducer failover (ClientOptions::failover, on by default): a round is handed back (test()
// true, wait() returns) only once every reducer of the round said CLEAR, i.e. every worker
// holds its results; a small round (at most 512 KiB) is handed back as soon as its own results
// are in, and a copy of them stands in for the caller's buffer until the CLEARs. When a reducer
// is lost (its connection closes or resets, it shuts down, or it alone stalls for `timeout`),
// the worker says goodbye to the others with the lost set
// (so every worker of the group learns it), connects a new session to the survivors, and the
// workers agree in two small all-reduces which bytes of their unfinished rounds each of them
// already holds; those bytes are copied from the lowest holder, the rest is reduced again, on
// the survivors (client/failover.h). Results are bit-identical to a run without the failure.
// Later rounds use the survivors. Only when no reducer is left, or the failure is not a
// reducer's (a worker left, a mismatch), do the rounds fail.
#pragma once

#include <poll.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/types.h"
#include "common/error.h"
#include "kernels/kernels.h"
#include "net/deadline.h"
#include "net/frame_io.h"
#include "net/ready_set.h"
#include "net/socket.h"
#include "protocol/auth.h"
#include "protocol/plan.h"

namespace rs::client {

struct Link;  // client/round.h
struct Round;
class Schedule;      // client/schedule.h
class Recovery;      // client/recovery.h
class RecoveryHost;  // client/recovery_host.h

class Client {
 public:
  explicit Client(ClientOptions opts);  // connects and waits until the whole group is there
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Reduces `nbytes` at `data` in place across the group: wait(start(...)).
  void allreduce(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag = 0, Compression comp = Compression::None);

  // Starts reducing `nbytes` at `data` in place and returns at once, unless
  // max_rounds_in_flight rounds are unfinished: then it drives them until one finishes
  // (failing after `timeout` seconds without progress). Connects first if the session was
  // dropped by an error (stats().reconnects counts it). The memory must stay valid and
  // untouched until test() returned true or wait() returned. Every worker of the group must
  // start the same rounds (size, dtype, op, tag, compression) in the same order.
  // `comp` other than None sends the float32 buffer as 16-bit values (see the top of this
  // file); it needs dtype F32 and segments of whole, 4-byte aligned floats (else a Config error).
  RoundId start(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag = 0, Compression comp = Compression::None);
  // A scatter-gather round: the buffer is the concatenation of `segs` (sent with writev
  // straight from them, results received straight back into them).
  RoundId start(const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag = 0,
                Compression comp = Compression::None);
  // As start(), but returns false (starting nothing) instead of waiting when
  // max_rounds_in_flight rounds are unfinished, or at a rejoin check (docs/protocol.md section 6)
  // until every round in flight is done and the other workers have reached the check too (its
  // exchange round moves on at each call, without waiting). A rejoin, when the workers agree on
  // one, still connects a new session inside the call (blocking, up to connect_timeout).
  bool try_start(void* data, size_t nbytes, DType dtype, Op op, uint64_t tag, RoundId* out,
                 Compression comp = Compression::None);
  bool try_start(const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag, RoundId* out,
                 Compression comp = Compression::None);

  // Moves bytes of every round in flight without blocking; true once round `id` is done
  // (its result is in the buffer). Rethrows the round's error. After it returned true or
  // threw, the id is forgotten (asking again is a Config error).
  bool test(RoundId id);
  // Blocks until round `id` is done (or throws its error): every round in flight progresses.
  // Fails with a Timeout naming the reducers after `timeout` seconds without progress (time
  // in which no thread was inside start/test/wait does not count: rounds only move then).
  void wait(RoundId id);
  // Rounds started and not yet handed back (a released round waiting for its CLEARs is not counted).
  size_t in_flight() const;

  // With failover, starts a thread that, every `period_s` seconds in which no call drives this
  // client, passes over its links without waiting (client/idle.cc): a reducer's loss or its
  // ERROR Failover is read and the failover exchange joined while the caller is busy elsewhere.
  // A process with two clients of one job (the fusion engine's data and probe groups) needs it:
  // one of them may wait in an exchange for the other workers' idle client of the same group.
  // An error such a pass meets drops the session as a call would, and the next start() raises it.
  // Runs until close(); a second call only changes the period; nothing without failover.
  void progress_while_idle(double period_s);

  // Says goodbye to every reducer; rounds in flight fail. Idempotent; a later start() reconnects.
  // Returns within about a second whatever another thread is doing: a network wait under the
  // client's lock (a connect, a handshake, a failover exchange) ends with an error when close()
  // is called (client/idle.cc).
  void close();
  // True in a process forked from the one that made this client (client/idle.cc): its connections
  // are the parent's. Such a client never sends, shuts down, or waits for the parent's lock:
  // close() and the destructor leave the connections alone, every round method raises a Config
  // error, connected() is false.
  bool inherited() const { return inherited_.load(std::memory_order_relaxed); }
  bool connected() const;
  ClientStats stats() const;
  // What the oldest round owed results waits for, link by link with its TCP state, as a round that
  // made no progress for `seconds` reports it (describe_stall); "" with no round in flight.
  std::string stall_text(double seconds) const;
  const ClientOptions& options() const { return opts_; }

  // Any error fails every round in flight: the session is out of step with the group then,
  // so it is dropped (links at a frame boundary say goodbye) and the next start() reconnects.

 private:
  // Connects every link of the current reducer set (active_). With `lost` (failover) a reducer
  // that refuses the connection for `refused_after_s` seconds is reported there instead of
  // failing the call.
  void connect_all(std::vector<size_t>* lost = nullptr, double refused_after_s = 3.0);
  proto::Hello hello_for(int stream) const;
  std::string session_group() const;      // the group name of this reducer set
  void enqueue(Round* r);                 // plan and append to the session's rounds
  void settle(Round& r);                  // Done once its results are in and cleared
  void release_early(Round& r);           // a small round's results are in: back to the caller
  void recycle_copy(Round& r);            // its results' copy back to spare_copies_
  void finish_part(size_t li, Round& r);  // a link's share of a round is complete
  void apply_clear(size_t li, uint64_t upto);
  void disconnect(bool say_bye);
  using Lock = std::unique_lock<std::timed_mutex>;
  void reconnect();  // a fresh session from the state every worker can derive (client.cc)
  bool start_locked(Lock& lk, const iovec* segs, size_t nsegs, DType dtype, Op op, uint64_t tag, Compression comp,
                    bool may_wait, RoundId* out);
  // One non-blocking pass: moves bytes on every link that is ready (`ready`: a revents per link,
  // from wait_ready() or the recovery's poll; null: ask the epoll set here without waiting). True
  // if anything moved.
  bool pump(const pollfd* ready = nullptr, bool idle = false);  // idle: also with no round open (idle.cc)
  void poll_and_pump(std::vector<pollfd>* pfds, int ms);        // waits up to ms for a link (lock held), then pump()
  // pump()'s handlers, in the order a pass meets them:
  const pollfd* poll_links();            // which links can move bytes now (wait_ready, no wait)
  bool pump_link(size_t li, short rev);  // link li's turn: write, read, queue more
  net::IoResult write_link(size_t li, net::IoBudget* budget);
  void on_written(size_t li, uint64_t token);  // a frame is written: its staging slot is free
  net::Sink on_header(size_t li, const proto::FrameHeader& h, const std::string& err);  // where a payload goes
  bool on_frame(size_t li, const proto::FrameHeader& h);  // a complete ERROR, CLEAR or RESULT
  bool count_io(uint64_t sent, uint64_t got);             // stats and the no-progress timer
  void watch(std::vector<pollfd>* pfds);                  // fill every link, then the poll set (one per link)
  // watch(), the epoll set in step with the links, then a wait up to ms (unlocked with `lk`): waits.cc
  // (`events`: the caller's buffer for the set's answer)
  int wait_ready(std::vector<pollfd>* pfds, std::vector<epoll_event>* events, int ms, Lock* lk, bool* woke);
  void fill(size_t li);                               // queue the frames the window allows on link li (Schedule)
  bool copies_short() const;                          // no DONE may wait: a drain, or the pool of copies (nearly) full
  void drive(Lock& lk, RoundId id, bool until_slot);  // blocking progress
  void fail_all(ErrorKind kind, const std::string& why);
  bool collect(RoundId id);  // true (and forgets it) if done; rethrows its error
  void retire();             // drops finished rounds from the front of the session's
  // The oldest round owed results, no progress for `seconds`: each stuck link with its TCP state (stall.cc).
  std::string describe_stall(double seconds) const;
  void wake_waiters();
  void idle_loop(std::chrono::milliseconds period);  // the progress_while_idle thread's body (client/idle.cc)
  void idle_pass();                                  // one pass over the links with no call driving them (mu_ held)
  void stop_idle_thread();                           // ends and joins that thread (mu_ not held)
  // Waits under mu_ that other threads may end (client/idle.cc). enter(): mu_ for a call (or
  // close, or an accessor); when an idle pass holds it longer than the call's timeout (a network
  // wait of a failover it joined), the pass gives up and the call goes on. check_interrupt(): what
  // the network waits under mu_ call between slices (interrupt_): throws when close() runs, or
  // when the holder is an idle pass that a call waited `timeout` for.
  Lock enter() const;
  void check_interrupt() const;
  void refuse_inherited() const;  // throws Config in a forked child (inherited())

  ClientOptions opts_;
  std::vector<net::HostPort> addrs_;
  proto::Credential credential_;
  std::vector<std::unique_ptr<Link>> links_;  // reducer-major: links_[i * streams + s], i indexes active_
  std::vector<size_t> active_;                // reducers (indices into addrs_) of the current session
  RoundId id_next_ = 0;
  uint64_t seq_next_ = 0;  // Round::seq of the next user round: from 0 at every reconnect
  std::unordered_map<RoundId, std::unique_ptr<Round>> rounds_;  // started, not yet collected
  std::unique_ptr<Schedule> sched_;  // this session's rounds, in round order, and how they go on the links
  size_t open_ = 0;                  // rounds in the session not finished (user, repair, exchange)
  size_t running_ = 0;               // user rounds not finished (in the session or being repaired), not released
  size_t released_open_ = 0;         // user rounds released (release_early), not yet done: at most max_rounds_in_flight
  std::vector<std::vector<uint8_t>> spare_copies_;  // released rounds' result copies, for reuse
  std::vector<std::unique_ptr<Round>> internal_;    // repair and exchange rounds (freed when they retire)
  std::vector<Round*> parents_;                     // user rounds waiting for their repair rounds
  // Reducer failover and rejoin checks (client/recovery.h): it sees this client through a
  // RecoveryHost (client/recovery_host.h), which recovery_host() makes (client/host.cc).
  class Host;
  std::unique_ptr<RecoveryHost> recovery_host();
  std::unique_ptr<Recovery> recovery_;
  ErrorKind dropped_kind_ = ErrorKind::Internal;  // the error that last dropped the session (fail_all)
  std::string dropped_why_;
  net::ProgressTimer timer_;  // no progress while some thread drives the rounds
  bool force_dones_ =
      false;        // Recovery::drain(): every round must end, so no DONE waits in the kernel (Schedule::fill)
  struct Driving {  // scope of a start/test/wait call (with mu_ held at both ends)
    explicit Driving(Client* c);
    ~Driving();
    Client* c_;
  };
  int callers_ = 0;  // threads inside start/test/wait
  net::Clock::time_point idle_since_ = net::Clock::now();
  ClientStats stats_;
  net::Fd wake_;                     // eventfd: wakes threads blocked in wait()'s epoll_wait when state changes
  int pollers_ = 0;                  // threads inside that wait
  std::vector<pollfd> pfds_;         // pump()'s readiness check (reused)
  net::ReadySet ready_;              // the links' sockets and wake_, for the waits (client/waits.cc)
  std::vector<epoll_event> events_;  // poll_links()'s answer from it (reused; under mu_)
  uint64_t session_gen_ = 0;         // changes whenever links_ does
  mutable std::timed_mutex mu_;
  // progress_while_idle(): its thread, period and stop flag (under mu_), the eventfd that wakes it
  // (period changed, stop), and the error one of its passes met (the next start() raises it).
  // (No condition variable: a forked child must be able to destroy what the parent's thread waited on.)
  std::unique_ptr<std::thread> idle_thread_;
  net::Fd idle_wake_;
  std::chrono::milliseconds idle_period_{0};
  std::atomic<bool> idle_stop_{false};
  std::optional<Error> idle_error_;
  bool idle_driving_ = false;               // (under mu_) its holder is the idle thread, in a pass
  mutable std::atomic<int> entering_{0};    // calls waiting for mu_ (the idle thread lets them go first)
  mutable std::atomic<int> idle_yield_{0};  // calls that waited their timeout for an idle pass
  std::atomic<int> closing_{0};             // close() calls under way: every wait under mu_ ends
  net::Interrupt interrupt_;                // check_interrupt(), for the network waits under mu_
  std::atomic<bool> inherited_{false};      // this process is a fork of the one that made it
  struct ForkRegistration {                 // in the process-wide list the at-fork handlers mark
    explicit ForkRegistration(Client* c);
    ~ForkRegistration();
    static void prepare();  // pthread_atfork's handlers (client/idle.cc)
    static void parent();
    static void child();
    Client* c_;
  };
  ForkRegistration fork_reg_{this};  // (last: unlisted before any other member is destroyed)
};

}  // namespace rs::client
