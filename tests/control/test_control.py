"""The reducer's control plane (gRPC health, GetStats, Drain), its metrics and `reduction-server status`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import control_tasks
import pytest
import yaml
from attack_tools import wait_until
from child_lines import ChildLines
from conftest import addresses, child_env_in_tree, run_ranks, serve_argv, start_serve
from paths import ROOT


# One group stream as ReducerServer.group_stats() reports it.
def _row(job: str, group: str, stream: int, **kw: Any) -> dict[str, Any]:
    row = dict(
        job=job,
        group=group,
        stream=stream,
        world_size=4,
        connected=4,
        complete=True,
        rounds=7,
        bytes_received=100,
        bytes_sent=90,
        last_error="",
        age_s=12.5,
    )
    row.update(kw)
    return row


# -- pure mapping -------------------------------------------------------------------------------


def test_group_rows_fold_streams_into_groups() -> None:
    from reducer.control.rows import group_rows

    rows = [
        _row("j1", "g", 1, bytes_received=50, bytes_sent=40, age_s=12.0, rounds=7, last_error="lost rank 2"),
        _row("j1", "g", 0, connected=3, complete=False),
        _row(
            "j0",
            "z",
            0,
            world_size=2,
            connected=1,
            complete=False,
            rounds=0,
            bytes_received=0,
            bytes_sent=0,
            age_s=0.25,
        ),
        _row("j1", "g", 2, bytes_received=1, bytes_sent=2, age_s=13.0, last_error="timeout"),
    ]
    out = [r.as_dict() for r in group_rows(rows)]
    assert out == [
        dict(
            job="j0",
            group="z",
            world_size=2,
            connected=1,
            complete=False,
            rounds=0,
            bytes_received=0,
            bytes_sent=0,
            last_error="",
            age_s=0.25,
            streams=1,
            ended=False,
        ),
        dict(
            job="j1",
            group="g",
            world_size=4,
            connected=3,
            complete=False,
            rounds=7,
            bytes_received=151,
            bytes_sent=132,
            last_error="lost rank 2",
            age_s=13.0,
            streams=3,
            ended=False,
        ),
    ]
    # An ended group is a row of its own beside a live one of the same name, and a stream the reducer
    # listed twice among the ended (it left, then failed) counts once, in its last state.
    live, ended = group_rows(
        [
            _row("j", "g", 0, bytes_received=5),
            _row("j", "g", 0, ended=True, bytes_received=7),
            _row("j", "g", 0, ended=True, bytes_received=9, last_error="failed"),
        ]
    )
    assert (live.ended, live.bytes_received) == (False, 5)
    assert (ended.ended, ended.bytes_received, ended.last_error, ended.streams) == (True, 9, "failed", 1)
    # Stream 0's error comes first when it has one.
    (g,) = group_rows([_row("j", "g", 1, last_error="b"), _row("j", "g", 0, last_error="a")])
    assert g.last_error == "a"
    assert group_rows([]) == []


def test_group_messages_carry_every_field() -> None:
    from reducer.control.service import group_messages

    (msg,) = group_messages(
        [
            _row("job-a", "grads", 0, bytes_received=2**40, last_error="peer lost"),
            _row("job-a", "grads", 1, bytes_received=5),
        ]
    )
    assert (msg.job, msg.group, msg.world_size, msg.connected, msg.complete, msg.rounds) == (
        "job-a",
        "grads",
        4,
        4,
        True,
        7,
    )
    assert (msg.bytes_received, msg.bytes_sent, msg.last_error, msg.age_s, msg.streams) == (
        2**40 + 5,
        180,
        "peer lost",
        12.5,
        2,
    )


def test_split_stats_maps_any_counter() -> None:
    from reducer.control.rows import split_stats

    stats = {
        "bytes_received": 2**50,
        "groups": 3,
        "draining": True,
        "new_counter": 5,
        "load": 0.5,
        "skew": -2,
        "mode": "epoll",
        "limits": {"max_group_bytes": 4 << 30, "max_groups": 64, "ratio": 1.5},
        "list": [1, 2],
        "none": None,
    }
    ints, floats, strings = split_stats(stats)
    assert ints == {
        "bytes_received": 2**50,
        "groups": 3,
        "draining": 1,
        "new_counter": 5,
        "limits.max_group_bytes": 4 << 30,
        "limits.max_groups": 64,
    }
    assert floats == {"load": 0.5, "skew": -2.0, "limits.ratio": 1.5}
    assert strings == {"mode": "epoll"}


class _Rows:
    """Stands for a ReducerServer in the metric mapping tests: stats() and group_stats() as given."""

    def __init__(self, stats: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        self._stats, self._rows = stats, rows

    def stats(self) -> dict[str, Any]:
        return dict(self._stats)

    def group_stats(self) -> list[dict[str, Any]]:
        return list(self._rows)


def test_metric_mapping_of_any_stats_and_rows() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    from reducer.control.metrics import ReducerCollector

    stats = {
        "bytes_received": 10,
        "bytes_sent": 20,
        "rounds_completed": 3,
        "errors": 1,
        "rejected": 2,
        "groups": 1,
        "memory_bytes": 4096,
        "limits": {"max_group_bytes": 4 << 30, "max_groups": 64},
        "slow-rounds": 5,
        "state": 7,
        "mode": "epoll",
    }
    rows = [_row("j", "g", 0, last_error="lost rank 1"), _row("j", "g", 1, bytes_received=1)]
    registry = CollectorRegistry()
    registry.register(ReducerCollector(_Rows(stats, rows)))
    got: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            got.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    assert got["reduction_server_received_bytes_total"] == {(): 10}
    assert got["reduction_server_rounds_total"] == {(): 3}
    assert got["reduction_server_errors_total"] == {
        (("cause", "connection"),): 1,
        (("cause", "handshake_rejected"),): 2,
    }
    assert got["reduction_server_limits"] == {(("name", "max_group_bytes"),): 4 << 30, (("name", "max_groups"),): 64}
    assert got["reduction_server_slow_rounds"] == {(): 5}
    assert "reduction_server_state" not in got  # no lifecycle given; the stats key may not take the name
    jg = (("group", "g"), ("job", "j"))
    assert got["reduction_server_group_received_bytes_total"] == {jg: 101}
    assert got["reduction_server_group_rounds_total"] == {jg: 7}
    assert got["reduction_server_group_failed"] == {jg: 1}
    assert got["reduction_server_group_connected_ranks"] == {jg: 4}


def test_drain_mac_and_nonces() -> None:
    from reducer.control.auth import NonceBook, check_drain, drain_mac

    book = NonceBook(ttl=60.0, limit=2)
    nonce = book.issue()
    good = drain_mac("secret", nonce, 5.0)
    assert check_drain(None, book, b"", b"", 5.0) is None  # no token: open
    assert "requires authentication" in check_drain("secret", book, b"", b"", 5.0)
    assert "MAC does not match" in check_drain("secret", book, nonce, drain_mac("other", nonce, 5.0), 5.0)
    nonce = book.issue()
    assert "MAC does not match" in check_drain("secret", book, nonce, drain_mac("secret", nonce, 6.0), 5.0)
    nonce = book.issue()
    assert check_drain("secret", book, nonce, drain_mac("secret", nonce, 5.0), 5.0) is None
    assert "already used" in check_drain("secret", book, nonce, drain_mac("secret", nonce, 5.0), 5.0)
    assert "already used" in check_drain("secret", book, b"x" * 32, good, 5.0)  # never issued
    first = book.issue()
    book.issue()
    book.issue()  # over the limit: oldest dropped
    assert not book.take(first)
    expired = NonceBook(ttl=0.0)
    n = expired.issue()
    assert not expired.take(n)


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    from grpc_tools import protoc

    proto = "reducer/control/reducer.proto"
    (tmp_path / "reducer" / "control").mkdir(parents=True)
    (tmp_path / proto).write_bytes((ROOT / proto).read_bytes())
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert protoc.main(["protoc", "-I.", "--python_out=.", "--pyi_out=.", "--grpc_python_out=.", proto]) == 0
    finally:
        os.chdir(cwd)
    for name in ("reducer_pb2.py", "reducer_pb2.pyi", "reducer_pb2_grpc.py"):
        fresh = (tmp_path / "reducer" / "control" / name).read_text()
        assert fresh == (ROOT / "reducer" / "control" / name).read_text(), f"regenerate {name} (see {proto})"


def test_importing_reducer_stays_light() -> None:
    code = (
        "import sys, reducer, reducer.communicator, reducer.server, reducer.cluster; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('grpc', 'grpc_health', 'prometheus_client') or m.startswith(('google.protobuf', 'reducer.control'))))"
    )
    env = child_env_in_tree()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_control_addresses_from_cluster_spec() -> None:
    from reducer.cli.status import control_addresses
    from reducer.errors import ConfigError

    spec = json.dumps(
        {
            "cluster": {"workerpool0": ["w0:2222"], "workerpool2": ["r0:2222", "[fd00::1]:4000"]},
            "task": {"type": "workerpool0", "index": 0},
        }
    )
    assert control_addresses([], {"CLUSTER_SPEC": spec}) == ["r0:2223", "[fd00::1]:4001"]
    assert control_addresses([], {"CLUSTER_SPEC": spec, "RS_CONTROL_PORT": "7000"}) == ["r0:7000", "[fd00::1]:7000"]
    assert control_addresses(["a:1", "b:2"], {"CLUSTER_SPEC": spec}) == ["a:1", "b:2"]
    with pytest.raises(ConfigError, match="RS_CONTROL_PORT"):
        control_addresses([], {"CLUSTER_SPEC": spec, "RS_CONTROL_PORT": "off"})
    with pytest.raises(ConfigError, match="no reducers to ask: pass their control addresses"):
        control_addresses([], {})
    with pytest.raises(ConfigError, match="no port"):
        control_addresses(["nohost"], {})
    # data port 65535: no next port (addresses.control_port_for), so no default control address
    top = json.dumps(
        {
            "cluster": {"workerpool0": ["w0:2222"], "workerpool2": ["r0:65535"]},
            "task": {"type": "workerpool0", "index": 0},
        }
    )
    with pytest.raises(ConfigError, match="data port 65535"):
        control_addresses([], {"CLUSTER_SPEC": top})
    assert control_addresses([], {"CLUSTER_SPEC": top, "RS_CONTROL_PORT": "7000"}) == ["r0:7000"]


def test_side_ports() -> None:
    from reducer import config
    from reducer.control.lifecycle import resolve_side_ports

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RS_CONTROL_PORT", raising=False)
        mp.delenv("RS_METRICS_PORT", raising=False)
        p = resolve_side_ports(None, None, 2222)
        assert (p.control, p.control_is_default, p.metrics) == (2223, True, None)
        p = resolve_side_ports(config.OFF, 0, 2222)
        assert (p.control, p.metrics) == (None, 0)
        mp.setenv("RS_CONTROL_PORT", "off")
        mp.setenv("RS_METRICS_PORT", "9400")
        p = resolve_side_ports(None, None, 2222)
        assert (p.control, p.metrics) == (None, 9400)
        p = resolve_side_ports(5000, None, 2222)
        assert (p.control, p.control_is_default) == (5000, False)
        mp.setenv("RS_CONTROL_PORT", "70000")
        with pytest.raises(config.ConfigError, match="RS_CONTROL_PORT"):
            resolve_side_ports(None, None, 2222)


# -- a live control plane in this process -------------------------------------------------------


@pytest.fixture
def planes(reducers):
    """Factory: planes(n, **server_kw) -> [(ReducerServer, Lifecycle, ControlPlane)] on 127.0.0.1."""
    from reducer.control.lifecycle import Lifecycle
    from reducer.control.service import ControlPlane

    started: list[Any] = []

    def make(n: int = 1, drain_timeout: float = 5.0, allow_unauthenticated_drain: bool = False, **kw: Any) -> list[Any]:
        out = []
        for server in reducers(n, **kw):
            lifecycle = Lifecycle(server, drain_timeout)
            plane = ControlPlane(
                server,
                lifecycle,
                host="127.0.0.1",
                port=0,
                auth_token=kw.get("auth_token"),
                allow_unauthenticated_drain=allow_unauthenticated_drain,
            ).start()
            started.append(plane)
            out.append((server, lifecycle, plane))
        return out

    yield make
    for plane in started:
        plane.stop(0)


def _client(plane: Any) -> Any:
    from reducer.control.client import ControlClient

    return ControlClient(plane.address, timeout=10.0)


def test_health_flips_on_drain(planes) -> None:
    ((server, lifecycle, plane),) = planes(1, allow_unauthenticated_drain=True)
    data_address = server.address
    with _client(plane) as c:
        assert [c.health(s) for s in ("", "reduction_server.v1.Reducer", "liveness")] == ["SERVING"] * 3
        reply = c.drain(timeout_s=2.0, wait=True)  # no token, and the operator opted in: Drain is open
        assert reply == {"state": "drained", "already_draining": False, "drained": True}
        assert not server.running
        assert c.health("") == c.health("reduction_server.v1.Reducer") == "NOT_SERVING"
        assert c.health("liveness") == "SERVING"  # drained on purpose: alive
        assert c.drain(wait=True)["already_draining"] is True
        stats = c.get_stats()
        assert stats["state"] == "drained" and stats["data_address"] == data_address
        with pytest.raises(Exception, match="NOT_FOUND"):
            c.health("no-such-service")


def test_liveness_fails_when_the_data_plane_dies_without_a_drain(planes) -> None:
    ((server, _lifecycle, plane),) = planes(1)
    with _client(plane) as c:
        server.stop()  # not through the lifecycle: an unexpected end
        plane.refresh()
        assert c.health("liveness") == "NOT_SERVING"
        assert c.health("") == "SERVING"  # nobody asked it to drain


def test_unauthenticated_drain_is_refused(planes) -> None:
    from reducer.control.client import ControlError

    ((server, lifecycle, plane),) = planes(1, auth_token="s3cret")
    with _client(plane) as c:
        for token in (None, "wrong"):
            with pytest.raises(ControlError) as info:
                c.drain(timeout_s=1.0, wait=True, token=token)
            assert info.value.code.name == "UNAUTHENTICATED"
        assert c.health() == "SERVING" and server.running and lifecycle.state == "serving"
        with pytest.raises(ControlError) as info:  # GetStats needs the same proof as Drain
            c.get_stats()
        assert info.value.code.name == "UNAUTHENTICATED"
        assert c.get_stats(token="s3cret")["auth_required"] is True
        assert c.drain(timeout_s=1.0, wait=True, token="s3cret")["state"] == "drained"
        assert c.health() == "NOT_SERVING" and not server.running


def test_drain_command(planes, capsys, monkeypatch, tmp_path) -> None:
    from reducer.cli.main import main

    monkeypatch.delenv("RS_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RS_AUTH_TOKEN_FILE", raising=False)
    ((server, lifecycle, plane),) = planes(1, auth_token="s3cret")
    assert main(["drain", "--timeout", "1", plane.address]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    assert server.running and lifecycle.state == "serving"
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    assert main(["drain", "--timeout", "1", "--auth-token-file", str(token), plane.address]) == 0
    assert capsys.readouterr().out == f"{plane.address}: drained\n"
    assert not server.running and lifecycle.state == "drained"
    monkeypatch.setenv("RS_AUTH_TOKEN", "s3cret")
    assert main(["drain", "--no-wait", plane.address]) == 0
    assert "a drain had already started" in capsys.readouterr().out


def _hold(pool: Any, tmp_path: Path, addrs: Sequence[str], groups: dict[str, int], rounds: int, n: int) -> list[Any]:
    """Start groups {name: world} of reduce_and_hold and wait until every rank is holding."""
    futs = [
        pool.submit(
            control_tasks.reduce_and_hold,
            rank=r,
            world=w,
            addrs=list(addrs),
            group=g,
            rounds=rounds,
            n=n,
            hold_dir=str(tmp_path),
        )
        for g, w in groups.items()
        for r in range(w)
    ]
    want = [tmp_path / f"{g}.{r}.ready" for g, w in groups.items() for r in range(w)]
    deadline = time.monotonic() + 90
    while not all(p.exists() for p in want):
        done = [f for f in futs if f.done()]
        for f in done:
            f.result()  # a worker that failed raises here
        assert time.monotonic() < deadline, "workers did not get ready"
        time.sleep(0.05)
    return futs


def _release(tmp_path: Path, futs: list[Any]) -> list[dict[str, Any]]:
    (tmp_path / "release").write_text("go")
    results = [f.result(timeout=60) for f in futs]
    for res in results:
        assert res["errors"] == [] and res["held"] is True
    return results


def test_get_stats_matches_the_data_plane(pool, planes, tmp_path) -> None:
    both = planes(2)
    addrs = addresses([s for s, _, _ in both])
    rounds, n = 5, 1 << 18  # 1 MiB float32: every round is split over both reducers
    futs = _hold(pool, tmp_path, addrs, {"grads": 2}, rounds, n)
    try:
        live = []
        for server, _, plane in both:
            with _client(plane) as c:
                live.append(c.get_stats())
            (row,) = live[-1]["groups"]
            assert row["job"] == "local" and row["group"] == "grads"
            assert (row["world_size"], row["connected"], row["complete"], row["streams"]) == (2, 2, True, 1)
            assert row["rounds"] == rounds
            assert row["last_error"] == "" and row["age_s"] > 0
            # Each reducer gets half of every worker's buffer each round, and sends half of the sum back to each.
            assert rounds * n * 4 <= row["bytes_received"] <= server.stats()["bytes_received"]
            assert rounds * n * 4 <= row["bytes_sent"] <= server.stats()["bytes_sent"]
            assert live[-1]["counters"]["groups"] == 1 and live[-1]["counters"]["connected_workers"] == 2
    finally:
        results = _release(tmp_path, futs)
    # Idle again: GetStats carries exactly the counters of ReducerServer.stats(), whatever their keys.
    from reducer.control.rows import split_stats

    for server, _, plane in both:
        with _client(plane) as c:
            stats = c.get_stats()
        ints, floats, strings = split_stats(server.stats())
        assert (stats["counters"], stats["values"], stats["info"]) == (ints, floats, strings)
        assert stats["counters"]["rounds_completed"] == rounds
        assert stats["state"] == "serving" and stats["data_address"] == server.address
    # Every worker sent its whole buffer each round, and the reducers got all of it.
    assert all(r["stats"]["bytes_sent"] >= rounds * n * 4 for r in results)
    assert sum(server.stats()["bytes_received"] for server, _, _ in both) >= 2 * rounds * n * 4


def test_status_json_lists_both_groups(pool, planes, tmp_path, capsys) -> None:
    from reducer.cli.main import main

    both = planes(2)
    addrs = addresses([s for s, _, _ in both])
    futs = _hold(pool, tmp_path, addrs, {"alpha": 1, "beta": 1}, 2, 1 << 18)
    try:
        assert main(["status", "--json", *[p.address for _, _, p in both]]) == 0
    finally:
        _release(tmp_path, futs)
    out = json.loads(capsys.readouterr().out)
    assert [r["address"] for r in out["reducers"]] == [p.address for _, _, p in both]
    for r, (server, _, _) in zip(out["reducers"], both):
        assert r["data_address"] == server.address and r["state"] == "serving"
        assert [(g["group"], g["world_size"], g["rounds"]) for g in r["groups"]] == [("alpha", 1, 2), ("beta", 1, 2)]
        assert r["counters"]["groups"] == 2


def test_status_json_reports_an_unreachable_reducer(planes, capsys) -> None:
    from reducer.cli.main import main
    from reducer.launch import free_ports

    ((_, _, plane),) = planes(1)
    (dead,) = free_ports(1)
    assert main(["status", "--json", "--timeout", "2", plane.address, f"127.0.0.1:{dead}"]) == 1
    out = json.loads(capsys.readouterr().out)["reducers"]
    assert out[0]["state"] == "serving" and "error" not in out[0]
    assert out[1]["address"] == f"127.0.0.1:{dead}" and "UNAVAILABLE" in out[1]["error"]


def test_status_live_table_renders(planes) -> None:
    from rich.console import Console

    from reducer.cli.status import render, snapshot

    ((_, _, plane),) = planes(1)
    console = Console(width=200, record=True)
    console.print(render(snapshot([plane.address, "127.0.0.1:1"], 2.0)))
    text = console.export_text()
    assert plane.address in text and "serving" in text and "no answer" in text


def _scrape(url: str) -> dict[str, dict[tuple, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_endpoint_counts_traffic(pool, planes) -> None:
    from reducer.control.metrics import MetricsEndpoint, reducer_registry

    ((server, lifecycle, _),) = planes(1)
    endpoint = MetricsEndpoint(reducer_registry(server, lifecycle), host="127.0.0.1", port=0)
    try:
        before = _scrape(endpoint.url)
        assert before["reduction_server_rounds_total"][()] == 0
        assert before["reduction_server_state"][(("state", "serving"),)] == 1
        res = run_ranks(pool, control_tasks.reduce_and_hold, 2, addrs=[server.address], group="m", rounds=3, n=4096)
        assert all(r["errors"] == [] for r in res)
        # The workers have closed; the reducer ends the group (and frees its memory) when it has
        # read their goodbyes: compare the endpoint with the stats once it has.
        assert wait_until(
            lambda: server.stats()["memory_bytes"] == 0 and server.stats()["connected_workers"] == 0, 10.0
        ), server.stats()
        after = _scrape(endpoint.url)
        stats = server.stats()
        assert after["reduction_server_rounds_total"][()] == stats["rounds_completed"] == 3
        assert after["reduction_server_received_bytes_total"][()] == stats["bytes_received"] > 0
        assert after["reduction_server_sent_bytes_total"][()] == stats["bytes_sent"] > 0
        assert after["reduction_server_chunks_reduced_total"][()] == stats["chunks_reduced"] > 0
        assert after["reduction_server_errors_total"][(("cause", "connection"),)] == stats["errors"]
        assert after["reduction_server_memory_bytes"][()] == stats["memory_bytes"]
        assert after["reduction_server_workers_connected"][()] == stats["connected_workers"]
        assert "process_cpu_seconds_total" in after
    finally:
        endpoint.stop()


def test_worker_metrics(pool, reducers) -> None:
    servers = reducers(2)
    rounds = 4
    res = run_ranks(
        pool, control_tasks.instrumented_rounds, 2, addrs=addresses(servers), group="wm", rounds=rounds, n=1 << 16
    )
    for r in res:
        assert r["errors"] == []
        b, a, stats = r["before"], r["after"], r["stats"]
        assert a["reduction_worker_rounds_total"] - b["reduction_worker_rounds_total"] == rounds
        assert a["reduction_worker_rounds_total"] == stats["rounds"]
        assert a["reduction_worker_sent_bytes_total"] == stats["bytes_sent"] > b["reduction_worker_sent_bytes_total"]
        assert a["reduction_worker_received_bytes_total"] == stats["bytes_received"]
        assert a["reduction_worker_reconnects_total"] == stats["reconnects"]
        assert a["reduction_worker_rejoin_probes_total"] == stats["rejoin_probes"] == 0  # no reducer lost
        assert b["reduction_worker_allreduce_seconds_count"] == 0
        assert a["reduction_worker_allreduce_seconds_count"] == rounds
        assert a["reduction_worker_allreduce_seconds_bucket{le=+Inf}"] == rounds
        assert a["reduction_worker_allreduce_seconds_sum"] > 0


def test_kubernetes_probes_ask_services_the_control_plane_serves(planes) -> None:
    manifest = ROOT / "examples" / "kubernetes" / "reduction-server.yaml"
    sts = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    ((_, lifecycle, plane),) = planes(1)
    with _client(plane) as c:
        for probe in ("readinessProbe", "livenessProbe"):
            assert c.health(container[probe]["grpc"].get("service", "")) == "SERVING"
        lifecycle.drain(1.0)
        assert lifecycle.wait(10)
        assert c.health(container["readinessProbe"]["grpc"].get("service", "")) == "NOT_SERVING"
        assert c.health(container["livenessProbe"]["grpc"].get("service", "")) == "SERVING"


# -- `reduction-server serve` with its control plane and metrics --------------------------------


def test_serve_control_plane_drain_then_sigterm(tmp_path) -> None:
    from reducer.control.client import ControlClient

    env = child_env_in_tree(RS_AUTH_TOKEN="tok")
    proc = start_serve("--control-port", "0", "--metrics-port", "0", "--drain-timeout", "2", env=env)
    out = ChildLines(proc.stdout, "serve")
    try:
        control = out.search(r"control plane \(gRPC health, GetStats, Drain\) on 127\.0\.0\.1:(\d+)", 60).group(1)
        metrics = out.search(r"Prometheus metrics on (http://\S+)", 60).group(1)
        with ControlClient(f"127.0.0.1:{control}", timeout=10) as c:
            assert c.health() == "SERVING"
            assert _scrape(metrics)["reduction_server_state"][(("state", "serving"),)] == 1
            assert c.drain(wait=True, token="tok")["state"] == "drained"
            assert c.health() == "NOT_SERVING" and c.health("liveness") == "SERVING"
            assert _scrape(metrics)["reduction_server_state"][(("state", "drained"),)] == 1
            assert proc.poll() is None  # stays up, not ready, until a signal
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        out.join(10)
        assert proc.returncode == 0, out.text()
        assert "stopped after 0 rounds" in out.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_serve_side_port_taken() -> None:
    import socket

    from reducer.launch import free_ports

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    try:
        # Asked for explicitly: an error.
        run = subprocess.run(
            serve_argv("--control-port", str(taken)),
            env=child_env_in_tree(),
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 1 and f"cannot listen on 127.0.0.1:{taken}" in run.stderr, run.stderr
        run = subprocess.run(
            serve_argv("--control-port", "off", "--metrics-port", str(taken)),
            env=child_env_in_tree(),
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 1 and f"cannot serve metrics on 127.0.0.1:{taken}" in run.stderr, run.stderr
    finally:
        holder.close()
    # The default (data port + 1) taken: a warning, and the reducer serves without a control plane.
    for data in free_ports(8):
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", data + 1))
        except OSError:
            holder.close()
            continue
        break
    else:
        pytest.fail("no free port pair found")
    proc = None
    try:
        proc = start_serve(port=data, env=child_env_in_tree())
        out = ChildLines(proc.stdout, "serve")
        out.wait_for("stop with SIGTERM", 60)
        text = out.text()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        out.join(10)
        assert proc.returncode == 0, out.text()
        assert (
            f"WARNING reducer.serve: no control plane (health, GetStats, Drain): cannot listen on 127.0.0.1:{data + 1}"
            in text
        ), text
    finally:
        holder.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
