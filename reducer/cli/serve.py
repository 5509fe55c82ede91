"""`reduction-server serve`: run one reducer node until SIGINT/SIGTERM.

Where it listens (docs/deploy.md, "serve"):

- host: ``--host``, else ``RS_HOST``, else ``0.0.0.0`` (all interfaces);
- port: ``--port``, else from the cluster description: ``CLUSTER_SPEC`` (then ``TF_CONFIG``)
  must describe this process as a reducer (``workerpool2`` / ``ps``) and the port of its own
  entry is used (``RS_PORT`` overrides it); with no cluster description at all, ``RS_PORT``, else
  2222 (the port Vertex AI uses everywhere).

With ``--port`` the cluster description is optional: it is only logged.
On SIGINT/SIGTERM the reducer stops accepting, lets rounds in flight finish for up to
``--drain-timeout`` seconds, closes everything and exits 0 (a second signal exits at once).

Beside the data port (docs/operations.md): the gRPC control plane (health, GetStats, Drain) on
``--control-port`` (default: data port + 1; ``off`` = none) and, with ``--metrics-port``, a
Prometheus endpoint. A Drain RPC (it needs the shared secret; without one it is refused unless
``--allow-unauthenticated-drain``) drains like SIGTERM but the process stays up, answering
NOT_SERVING, until it gets a signal. Both ports are capped in connections and requests per
address (docs/security.md, "Control port and metrics port"). GetStats reports the data address
``--advertise-address`` / ``RS_ADVERTISE_ADDRESS`` gives, else this reducer's own cluster entry,
else the address it binds (docs/deploy.md, "Reaching a reducer container through mapped ports").
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reducer import cluster, config
from reducer.addresses import DEFAULT_PORT, check_port, control_port_for, format_address
from reducer.errors import ConfigError, ReductionError
from reducer.wording import plural

log = logging.getLogger("reducer.serve")

DEFAULT_DRAIN_TIMEOUT = 10.0
DEFAULT_STATS_INTERVAL = 60.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run a reducer node (Vertex AI workerPoolSpecs[2], a ps replica, or anywhere)",
        description="Runs a reducer node until SIGINT/SIGTERM, then drains the rounds in flight and "
        "exits 0. Without --port the port comes from CLUSTER_SPEC (then TF_CONFIG), "
        "where this process must be a workerpool2 / ps replica; with no cluster "
        f"description at all it is $RS_PORT, else {DEFAULT_PORT}.",
    )
    # The flags of settings: their help and defaults come from the settings table (config.flag_help).
    p.add_argument("--host", default=None, help=config.flag_help("host"))
    p.add_argument("--port", type=int, default=None, help=config.flag_help("port"))
    p.add_argument("--threads", type=int, default=None, help=config.flag_help("threads"))
    p.add_argument(
        "--auth-token-file",
        default=None,
        help="file holding the shared secret workers must prove they know "
        "(default: $RS_AUTH_TOKEN, $RS_AUTH_TOKEN_FILE, else no authentication)",
    )
    p.add_argument(
        "--integrity",
        choices=("off", "on", "required"),
        default=None,
        help=config.flag_help(
            "integrity",
            "frame integrity (AES-GMAC tags on every frame, needs the shared secret): on = offered to workers "
            "that ask, required = workers that do not ask are refused; unset: on with a secret, off without",
        ),
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT,
        help="on SIGTERM/SIGINT, seconds to let rounds in flight finish (default %(default)s)",
    )
    p.add_argument(
        "--stats-interval",
        type=float,
        default=DEFAULT_STATS_INTERVAL,
        help="seconds between stats lines, logged at DEBUG level; 0 = never (default %(default)s)",
    )
    p.add_argument(
        "--control-port",
        type=_port_arg,
        default=None,
        metavar="PORT|off",
        help=config.flag_help(
            "control_port",
            "gRPC control plane (health, GetStats, Drain); 0 = any free port, off = none; unset: the data port + 1",
        ),
    )
    p.add_argument(
        "--metrics-port",
        type=_port_arg,
        default=None,
        metavar="PORT|off",
        help=config.flag_help(
            "metrics_port", "serve Prometheus metrics on http://HOST:PORT/metrics; 0 = any free port; unset: off"
        ),
    )
    p.add_argument(
        "--allow-unauthenticated-drain",
        action="store_true",
        default=None,
        help=config.flag_help(
            "allow_unauthenticated_drain",
            "without a shared secret, let anyone who reaches the control port Drain this reducer "
            "(with a secret Drain needs it)",
        ),
    )
    p.add_argument(
        "--advertise-address",
        default=None,
        metavar="HOST:PORT",
        help=config.flag_help("advertise_address"),
    )
    for name, kind, metavar in _MEMORY_FLAGS:
        p.add_argument(
            "--" + name.replace("_", "-"), type=kind, default=None, metavar=metavar, help=config.flag_help(name)
        )
    p.add_argument(
        "--ready-file", default=None, help="once listening, write HOST:PORT to this file (for scripts and `launch`)"
    )
    p.set_defaults(func=run)


def _port_arg(text: str) -> int:
    try:
        value = config.SETTINGS["control_port"].parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value is None:
        raise argparse.ArgumentTypeError("expected a port 0-65535 or 'off'")
    return int(value)


def _size_arg(text: str) -> int:
    try:
        return int(config.parse_text("max_memory_per_job", text))
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# The memory shares (docs/security.md, "Memory shares"): setting (the flag is its name), type,
# metavar; help and default from the settings table.
_MEMORY_FLAGS = (
    ("max_memory_per_job", _size_arg, "BYTES"),
    ("max_memory_per_peer", _size_arg, "BYTES"),
    ("memory_idle_timeout", float, "SECONDS"),
)


# -- where to listen ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ListenPlan:
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


# -- running ------------------------------------------------------------------------------------


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
    args: argparse.Namespace,
    plan: ListenPlan,
    server: Any,
    lifecycle: Any,
    token: str | None,
    advertise: tuple[str, str] | None = None,
) -> tuple[Any, Any]:
    """Start the control plane and the metrics endpoint; raises OSError for a port asked for explicitly."""
    ports = resolve_side_ports(args.control_port, args.metrics_port, server.port)
    control = metrics = None
    limits = _side_limits(server, ports)
    if ports.control is not None:
        try:
            from reducer.control.service import ControlPlane

            control = ControlPlane(
                server,
                lifecycle,
                host=plan.host,
                port=ports.control,
                auth_token=token,
                limits=limits,
                allow_unauthenticated_drain=args.allow_unauthenticated_drain,
                advertise=advertise,
            ).start()
        except (OSError, ImportError) as exc:
            if not ports.control_is_default:
                raise
            log.warning(
                "no control plane (health, GetStats, Drain): %s; choose a port with --control-port or "
                "RS_CONTROL_PORT, or set it to 'off'",
                exc,
            )
        else:
            log.info("control plane (gRPC health, GetStats, Drain) on %s:%d", plan.host, control.port)
    if ports.metrics is not None:
        from reducer.control.metrics import MetricsEndpoint, reducer_registry

        try:
            metrics = MetricsEndpoint(
                reducer_registry(server, lifecycle), host=plan.host, port=ports.metrics, limits=limits
            )
        except OSError as exc:
            if control is not None:
                control.stop(0)
            raise OSError(f"cannot serve metrics on {plan.host}:{ports.metrics}: {exc.strerror or exc}") from None
        log.info("Prometheus metrics on http://%s:%d/metrics", plan.host, metrics.port)
    return control, metrics


def _side_limits(server: Any, ports: SidePorts) -> Any:
    """The caps of the control and metrics ports (ConfigError for bad RS_CONTROL_* settings)."""
    if ports.control is None and ports.metrics is None:
        return None
    from reducer.control.limits import configured_limits

    limits = configured_limits(server)
    log.info(
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
    log.warning(
        "running WITHOUT authentication (no shared secret: --auth-token-file, RS_AUTH_TOKEN): %s", "; ".join(ports)
    )


def _serve_until_signalled(args: argparse.Namespace, server: Any, control: Any, signals: dict[str, Any]) -> None:
    """Refresh the control plane's view (and log stats at DEBUG every --stats-interval) until a signal."""
    interval = args.stats_interval if args.stats_interval and args.stats_interval > 0 else None
    next_stats = time.monotonic() + interval if interval else None
    while signals["count"] == 0:
        time.sleep(0.25)
        if control is not None:
            control.refresh()
        if next_stats is not None and interval is not None and time.monotonic() >= next_stats:
            next_stats += interval
            if log.isEnabledFor(logging.DEBUG):
                log.debug("stats: %s", _format_stats(server.stats()))


