"""Every setting of reduction-server, its RS_* environment variable and default, in one table.

The settings the C++ core reads (the worker client's, the NCCL plugin's, the reducer node's: host,
port, threads, group slots, timeouts, memory and connection limits) are defined once, in
csrc/common/settings.h: their rows here are built from the bound copy (reducer._core.SETTINGS)
with the defaults the C++ client and reducer start from, and their text is parsed by the same C++
code (_core.parse_setting), so Python, the C++ client, the reducer and the NCCL plugin cannot read
a variable differently. The rows below are the settings only Python reads; their booleans,
integers and sizes go through the same C++ rules (_core.parse_kind).

Rule everywhere: an explicit argument wins, then the RS_* variable, then the default. A variable
that is unset or blank (empty or only whitespace) counts as not set: the default applies. Every
seconds value (a *_timeout setting, its variable, argument or command-line flag) is at most
MAX_SECONDS (1e9 s): more is a ConfigError naming it (check_seconds, the C++ rule).
Every reader of a setting goes through get() (or env_text() for the raw text), with os.environ or
an explicit mapping. docs/configuration.md is the human-readable copy of SETTINGS, and `serve
--help` shows their defaults (default_text(), flag_help()): tests/config/test_reducer_settings.py checks
they agree with the table, and the reducer's own defaults (reducer._core.SERVER_DEFAULTS) too.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _core
from .errors import ConfigError


@dataclass(frozen=True)
class Setting:
    name: str  # argument name in the Python API
    env: str  # environment variable
    default: Any
    parse: Callable[[str], Any]
    doc: str
    native: bool = False  # defined by csrc/common/settings.h (parsed there too)


def _kind(kind: str) -> Callable[[str], Any]:
    """The C++ rule of `kind` (bool, int or size: csrc/common/settings.h) for a Python-only setting
    (a ValueError saying why; get() names the variable)."""
    return functools.partial(_core.parse_kind, kind)


_bool, _int, _size = _kind("bool"), _kind("int"), _kind("size")

# The largest value of every seconds setting, variable, argument and flag (1e9 s, about 31 years:
# csrc/common/defaults.h kMaxSeconds). More is refused, naming what gave it (check_seconds, and
# the C++ core's own checks); every conversion in the core saturates there (net::duration_of).
MAX_SECONDS: float = float(_core.MAX_SECONDS)


def check_seconds(value: float, what: str, zero: bool = False) -> float:
    """`value` as a number of seconds: finite, > 0 (or 0 with zero=True: "never" / "the default")
    and at most MAX_SECONDS, else ConfigError naming `what` (the C++ rule, one for all)."""
    return float(_core.check_seconds(float(value), what, zero))


OFF = -1  # control_port / metrics_port: the listener is disabled


def _only_why(exc: ConfigError) -> ValueError:
    """A ConfigError's "NAME=VALUE is not valid: WHY" as a ValueError saying only WHY (for a rule
    whose caller names the variable or flag itself)."""
    return ValueError(str(exc).split(" is not valid: ", 1)[-1])


def _seconds_or_zero(text: str) -> float:
    """A number of seconds >= 0 (0: 'never' / 'none'), at most MAX_SECONDS (a ValueError saying why:
    get() names the variable)."""
    try:
        return check_seconds(float(text), "seconds", zero=True)
    except ConfigError as exc:
        raise _only_why(exc) from None


def _port_or_off(text: str) -> int | None:
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


def _address(text: str) -> str:
    """``host:port`` (IPv6 in brackets), checked by the one parser (csrc/net/address.cc); a
    ValueError saying why (get() names the variable)."""
    try:
        host, port = _core.parse_address(text.strip())
    except ValueError as exc:  # ConfigError: re-raised as the plain reason, so get() names the variable
        raise ValueError(str(exc)) from None
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


_PYTHON_ONLY = [
    # -- worker client ---------------------------------------------------------
    Setting(
        "reducers",
        "RS_REDUCERS",
        None,
        lambda s: [a.strip() for a in s.split(",") if a.strip()],
        "Comma-separated reducer addresses host:port (IPv6 as [addr]:port); used when no "
        "CLUSTER_SPEC/TF_CONFIG is set.",
    ),
    Setting("rank", "RS_RANK", None, _int, "This worker's global rank (with RS_REDUCERS)."),
    Setting("world_size", "RS_WORLD_SIZE", None, _int, "Number of worker processes in the group (with RS_REDUCERS)."),
    Setting("group", "RS_GROUP", "default", str, "Group name: workers with the same job id and group reduce together."),
    Setting("job_id", "RS_JOB_ID", None, str, "Job id (default: CLOUD_ML_JOB_ID if set, else 'local')."),
    Setting(
        "fusion_threshold",
        "RS_FUSION_THRESHOLD",
        64 << 20,
        _size,
        "Fused buffer size in bytes for allreduce_async; 0 turns fusion off.",
    ),
    Setting(
        "cycle_time_ms",
        "RS_CYCLE_TIME_MS",
        5.0,
        float,
        "After this many milliseconds a worker asks the group for an agreed flush of partly filled fused "
        "buffers (cut points never depend on timing).",
    ),
    Setting("compression", "RS_COMPRESSION", None, str, "Wire compression for float32: 'bf16', 'fp16' or none."),
    Setting(
        "local_rank", "LOCAL_RANK", None, _int, "Rank of this process on its node (set by torchrun / the launcher)."
    ),
    Setting("local_world_size", "LOCAL_WORLD_SIZE", None, _int, "Processes per node (set by torchrun / the launcher)."),
    # -- reducer node: host, port, threads, the limits (group_slots, group_timeout, max_memory_*,
    # max_connections*, ...) are rows of the C++ table (csrc/common/settings.h, ServerOptions).
    # -- reducer control plane -------------------------------------------------
    Setting(
        "control_port",
        "RS_CONTROL_PORT",
        None,
        _port_or_off,
        "Reducer: gRPC control-plane port (health, GetStats, Drain); 0 = any free port, 'off' = none "
        "(default: data port + 1).",
    ),
    Setting(
        "metrics_port",
        "RS_METRICS_PORT",
        None,
        _port_or_off,
        "Reducer: Prometheus metrics port (HTTP /metrics); 0 = any free port (default: off).",
    ),
    Setting(
        "allow_unauthenticated_drain",
        "RS_ALLOW_UNAUTHENTICATED_DRAIN",
        False,
        _bool,
        "Reducer without a shared secret: let anyone who reaches the control port Drain it (default: refused).",
    ),
    Setting(
        "control_max_connections",
        "RS_CONTROL_MAX_CONNECTIONS",
        32,
        _int,
        "Reducer: open connections to the control port, and to the metrics port, each (lowered to fit the "
        "descriptors the data plane leaves free).",
    ),
    Setting(
        "control_max_connections_per_peer",
        "RS_CONTROL_MAX_CONNECTIONS_PER_PEER",
        4,
        _int,
        "Reducer: open connections from one IP address (IPv6: one /64) to the control port, and to the metrics port.",
    ),
    Setting(
        "control_rate",
        "RS_CONTROL_RATE",
        50.0,
        float,
        "Reducer: requests per second one IP address (IPv6: one /64) may make to the control port (gRPC calls), "
        "and to the metrics port, each with a burst as large; 0 = no limit.",
    ),
    Setting(
        "metrics_groups",
        "RS_METRICS_GROUPS",
        100,
        _int,
        "Reducer: groups with their own series on /metrics (job and group labels); 0 = no per-group series.",
    ),
    Setting(
        "drain_timeout",
        "RS_DRAIN_TIMEOUT",
        10.0,
        _seconds_or_zero,
        "Reducer node (`serve`): on SIGTERM/SIGINT, seconds the rounds in flight get to finish before it closes.",
    ),
    Setting(
        "stats_interval",
        "RS_STATS_INTERVAL",
        60.0,
        _seconds_or_zero,
        "Reducer node (`serve`): seconds between its stats lines, logged at DEBUG level; 0 = never.",
    ),
    # -- general ---------------------------------------------------------------
    Setting("log_level", "RS_LOG_LEVEL", "INFO", str, "Logging level of the library and the CLI."),
    # -- reducer node: the data address it tells others (GetStats, `status`) ----
    Setting(
        "advertise_address",
        "RS_ADVERTISE_ADDRESS",
        None,
        _address,
        "Reducer: the HOST:PORT at which others reach its data port, reported by GetStats and `status` "
        "(default: its own CLUSTER_SPEC/TF_CONFIG entry, else the address it binds); set it behind a "
        "port mapping or NAT.",
    ),
]


def _native_rows() -> list[Setting]:
    """The rows of the settings the C++ core defines (csrc/common/settings.h), parsed there."""
    return [
        Setting(
            row["name"],
            row["env"],
            row["default"],
            functools.partial(_core.parse_setting, row["name"]),
            row["doc"],
            native=True,
        )
        for row in _core.SETTINGS
    ]


SETTINGS: dict[str, Setting] = {s.name: s for s in _native_rows() + _PYTHON_ONLY}
assert len(SETTINGS) == len(_core.SETTINGS) + len(_PYTHON_ONLY), "a setting is defined in C++ and in Python"


def default_text(name: str) -> str:
    """A setting's default as docs/configuration.md's Default column and `--help` show it: 'unset'
    when it has none (its meaning says what applies then), booleans as true/false."""
    value = SETTINGS[name].default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flag_help(name: str, meaning: str | None = None) -> str:
    """The --help text of a command-line flag for a setting: its meaning (the table's, or the
    flag's own wording), then its variable and default from the table (argparse-escaped)."""
    setting = SETTINGS[name]
    if meaning is None:
        doc = setting.doc.removeprefix("Reducer: ").rstrip(".")
        meaning = doc[:1].lower() + doc[1:]
    default = f"${setting.env}" if setting.default is None else f"${setting.env}, else {default_text(name)}"
    return f"{meaning} (default: {default})".replace("%", "%%")


def env_text(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The text of a setting's variable in `env` (default os.environ); None when unset or blank."""
    raw = (os.environ if env is None else env).get(SETTINGS[name].env)
    return None if raw is None or raw.strip() == "" else raw


def get(name: str, override: Any = None, env: Mapping[str, str] | None = None) -> Any:
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
    except ConfigError:
        raise  # a C++-defined setting: its message already names the variable
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{setting.env}={raw!r} is not valid: {exc}") from None


def parse_text(name: str, text: str) -> Any:
    """A setting's text parsed by its rule (None when blank); ValueError saying only why it is not
    valid (for a command-line flag's type: argparse names the flag)."""
    try:
        return SETTINGS[name].parse(text)
    except ConfigError as exc:  # a C++-defined setting's message names its variable: keep the why
        raise _only_why(exc) from None


def parse_size(text: str) -> int:
    """Parse '64M' / '4K' / '1048576' into bytes."""
    try:
        return _size(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def compression_wire(compression: str | None) -> str | None:
    """The wire dtype name ('bfloat16', 'float16') of a float32 round under `compression`, None for
    none. The names (any case: 'bf16', 'bfloat16', 'fp16', 'float16', 'half', 'none', ...) are
    csrc/common/compression.h's (reducer._core.COMPRESSIONS); ConfigError for any other."""
    return None if compression is None else _core.compression_wire(str(compression))


# The canonical compression names ('bf16', 'fp16'), for command-line choices.
COMPRESSION_NAMES: tuple[str, ...] = tuple(sorted(set(_core.COMPRESSIONS.values()) - {"none"}))


def compression_name(compression: str | None) -> str | None:
    """The canonical name ('bf16', 'fp16') of a compression name (as compression_wire), None for none."""
    wire = compression_wire(compression)
    return None if wire is None else str(_core.COMPRESSIONS[wire])


def socket_buffer_arg(value: int | None = None) -> int:
    """The socket_buffer setting in bytes (0 = kernel autotuning; the default is the C++ table's)."""
    return int(get("socket_buffer", value))


def resolve_auth_token(token: str | None = None, token_file: str | None = None) -> str | None:
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
        with open(path, encoding="utf-8") as fh:
            secret = fh.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read auth token file {path!r}: {exc.strerror}") from None
    if not secret:
        raise ConfigError(f"auth token file {path!r} is empty")
    warning = _core.secret_file_warning(path)
    if warning:  # used all the same (docs/security.md, "The secret file")
        logging.getLogger("reducer.config").warning("%s", warning)
    return secret


def worker_integrity(value: str | bool | None = None) -> bool:
    """The integrity setting as a worker uses it: 'on' and 'required' both ask for it (a worker
    that asks never falls back)."""
    if isinstance(value, bool):
        return value
    mode = get("integrity", None if value is None else _parse_arg("integrity", value))
    return mode is not None and mode != "off"


def _parse_arg(name: str, value: Any) -> Any:
    """An explicit argument given as text, checked like its variable (ConfigError names the argument)."""
    setting = SETTINGS[name]
    if setting.native:
        return _core.parse_setting(name, str(value), name)
    try:
        return setting.parse(str(value))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name}={value!r} is not valid: {exc}") from None


def reducer_integrity(value: str | None = None, auth_token: str | None = None) -> str:
    """The integrity setting as the reducer core takes it: 'off', 'on', 'required', or 'auto'
    (unset: on with a shared secret, else off). ConfigError for on/required without a secret."""
    mode = get("integrity", None if value is None else _parse_arg("integrity", value))
    if mode in ("on", "required") and not auth_token:
        raise ConfigError(
            f"frame integrity '{mode}' needs authentication: give the reducer a shared secret "
            "(--auth-token-file, RS_AUTH_TOKEN, RS_AUTH_TOKEN_FILE) or set integrity off"
        )
    return "auto" if mode is None else mode


def setup_logging(level: str | None = None) -> None:
    """Configure the root logger for command-line use (the library itself never calls this)."""
    name = (level or get("log_level")).upper()
    numeric = getattr(logging, name, None)
    if not isinstance(numeric, int):
        raise ConfigError(f"unknown log level {name!r}")
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
