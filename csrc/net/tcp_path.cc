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
  // The round trip a window must cover: the smoothed one, but at most the minimum plus four mean
  // deviations. A jittery path's minimum is far below what most packets take (20 +- 10 ms each
  // way: a 20 ms minimum, 40-60 ms typical), while the smoothed round trip alone would count the
  // queue the window itself builds, and grow the window with it without end.
  const uint64_t var_bound = p.min_rtt_us + 4 * uint64_t(ti.tcpi_rttvar);
  p.rtt_us = p.min_rtt_us ? std::min<uint64_t>(ti.tcpi_rtt, var_bound) : 0;
  p.rtt_us = std::max(p.rtt_us, p.min_rtt_us);
  if (len >= offsetof(struct tcp_info, tcpi_delivery_rate) + sizeof ti.tcpi_delivery_rate)
    p.rate_Bps = ti.tcpi_delivery_rate;
  return p;
}

}  // namespace rs::net
