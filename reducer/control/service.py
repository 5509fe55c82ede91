"""The control plane of a reducer: grpc.health.v1.Health and reduction_server.v1.Reducer on one port.

    plane = ControlPlane(server, lifecycle, host="0.0.0.0", port=2223, auth_token=token).start()
    ...
    plane.stop()

Health service names (docs/operations.md, "Probes"):
- ``""`` and ``reduction_server.v1.Reducer``: SERVING while the data plane accepts groups,
  NOT_SERVING once it drains (SIGTERM or Drain) — the readiness probe;
- ``liveness``: SERVING while this process is healthy (the data plane runs, or was drained on
  purpose), NOT_SERVING when the data plane stopped without a drain — the liveness probe.
"""
from __future__ import annotations

import logging
from concurrent import futures
from typing import Any, List, Mapping, Optional

from . import import_grpc
from .auth import NonceBook, check_drain
from .lifecycle import DRAINED, SERVING, Lifecycle
from .rows import GroupRow, group_rows, split_stats

grpc = import_grpc()
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402

from . import reducer_pb2, reducer_pb2_grpc  # noqa: E402

log = logging.getLogger(__name__)

SERVICE = "reduction_server.v1.Reducer"
LIVENESS = "liveness"


def group_messages(rows: List[Mapping[str, Any]]) -> List[Any]:
    """ReducerServer.group_stats() rows (one per group stream) -> GroupStats messages (one per group)."""
    return [group_message(r) for r in group_rows(rows)]


def group_message(row: GroupRow) -> Any:
    return reducer_pb2.GroupStats(**row.as_dict())


def stats_response(server: Any, lifecycle: Lifecycle, data_address: str, auth_required: bool) -> Any:
    """GetStatsResponse for a ReducerServer (its counters, whatever keys it has, and its groups)."""
    from reducer import __version__

    ints, floats, strings = split_stats(server.stats())
    return reducer_pb2.GetStatsResponse(
        state=lifecycle.state, counters=ints, values=floats, info=strings,
        groups=group_messages(server.group_stats()), data_address=data_address,
        uptime_s=lifecycle.uptime_s, version=__version__, auth_required=auth_required)


class ReducerService(reducer_pb2_grpc.ReducerServicer):
    def __init__(self, server: Any, lifecycle: Lifecycle, auth_token: Optional[str]) -> None:
        self.server = server
        self.lifecycle = lifecycle
        self.data_address = server.address   # kept: a drained server no longer knows its bound port
        self.token = auth_token or None
        self.nonces = NonceBook()

    def GetStats(self, request: Any, context: Any) -> Any:
        return stats_response(self.server, self.lifecycle, self.data_address, self.token is not None)

    def Challenge(self, request: Any, context: Any) -> Any:
        return reducer_pb2.ChallengeResponse(nonce=self.nonces.issue(), auth_required=self.token is not None)

    def Drain(self, request: Any, context: Any) -> Any:
        refused = check_drain(self.token, self.nonces, request.nonce, request.mac, request.timeout_s)
        if refused is not None:
            log.warning("refused Drain from %s: %s", context.peer(), refused)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        if request.timeout_s < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"timeout_s must be >= 0, got {request.timeout_s}")
        started = self.lifecycle.drain(request.timeout_s, reason=f"Drain RPC from {context.peer()}")
        if request.wait:
            while not self.lifecycle.wait(0.5):
                if not context.is_active():   # the caller gave up (deadline or cancel)
                    break
        return reducer_pb2.DrainResponse(state=self.lifecycle.state, already_draining=not started)


class ControlPlane:
    """The gRPC server of one reducer: health + Reducer service, bound to host:port (0 = any free)."""

    def __init__(self, server: Any, lifecycle: Lifecycle, host: str = "0.0.0.0", port: int = 0,
                 auth_token: Optional[str] = None, threads: int = 4) -> None:
        self.server = server
        self.lifecycle = lifecycle
        self.host = host
        self._requested_port = int(port)
        self._port = 0
        self.health = health.HealthServicer()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rs-control"),
                                 options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc)
        reducer_pb2_grpc.add_ReducerServicer_to_server(ReducerService(server, lifecycle, auth_token), self._grpc)
        self._started = False

    def start(self) -> "ControlPlane":
        """Bind and serve; raises OSError if the port cannot be bound."""
        from reducer.addresses import format_address

        try:
            self._port = self._grpc.add_insecure_port(format_address(self.host, self._requested_port))
        except RuntimeError as exc:   # grpcio reports a failed bind as RuntimeError
            raise OSError(f"cannot listen on {format_address(self.host, self._requested_port)}: {exc}") from None
        self._grpc.start()
        self._started = True
        self.lifecycle.subscribe(self._on_state)
        return self

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        from reducer.addresses import connect_host, format_address

        host = connect_host(self.host)
        return format_address(host, self._port)

    def refresh(self) -> None:
        """Liveness: NOT_SERVING if the data plane stopped without a drain (call now and then)."""
        alive = self.server.running or self.lifecycle.state != SERVING
        status = health_pb2.HealthCheckResponse
        self.health.set(LIVENESS, status.SERVING if alive else status.NOT_SERVING)

    def _on_state(self, state: str) -> None:
        status = health_pb2.HealthCheckResponse
        ready = status.SERVING if state == SERVING else status.NOT_SERVING
        for name in ("", SERVICE):
            self.health.set(name, ready)
        self.refresh()
        if state == DRAINED:
            log.info("data plane drained; the control plane answers NOT_SERVING until the process ends")

    def stop(self, grace: float = 1.0) -> None:
        if self._started:
            self._grpc.stop(grace).wait(grace + 1.0)
            self._started = False
