"""ReducerServer: a reducer node in this process (the C++ event loops run without the GIL), and
where a served node listens (resolve_listen: the flags, RS_HOST / RS_PORT, the cluster description;
docs/deploy.md, "serve")."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import cluster, config
from ._native import core
from .addresses import DEFAULT_PORT, check_port, connect_host, format_address
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


# -- where a served node listens -----------------------------------------------------------------

DEFAULT_DRAIN_TIMEOUT: float = config.SETTINGS["drain_timeout"].default  # RS_DRAIN_TIMEOUT's default
DEFAULT_STATS_INTERVAL: float = config.SETTINGS["stats_interval"].default  # RS_STATS_INTERVAL's default


@dataclass(frozen=True)
class ListenPlan:
    """Where a served reducer listens, and why (resolve_listen)."""

    host: str
    port: int
    origin: str  # where the port came from, for the log
    cluster: Any = None  # reducer.cluster.ClusterInfo when a cluster description was read
    warning: str | None = None


def resolve_listen(
    host: str | None = None, port: int | None = None, env: Mapping[str, str] | None = None
) -> ListenPlan:
    """Decide the address to bind from the flags, RS_HOST/RS_PORT and CLUSTER_SPEC/TF_CONFIG.

    Raises ConfigError when the cluster description is invalid or does not describe a reducer
    (only when the port has to come from it, i.e. without --port).
    """
    env = os.environ if env is None else env
    bind_host = config.get("host", host, env)
    has_cluster = bool(env.get("CLUSTER_SPEC", "").strip() or env.get("TF_CONFIG", "").strip())

    if port is not None:
        port = check_port(port, "--port", any_port=True)
        info = None
        warning = None
        if has_cluster:
            try:
                found = cluster.discover(env)
            except ConfigError as exc:
                warning = f"ignoring the cluster description ({exc}); serving on --port {port}"
            else:
                if found.role == cluster.REDUCER:
                    info = found
                else:
                    warning = (
                        f"{found.source} describes this process as {found.task_type} (a {found.role}), "
                        f"not a reducer; serving anyway on --port {port}"
                    )
        return ListenPlan(bind_host, port, "--port", info, warning)

    if has_cluster:
        info = cluster.discover_reducer(env)  # ConfigError unless workerpool2 / ps
        assert info.bind_port is not None
        origin = (
            "RS_PORT"
            if config.env_text("port", env) is not None
            else f"{info.source} entry {info.task_type}[{info.node_rank}]"
        )
        return ListenPlan(bind_host, info.bind_port, origin, info)

    rs_port = config.get("port", None, env)
    if rs_port is not None:
        return ListenPlan(bind_host, check_port(rs_port, "RS_PORT", any_port=True), "RS_PORT")
    return ListenPlan(bind_host, DEFAULT_PORT, "default (no CLUSTER_SPEC or TF_CONFIG)")


def resolve_advertise(
    flag: str | None, plan: ListenPlan, env: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """The data address GetStats reports and where it comes from: --advertise-address, else
    RS_ADVERTISE_ADDRESS ("advertise"), else this reducer's own entry of the cluster description when
    it listens on that entry's port ("cluster"); None: the address it binds (the control plane's
    default). ConfigError names the flag or the variable."""
    if flag is not None:
        try:
            return config.SETTINGS["advertise_address"].parse(flag), "advertise"
        except ValueError as exc:
            raise ConfigError(f"--advertise-address {flag!r} is not valid: {exc}") from None
    advertised = config.get("advertise_address", None, env)
    if advertised is not None:
        return advertised, "advertise"
    info = plan.cluster
    if info is not None and 0 <= info.node_rank < len(info.reducers):
        entry = info.reducers[info.node_rank]
        if cluster.parse_address(entry)[1] == plan.port:
            return entry, "cluster"
    return None


def _short_list(addrs: list[str], limit: int = 6) -> str:
    if not addrs:
        return "(none)"
    if len(addrs) <= limit:
        return ", ".join(addrs)
    return ", ".join(addrs[: limit - 2]) + f", ... ({len(addrs) - limit + 2} more), " + addrs[-1]


def describe_cluster(info: Any) -> str:
    """One log line about the cluster a reducer sees."""
    return (
        f"{info.source}: this is reducer {info.node_rank} of {len(info.reducers)} "
        f"({info.task_type} index {info.node_rank}); job {info.job_id}; "
        f"{len(info.workers)} worker node(s): {_short_list(info.workers)}; "
        f"reducers: {_short_list(info.reducers)}"
    )


# Settings every data connection reads when it is set up (net/socket.cc), not when the reducer is made.
DATA_SOCKET_SETTINGS = ("keepalive_idle", "keepalive_interval", "keepalive_count", "tcp_user_timeout")


def check_listen_host(host: str) -> None:
    """A listen address that does not resolve is a bad argument (exit 2), found before anything starts."""
    try:
        socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(
            f"--host {host!r} (or RS_HOST) is not an address this machine can listen on: {reason}"
        ) from None
