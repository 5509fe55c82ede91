"""Attacks on the control port and the metrics port (issue 25, points 3, 4, 5 and 8).

- floods of idle connections and half-sent requests (HTTP/2 streams whose message never comes,
  HTTP heads that never end) against a `serve` process under RLIMIT_NOFILE = 256: the data plane
  keeps its descriptors (a new good group all-reduces exactly, 120 more data connections are
  accepted), health and /metrics still answer, the process's threads stay bounded;
- GetStats needs the secret's proof; worker addresses never reach callers who have not given it;
  per-group metric series are capped and can be turned off;
- Drain without a secret needs the operator's opt-in; its timeout must be finite; the startup
  WARNING names the control port;
- a GetStats flood from one address is cut to its token bucket (RESOURCE_EXHAUSTED) while
  another address, and a good group, go on.

Connection counts stay small (a few hundred) for a 2-core machine; no timing is asserted.
"""

from __future__ import annotations

import os
import re
import resource
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from attack_tools import (
    CHALLENGE,
    GoodGroup,
    close_all,
    closed_within,
    open_nonblocking,
    peers,
    recv_exact,
    run_good_group,
    wait_until,
)
from conftest import child_env_in_tree, start_serve

pytest.importorskip("grpc")
pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.timeout(120)

NOFILE = 256  # the reducer under attack: its data plane may use 256 - 64 = 192 descriptors
FLOOD = 300  # connections per flood: just past the descriptor limit


# -- tools ------------------------------------------------------------------------------------


class Serve:
    """`reduction-server serve` (control and metrics on free ports) in a subprocess, optionally under
    RLIMIT_NOFILE = nofile; its log is read in the background."""

    def __init__(self, args: Sequence[str] = (), nofile: int | None = None, **env: str) -> None:
        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = start_serve(
            "--control-port", "0", "--metrics-port", "0", *args, env=child_env_in_tree(**env), preexec_fn=limit
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.data_port = int(self.wait_for(r"reducer listening on 127\.0\.0\.1:(\d+)").group(1))
            self.control_port = int(
                self.wait_for(
                    r"control plane \(gRPC health, GetStats, Drain\) on "
                    r"127\.0\.0\.1:(\d+)"
                ).group(1)
            )
            self.metrics_url = self.wait_for(r"Prometheus metrics on (http://\S+)").group(1)
            self.wait_for("stop with SIGTERM")
        except BaseException:
            self.stop()
            raise
        self.address = f"127.0.0.1:{self.data_port}"
        self.control = f"127.0.0.1:{self.control_port}"
        self.metrics_port = int(self.metrics_url.rsplit(":", 1)[1].split("/")[0])

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log)
            if m:
                return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not in the log:\n{self.log}")

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(10)

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def half_sent_grpc(path: bytes, streams: int = 4) -> bytes:
    """An HTTP/2 connection's opening: the preface, SETTINGS, then `streams` gRPC calls to `path`
    whose HEADERS came but whose request message never will (no DATA, no END_STREAM)."""
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path),
        (b":authority", b"reducer"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]
    block = b"".join(b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v for n, v in headers)  # HPACK literals
    out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"")
    for i in range(streams):
        out += _frame(1, 0x4, 1 + 2 * i, block)  # HEADERS, END_HEADERS, no END_STREAM
    return out


