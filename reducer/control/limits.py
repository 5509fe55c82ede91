"""What the control port and the metrics port may take from a reducer process: pure Python policy.

- peer_key(): the key limits are counted under (an IPv4 address, or an IPv6 /64);
- PeerRateLimiter: a token bucket per peer key (requests per second, with a burst);
- ConnectionTable: open connections, capped in total and per peer; when full, a newcomer from a
  peer holding fewer connections than the heaviest one takes the place of that peer's least
  recently active connection (so a flood from a few addresses cannot lock out a health check);
- side_limits(): the caps of both ports from the descriptor limit, leaving the data plane every
  descriptor it may use (docs/security.md, "Control port and metrics port").

No sockets and no grpc here: reducer.control.front and reducer.control.http use these.
"""

from __future__ import annotations

import ipaddress
import logging
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reducer import config
from reducer.errors import ConfigError

Clock = Callable[[], float]

# Descriptors the process keeps for itself beside the data plane's connections: stdio, the
# interpreter's files, gRPC's and the event loops' epoll/eventfd/pipe descriptors, the listeners,
# log files and the /proc reads of the metrics (a served reducer with 8 threads holds 28-40).
RESERVE_FDS = 48
# Descriptors one control-port connection costs: the client's socket, the front's socket to the
# internal gRPC server and that server's end of it. A metrics connection costs one.
CONTROL_FDS_PER_CONNECTION = 3

DEFAULT_MAX_CONNECTIONS = 32  # per port
DEFAULT_MAX_CONNECTIONS_PER_PEER = 4
DEFAULT_RATE = 50.0  # requests per second per peer key, each port
MAX_TRACKED_PEERS = 4096  # rate-limiter buckets kept; the least recently used go first
BLOCK_S = 10.0  # a peer far over its request rate is cut off for this long


def peer_key(host: str) -> str:
    """The key a peer's limits are counted under: its IPv4 address, or the /64 of an IPv6 one
    (one host often owns a whole /64). IPv4-mapped IPv6 addresses count as IPv4; anything that
    is not an IP address (a Unix socket) is its own key."""
    text = host.strip().strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def grpc_peer_host(peer: str) -> tuple[str, int | None]:
    """grpc's context.peer() ("ipv4:10.0.0.1:5000", "ipv6:[::1]:5000", "unix:/x") -> (host, port)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, port = rest.rpartition(":")
        try:
            return host.strip("[]"), int(port)
        except ValueError:
            return host.strip("[]"), None
    return peer, None


class PeerRateLimiter:
    """A token bucket per peer key: `rate` requests per second, up to `burst` at once.

    rate 0 (or less) means no limit. A peer refused `block_after` times within one second
    (default twice the burst, at least 20) should be cut off for a while (should_block(); the
    fronts then close its connections and refuse new ones for BLOCK_S seconds: a refused request
    still costs the reducer a gRPC call or an HTTP parse, a refused connection almost nothing).
    At most `max_peers` buckets are kept; the least recently used is dropped first (it comes back
    full, which only helps a peer that was quiet).
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        max_peers: int = MAX_TRACKED_PEERS,
        clock: Clock = time.monotonic,
        block_after: int | None = None,
    ) -> None:
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(1.0, self.rate))
        self.block_after = int(block_after if block_after is not None else max(20, 2 * self.burst))
        self.max_peers = int(max_peers)
        self.clock = clock
        self.refused = 0
        # key -> [tokens, when, start of the refusal window, refusals in it]
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        """Take one token from `key`'s bucket; False (and counted) when it is empty."""
        if self.rate <= 0:
            return True
        now = self.clock()
        with self._lock:
            entry = self._buckets.pop(key, None) or [self.burst, now, now, 0.0]
            entry[0] = min(self.burst, entry[0] + max(0.0, now - entry[1]) * self.rate)
            entry[1] = now
            ok = entry[0] >= 1.0
            if ok:
                entry[0] -= 1.0
            else:
                self.refused += 1
                if now - entry[2] > 1.0:
                    entry[2], entry[3] = now, 0.0
                entry[3] += 1
            self._buckets[key] = entry
            while len(self._buckets) > self.max_peers:
                self._buckets.popitem(last=False)
            return ok

    def should_block(self, key: str) -> bool:
        """True once `key` was refused block_after times within a second (its count starts again)."""
        with self._lock:
            entry = self._buckets.get(key)
            if entry is None or entry[3] < self.block_after:
                return False
            entry[3] = 0.0
            return True


@dataclass
class _Entry:
    peer: str
    last_active: float


@dataclass(frozen=True)
class Admission:
    ok: bool
    conn_id: int = 0  # the new connection's id when ok
    evict: int | None = None  # a connection to close first, to make room
    why: str = ""  # why not, when refused


