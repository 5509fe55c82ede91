"""Where things are: ``host:port`` text, port numbers, and the job id that (with the group name)
names a group on the reducers. Used by the worker library, the reducer node and the tools alike.

- An address is ``host:port``; an IPv6 host is written in brackets, ``[::1]:2222``.
- A port someone connects to is 1-65535; a port to bind may also be 0 (any free port).
- A reducer's data port defaults to DEFAULT_PORT (2222, the port Vertex AI gives every replica);
  its gRPC control port defaults to the data port + 1 (control_port_for): the one home of both
  rules (the reducer CLI, the status tool, the launcher and the Vertex AI specs follow them).
- The job id is the argument, else ``RS_JOB_ID``, else ``CLOUD_ML_JOB_ID`` (Vertex AI), else
  ``local``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ._native import core
from .errors import ConfigError

__all__ = [
    "parse_address",
    "format_address",
    "connect_host",
    "check_port",
    "is_ipv6",
    "resolve_job_id",
    "MAX_PORT",
    "DEFAULT_PORT",
    "control_port_for",
]

MAX_PORT = 65535
DEFAULT_PORT = 2222  # a reducer's data port when nothing says otherwise
_WILDCARD_HOSTS = ("0.0.0.0", "", "::")


def is_ipv6(host: str) -> bool:
    """True for an (unbracketed) IPv6 host such as ``::1`` or ``fe80::1%eth0``."""
    return ":" in host


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (the inverse of parse_address)."""
    return f"[{host}]:{port}" if is_ipv6(host) else f"{host}:{port}"


def connect_host(bind_host: str) -> str:
    """The host a client on this machine connects to for a server bound to `bind_host`
    (a wildcard bind, ``0.0.0.0`` / ``::`` / empty, is reached through 127.0.0.1)."""
    return "127.0.0.1" if bind_host in _WILDCARD_HOSTS else bind_host


def check_port(port: Any, what: str, *, any_port: bool = False) -> int:
    """`port` if it is a port number (1-65535; with `any_port`, 0 = any free port, is allowed too),
    else ConfigError naming `what` (the argument or variable it came from)."""
    low = 0 if any_port else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= MAX_PORT:
        raise ConfigError(f"{what}={port!r} is not a port number ({low}-{MAX_PORT})")
    return port


def control_port_for(data_port: int) -> int | None:
    """The default control port of a reducer whose data port is `data_port`: the next port, None
    when there is none (the data port is 65535)."""
    return data_port + 1 if data_port < MAX_PORT else None


def parse_address(addr: str) -> tuple[str, int]:
    """Split ``"host:port"``, ``"1.2.3.4:5"`` or ``"[::1]:5"`` into ``(host, port)``.

    IPv6 hosts come back without brackets. Raises ConfigError on anything else: no port, no host,
    whitespace inside, '[' without ']', an unbracketed IPv6 address, a bracketed host that is not
    IPv6, a port that is not ASCII digits or not 1-65535 (csrc/net/address.cc).
    """
    if not isinstance(addr, str):
        raise ConfigError(f"address must be a string 'host:port', found {type(addr).__name__} {addr!r}")
    host, port = core.parse_address(addr)  # csrc/net/address.cc: the one parser (the NCCL plugin's too)
    return str(host), int(port)


def resolve_job_id(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The job id: `explicit` if given (not blank), else RS_JOB_ID, else CLOUD_ML_JOB_ID, else 'local',
    trimmed; blank counts as unset. One rule with the NCCL plugin (csrc/cluster/job.cc).

    `env` defaults to os.environ."""
    source = os.environ if env is None else env
    return str(core.cluster.resolve_job_id(source.get, explicit or ""))
