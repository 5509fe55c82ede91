"""The control plane of a reducer: grpc.health.v1.Health and reduction_server.v1.Reducer on one port.

    plane = ControlPlane(server, lifecycle, host="0.0.0.0", port=2223, auth_token=token).start()
    ...
    plane.stop()

How it is served (docs/security.md, "Control port and metrics port"): a ControlFront accepts on
host:port within a connection cap (total and per peer address, derived from the descriptor limit
so the data plane keeps its descriptors) and splices each connection to a grpc.aio server on the
loopback interface (reducer.control.loop), which bounds streams per connection, message sizes,
idle and connection age. Every RPC, health checks included, takes a token from its peer
address's bucket (RESOURCE_EXHAUSTED when empty). With a shared secret, GetStats and Drain need
an HMAC proof (reducer.control.auth); without one, GetStats hides worker addresses and Drain is
refused unless allow_unauthenticated_drain.

Health service names (docs/operations.md, "Probes"):
- ``""`` and ``reduction_server.v1.Reducer``: SERVING while the data plane accepts groups,
  NOT_SERVING once it drains (SIGTERM or Drain) — the readiness probe;
- ``liveness``: SERVING while this process is healthy (the data plane runs, or was drained on
  purpose), NOT_SERVING when the data plane stopped without a drain — the liveness probe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from reducer import __version__, config
from reducer.addresses import connect_host, format_address
from reducer.errors import ConfigError

from . import import_grpc, loop
from .auth import NonceBook, check_drain, check_stats
from .front import ControlFront
from .lifecycle import DRAINED, SERVING, Lifecycle
from .limits import (
    ConnectionTable,
    LogThrottle,
    PeerRateLimiter,
    SideLimits,
    configured_limits,
    grpc_peer_host,
    peer_key,
)
from .rows import GroupRow, group_rows, redacted, split_stats

grpc = import_grpc()
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from . import reducer_pb2, reducer_pb2_grpc  # noqa: E402

log = logging.getLogger(__name__)

SERVICE = "reduction_server.v1.Reducer"
LIVENESS = "liveness"

STREAMS_PER_CONNECTION = 4  # concurrent RPCs on one connection
MAX_MESSAGE_BYTES = 16 << 10  # largest request (every request is a few dozen bytes)
IDLE_MS = 30_000  # a connection without RPCs is closed (GOAWAY) after this
AGE_MS = 600_000  # every connection is asked to go after 10 minutes...
AGE_GRACE_MS = 600_000  # ...and closed 10 minutes later (room for Drain --wait)
KEEPALIVE_MS = 20_000  # the server pings; a live client's acks keep the front's idle timer off
HANDSHAKE_MS = 10_000  # to send the HTTP/2 preface and settings
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def grpc_options(limits: SideLimits) -> list[tuple[str, Any]]:
    """The internal gRPC server's options. It listens on the loopback interface only, behind the
    front; its own connection cap (twice the front's, so that connections the front has just
    closed never crowd out new ones) bounds what a local process connecting to it directly takes."""
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", 2 * limits.control_connections + 4),
        ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_connection_idle_ms", IDLE_MS),
        ("grpc.max_connection_age_ms", AGE_MS),
        ("grpc.max_connection_age_grace_ms", AGE_GRACE_MS),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_MS // 2),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_MS),
    ]


def group_messages(rows: list[Mapping[str, Any]], hide_addresses: bool = False) -> list[Any]:
    """ReducerServer.group_stats() rows (one per group stream) -> GroupStats messages (one per group)."""
    folded = group_rows(rows)
    return [group_message(r) for r in (redacted(folded) if hide_addresses else folded)]


def group_message(row: GroupRow) -> Any:
    return reducer_pb2.GroupStats(**row.as_dict())


@dataclass(frozen=True)
class Addresses:
    """A reducer's addresses as GetStats reports them (reducer.proto: data_address, data_address_from,
    control_address)."""

    data: str
    data_from: str = "listen"  # "advertise", "cluster" or "listen"
    control: str = ""


def stats_response(
    server: Any, lifecycle: Lifecycle, addresses: Addresses, auth_required: bool, hide_addresses: bool = False
) -> Any:
    """GetStatsResponse for a ReducerServer (its counters, whatever keys it has, and its groups)."""
    ints, floats, strings = split_stats(server.stats())
    return reducer_pb2.GetStatsResponse(
        state=lifecycle.state,
        counters=ints,
        values=floats,
        info=strings,
        groups=group_messages(server.group_stats(), hide_addresses),
        data_address=addresses.data,
        uptime_s=lifecycle.uptime_s,
        version=__version__,
        auth_required=auth_required,
        data_address_from=addresses.data_from,
        control_address=addresses.control,
    )


class RequestGate:
    """The per-peer request rate of the control port: every RPC takes one token of its peer's bucket."""

    def __init__(self, rate: float) -> None:
        self.limiter = PeerRateLimiter(rate)
        self.front: ControlFront | None = None
        self._log = LogThrottle(log)

    def peer(self, context: Any) -> str:
        raw = context.peer() or ""
        if self.front is not None:
            return self.front.real_peer(raw)
        return peer_key(grpc_peer_host(raw)[0])

    async def admit(self, context: Any) -> str:
        """The caller's peer key; aborts the RPC with RESOURCE_EXHAUSTED when its bucket is empty."""
        key = self.peer(context)
        if not self.limiter.allow(key):
            if self.front is not None and self.limiter.should_block(key):
                self.front.block(key)
            self._log.warning("control port: too many requests from %s (at most %g per second)", key, self.limiter.rate)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many requests from {key}: at most {self.limiter.rate:g} per second "
                "(RS_CONTROL_RATE); try again shortly",
            )
        return key