def send_to_all(socks: Sequence[socket.socket], data: bytes, seconds: float = 10.0) -> None:
    """Send `data` on every socket once it is connected (those that fail are left alone)."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_WRITE)
    deadline = time.monotonic() + seconds
    try:
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(0.2):
                sel.unregister(key.fileobj)
                try:
                    key.fileobj.send(data)
                except OSError:
                    pass
    finally:
        sel.close()


def challenged(socks: Sequence[socket.socket], seconds: float) -> int:
    """How many data connections received their whole challenge within `seconds` (all together)."""
    deadline = time.monotonic() + seconds
    count = 0
    for s in socks:
        s.setblocking(True)
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            recv_exact(s, CHALLENGE.size)
        except (OSError, ConnectionError):
            continue
        count += 1
    return count


def accept_queue(port: int) -> int:
    """Connections waiting in the accept queue of the listener on `port` (ss's Recv-Q)."""
    out = subprocess.run(
        ["ss", "-Hltn", f"( sport = :{port} )"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())


def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.status == 200
        return resp.read().decode()


class Forwarder:
    """A TCP forwarder on 127.0.0.1 whose connections reach `port` from `source` (another loopback
    address), so that a grpc channel in this process can act as a different peer."""

    def __init__(self, source: str, port: int) -> None:
        self.source, self.port = source, port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        """Until close() closes the listener (accept then fails)."""
        while True:
            try:
                client, _ = self.listener.accept()
                up = socket.socket()
                up.bind((self.source, 0))
                up.connect(("127.0.0.1", self.port))
            except OSError:
                return
            self._socks += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.listener.close()
        self._thread.join(5)
        close_all(self._socks)


def data_plane_still_works(srv: Serve, group: str) -> None:
    """A new good group all-reduces exactly, and 120 more data connections get their challenge."""
    run_good_group(srv.address, group, rounds=5, timeout=20.0, connect_timeout=20.0)
    socks = open_nonblocking(srv.data_port, peers(4, first=2), 120)
    try:
        assert challenged(socks, 20.0) == 120
    finally:
        close_all(socks)


def health(address: str) -> str:
    from reducer.control.client import ControlClient

    with ControlClient(address, timeout=15.0) as c:
        return c.health()


def serving_again(address: str, within: float = 10.0) -> bool:
    """Health answers SERVING within `within` s: right after a flood's connections close, the
    internal gRPC server may still count some of them for a moment (it closes them on its own loop)."""
    from reducer.control.client import ControlError

    def ok() -> bool:
        try:
            return health(address) == "SERVING"
        except ControlError:
            return False

    return wait_until(ok, within, interval=0.2)


# -- point 3: the ports cannot take the process's descriptors or threads --------------------------


def test_control_port_floods_leave_the_data_plane_and_health(tmp_path) -> None:
    with Serve(nofile=NOFILE) as srv:
        idle = open_nonblocking(srv.control_port, peers(8, first=2), FLOOD)
        half = open_nonblocking(srv.control_port, peers(8, first=2), 16)
        try:
            send_to_all(half, half_sent_grpc(b"/reduction_server.v1.Reducer/GetStats"))
            assert wait_until(lambda: accept_queue(srv.control_port) == 0, 20.0)  # the flood has landed
            data_plane_still_works(srv, "after-control-flood")
            assert health(srv.control) == "SERVING"
            assert srv.proc.poll() is None
        finally:
            close_all(idle + half)
        assert serving_again(srv.control)
        assert re.search(r"WARNING reducer\.control\.front: control port: (refused a connection|full)", srv.log), (
            srv.log
        )


def test_metrics_port_floods_leave_the_data_plane_and_scrapes(tmp_path) -> None:
    with Serve(nofile=NOFILE) as srv:
        threads_before = srv.threads()
        scrape(srv.metrics_url)  # the pool's threads exist now
        idle = open_nonblocking(srv.metrics_port, peers(8, first=2), FLOOD // 2)
        half = open_nonblocking(srv.metrics_port, peers(8, first=2), FLOOD // 2)
        try:
            send_to_all(half, b"GET /metrics HTTP/1.1\r\nHost: reducer\r\n")  # the head never ends
            assert wait_until(lambda: accept_queue(srv.metrics_port) == 0, 20.0)  # the flood has landed
            assert srv.threads() <= threads_before + 4, srv.threads()
            assert "reduction_server_rounds_total" in scrape(srv.metrics_url)
            data_plane_still_works(srv, "after-metrics-flood")
            assert srv.threads() <= threads_before + 4, srv.threads()
        finally:
            close_all(idle + half)
        assert serving_again(srv.control)


def test_half_sent_rpcs_hold_no_thread(reducers) -> None:
    """32 gRPC calls whose request never comes (8 connections, 4 streams each) from 4 addresses:
    the control plane still answers health and GetStats (a threaded gRPC server would have every
    pool thread waiting for those requests)."""
    from reducer.control.client import ControlClient
    from reducer.control.lifecycle import Lifecycle
    from reducer.control.service import ControlPlane

    (server,) = reducers(1)
    plane = ControlPlane(server, Lifecycle(server), host="127.0.0.1", port=0).start()
    socks: list[socket.socket] = []
    try:
        for source in peers(4, first=2) * 2:
            s = socket.socket()
            s.bind((source, 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", plane.port))
            s.sendall(half_sent_grpc(b"/reduction_server.v1.Reducer/GetStats"))
            socks.append(s)
        with ControlClient(plane.address, timeout=5) as c:
            assert c.health() == "SERVING" and c.get_stats()["state"] == "serving"
    finally:
        close_all(socks)
        plane.stop(0)


def test_fronts_close_silent_and_idle_connections() -> None:
    from reducer.control.front import ControlFront
    from reducer.control.http import MetricsServer
    from reducer.control.limits import ConnectionTable

    echo = socket.create_server(("127.0.0.1", 0))
    front = ControlFront(
        "127.0.0.1", 0, ConnectionTable(8, 8), echo.getsockname(), first_bytes_s=0.5, idle_s=1.0
    ).start()
    metrics = MetricsServer(
        "127.0.0.1", 0, lambda accept: (b"ok\n", "text/plain"), ConnectionTable(8, 8), request_timeout=0.5
    ).start()
    try:
        silent = [socket.create_connection(("127.0.0.1", front.port)) for _ in range(2)]
        talker = socket.create_connection(("127.0.0.1", front.port))
        talker.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        half = socket.create_connection(("127.0.0.1", metrics.port))
        half.sendall(b"GET /metrics HTTP/1.1\r\n")
        assert closed_within(silent + [talker, half], 15.0) == [True] * 4
        assert wait_until(lambda: len(front.table) == 0 and len(metrics.table) == 0, 5.0)
        assert front.timed_out == 3 and metrics.timed_out == 1
        whole = socket.create_connection(("127.0.0.1", metrics.port), timeout=10)
        whole.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert whole.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n")
        close_all(silent + [talker, half, whole])
    finally:
        front.stop()
        metrics.stop()
        echo.close()


def test_connection_table_caps_and_fair_eviction() -> None:
    from reducer.control.limits import ConnectionTable

    clock = [0.0]
    table = ConnectionTable(max_total=3, max_per_peer=2, clock=lambda: clock[0])
    a1, a2 = table.admit("a"), table.admit("a")
    assert a1.ok and a2.ok and a1.evict is None
    refused = table.admit("a")
    assert not refused.ok and "per-peer cap" in refused.why
    clock[0] = 1.0
    b1 = table.admit("b")
    assert b1.ok and len(table) == 3
    clock[0] = 2.0
    table.touch(a1.conn_id)  # a1 is active: a2 is a's least recently active
    c1 = table.admit("c")  # full: c (0) < a (2): a's idlest goes
    assert c1.ok and c1.evict == a2.conn_id and table.count("a") == 1 and len(table) == 3
    d1 = table.admit("d")  # full, heaviest holds 1, d holds 0: the idlest of a heaviest goes
    assert d1.ok and d1.evict is not None and len(table) == 3
    assert not table.admit("d").ok  # d holds 1 = the heaviest: no room, nobody evicted
    for admitted in (a1, a2, b1, c1, d1):
        table.release(admitted.conn_id)
    table.release(a1.conn_id)  # twice: harmless
    assert len(table) == 0 and table.count("a") == 0
    with pytest.raises(ValueError):
        ConnectionTable(0, 1)


def test_side_limits_leave_the_data_plane_its_descriptors() -> None:
    from reducer.control.limits import CONTROL_FDS_PER_CONNECTION, RESERVE_FDS, side_limits

    low = side_limits(nofile=256, data_max_connections=192)  # the core keeps 64 off its cap
    assert low.budget_fds == 256 - 192 - RESERVE_FDS
    assert low.control_connections * CONTROL_FDS_PER_CONNECTION + low.metrics_connections <= low.budget_fds
    assert low.control_connections >= 1 and low.metrics_connections >= 1
    high = side_limits(nofile=1 << 20, data_max_connections=4096, max_connections=32, per_peer=4, rate=50.0)
    assert (high.control_connections, high.metrics_connections, high.per_peer, high.rate) == (32, 32, 4, 50.0)
    tight = side_limits(nofile=100, data_max_connections=90)
    assert (tight.control_connections, tight.metrics_connections) == (1, 1)
    unknown = side_limits(nofile=None, data_max_connections=None, max_connections=7)
    assert (unknown.control_connections, unknown.metrics_connections, unknown.budget_fds) == (7, 7, None)
    with pytest.raises(ValueError):
        side_limits(256, 192, rate=float("nan"))


def test_peer_keys() -> None:
    from reducer.control.limits import grpc_peer_host, peer_key

    assert peer_key("10.0.0.7") == "10.0.0.7"
    assert peer_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert peer_key("2001:db8:1:2:aaaa::1") == peer_key("[2001:db8:1:2:bbbb::9]") == "2001:db8:1:2::/64"
    assert peer_key("fe80::1%eth0") == "fe80::/64"
    assert peer_key("unix:/tmp/x") == "unix:/tmp/x"
    assert grpc_peer_host("ipv4:127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert grpc_peer_host("ipv6:[::1]:5001") == ("::1", 5001)
    assert grpc_peer_host("unix:/x") == ("unix:/x", None)


# -- point 4: who sees what -------------------------------------------------------------------------


class _FakeReducer:
    """Stands for a started ReducerServer: fixed stats and group rows (one with worker addresses)."""

    address = "127.0.0.1:1"
    running = True

    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        self.rows = (
            rows
            if rows is not None
            else [
                _row("job-a", "g", "lost 10.1.2.3:41000 and [fd00::7]:5000; peer 2001:db8::9 gone"),
                _row("job-b", "h", ""),
            ]
        )

    def stats(self) -> dict[str, Any]:
        return {"groups": len(self.rows), "rounds_completed": 7}

    def group_stats(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows]

    def limits(self) -> dict[str, Any]:
        return {"max_connections": 100}

    def drain(self, timeout: float) -> None:
        self.running = False


def _row(job: str, group: str, error: str) -> dict[str, Any]:
    return dict(
        job=job,
        group=group,
        stream=0,
        world_size=2,
        connected=2,
        complete=True,
        rounds=7,
        bytes_received=10,
        bytes_sent=10,
        last_error=error,
        age_s=1.0,
    )


def _plane(server: Any, **kw: Any) -> Any:
    from reducer.control.lifecycle import Lifecycle
    from reducer.control.service import ControlPlane

    return ControlPlane(server, Lifecycle(server, 1.0), host="127.0.0.1", port=0, **kw).start()


def _client(plane: Any, **kw: Any) -> Any:
    from reducer.control.client import ControlClient

    return ControlClient(plane.address, timeout=10.0, **kw)


def _code(fn: Callable[[], Any]) -> str:
    from reducer.control.client import ControlError

    with pytest.raises(ControlError) as info:
        fn()
    return info.value.code.name


def test_get_stats_needs_the_secret_and_hides_addresses_otherwise(capsys, monkeypatch, tmp_path) -> None:
    import json

    from reducer.cli.main import main
    from reducer.control import reducer_pb2
    from reducer.control.auth import drain_mac, stats_mac

    secret = _plane(_FakeReducer(), auth_token="s3cret")
    open_ = _plane(_FakeReducer())
    try:
        with _client(secret) as c:
            assert c.health() == "SERVING"  # probes need nothing
            assert _code(c.get_stats) == "UNAUTHENTICATED"
            assert _code(lambda: c.get_stats(token="wrong")) == "UNAUTHENTICATED"
            nonce = c._nonce()
            assert (
                _code(
                    lambda: c._call(
                        "GetStats",
                        c._reducer.GetStats,
                        reducer_pb2.GetStatsRequest(nonce=nonce, mac=drain_mac("s3cret", nonce, 0.0)),
                    )
                )
                == "UNAUTHENTICATED"
            )  # a Drain proof
            nonce = c._nonce()
            good = reducer_pb2.GetStatsRequest(nonce=nonce, mac=stats_mac("s3cret", nonce))
            reply = c._call("GetStats", c._reducer.GetStats, good)
            assert "10.1.2.3:41000" in reply.groups[0].last_error  # proven: the whole truth
            assert _code(lambda: c._call("GetStats", c._reducer.GetStats, good)) == "UNAUTHENTICATED"  # replay
            stats = c.get_stats(token="s3cret")
            assert [g["job"] for g in stats["groups"]] == ["job-a", "job-b"] and stats["auth_required"]
        monkeypatch.delenv("RS_AUTH_TOKEN", raising=False)
        monkeypatch.delenv("RS_AUTH_TOKEN_FILE", raising=False)
        assert main(["status", "--json", secret.address]) == 1  # `status` without the secret
        assert "UNAUTHENTICATED" in json.loads(capsys.readouterr().out)["reducers"][0]["error"]
        (tmp_path / "token").write_text("s3cret\n")
        assert main(["status", "--json", "--auth-token-file", str(tmp_path / "token"), secret.address]) == 0
        assert len(json.loads(capsys.readouterr().out)["reducers"][0]["groups"]) == 2
        with _client(open_) as c:  # no secret: open, without addresses
            stats = c.get_stats()
        assert stats["groups"][0]["last_error"] == "lost <address> and <address>; peer <address> gone"
        assert not stats["auth_required"]
    finally:
        secret.stop(0)
        open_.stop(0)


def test_metric_group_series_are_capped_and_can_be_turned_off(monkeypatch) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    from reducer.control.metrics import ReducerCollector

    fake = _FakeReducer([_row("job", f"g{i}", "") for i in range(5)])

    def series(**kw: Any) -> dict[str, list[dict[str, str]]]:
        registry = CollectorRegistry()
        registry.register(ReducerCollector(fake, **kw))
        out: dict[str, list[dict[str, str]]] = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for s in family.samples:
                out.setdefault(s.name, []).append(dict(s.labels, value=s.value))
        return out

    monkeypatch.delenv("RS_METRICS_GROUPS", raising=False)
    assert len(series()["reduction_server_group_rounds_total"]) == 5  # the default (100) holds them all
    capped = series(max_groups=2)
    assert [s["group"] for s in capped["reduction_server_group_rounds_total"]] == ["g0", "g1"]
    assert capped["reduction_server_group_series_omitted"] == [{"value": 3.0}]
    monkeypatch.setenv("RS_METRICS_GROUPS", "0")
    off = series()
    assert not any("job" in s for samples in off.values() for s in samples)  # no job or group label anywhere
    assert off["reduction_server_group_series_omitted"] == [{"value": 5.0}]


# -- point 5: Drain -----------------------------------------------------------------------------------


def test_drain_without_a_secret_needs_the_operators_opt_in() -> None:
    closed = _FakeReducer()
    plane = _plane(closed)
    try:
        with _client(plane) as c:
            assert _code(lambda: c.drain(timeout_s=1.0, wait=True)) == "PERMISSION_DENIED"
            assert closed.running and plane.lifecycle.state == "serving" and c.health() == "SERVING"
    finally:
        plane.stop(0)
    opened = _FakeReducer()
    plane = _plane(opened, allow_unauthenticated_drain=True)
    try:
        with _client(plane) as c:
            assert c.drain(timeout_s=1.0, wait=True)["state"] == "drained" and not opened.running
    finally:
        plane.stop(0)


def test_drain_timeout_must_be_finite(capsys) -> None:
    from reducer.cli.main import main

    fake = _FakeReducer()
    plane = _plane(fake, auth_token="s3cret")
    try:
        with _client(plane) as c:
            for bad in (float("inf"), float("nan"), -1.0):
                assert _code(lambda: c.drain(timeout_s=bad, token="s3cret")) == "INVALID_ARGUMENT"
            assert fake.running and plane.lifecycle.state == "serving"
        for bad in ("inf", "nan", "-1"):
            assert main(["drain", "--timeout", bad, plane.address]) == 2
            assert "finite" in capsys.readouterr().err
        assert fake.running
    finally:
        plane.stop(0)


def test_serve_warns_about_every_open_port_and_drains_only_when_allowed() -> None:
    from reducer.control.client import ControlClient

    with Serve(["--allow-unauthenticated-drain"]) as srv:
        warning = srv.wait_for(r"WARNING reducer\.serve: running WITHOUT authentication[^\n]*").group(0)
        assert f"data port 127.0.0.1:{srv.data_port}" in warning
        assert f"control port 127.0.0.1:{srv.control_port}" in warning and "anyone may Drain" in warning
        assert f"metrics port 127.0.0.1:{srv.metrics_port}" in warning
        with ControlClient(srv.control, timeout=10) as c:
            assert c.drain(wait=True)["state"] == "drained"
    with Serve(RS_AUTH_TOKEN="tok") as srv:
        assert "WITHOUT authentication" not in srv.log


# -- point 8: GetStats floods --------------------------------------------------------------------------


def test_get_stats_flood_is_cut_per_peer_while_a_group_runs(reducers, caplog) -> None:
    from reducer.control.client import ControlClient, ControlError
    from reducer.control.lifecycle import Lifecycle
    from reducer.control.limits import PeerRateLimiter, SideLimits
    from reducer.control.service import ControlPlane

    (server,) = reducers(1)
    plane = ControlPlane(server, Lifecycle(server), host="127.0.0.1", port=0, limits=SideLimits(rate=20.0)).start()
    limiter = plane.gate.limiter = PeerRateLimiter(20.0, clock=lambda: 0.0)  # no refill: exact counts
    forwarder = Forwarder("127.0.0.2", plane.port)
    counts = {"ok": 0, "RESOURCE_EXHAUSTED": 0, "UNAVAILABLE": 0, "other": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def flood() -> None:
        with ControlClient(forwarder.address, timeout=10) as c:
            while not stop.is_set():
                try:
                    c.get_stats()
                    key = "ok"
                except ControlError as exc:
                    key = exc.code.name if exc.code.name in counts else "other"
                with lock:
                    counts[key] += 1
                if key == "UNAVAILABLE":
                    stop.wait(0.05)

    floods = [threading.Thread(target=flood, daemon=True) for _ in range(3)]
    blocked = "control port: 127.0.0.2 is far over its request rate"
    try:
        with GoodGroup(server.address, "under-stats-flood", rounds=40) as group:
            for t in floods:
                t.start()
            group.wait_connected()
            with ControlClient(plane.address, timeout=10) as mine:  # another address: its own bucket
                for _ in range(5):
                    assert mine.health() == "SERVING"
                    assert mine.get_stats()["state"] == "serving"
            group.join()
        assert wait_until(lambda: blocked in caplog.text, 30.0), counts
        assert wait_until(lambda: counts["UNAVAILABLE"] > 0, 30.0), counts  # cut off at the door
    finally:
        stop.set()
        for t in floods:
            t.join(15)
        forwarder.close()
        plane.stop(0)
    # The flooding address got its burst and nothing more; it was refused, then cut off.
    assert counts["ok"] == 20 and counts["RESOURCE_EXHAUSTED"] >= 1 and counts["other"] == 0, counts
    assert limiter.refused >= limiter.block_after


def test_metrics_requests_are_rate_limited_per_peer() -> None:
    from reducer.control.http import MetricsServer
    from reducer.control.limits import ConnectionTable, PeerRateLimiter

    limiter = PeerRateLimiter(5.0, clock=lambda: 0.0)  # no refill: exact counts
    server = MetricsServer(
        "127.0.0.1", 0, lambda accept: (b"m 1\n", "text/plain"), ConnectionTable(16, 16), limiter
    ).start()
    answers: list[str] = []
    try:
        for _ in range(30):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", server.port))
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                head = s.recv(64)
            except ConnectionResetError:
                head = b""
            answers.append(head.split(b" ")[1].decode() if head else "closed")
            s.close()
        assert scrape(f"http://127.0.0.1:{server.port}/metrics") == "m 1\n"  # another address
    finally:
        server.stop()
    # 5 answered (the burst), 20 refused (then the address is cut off), the rest closed unanswered.
    assert answers == ["200"] * 5 + ["429"] * limiter.block_after + ["closed"] * (25 - limiter.block_after)


def test_rate_limiter_buckets() -> None:
    from reducer.control.limits import PeerRateLimiter

    clock = [0.0]
    limiter = PeerRateLimiter(rate=2.0, burst=3.0, max_peers=2, clock=lambda: clock[0])
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b")  # a's bucket is not b's
    clock[0] = 0.5  # one token back for a
    assert [limiter.allow("a") for _ in range(2)] == [True, False]
    clock[0] = 100.0  # full again, never more than the burst
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.refused == 3
    assert all(PeerRateLimiter(0.0).allow("x") for _ in range(1000))  # 0 = no limit
    # Cut-off: block_after refusals within one second, not spread thinner.
    clock[0] = 0.0
    flood = PeerRateLimiter(rate=1.0, burst=1.0, block_after=3, clock=lambda: clock[0])
    assert flood.allow("f") and not flood.allow("f") and not flood.allow("f")
    assert not flood.should_block("f")
    clock[0] = 1.5  # a new window (and one token back)
    assert flood.allow("f") and [flood.allow("f") for _ in range(2)] == [False, False]
    assert not flood.should_block("f")
    assert not flood.allow("f") and flood.should_block("f")
    assert not flood.should_block("f")  # its count starts again
    assert not flood.should_block("nobody")
