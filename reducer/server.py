"""ReducerServer: a reducer node in this process (the C++ event loops run without the GIL)."""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from . import config
from ._native import core

log = logging.getLogger(__name__)


class ReducerServer:
    """A reducer node.

    >>> with ReducerServer(port=0) as srv:
    ...     print(srv.port)

    host/port: where to listen (port 0 = any free port); threads: event-loop
    threads (default: CPUs, at most 8); auth_token: shared secret that workers must
    prove they know (HMAC-SHA256 challenge-response); window: chunks in flight per
    group stream (memory per group stream = window x (world + 2) x chunk bytes);
    max_group_bytes: a group whose buffers would exceed this is refused (default 4 GiB).
    """

    def __init__(
        self,
        host: Optional[str] = None,
        port: Optional[int] = None,
        threads: Optional[int] = None,
        auth_token: Optional[str] = None,
        window: int = 4,
        handshake_timeout: float = 10.0,
        socket_buffer: Optional[int] = None,
        max_group_bytes: Optional[int] = None,
    ) -> None:
        self.host: str = config.get("host", host)
        port_value = config.get("port", port)
        self._requested_port: int = 0 if port_value is None else int(port_value)
        self.threads: int = int(config.get("threads", threads) or 0)
        token = config.resolve_auth_token(auth_token)
        self._server = core.Server(self.host, self._requested_port, self.threads, token or "", window,
                                   handshake_timeout, config.socket_buffer_arg(socket_buffer),
                                   int(config.get("max_group_bytes", max_group_bytes) or 0))
        self._started = False

    def start(self) -> "ReducerServer":
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
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def running(self) -> bool:
        return bool(self._server.running)

    def stop(self, drain_timeout: float = 0.0) -> None:
        """Stop accepting, wait up to drain_timeout s for rounds in flight, close everything."""
        if self._started:
            self._server.stop(drain_timeout)
            self._started = False

    def drain(self, timeout: float) -> None:
        """Stop accepting connections (no new group, no new worker), let the rounds in flight finish
        for up to `timeout` seconds, then close every connection. The core has no mode that keeps
        serving its groups while refusing new ones, so the groups end after their current round:
        their workers see the reducer gone. Blocks; used by the Drain RPC and SIGTERM
        (docs/operations.md)."""
        self.stop(timeout)

    def stats(self) -> Dict[str, Any]:
        """Counters: bytes_received, bytes_sent, rounds_completed, connected_workers, groups, ..."""
        return dict(self._server.stats())

    def __enter__(self) -> "ReducerServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        return f"ReducerServer({self.host}:{self.port}, {state})"
