"""`reduction-server serve`: run one reducer node until SIGINT/SIGTERM (its flags; the node's life
is reducer.control.lifecycle.serve_node, where it listens reducer.server.resolve_listen).

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
import sys
from dataclasses import fields

from reducer import config
from reducer.addresses import DEFAULT_PORT
from reducer.errors import ConfigError


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
    p.add_argument("--drain-timeout", type=float, default=None, help=config.flag_help("drain_timeout"))
    p.add_argument("--stats-interval", type=float, default=None, help=config.flag_help("stats_interval"))
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


def run(args: argparse.Namespace) -> int:
    from reducer.control.lifecycle import NodeError, NodeOptions, prepare_node, serve_node

    try:
        for name, flag in (("drain_timeout", "--drain-timeout"), ("stats_interval", "--stats-interval")):
            if getattr(args, name) is not None:
                config.check_seconds(getattr(args, name), flag, zero=True)
            setattr(args, name, config.get(name, getattr(args, name)))  # else RS_*, else the default
        if args.memory_idle_timeout is not None:
            config.check_seconds(args.memory_idle_timeout, "--memory-idle-timeout", zero=True)
        if args.threads is not None and args.threads < 1:
            raise ConfigError(f"--threads={args.threads} must be at least 1 (leave it out for the default)")
        node = prepare_node(NodeOptions(**{f.name: getattr(args, f.name) for f in fields(NodeOptions)}))
    except ConfigError as exc:
        print(f"reduction-server serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        serve_node(node)
    except NodeError as exc:
        print(f"reduction-server serve: error: {exc}", file=sys.stderr)
        return exc.status
    return 0
