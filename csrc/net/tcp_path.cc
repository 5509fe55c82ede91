#include "net/tcp_path.h"

// <linux/tcp.h>, not glibc's <netinet/tcp.h> (whose struct tcp_info stops before tcpi_min_rtt):
// the two cannot be included together, hence a file of its own.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace rs::net {

// True if the kernel filled field `f` of `ti` (`len` bytes of it): an older kernel fills less.
#define RS_TCPI_HAS(f) (len >= offsetof(struct tcp_info, f) + sizeof ti.f)

TcpPath tcp_path(int fd) {
  TcpPath p;
  struct tcp_info ti;
  std::memset(&ti, 0, sizeof ti);
  socklen_t len = sizeof ti;
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return p;
  if (RS_TCPI_HAS(tcpi_min_rtt)) p.min_rtt_us = ti.tcpi_min_rtt;
  if (p.min_rtt_us == ~uint32_t(0)) p.min_rtt_us = 0;  // "no sample yet"
  // The round trip a window must cover: the path's minimum, never the smoothed one. A queue on the
  // path (the window's own, or other flows': W senders into one reducer's link) raises the smoothed
  // round trip, and a window sized from it grows with the queue it fills: 16 workers x 16 reducers
  // on 50 Mbit/s links fell from 97% of the link bound to 76% that way. Jitter is covered by the
  // headroom (protocol/plan.h kPathHeadroom), not by the round trip.
  p.rtt_us = p.min_rtt_us;
  // The stall state (tcpi_total_retrans and all before it are in every kernel this builds on).
  p.known = true;
  p.unacked = ti.tcpi_unacked;
  p.retrans = ti.tcpi_retrans;
  p.total_retrans = ti.tcpi_total_retrans;
  p.backoff = ti.tcpi_backoff;
  p.rto_us = ti.tcpi_rto;
  p.srtt_us = ti.tcpi_rtt;
  p.cwnd = ti.tcpi_snd_cwnd;
  p.last_send_ms = ti.tcpi_last_data_sent;
  if (RS_TCPI_HAS(tcpi_notsent_bytes)) p.notsent_bytes = ti.tcpi_notsent_bytes;
  if (RS_TCPI_HAS(tcpi_snd_wnd)) {
    p.snd_wnd_known = true;
    p.snd_wnd = ti.tcpi_snd_wnd;
  }
  return p;
}

#undef RS_TCPI_HAS

std::string duration_text(uint64_t us) {
  char buf[32];
  if (us >= 1000000) std::snprintf(buf, sizeof buf, "%.1f s", double(us) / 1e6);
  else if (us >= 10000) std::snprintf(buf, sizeof buf, "%.0f ms", double(us) / 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f ms", double(us) / 1e3);
  return buf;
}

namespace {

// What the state plainly says, or "". The peer's window first: a zero window backs off its probes
// too. Without tcpi_snd_wnd: bytes wait to be sent while nothing is in flight, which only the
// peer's window holds back (the congestion window never drops below one segment).
std::string reading(const TcpPath& t, const std::string& peer) {
  const bool zero_window = t.snd_wnd_known ? t.snd_wnd == 0 : (t.unacked == 0 && t.notsent_bytes > 0);
  if (zero_window) return "the peer's receive window is zero: " + peer + " is not reading";
  if (t.unacked > 0 && t.backoff > 0) {
    const uint64_t since_us = t.last_send_ms * 1000;
    const uint64_t retry_us = t.rto_us > since_us ? t.rto_us - since_us : 0;
    return "retransmission backoff: the path dropped packets; TCP will retry in ~" + duration_text(retry_us);
  }
  if (t.unacked == 0 && t.notsent_bytes == 0) return "nothing unacked: waiting on " + peer;
  return "";
}

}  // namespace

std::string tcp_stall_text(const TcpPath& t, const std::string& peer) {
  if (!t.known) return "tcp: no state (the connection is closed)";
  std::string s = "tcp: unacked " + std::to_string(t.unacked) + " segs, retrans " + std::to_string(t.retrans) +
                  " (total " + std::to_string(t.total_retrans) + "), backoff " + std::to_string(t.backoff) + ", rto " +
                  duration_text(t.rto_us) + ", rtt " + duration_text(t.srtt_us) + ", cwnd " + std::to_string(t.cwnd);
  if (t.snd_wnd_known) s += ", peer window " + std::to_string(t.snd_wnd) + " B";
  if (t.notsent_bytes) s += ", unsent " + std::to_string(t.notsent_bytes) + " B";
  s += ", last send " + duration_text(t.last_send_ms * 1000) + " ago";
  const std::string why = reading(t, peer);
  return why.empty() ? s : s + ": " + why;
}

}  // namespace rs::net
