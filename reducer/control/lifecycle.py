"""The life of a served reducer: serving -> draining -> drained, whoever asks for the drain.

SIGTERM/SIGINT (reduction-server serve) and the Drain RPC both end up in Lifecycle.drain(); the
health service and the metrics subscribe to the changes (Lifecycle: pure Python, no grpc).

serve_node() runs one reducer node this way, as `reduction-server serve` does (reducer/cli/serve.py
only parses its flags): where it listens (reducer.server.resolve_listen), the data plane, the control
plane and the metrics beside it (grpc and prometheus_client imported only then), the ready file, the
stats lines, then on SIGINT/SIGTERM the drain (a second signal exits at once) and the totals.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reducer import config
from reducer.addresses import control_port_for, format_address
from reducer.errors import ConfigError, ReductionError
from reducer.server import (
    DATA_SOCKET_SETTINGS,
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_STATS_INTERVAL,
    ListenPlan,
    ReducerServer,
    check_listen_host,
    describe_cluster,
    resolve_advertise,
    resolve_listen,
)
from reducer.wording import plural

from .limits import configured_limits

log = logging.getLogger(__name__)
node_log = logging.getLogger("reducer.serve")  # the served node's lines: the name docs/operations.md shows

SERVING = "serving"  # the data plane accepts workers and groups
DRAINING = "draining"  # no new connections; rounds in flight finish (up to the drain timeout)
DRAINED = "drained"  # the data plane is stopped
STATES = (SERVING, DRAINING, DRAINED)

Listener = Callable[[str], None]


class Lifecycle:
    """Drains one started ReducerServer at most once, in a background thread.

    ``drain(timeout)`` returns at once; ``wait(timeout)`` blocks until the data plane has stopped.
    Draining is ReducerServer.drain(): stop accepting connections, let rounds in flight finish for
    up to `timeout` seconds, close every connection.
    """

    def __init__(self, server: Any, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT) -> None:
        config.check_seconds(drain_timeout, "drain_timeout", zero=True)  # (ConfigError is a ValueError)
        self.server = server
        self.drain_timeout = float(drain_timeout)
        self.started_at = time.monotonic()
        self._state = SERVING
        self._reason = ""
        self._lock = threading.RLock()  # held while listeners run: they see the changes in order
        self._done = threading.Event()
        self._listeners: list[Listener] = []

    @property
    def state(self) -> str:
        return self._state

    @property
    def reason(self) -> str:
        """Who asked for the drain ("" while serving)."""
        return self._reason

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at

    def subscribe(self, listener: Listener) -> None:
        """Call listener(state) now and on every change (from the thread that makes it; keep it quick)."""
        with self._lock:
            self._listeners.append(listener)
            listener(self._state)

    def drain(self, timeout: float | None = None, reason: str = "") -> bool:
        """Start draining (timeout: seconds for rounds in flight, None = the default).

        Returns False when a drain had already started (the first one's timeout holds).
        ValueError (ConfigError) for a timeout that is not a finite number (inf or NaN) or more
        than config.MAX_SECONDS; <= 0 means the default."""
        if timeout is not None and (timeout > 0 or not math.isfinite(timeout)):
            config.check_seconds(timeout, "drain timeout")
        seconds = self.drain_timeout if timeout is None or timeout <= 0 else float(timeout)
        with self._lock:
            if self._state != SERVING:
                return False
            self._reason = reason or "drain"
            log.info("draining (%s): no new connections; rounds in flight get up to %gs", self._reason, seconds)
            self._set(DRAINING)
        threading.Thread(target=self._run, args=(seconds,), name="rs-drain", daemon=True).start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """True once the data plane has stopped (False if `timeout` seconds passed first)."""
        return self._done.wait(timeout)

    def _run(self, seconds: float) -> None:
        try:
            self.server.drain(seconds)
        except Exception:  # the data plane is gone either way; say why
            log.exception("drain failed")
        finally:
            self._set(DRAINED)
            self._done.set()

    def _set(self, state: str) -> None:
        with self._lock:
            self._state = state
            for listener in self._listeners:
                try:
                    listener(state)
                except Exception:
                    log.exception("lifecycle listener failed on %s", state)


# -- a served node ------------------------------------------------------------------------------


@dataclass
class NodeOptions:
    """What a served node is asked for: `reduction-server serve`'s flags (None: the setting's
    RS_* variable, else its default; docs/configuration.md)."""

    host: str | None = None
    port: int | None = None
    threads: int | None = None
    auth_token_file: str | None = None
    integrity: str | None = None
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    stats_interval: float = DEFAULT_STATS_INTERVAL
    control_port: int | None = None
    metrics_port: int | None = None
    allow_unauthenticated_drain: bool | None = None
    advertise_address: str | None = None
    max_memory_per_job: int | None = None
    max_memory_per_peer: int | None = None
    memory_idle_timeout: float | None = None
    ready_file: str | None = None


_MEMORY_SHARES = ("max_memory_per_job", "max_memory_per_peer", "memory_idle_timeout")  # ReducerServer's limits


@dataclass
class Node:
    """A node whose settings were checked (prepare_node): serve_node runs it."""

    options: NodeOptions
    plan: ListenPlan
    token: str | None
    advertise: tuple[str, str] | None


class NodeError(ReductionError):
    """The node could not start; `status` is the exit status a command reports (2: a setting, 1: a port)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def prepare_node(options: NodeOptions) -> Node:
    """Check every setting (flags and RS_* variables) before anything starts: ConfigError names
    the flag or the variable."""
    plan = resolve_listen(options.host, options.port)
    check_listen_host(plan.host)
    advertise = resolve_advertise(options.advertise_address, plan)
    for name in DATA_SOCKET_SETTINGS:  # read by every data socket: a bad value is refused here, named
        config.get(name, None)
    token = config.resolve_auth_token(token_file=options.auth_token_file)
    config.reducer_integrity(options.integrity, token)  # on/required without a secret: refused here
    return Node(options, plan, token, advertise)


