// One event loop of the reducer (threading model: server.cc). The loop owns its connections
// and its groups' table, waits on epoll and dispatches each event to the part that handles it:
//   acceptor.h    accept, connection caps, back-off (loop 0 only)
//   session.h     the handshake (loop 0), then the hand-off to the loop that owns the group
//   membership.h  join, leave, failed and expired groups
//   data_path.h   data frames -> slots -> results
//   releases.h    DONE / CLEAR of failover groups
//   output.h      writing queues, replies and error frames
//   lingering.h   the graceful close after a last frame
//   stats.h       group_stats() snapshots
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "net/socket.h"
#include "server/acceptor.h"
#include "server/conn.h"
#include "server/data_path.h"
#include "server/group_table.h"
#include "server/lingering.h"
#include "server/membership.h"
#include "server/output.h"
#include "server/releases.h"
#include "server/server_impl.h"
#include "server/session.h"
#include "server/stats.h"

namespace rs::server {

struct Loop {
  Server::Impl* srv = nullptr;
  int index = 0;
  net::Fd ep;
  net::Fd ev;  // eventfd: wakes the loop (stop, inbox, snapshot requests)
  std::thread thread;
  std::atomic<bool> stop{false};
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::unique_ptr<GroupTable> table;

  Output out{*this};
  Acceptor acceptor{*this};
  Session session{*this};
  Membership members{*this};
  DataPath data{*this};
  Releases releases{*this};
  Lingering lingering{*this};
  GroupStatsBoard stats;

  Loop() = default;
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  void run();  // the thread's body: until `stop`, then every connection is closed
  void wake();
  void set_state(Conn* c, ConnState st);
  // Ends a connection (reap() closes it). `linger`: its last frame went out; shut it for
  // writing and drain its input for a while first (Conn::linger).
  void kill(Conn* c, const std::string& why, bool is_error, bool linger = false);
  // Joins the group here, or moves the connection to the loop that owns its group (true: `c`
  // is that loop's now and must not be touched).
  bool handoff(Conn* c);
  void close_conn(Conn* c);

 private:
  std::atomic<uint64_t>* counter_of(ConnState st);
  void on_event(const epoll_event& e);
  bool on_readable(Conn* c);  // false if the connection was handed off
  void on_internal_error(Conn* c, const std::exception& e);
  void reap();
  void sweep();
  void shutdown_all();
  void drain_inbox();

  std::vector<Conn*> dying_;
  std::mutex inbox_mu_;
  std::vector<std::unique_ptr<Conn>> inbox_;  // connections handed to this loop
};

}  // namespace rs::server
