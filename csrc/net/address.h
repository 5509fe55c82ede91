// "host:port" text: the one parser of the worker client, the ring, the NCCL plugin and the Python
// library (reducer.addresses.parse_address calls it through reducer._core.parse_address).
#pragma once

#include <string>

#include "net/socket.h"

namespace rs::net {

// "host:port", "1.2.3.4:5", "[::1]:5", "[fe80::1%eth0]:5" (surrounding whitespace ignored; the host
// comes back without brackets). Throws Error(Config) on anything else, with the message
// reducer.addresses has always given (values quoted as Python's repr writes them): no port, no
// host, whitespace inside, '[' without ']', an unbracketed IPv6 address, a bracketed host that is
// not IPv6, a port that is not ASCII digits or not 1-65535.
HostPort parse_host_port(const std::string& text);

}  // namespace rs::net