def _stop(args: argparse.Namespace, server: Any, lifecycle: Any, control: Any, metrics: Any, signal_name: str) -> None:
    """Drain the rounds in flight (up to --drain-timeout), stop the side ports, log the totals."""
    log.info("received %s: stopping (draining rounds in flight for up to %gs)", signal_name, args.drain_timeout)
    # The drain blocks in C++ without the GIL in a thread of its own, so a second signal is still
    # handled here; a Drain RPC may have started (or finished) it already.
    lifecycle.drain(args.drain_timeout, reason=f"received {signal_name}")
    while not lifecycle.wait(0.25):
        pass
    if control is not None:
        control.stop()
    if metrics is not None:
        metrics.stop()
    stats = server.stats()
    log.info(
        "stopped after %s (%.1f MB received, %.1f MB sent)",
        plural(stats.get("rounds_completed", 0), "round"),
        stats.get("bytes_received", 0) / 1e6,
        stats.get("bytes_sent", 0) / 1e6,
    )
    log.debug("final stats: %s", _format_stats(stats))


# Settings every data connection reads when it is set up (net/socket.cc), not when the reducer is made.
DATA_SOCKET_SETTINGS = ("keepalive_idle", "keepalive_interval", "keepalive_count", "tcp_user_timeout")


def _check_host(host: str) -> None:
    """A listen address that does not resolve is a bad argument (exit 2), found before anything starts."""
    try:
        socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(
            f"--host {host!r} (or RS_HOST) is not an address this machine can listen on: {reason}"
        ) from None