def serve_node(node: Node) -> None:
    """Run the node until SIGINT/SIGTERM, then drain it (up to drain_timeout) and stop.

    NodeError when it cannot start. Signals are handled only from the main thread; a second
    signal during the drain exits the process at once (status 1)."""
    plan = node.plan
    if plan.warning:
        node_log.warning("%s", plan.warning)
    if plan.cluster is not None:
        node_log.info("cluster from %s", describe_cluster(plan.cluster))
    else:
        node_log.info("no cluster description (CLUSTER_SPEC / TF_CONFIG): serving any worker that connects")

    signals: dict[str, Any] = {"count": 0, "name": ""}

    def on_signal(signum: int, _frame: Any) -> None:
        signals["count"] += 1
        signals["name"] = signal.Signals(signum).name
        if signals["count"] > 1:
            # The first signal is draining; the user wants out now.
            node_log.warning("second %s: exiting without waiting for the drain", signals["name"])
            logging.shutdown()
            os._exit(1)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread (embedded use): no signal handling
            pass
    try:
        server, lifecycle, control, metrics = _start_node(node)
        _serve_until_signalled(node.options, server, control, signals)
        _stop(node.options, server, lifecycle, control, metrics, signals["name"])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_node(node: Node) -> tuple[ReducerServer, Lifecycle, Any, Any]:
    """The data plane, then the control plane and the metrics: listening, announced in the log."""
    options, plan, token = node.options, node.plan, node.token
    try:
        shares = {name: getattr(options, name) for name in _MEMORY_SHARES}
        server = ReducerServer(
            plan.host, plan.port, options.threads, token or "", integrity=options.integrity, **shares
        )
    except ConfigError as exc:  # a setting (RS_GROUP_TIMEOUT=1e10, ...): say which, not "cannot listen"
        raise NodeError(str(exc), 2) from None
    try:
        server.start()
    except (ReductionError, OSError, RuntimeError) as exc:
        detail = str(exc)
        if "listen" not in detail:
            detail = f"cannot listen on {plan.host}:{plan.port}: {detail}"
        raise NodeError(detail, 1) from None
    lifecycle = Lifecycle(server, options.drain_timeout)
    try:
        control, metrics = _start_side(options, plan, server, lifecycle, token, node.advertise)
    except (OSError, ImportError, ConfigError) as exc:
        server.stop()
        raise NodeError(str(exc), 1) from None
    if not token:
        _warn_unauthenticated(plan, server, control, metrics)
    if options.ready_file:
        _write_ready_file(options.ready_file, server.address)
    node_log.info(
        "listening on %s:%d (port from %s; authentication %s); stop with SIGTERM or Ctrl-C",
        plan.host,
        server.port,
        plan.origin,
        "on" if token else "off",
    )
    if node.advertise is not None:
        how = "--advertise-address / RS_ADVERTISE_ADDRESS" if node.advertise[1] == "advertise" else "its cluster entry"
        node_log.info("data address reported to others (GetStats, status): %s (from %s)", node.advertise[0], how)
    return server, lifecycle, control, metrics


