"""The data address a reducer reports (GetStats, `reduction-server status`) when it is reached
through another address than its own: `serve --advertise-address` / RS_ADVERTISE_ADDRESS, its
cluster entry by default, and status's note when it shows only the reducer's own view.

A port mapping (`podman run -p 17001:2223`) is played by TCP forwarders on loopback
(test_control_security.Forwarder): real reducer processes, real connections through another
port. tests/deploy/test_container_job.py does it with a container (opt-in).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import child_env
from paths import ROOT
from test_control_security import Forwarder
from test_serve import Serve, _allreduce_one, tf_config

from reducer.cli.main import main
from reducer.launch import free_ports

pytestmark = pytest.mark.timeout(90)

CONTROL_LINE = r"control plane \(gRPC health, GetStats, Drain\) on 127\.0\.0\.1:(\d+)"
DATA_LINE = r"listening on 127\.0\.0\.1:(\d+)"


@pytest.fixture
def started() -> Iterator[list]:
    """Reducer processes and forwarders, ended after the test."""
    things: list = []
    yield things
    for t in things:
        t.kill() if isinstance(t, Serve) else t.close()


def _serve(started: list, *args: str, env: dict[str, str] | None = None) -> tuple[Serve, int, int]:
    """`serve` on 127.0.0.1 (any free data and control ports): (process, data port, control port)."""
    s = Serve(["--host", "127.0.0.1", "--control-port", "0", *args], env or child_env())
    started.append(s)
    control = int(s.wait_for(CONTROL_LINE, 60).group(1))
    data = int(s.wait_for(DATA_LINE, 60).group(1))
    return s, data, control


def _status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reducer.cli.main", "status", "--timeout", "20", *args],
        env=child_env(),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _status_json(address: str) -> dict:
    proc = _status("--json", address)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (reducer,) = json.loads(proc.stdout)["reducers"]
    return reducer


def test_status_through_a_mapped_port(started) -> None:
    # Without --advertise-address: the reducer reports its own view, and status says it reached
    # the reducer elsewhere.
    _, data, control = _serve(started, "--port", "0")
    relay = Forwarder("127.0.0.1", control)
    started.append(relay)
    r = _status_json(relay.address)
    assert r["address"] == relay.address
    assert r["data_address"] == f"127.0.0.1:{data}" and r["data_address_from"] == "listen", r
    assert r["control_address"] == f"127.0.0.1:{control}", r
    proc = _status("--once", relay.address)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # the note folds at the terminal width
    assert f"127.0.0.1:{data}*" in text, proc.stdout
    assert (
        f"* {relay.address}: data 127.0.0.1:{data} as the reducer sees itself (its control port: "
        f"127.0.0.1:{control}), reached here through {relay.address}" in text
    ), proc.stdout
    assert "--advertise-address HOST:PORT" in text, proc.stdout
    # Asked at its own address: no note.
    proc = _status("--once", f"127.0.0.1:{control}")
    assert proc.returncode == 0 and "as the reducer sees itself" not in proc.stdout, proc.stdout


def test_advertised_address_is_reported_and_reaches_the_reducer(started) -> None:
    # Map the data port first, then tell the reducer the mapped address (as with `podman run -p`).
    data = free_ports(1)[0]
    data_relay = Forwarder("127.0.0.1", data)
    started.append(data_relay)
    s, bound, control = _serve(started, "--port", str(data), "--advertise-address", data_relay.address)
    assert bound == data
    s.wait_for(rf"data address reported to others \(GetStats, status\): {data_relay.address} \(from --advertise")
    control_relay = Forwarder("127.0.0.1", control)
    started.append(control_relay)
    r = _status_json(control_relay.address)
    assert r["data_address"] == data_relay.address and r["data_address_from"] == "advertise", r
    proc = _status("--once", control_relay.address)
    assert proc.returncode == 0 and "as the reducer sees itself" not in proc.stdout, proc.stdout
    # The address reported is one a worker can use: a round through the relay.
    np.testing.assert_array_equal(_allreduce_one(data_relay.address), np.arange(10, dtype=np.float32))
    assert int(_status_json(control_relay.address)["counters"]["rounds_completed"]) == 1


def test_cluster_entry_is_the_default_and_the_variable_wins(started) -> None:
    data = free_ports(1)[0]
    spec = tf_config({"ps": [f"localhost:{data}"], "worker": ["localhost:1"]}, "ps", 0)
    _, _, control = _serve(started, env=child_env(TF_CONFIG=spec))
    r = _status_json(f"127.0.0.1:{control}")
    assert r["data_address"] == f"localhost:{data}" and r["data_address_from"] == "cluster", r
    # --port elsewhere than the entry: the entry is not this reducer's address.
    _, other, control = _serve(started, "--port", "0", env=child_env(TF_CONFIG=spec))
    r = _status_json(f"127.0.0.1:{control}")
    assert r["data_address"] == f"127.0.0.1:{other}" and r["data_address_from"] == "listen", r
    # RS_ADVERTISE_ADDRESS over the cluster entry; IPv6 comes back in brackets.
    _, _, control = _serve(started, "--port", "0", env=child_env(TF_CONFIG=spec, RS_ADVERTISE_ADDRESS=" [::1]:7 "))
    r = _status_json(f"127.0.0.1:{control}")
    assert r["data_address"] == "[::1]:7" and r["data_address_from"] == "advertise", r


@pytest.mark.parametrize(
    "args, env, named",
    [
        (["--advertise-address", "nohost"], {}, "--advertise-address 'nohost' is not valid: "),
        (["--advertise-address", "h:0"], {}, "port 0 is out of range"),
        ([], {"RS_ADVERTISE_ADDRESS": "a b:1"}, "RS_ADVERTISE_ADDRESS='a b:1' is not valid: "),
    ],
)
def test_bad_advertise_address_is_one_line_exit_2(monkeypatch, capsys, args, env, named) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["serve", "--port", "0", "--control-port", "off", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reduction-server serve: error: ") and named in err and err.count("\n") == 1, err


def test_own_view_note_only_when_reached_elsewhere() -> None:
    from reducer.cli.status import own_view_note

    mine = {"address": "127.0.0.1:2223", "data_address": "127.0.0.1:2222", "control_address": "127.0.0.1:2223"}
    assert own_view_note(dict(mine, data_address_from="listen")) is None
    assert own_view_note(dict(mine, data_address_from="listen", address="localhost:2223")) is None
    assert own_view_note(dict(mine, data_address_from="advertise", address="127.0.0.1:18081")) is None
    assert own_view_note(dict(mine, data_address_from="cluster", address="10.0.0.3:2223")) is None
    # A reducer older than the fields says nothing about its own view: no note.
    assert own_view_note(dict(mine, data_address_from="", control_address="", address="127.0.0.1:9")) is None
    note = own_view_note(dict(mine, data_address_from="listen", address="10.0.0.3:2223"))
    assert note is not None and "reached here through 10.0.0.3:2223" in note
    # Whatever a reducer sends as its control address: a note, no exception.
    assert own_view_note(dict(mine, data_address_from="listen", control_address="[garbage")) is not None
