"""ReducerServer: a reducer node in this process (the C++ event loops run without the GIL)."""

from __future__ import annotations

import logging
import time
from typing import Any

from . import config
from ._native import core
from .addresses import connect_host, format_address
from .errors import ConfigError

log = logging.getLogger(__name__)


# Reducer settings passed to the core: rows of the settings table (csrc/common/settings.h), whose
# defaults are the ones the core's ServerOptions starts from (tests/config/test_reducer_settings.py).
_LIMITS = (
    "group_slots",
    "handshake_timeout",
    "group_timeout",
    "max_group_bytes",
    "max_memory_bytes",
    "max_connections",
    "max_connections_per_peer",
    "max_groups_per_peer",
    "max_memory_per_job",
    "max_memory_per_peer",
    "memory_idle_timeout",
)


class ReducerServer:
    """A reducer node.

    >>> with ReducerServer(port=0) as srv:
    ...     print(srv.port)

    host/port: where to listen (port 0 = any free port); threads: event-loop threads (default:
    CPUs, at most 8); auth_token: the shared secret workers must prove they know (HMAC-SHA256
    challenge-response, per-job keys; docs/security.md). integrity: frame integrity, 'off', 'on'
    (offered to workers that ask) or 'required' (workers that do not ask are refused); default
    RS_INTEGRITY, else on with an auth_token and off without; on/required need an auth_token. The limits (group_slots,
    handshake_timeout, group_timeout, max_group_bytes, max_memory_bytes, max_connections,
    max_connections_per_peer, max_groups_per_peer, and the memory shares max_memory_per_job,
    max_memory_per_peer and memory_idle_timeout) are described in docs/configuration.md; each
    defaults to its RS_* variable, else the settings table's default (config.SETTINGS, the C++ core's
    own). `limits()` reports those in force.
    """

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        threads: int | None = None,
        auth_token: str | None = None,
        socket_buffer: int | None = None,
        integrity: str | None = None,
        **limits: Any,
    ) -> None:
        unknown = set(limits) - set(_LIMITS)
        if unknown:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(unknown))}")
        self.host: str = config.get("host", host)
        port_value = config.get("port", port)
        self._requested_port: int = 0 if port_value is None else int(port_value)
        self.threads: int = int(config.get("threads", threads) or 0)
        if self.threads < 0:
            raise ConfigError(f"threads={self.threads} is not valid: at least 1 (0 or None: the default)")
        token = config.resolve_auth_token(auth_token)
        options: dict[str, Any] = {name: config.get(name, limits.get(name)) for name in _LIMITS}
        options["socket_buffer"] = config.get("socket_buffer", socket_buffer)
        options["integrity"] = config.reducer_integrity(integrity, token)
        self._server = core.Server(
            self.host,
            self._requested_port,
            self.threads,
            token or "",
            **{k: v for k, v in options.items() if v is not None},
        )
        self._started = False

    def start(self) -> ReducerServer:
        if not self._started:
            self._server.start()
            self._started = True
        return self

    @property
    def port(self) -> int:
        """The bound port (the real one when port=0 was asked for)."""
        return int(self._server.port) if self._started else self._requested_port

    @property
    def address(self) -> str:
        return format_address(connect_host(self.host), self.port)

    @property
    def running(self) -> bool:
        return bool(self._server.running)

    def stop(self, drain_timeout: float = 0.0) -> None:
        """Stop accepting, wait up to drain_timeout s for rounds in flight, close everything."""
        if self._started:
            self._server.stop(drain_timeout)
            self._started = False

    def drain(self, timeout: float) -> None:
        """Take no new group (a hello for an unknown group gets ShuttingDown) while the groups
        already here keep running; when they have all ended, or after `timeout` seconds, stop:
        rounds still in flight then get what is left of the timeout to finish, and the last
        groups' workers see the reducer go. Blocks; used by the Drain RPC and SIGTERM
        (docs/operations.md)."""
        if not self._started:
            return
        self._server.drain()
        deadline = time.monotonic() + max(0.0, float(timeout))
        while self._server.stats()["groups"] > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop(max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, Any]:
        """Counters (bytes_received, bytes_sent, rounds_completed, connected_workers, groups,
        handshakes, waiting, refused_over_limit, memory_bytes, ...) and the limits in force under
        "limits"."""
        out: dict[str, Any] = dict(self._server.stats())
        out["limits"] = self.limits()
        return out

    def limits(self) -> dict[str, Any]:
        """The limits in force (machine-dependent defaults are resolved once started)."""
        return dict(self._server.limits())

    def group_stats(self) -> list[dict[str, Any]]:
        """One row per group stream (live, and the last few that ended): job, group, stream,
        world_size, connected, complete, rounds, bytes_received, bytes_sent, last_error, age_s.
        Refreshed by the reducer every 250 ms."""
        return [dict(row) for row in self._server.group_stats()]

    def __enter__(self) -> ReducerServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        return f"ReducerServer({self.host}:{self.port}, {state})"