def _write_ready_file(path: str, address: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(address + "\n")
    os.replace(tmp, path)


def _format_stats(stats: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in stats.items())


@dataclass
class SidePorts:
    """Where the control plane and the metrics listen (None = not at all)."""

    control: int | None
    control_is_default: bool  # data port + 1, chosen by us: a failed bind is only a warning
    metrics: int | None


def resolve_side_ports(control: int | None, metrics: int | None, data_port: int) -> SidePorts:
    """--control-port / --metrics-port, else RS_CONTROL_PORT / RS_METRICS_PORT, else the defaults."""
    control = config.get("control_port", control)
    metrics = config.get("metrics_port", metrics)
    is_default = control is None
    if is_default:
        control = control_port_for(data_port)
    return SidePorts(
        None if control == config.OFF else control,
        is_default,
        None if metrics is None or metrics == config.OFF else metrics,
    )


def _start_side(
    options: NodeOptions,
    plan: ListenPlan,
    server: Any,
    lifecycle: Any,
    token: str | None,
    advertise: tuple[str, str] | None = None,
) -> tuple[Any, Any]:
    """Start the control plane and the metrics endpoint; raises OSError for a port asked for explicitly."""
    ports = resolve_side_ports(options.control_port, options.metrics_port, server.port)
    control = metrics = None
    limits = _side_limits(server, ports)
    if ports.control is not None:
        try:
            from .service import ControlPlane  # noqa: PLC0415 (grpc, only now; it imports this module)

            control = ControlPlane(
                server,
                lifecycle,
                host=plan.host,
                port=ports.control,
                auth_token=token,
                limits=limits,
                allow_unauthenticated_drain=options.allow_unauthenticated_drain,
                advertise=advertise,
            ).start()
        except (OSError, ImportError) as exc:
            if not ports.control_is_default:
                raise
            node_log.warning(
                "no control plane (health, GetStats, Drain): %s; choose a port with --control-port or "
                "RS_CONTROL_PORT, or set it to 'off'",
                exc,
            )
        else:
            node_log.info("control plane (gRPC health, GetStats, Drain) on %s:%d", plan.host, control.port)
    if ports.metrics is not None:
        from .metrics import MetricsEndpoint, reducer_registry  # noqa: PLC0415 (prometheus_client, only now)

        try:
            metrics = MetricsEndpoint(
                reducer_registry(server, lifecycle), host=plan.host, port=ports.metrics, limits=limits
            )
        except OSError as exc:
            if control is not None:
                control.stop(0)
            raise OSError(f"cannot serve metrics on {plan.host}:{ports.metrics}: {exc.strerror or exc}") from None
        node_log.info("Prometheus metrics on http://%s:%d/metrics", plan.host, metrics.port)
    return control, metrics


def _side_limits(server: Any, ports: SidePorts) -> Any:
    """The caps of the control and metrics ports (ConfigError for bad RS_CONTROL_* settings)."""
    if ports.control is None and ports.metrics is None:
        return None
    limits = configured_limits(server)
    node_log.info(
        "control and metrics ports: at most %d and %d connections (%d per address), %g requests/s per address%s",
        limits.control_connections,
        limits.metrics_connections,
        limits.per_peer,
        limits.rate,
        "" if limits.budget_fds is None else f"; {limits.budget_fds} descriptors left beside the data plane's",
    )
    return limits


def _warn_unauthenticated(plan: ListenPlan, server: Any, control: Any, metrics: Any) -> None:
    """The startup WARNING of a reducer without a shared secret: every port it opened, and what is open."""
    ports = [f"data port {format_address(plan.host, server.port)} (anyone may join any group)"]
    if control is not None:
        drain = (
            "anyone may Drain it: --allow-unauthenticated-drain"
            if control.service.allow_unauthenticated_drain
            else "Drain refused"
        )
        ports.append(
            f"control port {format_address(plan.host, control.port)} (health and GetStats open to anyone, {drain})"
        )
    if metrics is not None:
        ports.append(f"metrics port {format_address(plan.host, metrics.port)} (open to anyone)")
    node_log.warning(
        "running WITHOUT authentication (no shared secret: --auth-token-file, RS_AUTH_TOKEN): %s", "; ".join(ports)
    )


def _serve_until_signalled(options: NodeOptions, server: Any, control: Any, signals: dict[str, Any]) -> None:
    """Refresh the control plane's view (and log stats at DEBUG every --stats-interval) until a signal."""
    interval = options.stats_interval if options.stats_interval and options.stats_interval > 0 else None
    next_stats = time.monotonic() + interval if interval else None
    while signals["count"] == 0:
        time.sleep(0.25)
        if control is not None:
            control.refresh()
        if next_stats is not None and interval is not None and time.monotonic() >= next_stats:
            next_stats += interval
            if node_log.isEnabledFor(logging.DEBUG):
                node_log.debug("stats: %s", _format_stats(server.stats()))


def _stop(options: NodeOptions, server: Any, lifecycle: Any, control: Any, metrics: Any, signal_name: str) -> None:
    """Drain the rounds in flight (up to --drain-timeout), stop the side ports, log the totals."""
    node_log.info("received %s: stopping (draining rounds in flight for up to %gs)", signal_name, options.drain_timeout)
    # The drain blocks in C++ without the GIL in a thread of its own, so a second signal is still
    # handled here; a Drain RPC may have started (or finished) it already.
    lifecycle.drain(options.drain_timeout, reason=f"received {signal_name}")
    while not lifecycle.wait(0.25):
        pass
    if control is not None:
        control.stop()
    if metrics is not None:
        metrics.stop()
    stats = server.stats()
    node_log.info(
        "stopped after %s (%.1f MB received, %.1f MB sent)",
        plural(stats.get("rounds_completed", 0), "round"),
        stats.get("bytes_received", 0) / 1e6,
        stats.get("bytes_sent", 0) / 1e6,
    )
    node_log.debug("final stats: %s", _format_stats(stats))