class ConnectionTable:
    """Open connections of one port: at most `max_total`, at most `max_per_peer` per peer key.

    admit() refuses a connection over its peer's cap. When the table is full, a newcomer whose
    peer holds fewer connections than the peer holding the most takes the place of that peer's
    least recently active connection (admit() names it in `evict` and frees its slot; the caller
    closes it); otherwise the newcomer is refused. Thread-safe.
    """

    def __init__(self, max_total: int, max_per_peer: int, clock: Clock = time.monotonic) -> None:
        if max_total < 1 or max_per_peer < 1:
            raise ValueError(f"connection caps must be >= 1, got {max_total} and {max_per_peer}")
        self.max_total = int(max_total)
        self.max_per_peer = int(max_per_peer)
        self.clock = clock
        self.refused = 0
        self.evicted = 0
        self._entries: dict[int, _Entry] = {}
        self._per_peer: dict[str, int] = {}
        self._next_id = 1
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def count(self, peer: str) -> int:
        return self._per_peer.get(peer, 0)

    def admit(self, peer: str) -> Admission:
        with self._lock:
            mine = self._per_peer.get(peer, 0)
            if mine >= self.max_per_peer:
                self.refused += 1
                return Admission(False, why=f"{mine} connections already open from {peer} (per-peer cap)")
            victim = None
            if len(self._entries) >= self.max_total:
                victim = self._victim(mine)
                if victim is None:
                    self.refused += 1
                    return Admission(False, why=f"{len(self._entries)} connections open (cap)")
                self._drop(victim)
                self.evicted += 1
            conn_id = self._next_id
            self._next_id += 1
            self._entries[conn_id] = _Entry(peer, self.clock())
            self._per_peer[peer] = mine + 1
            return Admission(True, conn_id, victim)

    def _victim(self, newcomer_count: int) -> int | None:
        heaviest = max(self._per_peer.items(), key=lambda kv: kv[1], default=("", 0))
        if heaviest[1] <= newcomer_count:
            return None
        ids = [i for i, e in self._entries.items() if e.peer == heaviest[0]]
        return min(ids, key=lambda i: self._entries[i].last_active)

    def touch(self, conn_id: int) -> None:
        """The connection did something (bytes arrived): it is evicted last."""
        entry = self._entries.get(conn_id)
        if entry is not None:
            entry.last_active = self.clock()

    def release(self, conn_id: int) -> None:
        with self._lock:
            self._drop(conn_id)

    def _drop(self, conn_id: int) -> None:
        entry = self._entries.pop(conn_id, None)
        if entry is None:
            return
        left = self._per_peer[entry.peer] - 1
        if left:
            self._per_peer[entry.peer] = left
        else:
            del self._per_peer[entry.peer]


@dataclass(frozen=True)
class SideLimits:
    """The caps of the control port and the metrics port (docs/configuration.md)."""

    control_connections: int = DEFAULT_MAX_CONNECTIONS
    metrics_connections: int = DEFAULT_MAX_CONNECTIONS
    per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    rate: float = DEFAULT_RATE  # requests per second per peer key (0 = no limit), each port
    budget_fds: int | None = None  # descriptors left to the two ports (None: not derived)


def side_limits(
    nofile: int | None,
    data_max_connections: int | None,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER,
    rate: float = DEFAULT_RATE,
) -> SideLimits:
    """The caps of both ports: at most `max_connections` each, and together within the descriptors
    the data plane cannot use: nofile - data_max_connections - RESERVE_FDS, two thirds of them for
    the control port (CONTROL_FDS_PER_CONNECTION each), a third for the metrics port. At least one
    connection each. Without a descriptor limit (None or unlimited) only `max_connections` applies."""
    if max_connections < 1 or per_peer < 1:
        raise ValueError(f"connection caps must be >= 1, got {max_connections} and {per_peer}")
    if rate < 0 or rate != rate:
        raise ValueError(f"the request rate must be >= 0, got {rate}")
    if nofile is None or data_max_connections is None:
        return SideLimits(max_connections, max_connections, per_peer, rate, None)
    budget = int(nofile) - int(data_max_connections) - RESERVE_FDS
    control = max(1, min(max_connections, (budget * 2 // 3) // CONTROL_FDS_PER_CONNECTION))
    metrics = max(1, min(max_connections, budget // 3))
    return SideLimits(control, metrics, per_peer, rate, budget)


def configured_limits(server: Any = None) -> SideLimits:
    """side_limits() from the settings (RS_CONTROL_MAX_CONNECTIONS, RS_CONTROL_MAX_CONNECTIONS_PER_PEER,
    RS_CONTROL_RATE), this process's descriptor limit and the data plane's max_connections of
    `server` (a started ReducerServer; without one, the descriptors are not counted)."""
    data_max = None
    if server is not None:
        try:
            data_max = int(server.limits()["max_connections"])
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError):
            data_max = None
    try:
        return side_limits(
            nofile_limit(),
            data_max,
            config.get("control_max_connections"),
            config.get("control_max_connections_per_peer"),
            config.get("control_rate"),
        )
    except ValueError as exc:
        raise ConfigError(f"control-plane limits: {exc}") from None


def nofile_limit() -> int | None:
    """The soft RLIMIT_NOFILE of this process (None when unlimited or unknown)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


class LogThrottle:
    """Logs a repeated event at most once per `every` seconds, with how many were not logged."""

    def __init__(self, logger: logging.Logger, every: float = 10.0, clock: Clock = time.monotonic) -> None:
        self.logger, self.every, self.clock = logger, every, clock
        self._next = 0.0
        self._quiet = 0
        self._lock = threading.Lock()

    def warning(self, fmt: str, *args: object) -> None:
        now = self.clock()
        with self._lock:
            if now < self._next:
                self._quiet += 1
                return
            quiet, self._quiet, self._next = self._quiet, 0, now + self.every
        suffix = f" ({quiet} more like it not logged in the last {self.every:g}s)" if quiet else ""
        self.logger.warning(fmt + suffix, *args)
