// What TCP has measured of a connection (TCP_INFO): the round trip without queueing, which the
// worker client sizes its windows from (protocol/plan.h path_window), and the state that says why a
// connection stopped moving (a stalled round's message and warning).
#pragma once

#include <cstdint>
#include <string>

namespace rs::net {

struct TcpPath {
  uint64_t min_rtt_us = 0;  // tcpi_min_rtt (0: unknown)
  uint64_t rtt_us = 0;      // the round trip a window covers: tcpi_min_rtt (0: unknown); see tcp_path.cc
  // Why bytes do not move (all 0 when `known` is false: the socket is closed or not TCP).
  bool known = false;
  uint32_t unacked = 0;        // tcpi_unacked: segments sent and not acknowledged
  uint32_t retrans = 0;        // tcpi_retrans: of those, retransmitted
  uint32_t total_retrans = 0;  // tcpi_total_retrans: retransmitted segments over the connection's life
  uint32_t backoff = 0;        // tcpi_backoff: retransmission (or zero-window probe) timeouts in a row
  uint64_t rto_us = 0;         // tcpi_rto: the retransmission timeout, backoff included
  uint64_t srtt_us = 0;        // tcpi_rtt: the smoothed round trip
  uint32_t cwnd = 0;           // tcpi_snd_cwnd, segments
  uint64_t last_send_ms = 0;   // tcpi_last_data_sent: since data (a retransmission too) last left
  uint64_t notsent_bytes = 0;  // tcpi_notsent_bytes: written by the client, not sent yet
  bool snd_wnd_known = false;  // the kernel reports tcpi_snd_wnd (Linux 6.2+)
  uint64_t snd_wnd = 0;        // tcpi_snd_wnd: the peer's advertised receive window, bytes
};

// Reads TCP_INFO of socket `fd`; zeros when it cannot (closed, not TCP, an old kernel).
TcpPath tcp_path(int fd);

// One line for a link that made no progress: "tcp: unacked 12 segs, retrans 3 (total 41), backoff 6,
// rto 12.8 s, rtt 45 ms, cwnd 1, last send 9.1 s ago: <reading>", the reading where the state is
// plain (retransmission backoff, the peer's zero window, nothing unacked: waiting on the peer).
// `peer` names the other end in the reading ("the reducer").
std::string tcp_stall_text(const TcpPath& t, const std::string& peer);

// "0.05 ms", "45 ms", "12.8 s": a duration in microseconds for log lines and messages.
std::string duration_text(uint64_t us);

}  // namespace rs::net
