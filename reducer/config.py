"""Every setting of reduction-server, its RS_* environment variable and default, in one table.

Rule everywhere: an explicit argument wins, then the RS_* variable, then the default. A variable
that is unset or blank (empty or only whitespace) counts as not set: the default applies.
Every reader of a setting goes through get() (or env_text() for the raw text), with os.environ or
an explicit mapping. docs/configuration.md is the human-readable copy of SETTINGS (a test checks
they agree).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Union

from .errors import ConfigError


@dataclass(frozen=True)
class Setting:
    name: str            # argument name in the Python API
    env: str             # environment variable
    default: Any
    parse: Callable[[str], Any]
    doc: str


def _bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


OFF = -1   # control_port / metrics_port: the listener is disabled


def _port_or_off(text: str) -> Optional[int]:
    """A port 0-65535 (0 = any free port), 'off' (or -1) = disabled, '' = unset (the default)."""
    t = text.strip().lower()
    if t == "":
        return None
    if t in ("off", "none", "-1"):
        return OFF
    port = int(t)
    if not 0 <= port <= 65535:
        raise ValueError(f"not a port 0-65535 or 'off': {text!r}")
    return port


INTEGRITY_MODES = ("off", "on", "required")


def _integrity(text: str) -> str:
    """Frame integrity: 'off', 'on' or 'required' (see docs/security.md)."""
    t = text.strip().lower()
    if t not in INTEGRITY_MODES:
        raise ValueError(f"not one of {', '.join(INTEGRITY_MODES)}: {text!r}")
    return t


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (powers of 1024): '64M', '4096'."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    if t and t[-1] in "KMGT":
        mult = 1024 ** ("KMGT".index(t[-1]) + 1)
        t = t[:-1]
    value = float(t) * mult
    if value < 0 or value != int(value):
        raise ValueError(f"not a size in bytes: {text!r}")
    return int(value)


_TABLE = [
    # -- worker client ---------------------------------------------------------
    Setting("reducers", "RS_REDUCERS", None, lambda s: [a.strip() for a in s.split(",") if a.strip()],
            "Comma-separated reducer addresses host:port (IPv6 as [addr]:port); used when no CLUSTER_SPEC/TF_CONFIG is set."),
    Setting("rank", "RS_RANK", None, int, "This worker's global rank (with RS_REDUCERS)."),
    Setting("world_size", "RS_WORLD_SIZE", None, int, "Number of worker processes in the group (with RS_REDUCERS)."),
    Setting("group", "RS_GROUP", "default", str, "Group name: workers with the same job id and group reduce together."),
    Setting("job_id", "RS_JOB_ID", None, str, "Job id (default: CLOUD_ML_JOB_ID if set, else 'local')."),
    Setting("timeout", "RS_TIMEOUT", 30.0, float, "Seconds without progress before an operation fails (also bounds connect retries)."),
    Setting("connect_timeout", "RS_CONNECT_TIMEOUT", 300.0, float,
            "Seconds to wait for the reducers to accept and for every worker of the group to connect (a reducer still unreachable after 3 s is named once in a WARNING)."),
    Setting("streams", "RS_STREAMS", 1, int, "TCP connections per reducer per worker (one TCP stream cannot fill a fast NIC)."),
    Setting("chunk_bytes", "RS_CHUNK_BYTES", 1 << 20, _size,
            "Largest pipeline chunk in bytes (all workers of a group must agree); a round uses about shard/64, at least 16 KiB (64 KiB for shards under 128 KiB; shard/128, at least 64 KiB, for shards over 4 MiB)."),
    Setting("window", "RS_WINDOW", 4, int,
            "Chunks a worker keeps in flight per reducer connection (sent, result not yet back)."),
    Setting("max_rounds_in_flight", "RS_MAX_ROUNDS_IN_FLIGHT", 8, int,
            "Unfinished all-reduce rounds a worker keeps in flight before starting another waits."),
    Setting("failover", "RS_FAILOVER", True, _bool,
            "Finish rounds on the surviving reducers when one is lost (every worker of a group must agree)."),
    Setting("socket_buffer", "RS_SOCKET_BUFFER", None, _size,
            "SO_SNDBUF/SO_RCVBUF of data connections in bytes (0: leave to the kernel's autotuning)."),
    Setting("tcp_congestion", "RS_TCP_CONGESTION", "auto", str,
            "TCP congestion control (TCP_CONGESTION) of every data connection of the process (workers, reducers, ring, NCCL plugin), e.g. 'cubic' or 'bbr'; 'auto': cubic where the process may use it, else the kernel's (measured: docs/performance.md); 'default': the kernel's."),
    Setting("auth_token", "RS_AUTH_TOKEN", None, str, "Shared secret for HMAC-SHA256 authentication (workers and reducers)."),
    Setting("auth_token_file", "RS_AUTH_TOKEN_FILE", None, str, "File holding the shared secret (alternative to RS_AUTH_TOKEN)."),
    Setting("integrity", "RS_INTEGRITY", None, _integrity,
            "Frame integrity (AES-GMAC tags on every frame; needs the auth token): 'off', 'on' or 'required'. "
            "Worker: 'on'/'required' ask every reducer for it (default off). Reducer: 'on' offers it, 'required' "
            "refuses workers that do not ask (default: on with a secret, else off)."),
    Setting("fusion_threshold", "RS_FUSION_THRESHOLD", 64 << 20, _size, "Fused buffer size in bytes for allreduce_async; 0 turns fusion off."),
    Setting("cycle_time_ms", "RS_CYCLE_TIME_MS", 5.0, float, "After this many milliseconds a worker asks the group for an agreed flush of partly filled fused buffers (cut points never depend on timing)."),
    Setting("compression", "RS_COMPRESSION", None, str, "Wire compression for float32: 'bf16', 'fp16' or none."),
    Setting("local_rank", "LOCAL_RANK", None, int, "Rank of this process on its node (set by torchrun / the launcher)."),
    Setting("local_world_size", "LOCAL_WORLD_SIZE", None, int, "Processes per node (set by torchrun / the launcher)."),
    # -- reducer node ----------------------------------------------------------
    Setting("host", "RS_HOST", "0.0.0.0", str, "Address the reducer binds."),
    Setting("port", "RS_PORT", None, int, "Port the reducer binds (default: its CLUSTER_SPEC entry, else 2222)."),
    Setting("threads", "RS_THREADS", None, int, "Reducer event-loop threads (default: number of CPUs, at most 8)."),
    Setting("max_group_bytes", "RS_MAX_GROUP_BYTES", None, _size,
            "Reducer: largest reduction-buffer memory per group stream (default 4 GiB); a group asking more is refused."),
    Setting("max_memory_bytes", "RS_MAX_MEMORY", None, _size,
            "Reducer: reduction-buffer memory of all groups together (default: half of the physical memory)."),
    Setting("max_memory_per_job", "RS_MAX_MEMORY_PER_JOB", None, _size,
            "Reducer: reduction-buffer memory of one job id's groups together (default: half of max_memory_bytes)."),
    Setting("max_memory_per_peer", "RS_MAX_MEMORY_PER_PEER", None, _size,
            "Reducer: reduction-buffer memory charged to one IP address: slots x chunk per rank it connected, "
            "plus the accumulator of the groups where it is rank 0 (default: half of max_memory_bytes)."),
    Setting("memory_idle_timeout", "RS_MEMORY_IDLE_TIMEOUT", None, float,
            "Reducer: seconds a complete group may receive nothing before it gives its memory back until its next "
            "chunk (default 60; 0 = never)."),
    Setting("group_slots", "RS_GROUP_SLOTS", None, int,
            "Reducer: chunk slots per group stream (default 4); memory per group stream = slots x (world + 2) x chunk."),
    Setting("handshake_timeout", "RS_HANDSHAKE_TIMEOUT", None, float,
            "Reducer and the NCCL plugin's point-to-point listener: seconds a new connection has to send its "
            "hello (default 10)."),
    Setting("group_timeout", "RS_GROUP_TIMEOUT", None, float,
            "Reducer: seconds a group may wait for all its ranks before its members are refused (default 300)."),
    Setting("max_connections", "RS_MAX_CONNECTIONS", None, int,
            "Reducer: open connections (default 4096, at most the descriptor limit minus 64)."),
    Setting("max_connections_per_peer", "RS_MAX_CONNECTIONS_PER_PEER", None, int,
            "Reducer: open connections from one IP address, in any state (default 256)."),
    Setting("max_groups_per_peer", "RS_MAX_GROUPS_PER_PEER", None, int,
            "Reducer: live group streams created from one IP address (default 64)."),
    # -- NCCL plugin (read by the C++ library NCCL loads; docs/nccl-plugin.md) --
    Setting("nccl_socket_ifname", "RS_NCCL_SOCKET_IFNAME", None, str,
            "NCCL plugin: interface of its point-to-point TCP net (NCCL's syntax: prefixes, '=exact', '^exclude'; "
            "default NCCL_SOCKET_IFNAME, else the first non-loopback interface)."),
    Setting("nccl_nsocks", "RS_NCCL_NSOCKS", 2, int,
            "NCCL plugin: TCP sockets per point-to-point connection (1-16); messages are striped over them."),
    Setting("control_port", "RS_CONTROL_PORT", None, _port_or_off,
            "Reducer: gRPC control-plane port (health, GetStats, Drain); 0 = any free port, 'off' = none (default: data port + 1)."),
    Setting("metrics_port", "RS_METRICS_PORT", None, _port_or_off,
            "Reducer: Prometheus metrics port (HTTP /metrics); 0 = any free port (default: off)."),
    Setting("allow_unauthenticated_drain", "RS_ALLOW_UNAUTHENTICATED_DRAIN", False, _bool,
            "Reducer without a shared secret: let anyone who reaches the control port Drain it (default: refused)."),
    Setting("control_max_connections", "RS_CONTROL_MAX_CONNECTIONS", 32, int,
            "Reducer: open connections to the control port, and to the metrics port, each (lowered to fit the "
            "descriptors the data plane leaves free)."),
    Setting("control_max_connections_per_peer", "RS_CONTROL_MAX_CONNECTIONS_PER_PEER", 4, int,
            "Reducer: open connections from one IP address (IPv6: one /64) to the control port, and to the metrics port."),
    Setting("control_rate", "RS_CONTROL_RATE", 50.0, float,
            "Reducer: requests per second one IP address (IPv6: one /64) may make to the control port (gRPC calls), "
            "and to the metrics port, each with a burst as large; 0 = no limit."),
    Setting("metrics_groups", "RS_METRICS_GROUPS", 100, int,
            "Reducer: groups with their own series on /metrics (job and group labels); 0 = no per-group series."),
    # -- general ---------------------------------------------------------------
    Setting("log_level", "RS_LOG_LEVEL", "INFO", str, "Logging level of the library and the CLI."),
]

SETTINGS: Dict[str, Setting] = {s.name: s for s in _TABLE}


def env_text(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The text of a setting's variable in `env` (default os.environ); None when unset or blank."""
    raw = (os.environ if env is None else env).get(SETTINGS[name].env)
    return None if raw is None or raw.strip() == "" else raw


