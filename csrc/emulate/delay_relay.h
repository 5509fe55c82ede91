// A userspace L2 relay that adds delay, jitter and loss between emulated hosts (the bench's
// switch namespace; this kernel has neither sch_netem nor sch_fq for earliest-departure-time
// delays). It forwards Ethernet frames among its interfaces like a learning bridge, each frame
// leaving delay +- jitter (uniform) after it arrived, in arrival order per output (no
// reordering: a frame never leaves before the one queued ahead of it), dropped with probability
// `loss`. Frames keep their GSO/checksum state (PACKET_VNET_HDR), so large TCP segments cross
// as one frame. Runs until the process is killed (or `run_for_s` > 0 has passed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rs::emulate {

struct RelayOptions {
  std::vector<std::string> ifaces;  // the switch's ports
  uint64_t delay_us = 0;
  uint64_t jitter_us = 0;  // at most delay_us
  double loss = 0;         // 0 <= loss < 1
  uint64_t seed = 1;
  double run_for_s = 0;  // 0: forever
};

// Throws rs::Error (Config) on bad options or when a port cannot be opened.
void run_delay_relay(const RelayOptions& o);

}  // namespace rs::emulate
