"""Seconds settings have one upper bound, and secrets are checked where they are read (issue 28,
points 4 and 8).

Every seconds setting, variable, argument and flag is a finite number > 0 (some allow 0) and at
most config.MAX_SECONDS (1e9 s, about 31 years): more is a ConfigError naming the variable,
argument or flag, on every path (the library, the reducer and its CLI, the NCCL plugin), where it
used to overflow the core's clock arithmetic ("no progress for 10000000000 s" at once, "joined
within -2147483648 s", a plugin listener that accepted nothing). At the bound everything works.
`reduction-server job-token` refuses a job credential given as the secret, and a secret file its
group or others may read is used with a warning naming it and its mode.
"""

from __future__ import annotations

import ctypes as C
import logging
import os
import subprocess
import time

import nccl_harness as H
import pytest
from attack_tools import GoodGroup, serve
from conftest import CLI, child_env
from paths import ROOT

import reducer
from reducer import _core, config
from reducer.errors import ConfigError

TOO_LONG = 1e10  # > MAX_SECONDS: what overflowed before

pytestmark = pytest.mark.timeout(120)


def _cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], env=child_env(**env), cwd=str(ROOT), capture_output=True, text=True, timeout=timeout
    )


def test_the_bound_is_one_rule():
    assert config.MAX_SECONDS == 1e9
    assert config.check_seconds(1e9, "x") == 1e9 and config.check_seconds(0, "x", zero=True) == 0
    for bad in (TOO_LONG, float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ConfigError, match="^--flag="):
            config.check_seconds(bad, "--flag")
    with pytest.raises(ConfigError, match=r"^RS_TIMEOUT='1e10' is not valid: more than 1e9 seconds"):
        config.get("timeout", env={"RS_TIMEOUT": "1e10"})


# -- the worker library ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["timeout", "connect_timeout"])
def test_worker_seconds_above_the_bound_are_refused(name, monkeypatch):
    with serve() as srv:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=f"^{name}=10000000000 is not valid: more than 1e9 seconds"):
            reducer.Communicator([srv.address], 0, 1, **{name: TOO_LONG})
        env = config.SETTINGS[name].env
        monkeypatch.setenv(env, "1e10")
        with pytest.raises(ConfigError, match=f"^{env}='1e10' is not valid"):
            reducer.Communicator([srv.address], 0, 1)
        monkeypatch.delenv(env)
        for bad in (float("inf"), float("nan")):  # not caught before for connect_timeout
            with pytest.raises(ConfigError, match=f"^{name}="):
                reducer.Communicator([srv.address], 0, 1, **{name: bad})
        assert time.monotonic() - t0 < 30  # refused up front, never a wait
    # The plugin's reader of the same variables (client/client_settings.h).
    with pytest.raises(ConfigError, match=f"^{config.SETTINGS[name].env}='1e10' is not valid"):
        _core.read_client_options({config.SETTINGS[name].env: "1e10"})


def test_worker_seconds_at_the_bound_work():
    """timeout and connect_timeout of 1e9 s (and the reducer's group and handshake timeouts): a
    group of 2 reduces exactly (a timeout used to overflow into "no progress for ... s" at once)."""
    with serve(group_timeout=1e9, handshake_timeout=1e9) as srv:
        group = GoodGroup(srv.address, "bound", rounds=3, timeout=1e9, connect_timeout=1e9).start()
        group.wait_connected()
        group.join(60)


# -- the reducer ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["group_timeout", "handshake_timeout", "memory_idle_timeout"])
def test_reducer_seconds_above_the_bound_are_refused(name, monkeypatch):
    """Refused when the reducer starts (ReducerServer(...).start(), as serve does)."""
    with pytest.raises(ConfigError, match=f"^{name}=10000000000 is not valid"):
        serve(**{name: TOO_LONG})
    env = config.SETTINGS[name].env
    monkeypatch.setenv(env, "1e10")
    with pytest.raises(ConfigError, match=f"^({env}='1e10'|{name}=10000000000) is not valid"):
        serve()
    monkeypatch.setenv(env, "inf")
    with pytest.raises(ConfigError, match=f"^({env}='inf'|{name}=inf) is not valid"):
        serve()


