#include "net/tcp_path.h"

// <linux/tcp.h>, not glibc's <netinet/tcp.h> (whose struct tcp_info stops before tcpi_min_rtt):
// the two cannot be included together, hence a file of its own.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace rs::net {

TcpPath tcp_path(int fd) {
  TcpPath p;
  struct tcp_info ti;
  std::memset(&ti, 0, sizeof ti);
  socklen_t len = sizeof ti;
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return p;
  // An older kernel fills less: only the fields it returned count.
  if (len >= offsetof(struct tcp_info, tcpi_min_rtt) + sizeof ti.tcpi_min_rtt) p.min_rtt_us = ti.tcpi_min_rtt;
  if (p.min_rtt_us == ~uint32_t(0)) p.min_rtt_us = 0;  // "no sample yet"
  // The round trip a window must cover: the path's minimum, never the smoothed one. A queue on the
  // path (the window's own, or other flows': W senders into one reducer's link) raises the smoothed
  // round trip, and a window sized from it grows with the queue it fills: 16 workers x 16 reducers
  // on 50 Mbit/s links fell from 97% of the link bound to 76% that way. Jitter is covered by the
  // headroom (protocol/plan.h kPathHeadroom), not by the round trip.
  p.rtt_us = p.min_rtt_us;
  if (len >= offsetof(struct tcp_info, tcpi_delivery_rate) + sizeof ti.tcpi_delivery_rate)
    p.rate_Bps = ti.tcpi_delivery_rate;
  return p;
}

}  // namespace rs::net
