// The reducer node: accepts worker connections, reduces the chunks of every
// group it serves and streams the results back. Knows nothing of Python.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rs::server {

struct ServerOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 0;            // 0: any free port
  int threads = 0;              // event loops; 0: number of CPUs, at most 8
  std::string auth_token;       // empty: no authentication
  int window = 4;               // chunks in flight per group stream (memory bound, see docs/protocol.md)
  double handshake_timeout = 10.0;
  int socket_buffer = 4 << 20;
  uint64_t max_group_bytes = uint64_t(4) << 30;  // reduction buffers per group stream (a hello asking more is refused)
};

struct ServerStats {
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t rounds_completed = 0;
  uint64_t chunks_reduced = 0;
  uint64_t connections = 0;        // open data connections (after handshake)
  uint64_t connected_workers = 0;  // open stream-0 connections: one per worker process
  uint64_t groups = 0;             // live groups (job, group) with members
  uint64_t errors = 0;             // connections closed because of an error
  uint64_t rejected = 0;           // handshakes refused (auth, version, conflicts, garbage)
  uint64_t memory_bytes = 0;       // reduction buffers currently allocated
};

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();                    // binds and starts the event loops; throws Error(Config)
  uint16_t port() const;           // the bound port (valid after start)
  // Stop accepting, wait up to drain_timeout seconds for rounds in flight, then close everything.
  void stop(double drain_timeout = 0.0);
  bool running() const;
  ServerStats stats() const;

  struct Impl;  // opaque; public only so the event loops in server.cc can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace rs::server
