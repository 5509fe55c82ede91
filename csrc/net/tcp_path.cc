#include "net/tcp_path.h"

// <linux/tcp.h>, not glibc's <netinet/tcp.h> (whose struct tcp_info stops before tcpi_min_rtt):
// the two cannot be included together, hence a file of its own.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

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
  if (len >= offsetof(struct tcp_info, tcpi_delivery_rate) + sizeof ti.tcpi_delivery_rate)
    p.rate_Bps = ti.tcpi_delivery_rate;
  if (p.min_rtt_us == ~uint32_t(0)) p.min_rtt_us = 0;  // "no sample yet"
  return p;
}

}  // namespace rs::net
