"""`reduction-server serve`: a reducer that configures itself from CLUSTER_SPEC / TF_CONFIG."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from conftest import CHILD_ENV_DROP, child_env, serve_argv, start_serve
from paths import ROOT

import reducer
from reducer import config, server
from reducer.cli.main import main
from reducer.errors import AuthError, ConfigError
from reducer.launch import free_ports

pytestmark = pytest.mark.timeout(60)


def _env(**extra: str) -> dict[str, str]:
    return child_env(**extra)


def vertex_spec(pools: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps(
        {"cluster": pools, "environment": "cloud", "task": {"type": task_type, "index": index, "trial": ""}, "job": {}}
    )


def tf_config(pools: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": pools, "task": {"type": task_type, "index": index}, "environment": "cloud"})


class Serve:
    """`reduction-server serve` in a subprocess, its log collected in the background."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = start_serve(*args, host=None, port=None, env=env)
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()

    @property
    def log(self) -> str:
        with self._cond:
            return "".join(self._lines)

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                m = re.search(pattern, "".join(self._lines))
                if m:
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{pattern!r} not in the log:\n{''.join(self._lines)}")
                self._cond.wait(min(left, 0.2))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def served():
    started: list[Serve] = []

    def make(args: list[str], env: dict[str, str]) -> Serve:
        s = Serve(args, env)
        started.append(s)
        return s

    yield make
    for s in started:
        s.kill()


def _allreduce_one(address: str, **kw) -> np.ndarray:
    with reducer.Communicator([address], rank=0, world_size=1, timeout=10, connect_timeout=10, **kw) as comm:
        a = np.arange(10, dtype=np.float32)
        comm.allreduce(a)
        return a


# -- from the cluster description ---------------------------------------------------------------


def test_cluster_spec_workerpool2_binds_its_own_port(served):
    p0, p1, w0, w1 = free_ports(4)
    pools = {
        "workerpool0": [f"127.0.0.1:{w0}"],
        "workerpool1": [f"127.0.0.1:{w1}"],
        "workerpool2": [f"127.0.0.1:{p0}", f"127.0.0.1:{p1}"],
    }
    s = served([], _env(CLUSTER_SPEC=vertex_spec(pools, "workerpool2", 1), RS_DRAIN_TIMEOUT="3.5"))
    s.wait_for(rf"listening on 0\.0\.0\.0:{p1} \(port from CLUSTER_SPEC entry workerpool2\[1\]")
    log = s.log
    assert "this is reducer 1 of 2 (workerpool2 index 1)" in log
    assert f"2 worker node(s): 127.0.0.1:{w0}, 127.0.0.1:{w1}" in log
    np.testing.assert_array_equal(_allreduce_one(f"127.0.0.1:{p1}"), np.arange(10, dtype=np.float32))
    assert s.stop(signal.SIGTERM) == 0
    assert "received SIGTERM: stopping (draining rounds in flight for up to 3.5s)" in s.log  # RS_DRAIN_TIMEOUT
    assert "stopped after 1 round" in s.log


def test_tf_config_ps_and_sigint(served):
    (p,) = free_ports(1)
    pools = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": [f"127.0.0.1:{p}"]}
    s = served([], _env(TF_CONFIG=tf_config(pools, "ps", 0)))
    s.wait_for(rf"listening on 0\.0\.0\.0:{p} \(port from TF_CONFIG entry ps\[0\]")
    assert "TF_CONFIG: this is reducer 0 of 1 (ps index 0)" in s.log
    assert s.stop(signal.SIGINT) == 0
    assert "received SIGINT" in s.log


def test_no_cluster_uses_rs_port_and_ready_file(served, tmp_path):
    (p,) = free_ports(1)
    ready = tmp_path / "ready"
    s = served(
        ["--host", "127.0.0.1", "--ready-file", str(ready), "--stats-interval", "0.3"],
        _env(RS_PORT=str(p), RS_LOG_LEVEL="DEBUG"),
    )
    s.wait_for(rf"listening on 127\.0\.0\.1:{p} \(port from RS_PORT")
    assert "no cluster description" in s.log
    assert ready.read_text().strip() == f"127.0.0.1:{p}"
    s.wait_for(r"DEBUG reducer\.serve: stats: bytes_received=0, .*rounds_completed=0")  # periodic, at DEBUG
    assert s.stop() == 0


def test_rs_port_and_flags_override(tmp_path):
    pools = {"workerpool0": ["w:2222"], "workerpool2": ["r0:2222", "r1:3333"]}
    env = {"CLUSTER_SPEC": vertex_spec(pools, "workerpool2", 1)}
    plan = server.resolve_listen(env=env)
    assert (plan.host, plan.port, plan.cluster.node_rank) == ("0.0.0.0", 3333, 1)
    plan = server.resolve_listen(env={**env, "RS_PORT": "4444", "RS_HOST": "127.0.0.1"})
    assert (plan.host, plan.port, plan.origin) == ("127.0.0.1", 4444, "RS_PORT")
    plan = server.resolve_listen(host="::", port=5555, env={**env, "RS_PORT": "4444", "RS_HOST": "127.0.0.1"})
    assert (plan.host, plan.port, plan.origin) == ("::", 5555, "--port")
    assert plan.cluster is not None and plan.warning is None
    # No cluster at all: RS_PORT, else 2222 (Vertex AI's port).
    assert server.resolve_listen(env={}).port == 2222
    assert server.resolve_listen(env={"RS_PORT": "7777"}).port == 7777
    # --port serves anyway when the cluster says this is not a reducer (with a warning).
    worker = {"CLUSTER_SPEC": vertex_spec(pools, "workerpool0", 0)}
    plan = server.resolve_listen(port=6000, env=worker)
    assert plan.port == 6000 and plan.cluster is None and "workerpool0 (a worker), not a reducer" in plan.warning
    with pytest.raises(ConfigError, match="RS_PORT"):
        server.resolve_listen(env={"RS_PORT": "http"})
    with pytest.raises(ConfigError, match="--port"):
        server.resolve_listen(port=70000, env={})