def get(name: str, override: Any = None, env: Optional[Mapping[str, str]] = None) -> Any:
    """Value of a setting: `override` if not None, else its variable in `env` (default os.environ),
    parsed, else (unset or blank) the default. ConfigError names the variable if it does not parse."""
    setting = SETTINGS[name]
    if override is not None:
        return override
    raw = env_text(name, env)
    if raw is None:
        return setting.default
    try:
        return setting.parse(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{setting.env}={raw!r} is not valid: {exc}") from None


def parse_size(text: str) -> int:
    """Parse '64M' / '4K' / '1048576' into bytes."""
    try:
        return _size(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def socket_buffer_arg(value: Optional[int] = None) -> int:
    """The socket_buffer setting as the C++ core takes it: -1 keeps the core's default, 0 = kernel autotuning."""
    v = get("socket_buffer", value)
    return -1 if v is None else int(v)


def resolve_auth_token(token: Optional[str] = None, token_file: Optional[str] = None) -> Optional[str]:
    """The shared secret: an explicit token, a token file, RS_AUTH_TOKEN, RS_AUTH_TOKEN_FILE, else None."""
    if token is not None:
        return token
    path = token_file
    if path is None:
        env_token = get("auth_token")
        if env_token is not None:
            return env_token
        path = get("auth_token_file")
    if path is None:
        return None
    try:
        with open(path, "r", encoding="utf-8") as fh:
            secret = fh.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read auth token file {path!r}: {exc.strerror}") from None
    if not secret:
        raise ConfigError(f"auth token file {path!r} is empty")
    return secret


def worker_integrity(value: Union[str, bool, None] = None) -> bool:
    """The integrity setting as a worker uses it: 'on' and 'required' both ask for it (a worker
    that asks never falls back)."""
    if isinstance(value, bool):
        return value
    mode = get("integrity", None if value is None else _parse_arg("integrity", value))
    return mode is not None and mode != "off"


def _parse_arg(name: str, value: Any) -> Any:
    """An explicit argument given as text, checked like its variable (ConfigError names the argument)."""
    try:
        return SETTINGS[name].parse(str(value))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name}={value!r} is not valid: {exc}") from None


def reducer_integrity(value: Optional[str] = None, auth_token: Optional[str] = None) -> str:
    """The integrity setting as the reducer core takes it: 'off', 'on', 'required', or 'auto'
    (unset: on with a shared secret, else off). ConfigError for on/required without a secret."""
    mode = get("integrity", None if value is None else _parse_arg("integrity", value))
    if mode in ("on", "required") and not auth_token:
        raise ConfigError(f"frame integrity '{mode}' needs authentication: give the reducer a shared secret "
                          "(--auth-token-file, RS_AUTH_TOKEN, RS_AUTH_TOKEN_FILE) or set integrity off")
    return "auto" if mode is None else mode


def setup_logging(level: Optional[str] = None) -> None:
    """Configure the root logger for command-line use (the library itself never calls this)."""
    name = (level or get("log_level")).upper()
    numeric = getattr(logging, name, None)
    if not isinstance(numeric, int):
        raise ConfigError(f"unknown log level {name!r}")
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