class HealthService(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health (Check, List, Watch) over a plain dict any thread may set."""

    def __init__(self, gate: RequestGate) -> None:
        self.gate = gate
        self.statuses: dict[str, int] = {"": _SERVING}

    def set(self, service: str, status: int) -> None:
        self.statuses[service] = status

    async def Check(self, request: Any, context: Any) -> Any:
        await self.gate.admit(context)
        status = self.statuses.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def List(self, request: Any, context: Any) -> Any:
        await self.gate.admit(context)
        return health_pb2.HealthListResponse(
            statuses={k: health_pb2.HealthCheckResponse(status=v) for k, v in dict(self.statuses).items()}
        )

    async def Watch(self, request: Any, context: Any) -> Any:
        await self.gate.admit(context)
        last = None
        while True:
            status = self.statuses.get(request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await asyncio.sleep(0.5)


class ReducerService(reducer_pb2_grpc.ReducerServicer):
    def __init__(
        self,
        server: Any,
        lifecycle: Lifecycle,
        auth_token: str | None,
        gate: RequestGate,
        allow_unauthenticated_drain: bool = False,
        advertise: tuple[str, str] | None = None,
    ) -> None:
        self.server = server
        self.lifecycle = lifecycle
        # Kept: a drained server no longer knows its bound port. The control address is set once bound.
        self.addresses = Addresses(*advertise) if advertise else Addresses(server.address)
        self.token = auth_token or None
        self.nonces = NonceBook()
        self.gate = gate
        self.allow_unauthenticated_drain = bool(allow_unauthenticated_drain)

    async def GetStats(self, request: Any, context: Any) -> Any:
        peer = await self.gate.admit(context)
        refused = check_stats(self.token, self.nonces, request.nonce, request.mac)
        if refused is not None:
            log.debug("refused GetStats from %s: %s", peer, refused)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        return stats_response(
            self.server, self.lifecycle, self.addresses, self.token is not None, hide_addresses=self.token is None
        )

    async def Challenge(self, request: Any, context: Any) -> Any:
        await self.gate.admit(context)
        return reducer_pb2.ChallengeResponse(nonce=self.nonces.issue(), auth_required=self.token is not None)

    async def Drain(self, request: Any, context: Any) -> Any:
        peer = await self.gate.admit(context)
        timeout_s = request.timeout_s
        try:
            config.check_seconds(timeout_s, "timeout_s", zero=True)
        except ConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        refused = check_drain(self.token, self.nonces, request.nonce, request.mac, timeout_s)
        if refused is not None:
            log.warning("refused Drain from %s: %s", peer, refused)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        if self.token is None and not self.allow_unauthenticated_drain:
            log.warning("refused Drain from %s: no shared secret and no --allow-unauthenticated-drain", peer)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "this reducer has no shared secret, so it takes Drain from nobody: give it one "
                "(--auth-token-file, RS_AUTH_TOKEN) or start it with --allow-unauthenticated-drain "
                "(RS_ALLOW_UNAUTHENTICATED_DRAIN=1); SIGTERM drains it too",
            )
        started = self.lifecycle.drain(timeout_s, reason=f"Drain RPC from {peer}")
        if request.wait:
            while not self.lifecycle.wait(0):
                await asyncio.sleep(0.25)  # a caller that gives up cancels this coroutine
        return reducer_pb2.DrainResponse(state=self.lifecycle.state, already_draining=not started)


class ControlPlane:
    """The control plane of one reducer: health + Reducer service on host:port (0 = any free port).

    limits: the caps (default: from the settings and the descriptor limit, see
    reducer.control.limits.configured_limits); allow_unauthenticated_drain: default
    RS_ALLOW_UNAUTHENTICATED_DRAIN, else False; advertise: (data address, where it comes from:
    "advertise" or "cluster") that GetStats reports instead of the server's own address.
    """

    def __init__(
        self,
        server: Any,
        lifecycle: Lifecycle,
        host: str = "0.0.0.0",
        port: int = 0,
        auth_token: str | None = None,
        limits: SideLimits | None = None,
        allow_unauthenticated_drain: bool | None = None,
        advertise: tuple[str, str] | None = None,
    ) -> None:
        self.server = server
        self.lifecycle = lifecycle
        self.host = host
        self._requested_port = int(port)
        self.limits = limits if limits is not None else configured_limits(server)
        self.gate = RequestGate(self.limits.rate)
        self.health = HealthService(self.gate)
        allow = config.get("allow_unauthenticated_drain", allow_unauthenticated_drain)
        self.service = ReducerService(server, lifecycle, auth_token, self.gate, allow, advertise)
        self.front: ControlFront | None = None
        self._grpc: Any = None

    def start(self) -> ControlPlane:
        """Bind and serve; raises OSError if the port cannot be bound."""
        table = ConnectionTable(self.limits.control_connections, self.limits.per_peer)
        front = ControlFront(self.host, self._requested_port, table, ("127.0.0.1", 0))
        try:
            self._grpc, upstream = loop.run(self._start_grpc())
        except BaseException:
            front.stop()
            raise
        front.upstream = upstream
        self.front = front
        self.gate.front = front
        front.start()
        self.service.addresses = replace(self.service.addresses, control=self.address)
        self.lifecycle.subscribe(self._on_state)
        return self

    async def _start_grpc(self) -> tuple[Any, tuple[str, int]]:
        server = grpc.aio.server(
            options=grpc_options(self.limits),
            maximum_concurrent_rpcs=self.limits.control_connections * STREAMS_PER_CONNECTION + 4,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reducer_pb2_grpc.add_ReducerServicer_to_server(self.service, server)
        for host in ("127.0.0.1", "::1"):
            try:
                port = server.add_insecure_port(f"[{host}]:0" if ":" in host else f"{host}:0")
            except RuntimeError:
                continue
            if port:
                await server.start()
                return server, (host, port)
        raise OSError("the control plane cannot listen on the loopback interface (127.0.0.1 or ::1)")

    @property
    def port(self) -> int:
        return self.front.port if self.front is not None else 0

    @property
    def address(self) -> str:
        return format_address(connect_host(self.host), self.port)

    def refresh(self) -> None:
        """Liveness: NOT_SERVING if the data plane stopped without a drain (call now and then)."""
        alive = self.server.running or self.lifecycle.state != SERVING
        self.health.set(LIVENESS, _SERVING if alive else _NOT_SERVING)

    def _on_state(self, state: str) -> None:
        ready = _SERVING if state == SERVING else _NOT_SERVING
        for name in ("", SERVICE):
            self.health.set(name, ready)
        self.refresh()
        if state == DRAINED:
            log.info("data plane drained; the control plane answers NOT_SERVING until the process ends")

    def stop(self, grace: float = 1.0) -> None:
        if self.front is not None:
            self.front.stop()
            self.front = None
        if self._grpc is not None:
            try:
                loop.run(self._grpc.stop(grace), timeout=grace + 5.0)
            except Exception:  # stopping anyway; say why
                log.exception("stopping the control plane's gRPC server failed")
            self._grpc = None
