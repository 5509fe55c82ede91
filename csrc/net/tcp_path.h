// What TCP has measured of a connection's path (TCP_INFO): the round trip without queueing and
// the delivery rate, which the worker client sizes its windows from (protocol/plan.h path_window).
#pragma once

#include <cstdint>

namespace rs::net {

struct TcpPath {
  uint64_t min_rtt_us = 0;  // tcpi_min_rtt (0: unknown)
  uint64_t rtt_us = 0;      // the round trip a window covers: tcpi_min_rtt (0: unknown); see tcp_path.cc
  uint64_t rate_Bps = 0;    // tcpi_delivery_rate, bytes per second (0: unknown, nothing delivered yet)
};

// Reads TCP_INFO of socket `fd`; zeros when it cannot (not TCP, an old kernel).
TcpPath tcp_path(int fd);

}  // namespace rs::net