def run(args: argparse.Namespace) -> int:
    try:
        config.check_seconds(args.drain_timeout, "--drain-timeout", zero=True)
        if args.memory_idle_timeout is not None:
            config.check_seconds(args.memory_idle_timeout, "--memory-idle-timeout", zero=True)
        if args.threads is not None and args.threads < 1:
            raise ConfigError(f"--threads={args.threads} must be at least 1 (leave it out for the default)")
        plan = resolve_listen(args.host, args.port)
        _check_host(plan.host)
        advertise = resolve_advertise(args.advertise_address, plan)
        for name in DATA_SOCKET_SETTINGS:  # read by every data socket: a bad value is refused here, named
            config.get(name, None)
        token = config.resolve_auth_token(token_file=args.auth_token_file)
        config.reducer_integrity(args.integrity, token)  # on/required without a secret: refused here
    except ConfigError as exc:
        print(f"reduction-server serve: error: {exc}", file=sys.stderr)
        return 2

    if plan.warning:
        log.warning("%s", plan.warning)
    if plan.cluster is not None:
        log.info("cluster from %s", describe_cluster(plan.cluster))
    else:
        log.info("no cluster description (CLUSTER_SPEC / TF_CONFIG): serving any worker that connects")

    from reducer.server import ReducerServer  # noqa: PLC0415 (the C++ core: the CLI starts without it)

    signals: dict[str, Any] = {"count": 0, "name": ""}

    def on_signal(signum: int, _frame: Any) -> None:
        signals["count"] += 1
        signals["name"] = signal.Signals(signum).name
        if signals["count"] > 1:
            # The first signal is draining; the user wants out now.
            log.warning("second %s: exiting without waiting for the drain", signals["name"])
            logging.shutdown()
            os._exit(1)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread (embedded use): no signal handling
            pass
    try:
        try:
            server = ReducerServer(
                host=plan.host,
                port=plan.port,
                threads=args.threads,
                auth_token=token or "",
                integrity=args.integrity,
                max_memory_per_job=args.max_memory_per_job,
                max_memory_per_peer=args.max_memory_per_peer,
                memory_idle_timeout=args.memory_idle_timeout,
            )
        except ConfigError as exc:  # a setting (RS_GROUP_TIMEOUT=1e10, ...): say which, not "cannot listen"
            print(f"reduction-server serve: error: {exc}", file=sys.stderr)
            return 2
        try:
            server.start()
        except (ReductionError, OSError, RuntimeError) as exc:
            detail = str(exc)
            if "listen" not in detail:
                detail = f"cannot listen on {plan.host}:{plan.port}: {detail}"
            print(f"reduction-server serve: error: {detail}", file=sys.stderr)
            return 1
        from reducer.control.lifecycle import Lifecycle

        lifecycle = Lifecycle(server, args.drain_timeout)
        try:
            control, metrics = _start_side(args, plan, server, lifecycle, token, advertise)
        except (OSError, ImportError, ConfigError) as exc:
            server.stop()
            print(f"reduction-server serve: error: {exc}", file=sys.stderr)
            return 1
        if not token:
            _warn_unauthenticated(plan, server, control, metrics)
        if args.ready_file:
            _write_ready_file(args.ready_file, server.address)
        log.info(
            "listening on %s:%d (port from %s; authentication %s); stop with SIGTERM or Ctrl-C",
            plan.host,
            server.port,
            plan.origin,
            "on" if token else "off",
        )

        if advertise is not None:
            how = "--advertise-address / RS_ADVERTISE_ADDRESS" if advertise[1] == "advertise" else "its cluster entry"
            log.info("data address reported to others (GetStats, status): %s (from %s)", advertise[0], how)
        _serve_until_signalled(args, server, control, signals)
        _stop(args, server, lifecycle, control, metrics, signals["name"])
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