@pytest.mark.parametrize(
    "args, env, named",
    [
        (["--drain-timeout", "1e10"], {}, "--drain-timeout=10000000000"),
        (["--memory-idle-timeout", "1e10"], {}, "--memory-idle-timeout=10000000000"),
        ([], {"RS_GROUP_TIMEOUT": "1e10"}, "RS_GROUP_TIMEOUT='1e10'"),
        ([], {"RS_HANDSHAKE_TIMEOUT": "1e10"}, "RS_HANDSHAKE_TIMEOUT='1e10'"),
        ([], {"RS_DRAIN_TIMEOUT": "1e10"}, "RS_DRAIN_TIMEOUT='1e10'"),
        (["--stats-interval", "1e10"], {}, "--stats-interval=10000000000"),
    ],
    ids=[
        "drain-timeout",
        "memory-idle-timeout",
        "RS_GROUP_TIMEOUT",
        "RS_HANDSHAKE_TIMEOUT",
        "RS_DRAIN_TIMEOUT",
        "stats-interval",
    ],
)
def test_serve_refuses_seconds_above_the_bound(args, env, named):
    """serve exits 2 at once with one line naming the flag or variable (it used to start, and
    draining for --drain-timeout 1e10 stopped at once)."""
    argv = ["serve", "--host", "127.0.0.1", "--port", "0", "--threads", "1", "--control-port", "off", *args]
    try:
        done = _cli(*argv, timeout=30, **env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve {' '.join(args)} {env} started instead of refusing the value")
    assert done.returncode == 2, done.stderr
    assert f"reduction-server serve: error: {named} is not valid: more than 1e9 seconds" in done.stderr, done.stderr
    assert "cannot listen" not in done.stderr


@pytest.mark.parametrize("command", ["drain", "status"])
def test_control_clis_refuse_a_timeout_above_the_bound(command):
    """drain and status ask with a gRPC deadline; status --timeout 1e10 used to fail at once with
    DEADLINE_EXCEEDED."""
    done = _cli(command, "--timeout", "1e10", "127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    assert f"reduction-server {command}: error: --timeout=10000000000 is not valid" in done.stderr, done.stderr


# -- the NCCL plugin ------------------------------------------------------------------------------


def _plugin_listen(monkeypatch, handshake_timeout: str):
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RS_HANDSHAKE_TIMEOUT", handshake_timeout)
    plugin = H.Plugin()
    return plugin, H.init_net(plugin, 12)


def test_plugin_refuses_a_handshake_timeout_above_the_bound(monkeypatch):
    """RS_HANDSHAKE_TIMEOUT=1e10 used to give a listener that dropped every connection at once."""
    plugin, net = _plugin_listen(monkeypatch, "1e10")
    try:
        handle, lcomm = C.create_string_buffer(H.HANDLE_BYTES), C.c_void_p()
        assert H.has_ctx(12) and net.listen(None, 0, handle, C.byref(lcomm)) != 0
        assert not lcomm.value
        assert "RS_HANDSHAKE_TIMEOUT='1e10' is not valid: more than 1e9 seconds" in plugin.log_text()
    finally:
        plugin.close()


def test_plugin_accepts_connections_at_the_bound(monkeypatch):
    plugin, net = _plugin_listen(monkeypatch, "1e9")
    handle, lcomm = H.listen(plugin, net, 12, None)
    scomm, rcomm = C.c_void_p(), C.c_void_p()
    try:
        peer = C.create_string_buffer(handle.raw, H.HANDLE_BYTES)
        deadline = time.monotonic() + 30
        while not (scomm.value and rcomm.value) and time.monotonic() < deadline:
            if not scomm.value:
                H.check(net.connect(None, 0, peer, C.byref(scomm), None), "connect", plugin)
            if not rcomm.value:
                H.check(net.accept(lcomm, C.byref(rcomm), None), "accept", plugin)
            time.sleep(0.001)
        assert scomm.value and rcomm.value, plugin.log_text()
    finally:
        if scomm.value:
            H.check(net.closeSend(scomm), "closeSend", plugin)
        if rcomm.value:
            H.check(net.closeRecv(rcomm), "closeRecv", plugin)
        H.check(net.closeListen(lcomm), "closeListen", plugin)
        plugin.close()


# -- secrets (issue 28, point 8) --------------------------------------------------------------------


def _credential() -> str:
    return str(_core.job_token("the-real-secret", "job-a"))


@pytest.mark.parametrize("via", ["RS_AUTH_TOKEN", "RS_AUTH_TOKEN_FILE", "--auth-token-file"])
def test_job_token_refuses_a_job_credential(via, tmp_path):
    path = tmp_path / "secret"
    path.write_text(_credential() + "\n")
    path.chmod(0o600)
    env = {"RS_AUTH_TOKEN": _credential()} if via == "RS_AUTH_TOKEN" else {}
    env.update({"RS_AUTH_TOKEN_FILE": str(path)} if via == "RS_AUTH_TOKEN_FILE" else {})
    args = ["--auth-token-file", str(path)] if via == "--auth-token-file" else []
    done = _cli("job-token", "--job", "job-b", *args, **env)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"reduction-server job-token: error: {via}"), done.stderr
    assert "is a job credential (rsjob1:<job>:<key>), not the reducers' shared secret" in lines[0]
    # The secret itself still works.
    done = _cli("job-token", "--job", "job-a", RS_AUTH_TOKEN="the-real-secret")
    assert done.returncode == 0 and done.stdout.strip() == _credential(), done.stderr


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_file_others_may_read_is_used_with_a_warning(mode, tmp_path, caplog):
    path = tmp_path / "secret"
    path.write_text("s3cret\n")
    path.chmod(mode)
    want = f"the secret file '{path}' is open to its group or others (mode {mode:04o})"
    with caplog.at_level(logging.WARNING):
        assert config.resolve_auth_token(token_file=str(path)) == "s3cret"  # used all the same
        assert _core.read_client_options({"RS_AUTH_TOKEN_FILE": str(path)})["auth_token"] == "s3cret"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if want in w]) == 2, warnings  # the library's and the plugin's reader
    assert any(w.startswith("RS_AUTH_TOKEN_FILE: ") for w in warnings), warnings
    done = _cli("job-token", "--job", "job-a", "--auth-token-file", str(path))
    assert done.returncode == 0 and want in done.stderr, done.stderr


def test_a_private_secret_file_is_used_without_a_word(tmp_path, caplog):
    path = tmp_path / "secret"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        assert config.resolve_auth_token(token_file=str(path)) == "s3cret"
        assert _core.read_client_options({"RS_AUTH_TOKEN_FILE": str(path)})["auth_token"] == "s3cret"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert os.stat(path).st_mode & 0o777 == 0o600
