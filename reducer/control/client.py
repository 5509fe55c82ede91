"""ControlClient: talks to one reducer's control plane (health, GetStats, Drain).

    with ControlClient("10.0.0.3:2223") as c:
        c.health()            # "SERVING" / "NOT_SERVING"
        c.get_stats()         # dict: state, counters, values, info, groups, ...
        c.drain(timeout_s=30, wait=True, token=secret)

A reducer with a shared secret wants it proven for GetStats and Drain (a Challenge nonce and an
HMAC, reducer.control.auth): pass `token` to the client or to the call.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import MessageToDict

from . import import_grpc
from .auth import drain_mac, stats_mac
from .lifecycle import DRAINED

grpc = import_grpc()
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from . import reducer_pb2, reducer_pb2_grpc  # noqa: E402
from .service import SERVICE  # noqa: E402


class ControlError(RuntimeError):
    """An RPC to a control plane failed; `code` is the grpc.StatusCode."""

    def __init__(self, address: str, rpc: str, code: Any, detail: str) -> None:
        super().__init__(f"{address}: {rpc} failed: {code.name if code else 'error'}: {detail}")
        self.address = address
        self.code = code
        self.detail = detail


class ControlClient:
    def __init__(self, address: str, timeout: float = 5.0, token: str | None = None) -> None:
        self.address = address
        self.timeout = float(timeout)
        self.token = token or None
        self._channel = grpc.insecure_channel(address)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._reducer = reducer_pb2_grpc.ReducerStub(self._channel)

    def _call(self, rpc: str, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            raise ControlError(self.address, rpc, exc.code(), exc.details() or "") from None

    def health(self, service: str = "") -> str:
        """The health status name of `service` ("" = the reducer as a whole; "liveness")."""
        reply = self._call("Health.Check", self._health.Check, health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def _nonce(self) -> bytes:
        return self._call("Challenge", self._reducer.Challenge, reducer_pb2.ChallengeRequest()).nonce

    def get_stats(self, token: str | None = None) -> dict[str, Any]:
        """GetStatsResponse as a dict (proto field names; integers stay integers). With a token (this
        call's, else the client's), proves it; a reducer that has one refuses without (UNAUTHENTICATED)."""
        token = token or self.token
        request = reducer_pb2.GetStatsRequest()
        if token:
            nonce = self._nonce()
            request = reducer_pb2.GetStatsRequest(nonce=nonce, mac=stats_mac(token, nonce))
        reply = self._call("GetStats", self._reducer.GetStats, request)
        out = MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        # JSON mapping writes uint64 as strings; give the numbers back.
        out["counters"] = {k: int(v) for k, v in reply.counters.items()}
        out["groups"] = [
            dict(g, rounds=int(g["rounds"]), bytes_received=int(g["bytes_received"]), bytes_sent=int(g["bytes_sent"]))
            for g in out["groups"]
        ]
        return out

    def drain(
        self, timeout_s: float = 0.0, wait: bool = False, token: str | None = None, rpc_timeout: float | None = None
    ) -> dict[str, Any]:
        """Ask the reducer to drain (timeout_s 0 = its own --drain-timeout). With a token (this call's,
        else the client's), proves it with the Challenge nonce; without, a reducer that has a token
        refuses (UNAUTHENTICATED), one without refuses unless it allows unauthenticated drains
        (PERMISSION_DENIED)."""
        token = token or self.token
        nonce = mac = b""
        if token:
            nonce = self._nonce()
            mac = drain_mac(token, nonce, timeout_s)
        if rpc_timeout is None:
            rpc_timeout = self.timeout + (timeout_s + 30.0 if wait else 0.0)
        reply = self._call(
            "Drain",
            self._reducer.Drain,
            reducer_pb2.DrainRequest(timeout_s=timeout_s, wait=wait, nonce=nonce, mac=mac),
            timeout=rpc_timeout,
        )
        return {"state": reply.state, "already_draining": reply.already_draining, "drained": reply.state == DRAINED}

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["ControlClient", "ControlError", "SERVICE"]
