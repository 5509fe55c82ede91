"""The reducer's settings are rows of the one settings table (issue 30, house 3).

host, port, threads, group_slots, group_timeout, the memory limits and shares, memory_idle_timeout
and the connection limits are defined once, in csrc/common/settings.h (bound as
reducer._core.SETTINGS), with the common/defaults.h constants the C++ reducer's ServerOptions
starts from. These tests keep every copy in step with that table: the C++ reducer's own defaults
(a default-made ServerOptions, reducer._core.SERVER_DEFAULTS), reducer/config.py's rows (real
defaults, not None), what ReducerServer hands the core with nothing set, `reduction-server serve`'s
flags and --help, and the Default column of docs/configuration.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest
from conftest import child_env
from paths import ROOT

from reducer import _core, addresses, config
from reducer import server as server_module
from reducer.cli import main as cli_main
from reducer.errors import ConfigError

NATIVE = {row["name"]: row for row in _core.SETTINGS}
REDUCER_ROWS = {n for n, row in NATIVE.items() if row["reducer"]}
# The reducer node's own settings: rows of the C++ table now (they were Python-only rows with
# default None, their defaults written in server.h, config.py's docs and serve's help apart).
NODE = (
    "host",
    "port",
    "threads",
    "group_slots",
    "group_timeout",
    "max_group_bytes",
    "max_memory_bytes",
    "max_memory_per_job",
    "max_memory_per_peer",
    "memory_idle_timeout",
    "max_connections",
    "max_connections_per_peer",
    "max_groups_per_peer",
)
# Settings whose default is worked out when unset (the table has none): what applies then.
DERIVED = {"port": "its CLUSTER_SPEC/TF_CONFIG entry, else 2222 (serve); any free port (ReducerServer)"}

pytestmark = pytest.mark.timeout(60)


def test_reducer_node_settings_are_rows_of_the_cpp_table() -> None:
    for name in NODE:
        assert name in REDUCER_ROWS, name
        setting = config.SETTINGS[name]
        assert setting.native and setting.default == NATIVE[name]["default"], name
        assert (setting.default is None) == (name in DERIVED), f"{name}: a real default, or say how it is derived"
    assert str(addresses.DEFAULT_PORT) in NATIVE["port"]["doc"]


def test_cpp_reducer_defaults_are_the_table() -> None:
    """A default-made ServerOptions (server/server.h) against the table, through the binding."""
    got = dict(_core.SERVER_DEFAULTS)
    assert got.pop("integrity") == "auto" and NATIVE["integrity"]["default"] is None  # unset: by the secret
    assert got.pop("port") == 0 and NATIVE["port"]["default"] is None  # the API's default: any free port
    assert set(got) <= REDUCER_ROWS, set(got) - REDUCER_ROWS
    for name, value in got.items():
        assert value == NATIVE[name]["default"], f"ServerOptions.{name} = {value!r}, the table says {NATIVE[name]}"
    # Every reducer row that is an option of the node has its default there.
    assert {n for n in NODE if n not in DERIVED} <= set(got)


def test_reducer_server_hands_the_core_the_table_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in config.SETTINGS.values():
        monkeypatch.delenv(s.env, raising=False)
    srv = server_module.ReducerServer(host="127.0.0.1", port=0)  # not started: the options as given
    limits = srv.limits()
    assert set(server_module._LIMITS) <= REDUCER_ROWS
    for name in server_module._LIMITS:
        assert limits[name] == NATIVE[name]["default"], name
    assert srv.threads == NATIVE["threads"]["default"]


def _serve_parser() -> argparse.ArgumentParser:
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_serve_flags_default_to_the_table() -> None:
    """Every serve flag of a setting leaves it unset (so its variable, then the table's default,
    applies) and its help names the variable and shows the table's default."""
    parser = _serve_parser()
    flags = {a.dest: a for a in parser._actions if a.dest in config.SETTINGS}
    assert {"host", "port", "threads", "max_memory_per_job", "max_memory_per_peer", "memory_idle_timeout"} <= set(flags)
    args = parser.parse_args([])
    for name, action in flags.items():
        assert getattr(args, name) is None, f"--{name} has a default of its own"
        assert config.get(name, getattr(args, name), env={}) == config.SETTINGS[name].default, name
        if name == "auth_token_file":  # two settings (RS_AUTH_TOKEN first): its help says so
            continue
        setting = config.SETTINGS[name]
        default = "" if setting.default is None else f", else {config.default_text(name)}"
        assert action.help.endswith(f"(default: ${setting.env}{default})"), (name, action.help)


def test_serve_help_shows_the_table_defaults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "reducer.cli.main", "serve", "--help"],
        env=child_env(),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps lines
    for name in ("host", "threads", "max_memory_per_job", "memory_idle_timeout"):
        assert f"${config.SETTINGS[name].env}, else {config.default_text(name)})" in text, name


def test_docs_default_column_is_the_table() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {}
    for line in doc.splitlines():
        m = re.match(r"\| `(\w+)` \| `(\w+)` \| (.*?) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    assert set(rows) == set(config.SETTINGS), set(rows) ^ set(config.SETTINGS)
    for name, setting in config.SETTINGS.items():
        env, default = rows[name]
        assert env == setting.env, name
        shown = "unset" if setting.default is None else f"`{config.default_text(name)}`"
        assert default.startswith(shown), f"docs/configuration.md: {name}'s default is {default!r}, the table's {shown}"


def test_reducer_settings_are_read_by_the_cpp_rules() -> None:
    """One rule per kind, with the table's bounds: what the core refused at start (group_slots
    65) is refused where it is read, naming the variable; memory_idle_timeout's 0 is 'never'."""
    assert config.get("memory_idle_timeout", env={"RS_MEMORY_IDLE_TIMEOUT": "0"}) == 0.0
    assert config.get("max_memory_per_job", env={"RS_MAX_MEMORY_PER_JOB": "8G"}) == 8 << 30
    for env, text in [
        ("RS_GROUP_SLOTS", "65"),
        ("RS_THREADS", "-1"),
        ("RS_MEMORY_IDLE_TIMEOUT", "nan"),
        ("RS_GROUP_TIMEOUT", "0"),
        ("RS_MAX_CONNECTIONS", "0"),
    ]:
        name = next(n for n, s in config.SETTINGS.items() if s.env == env)
        with pytest.raises(ConfigError, match=f"^{env}='{text}' is not valid"):
            config.get(name, env={env: text})