_WORKERS = {"workerpool0": ["10.0.0.1:2222"], "workerpool1": ["10.0.0.2:2222"], "workerpool2": ["10.0.0.3:2222"]}


@pytest.mark.parametrize(
    "variable,text,expected",
    [
        (
            "CLUSTER_SPEC",
            vertex_spec(_WORKERS, "workerpool0", 0),
            r"this process is workerpool0 \(a worker\) in CLUSTER_SPEC, not a reducer: "
            r"reducers must run as workerpool2",
        ),
        ("CLUSTER_SPEC", vertex_spec(_WORKERS, "workerpool1", 0), r"workerpool1 \(a worker\).*not a reducer"),
        ("CLUSTER_SPEC", vertex_spec(_WORKERS, "workerpool3", 0), r"workerpool3 \(an evaluator\).*not a reducer"),
        (
            "TF_CONFIG",
            tf_config({"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]}, "worker", 0),
            r"this process is worker \(a worker\) in TF_CONFIG, not a reducer: reducers must run as ps",
        ),
        ("TF_CONFIG", tf_config({"chief": ["a:1"], "ps": ["c:1"]}, "evaluator", 0), r"evaluator \(an evaluator\)"),
        (
            "CLUSTER_SPEC",
            vertex_spec({"workerpool0": ["a:1"]}, "workerpool2", 0),
            r"task type is 'workerpool2' but the cluster has no 'workerpool2' pool",
        ),
        ("CLUSTER_SPEC", vertex_spec(_WORKERS, "workerpool2", 1), r"task index 1 is out of range"),
        ("CLUSTER_SPEC", "{not json", r"CLUSTER_SPEC is not valid JSON"),
    ],
    ids=[
        "vertex-primary",
        "vertex-worker",
        "vertex-evaluator",
        "tf-worker",
        "tf-evaluator",
        "no-pool2",
        "bad-index",
        "bad-json",
    ],
)
def test_not_a_reducer_is_a_clear_error(monkeypatch, capsys, variable, text, expected):
    for k in CHILD_ENV_DROP:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(variable, text)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reduction-server serve: error: "), err
    assert re.search(expected, err), err


def test_not_a_reducer_exits_2_from_the_command_line():
    proc = subprocess.run(
        serve_argv(threads=None, host=None, port=None),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(CLUSTER_SPEC=vertex_spec(_WORKERS, "workerpool1", 0)),
    )
    assert proc.returncode == 2
    assert "not a reducer" in proc.stderr and "pass --port to serve anyway" in proc.stderr


def test_port_in_use_exits_1(served):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        s = served(["--host", "127.0.0.1", "--port", str(port)], _env())
        assert s.proc.wait(timeout=30) == 1
        s.wait_for(rf"error: cannot listen on 127\.0\.0\.1:{port}")


def test_serve_node_says_why_it_cannot_start(monkeypatch):
    """The node's life without the command (reducer.control.lifecycle): a setting the core refuses
    is status 2 and names its variable, a taken port is status 1; nothing is left listening."""
    from reducer.control.lifecycle import NodeError, NodeOptions, prepare_node, serve_node

    for k in CHILD_ENV_DROP:
        monkeypatch.delenv(k, raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        node = prepare_node(NodeOptions(host="127.0.0.1", port=port, control_port=config.OFF))
        assert (node.plan.port, node.plan.origin, node.token) == (port, "--port", None)
        with pytest.raises(NodeError, match=rf"cannot listen on 127\.0\.0\.1:{port}") as taken:
            serve_node(node)
        assert taken.value.status == 1
    monkeypatch.setenv("RS_GROUP_TIMEOUT", "1e10")
    with pytest.raises(NodeError, match="RS_GROUP_TIMEOUT") as refused:
        serve_node(prepare_node(NodeOptions(host="127.0.0.1", port=0)))
    assert refused.value.status == 2
    with pytest.raises(ConfigError, match="RS_HOST"):
        prepare_node(NodeOptions(host="999.1.1.1", port=0))


# -- authentication ------------------------------------------------------------------------------


def test_auth_token_file(served, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    (p,) = free_ports(1)
    s = served(["--host", "127.0.0.1", "--port", str(p), "--auth-token-file", str(token)], _env())
    s.wait_for(r"authentication on")
    address = f"127.0.0.1:{p}"
    with pytest.raises(AuthError):
        _allreduce_one(address, auth_token="wrong")
    with pytest.raises(AuthError):
        _allreduce_one(address, auth_token="")
    np.testing.assert_array_equal(_allreduce_one(address, auth_token="s3cret"), np.arange(10, dtype=np.float32))
    assert "s3cret" not in s.log
    assert s.stop() == 0


def test_auth_token_file_errors(monkeypatch, capsys, tmp_path):
    for k in CHILD_ENV_DROP:
        monkeypatch.delenv(k, raising=False)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert main(["serve", "--port", "0", "--auth-token-file", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--auth-token-file", str(tmp_path / "missing")]) == 2
    assert "cannot read auth token file" in capsys.readouterr().err
