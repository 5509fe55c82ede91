"""Every documented setting works through every entry point that applies to it (issue 23, point 2).

The settings the C++ core reads are defined once, in csrc/common/settings.h (bound as
reducer._core.SETTINGS); reducer/config.py builds its rows for them from that table, and the NCCL
plugin reads them with the same C++ reader (client/client_settings.h, bound here as
_core.read_client_options). These tests keep the Communicator / reducer.init signature, the config
table and the C++ table in agreement name by name, and check, setting by setting, that a value
given as an argument to Communicator(...), as an argument to reducer.init(...), as its RS_*
variable, and (for the plugin's settings) to the plugin's reader, reaches the client it configures.
A malformed value of every setting is a ConfigError naming the variable, on every path.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nccl_harness as H
import pytest
from attack_tools import serve
from paths import DOCS, TESTS

import reducer
from reducer import _core, config
from reducer.communicator import Communicator
from reducer.errors import ConfigError

SECRET = "entry-point-secret"
NATIVE = {row["name"]: row for row in _core.SETTINGS}
NON_OPTIONS = ("self", "reducers", "rank", "world_size", "job_id")  # discovery, not settings

# name -> (text for the variable, the value the client runs with, how to read it off a Communicator).
# Every setting a Communicator takes must be here: test_every_worker_setting_has_a_case checks it.
Effect = Callable[[Communicator], Any]


def _opt(field: str) -> Effect:
    return lambda comm: comm._client.options()[field]


CASES: dict[str, tuple[str, Any, Effect]] = {
    "timeout": ("12.5", 12.5, _opt("timeout")),
    "connect_timeout": (" 45 ", 45.0, _opt("connect_timeout")),
    "streams": ("2", 2, _opt("streams")),
    "chunk_bytes": ("64K", 65536, _opt("chunk_bytes")),
    "window": ("3", 3, _opt("window")),
    "max_rounds_in_flight": ("5", 5, _opt("max_rounds_in_flight")),
    "failover": ("OFF", False, _opt("failover")),
    "socket_buffer": ("256k", 262144, _opt("socket_buffer")),
    "auth_token": (SECRET, SECRET, _opt("auth_token")),
    "integrity": ("On", True, _opt("integrity")),
    "group": ("entry-points", "entry-points", _opt("group")),
    "fusion_threshold": ("1M", 1 << 20, lambda comm: comm.fusion_threshold),
    "cycle_time_ms": ("7.5", 7.5, lambda comm: comm.cycle_time_ms),
    "compression": ("bf16", "bf16", lambda comm: comm.compression),
}

# A malformed text for every setting (None: any text is valid, e.g. a name or a path).
BAD: dict[str, str | None] = {
    "timeout": "0",
    "connect_timeout": "-3",
    "streams": "0",
    "chunk_bytes": "1001",
    "window": "2000",
    "max_rounds_in_flight": "0",
    "failover": "maybe",
    "socket_buffer": "3G",
    "tcp_congestion": None,
    "keepalive_idle": "0",
    "keepalive_interval": "2s",
    "keepalive_count": "128",
    "tcp_user_timeout": "-1",
    "auth_token": None,
    "auth_token_file": None,
    "integrity": "sometimes",
    "handshake_timeout": "nan",
    "nccl_socket_ifname": None,
    "nccl_nsocks": "17",
    "nccl_p2p_plugin": None,
    "reducers": None,
    "rank": "one",
    "world_size": "x",
    "group": None,
    "job_id": None,
    "fusion_threshold": "12Q",
    "cycle_time_ms": "soon",
    "compression": None,
    "local_rank": "x",
    "local_world_size": "2.5",
    "host": None,
    "port": "http",
    "threads": "many",
    "max_group_bytes": "-1",
    "max_memory_bytes": "lots",
    "max_memory_per_job": "1.5.0G",
    "max_memory_per_peer": "x",
    "memory_idle_timeout": "x",
    "group_slots": "x",
    "group_timeout": "x",
    "max_connections": "x",
    "max_connections_per_peer": "x",
    "max_groups_per_peer": "x",
    "control_port": "70000",
    "metrics_port": "-5",
    "allow_unauthenticated_drain": "perhaps",
    "control_max_connections": "x",
    "control_max_connections_per_peer": "x",
    "control_rate": "x",
    "metrics_groups": "x",
    "drain_timeout": "-1",
    "stats_interval": "soon",
    "log_level": None,
    "advertise_address": "reducer-0",
}


def _communicator_options() -> set:
    return set(inspect.signature(Communicator.__init__).parameters) - set(NON_OPTIONS)


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for s in config.SETTINGS.values():
        monkeypatch.delenv(s.env, raising=False)
    yield monkeypatch


@pytest.fixture(scope="module")
def reducer_address() -> Iterator[str]:
    with serve(auth_token=SECRET) as srv:  # a secret: integrity is offered, auth is checked
        yield f"127.0.0.1:{srv.port}"


# -- one definition: the signature, the config table and the C++ table agree name by name ----------


def test_config_rows_of_cpp_settings_are_the_cpp_table() -> None:
    for name, row in NATIVE.items():
        setting = config.SETTINGS[name]
        assert setting.native and setting.env == row["env"] and setting.default == row["default"], name
    assert {n for n, s in config.SETTINGS.items() if s.native} == set(NATIVE)


def test_communicator_signature_is_the_worker_settings() -> None:
    options = _communicator_options()
    assert options <= set(config.SETTINGS), options - set(config.SETTINGS)
    assert {n for n, row in NATIVE.items() if row["worker"]} == {n for n in options if n in NATIVE}
    assert options == set(CASES), "every Communicator option needs an entry-point case here"


def test_client_defaults_are_the_table() -> None:
    """ClientOptions' defaults (client.h) and what the plugin's reader gives with nothing set."""
    got = _core.read_client_options({})
    for name in (
        "timeout",
        "connect_timeout",
        "streams",
        "chunk_bytes",
        "window",
        "max_rounds_in_flight",
        "failover",
        "socket_buffer",
    ):
        assert got[name] == NATIVE[name]["default"], name
    assert got["auth_token"] == "" and got["integrity"] is False


def test_every_setting_has_a_malformed_case() -> None:
    assert set(BAD) == set(config.SETTINGS)


def test_documented_settings_are_the_table() -> None:
    doc = (DOCS / "configuration.md").read_text(encoding="utf-8")
    rows = [line.split("|") for line in doc.splitlines() if line.startswith("| `")]
    names = {cells[1].strip().strip("`") for cells in rows if cells[2].strip().startswith("`")}
    assert names == set(config.SETTINGS), names ^ set(config.SETTINGS)


# -- every entry point reaches the client ---------------------------------------------------------


def _connect(address: str, entry: str, name: str, monkeypatch: pytest.MonkeyPatch) -> Communicator:
    text, value, _ = CASES[name]
    kwargs: dict[str, Any] = {} if name == "auth_token" else {"auth_token": SECRET}
    if name == "chunk_bytes":
        kwargs["fusion_threshold"] = 0  # below the fused buffer's size: irrelevant here
    if entry == "env":
        monkeypatch.setenv(config.SETTINGS[name].env, text)
    else:
        kwargs[name] = "on" if name == "integrity" else value
    if entry == "init":
        return reducer.init(reducers=[address], rank=0, world_size=1, **kwargs)
    return Communicator([address], 0, 1, **kwargs)


@pytest.mark.parametrize("entry", ["argument", "init", "env"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_worker_setting_reaches_the_client(
    reducer_address: str, clean_env: pytest.MonkeyPatch, name: str, entry: str
) -> None:
    comm = _connect(reducer_address, entry, name, clean_env)
    try:
        assert CASES[name][2](comm) == CASES[name][1]
    finally:
        comm.close()


@pytest.mark.parametrize("name", sorted(n for n, row in NATIVE.items() if row["plugin"] and n in CASES))
def test_plugin_setting_reaches_the_client_options(name: str) -> None:
    text, value, _ = CASES[name]
    assert _core.read_client_options({NATIVE[name]["env"]: text})[name] == value


def test_auth_token_file_through_env_and_plugin(
    reducer_address: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n", encoding="utf-8")
    assert _core.read_client_options({"RS_AUTH_TOKEN_FILE": str(path)})["auth_token"] == SECRET
    with pytest.raises(ConfigError, match="^RS_AUTH_TOKEN_FILE="):
        _core.read_client_options({"RS_AUTH_TOKEN_FILE": str(tmp_path / "missing")})
    clean_env.setenv("RS_AUTH_TOKEN_FILE", str(path))
    with Communicator([reducer_address], 0, 1) as comm:
        assert comm._client.options()["auth_token"] == SECRET


# -- a malformed value names its variable, on every path -----------------------------------------


@pytest.mark.parametrize("name", sorted(n for n, bad in BAD.items() if bad is not None))
def test_malformed_value_names_the_variable(clean_env: pytest.MonkeyPatch, name: str) -> None:
    setting = config.SETTINGS[name]
    env = {setting.env: BAD[name]}
    with pytest.raises(ConfigError, match=f"^{setting.env}="):
        config.get(name, env=env)
    row = NATIVE.get(name)
    if row is not None and row["plugin"] and name in CASES:
        with pytest.raises(ConfigError, match=f"^{setting.env}="):
            _core.read_client_options(env)
    if name in CASES:  # refused before any connection is made
        clean_env.setenv(setting.env, BAD[name])
        with pytest.raises(ConfigError, match=f"^{setting.env}="):
            Communicator(["127.0.0.1:1"], 0, 1, auth_token=SECRET)


@pytest.mark.parametrize("text,value", [("TRUE", True), (" yes ", True), ("Off", False), ("0", False)])
def test_booleans_and_modes_any_case_everywhere(text: str, value: bool) -> None:
    assert config.get("failover", env={"RS_FAILOVER": text}) is value
    assert _core.read_client_options({"RS_FAILOVER": text})["failover"] is value
    assert config.get("allow_unauthenticated_drain", env={"RS_ALLOW_UNAUTHENTICATED_DRAIN": text}) is value


def test_blank_is_unset_everywhere() -> None:
    blank = {row["env"]: "  " for row in NATIVE.values()}
    defaults = _core.read_client_options({})
    assert _core.read_client_options(blank) == defaults
    for name in NATIVE:
        assert config.get(name, env={config.SETTINGS[name].env: " "}) == config.SETTINGS[name].default


# -- the plugin's point-to-point settings, through the built plugin itself ----------------------

_PLUGIN_INIT = (
    "import ctypes as C, nccl_harness as H\n"
    "p = H.Plugin(); net = p.net(12); ctx = C.c_void_p()\n"
    "rc = net.init(C.byref(ctx), 1, None, p.logger, None)\n"
    "print(rc); print(p.log_text())\n"
)


def _plugin_init(env: dict[str, str]) -> tuple[int, str]:
    """net.init of the NCCL plugin in a fresh process (it reads its settings once per load)."""
    full = {k: v for k, v in os.environ.items() if k not in H.CLUSTER_VARS and not k.startswith("RS_NCCL")}
    out = subprocess.run(
        [sys.executable, "-c", _PLUGIN_INIT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=TESTS,
        env={**full, **env},
    ).stdout
    rc, log = out.split("\n", 1)
    return int(rc), log


@pytest.mark.parametrize(
    "env,expect",
    [
        ({"RS_NCCL_SOCKET_IFNAME": " lo ", "RS_NCCL_NSOCKS": "3"}, "TCP on lo (127.0.0.1), 3 socket(s) per connection"),
        ({"RS_NCCL_SOCKET_IFNAME": "lo", "RS_NCCL_NSOCKS": " "}, "TCP on lo (127.0.0.1), 2 socket(s) per connection"),
    ],
)
def test_plugin_p2p_settings_reach_the_plugin(env: dict[str, str], expect: str) -> None:
    rc, log = _plugin_init(env)
    assert rc == 0 and expect in log, log


def test_plugin_refuses_a_malformed_p2p_setting_naming_it() -> None:
    rc, log = _plugin_init({"RS_NCCL_SOCKET_IFNAME": "lo", "RS_NCCL_NSOCKS": BAD["nccl_nsocks"] or ""})
    assert rc != 0 and "RS_NCCL_NSOCKS='17' is not valid: out of range 1..16" in log, log
