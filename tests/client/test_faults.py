"""Faults: unreachable reducers, dying workers and reducers, disagreements, authentication."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import time

import numpy as np
import pytest
import tasks
from conftest import addresses, run_ranks, run_ranks_collect

import reducer

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_reducer_names_address():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(reducer.ConnectError, match=rf"127\.0\.0\.1:{port}.*attempts"):
        reducer.Communicator([f"127.0.0.1:{port}"], 0, 1, connect_timeout=1.0)
    assert time.monotonic() - t0 < 5


def test_bad_address_is_config_error():
    with pytest.raises(reducer.ConfigError, match="port"):
        reducer.Communicator(["127.0.0.1"], 0, 1)
    with pytest.raises(reducer.ConfigError, match="rank"):
        reducer.Communicator(["127.0.0.1:1"], 2, 2)


def test_missing_worker_times_out_instead_of_hanging(reducers):
    srv = reducers(1)[0]
    t0 = time.monotonic()
    with pytest.raises(reducer.ReductionTimeout, match="group"):
        reducer.Communicator([srv.address], 0, 2, group="lonely", connect_timeout=1.0)
    assert time.monotonic() - t0 < 5


def test_worker_dies_mid_round_then_group_reconnects(pool, reducers):
    servers = reducers(2)
    addrs = addresses(servers)
    ctx = mp.get_context("spawn")
    victim = ctx.Process(target=tasks.join_and_wait, args=(addrs, 2, 3, "die"))
    victim.start()
    try:
        futs = [
            pool.submit(tasks.hold_round, rank=r, world=3, addrs=addrs, group="die", again=True, timeout=20)
            for r in range(2)
        ]
        # Wait until the group has formed on both reducers (the victim's process may take a while
        # to start); ranks 0 and 1 then enter the round at once, and rank 2 never sends.
        deadline = time.monotonic() + 30
        while not all(any(r["group"] == "die" and r["complete"] for r in srv.group_stats()) for srv in servers):
            assert time.monotonic() < deadline, "the group did not form"
            time.sleep(0.05)
        time.sleep(0.5)
        victim.kill()
        victim.join(10)
        # A replacement for rank 2 joins the re-formed group and runs one round.
        time.sleep(0.3)
        replacement = pool.submit(tasks.hold_round, rank=2, world=3, addrs=addrs, group="die", timeout=20)
        out = [f.result(timeout=60) for f in futs]
        rep = replacement.result(timeout=60)
    finally:
        if victim.is_alive():
            victim.kill()
    for o in out:
        assert o["first"].startswith("PeerLostError"), o
        assert "rank 2" in o["first"]
        assert o["elapsed"] < 10
        assert o["second"] == 3.0, o
    assert rep["first"] == "ok"
    assert servers[0].stats()["errors"] >= 1


def test_reducer_dies_mid_round(pool, reducers):
    """With failover off, a reducer that dies fails the round at once (tests/client/test_failover.py
    covers the default, where the round finishes on the survivors)."""
    good = reducers(1)[0]
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = ctx.Process(target=tasks.serve_forever, args=(port_file,))
        proc.start()
        try:
            for _ in range(200):
                if os.path.exists(port_file):
                    break
                time.sleep(0.05)
            addrs = [good.address, f"127.0.0.1:{open(port_file).read()}"]
            silent = pool.submit(tasks.join_and_wait, addrs, 1, 2, "rdie", 3.0, False)
            fut = pool.submit(tasks.hold_round, rank=0, world=2, addrs=addrs, group="rdie", timeout=30, failover=False)
            time.sleep(1.5)
            proc.kill()
            out = fut.result(timeout=30)
        finally:
            proc.kill()
            proc.join(5)
    assert out["first"].startswith("PeerLostError"), out
    assert out["elapsed"] < 10
    # The survivor's other reducer keeps serving new groups.
    res = run_ranks(pool, tasks.allreduce_once, 2, addrs=[good.address], group="after")
    assert res[0]["value"][0] == 2
    silent.result(timeout=30)


@pytest.mark.parametrize(
    "field,kw",
    [
        ("size", dict(sizes_by_rank=[1000, 1001])),
        ("dtype", dict(dtypes_by_rank=["float32", "int32"])),
        ("op", dict(ops_by_rank=["sum", "max"])),
    ],
)
def test_disagreement_raises_on_every_worker(pool, reducers, field, kw):
    servers = reducers(2)
    out = run_ranks_collect(pool, tasks.allreduce_once, 2, addrs=addresses(servers), group=f"mm-{field}", **kw)
    for o in out:
        assert isinstance(o, reducer.MismatchError), o
        assert "disagree" in str(o)
    # The reducers keep serving: a well-formed group works afterwards.
    res = run_ranks(pool, tasks.allreduce_once, 2, addrs=addresses(servers), group=f"ok-{field}")
    assert res[0]["value"][0] == 2


def test_group_conflict_on_world_size(reducers):
    srv = reducers(1)[0]
    import threading

    errs = []

    def first():
        try:
            reducer.Communicator([srv.address], 0, 2, group="conf", connect_timeout=1.5)
        except reducer.ReductionError as exc:
            errs.append(exc)

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.3)
    with pytest.raises(reducer.MismatchError, match="world size 3 differs"):
        reducer.Communicator([srv.address], 1, 3, group="conf", connect_timeout=3)
    t.join(10)


def test_authentication(pool, reducers):
    srv = reducers(1, auth_token="s3cret")[0]
    ok = run_ranks(pool, tasks.allreduce_once, 2, addrs=[srv.address], group="auth", auth_token="s3cret")
    assert ok[0]["value"][0] == 2
    with pytest.raises(reducer.AuthError, match="authentication failed"):
        reducer.Communicator([srv.address], 0, 1, auth_token="wrong", connect_timeout=3)
    with pytest.raises(reducer.AuthError, match="authentication failed"):
        reducer.Communicator([srv.address], 0, 1, connect_timeout=3)
    assert srv.stats()["rejected"] >= 2


def test_auth_token_from_environment_and_file(reducers, monkeypatch, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    monkeypatch.setenv("RS_AUTH_TOKEN_FILE", str(token_file))
    srv = reducers(1)[0]  # takes the token from RS_AUTH_TOKEN_FILE
    with reducer.Communicator([srv.address], 0, 1, group="envauth") as comm:  # so does the worker
        a = np.ones(2, np.float32)
        comm.allreduce(a)
    monkeypatch.delenv("RS_AUTH_TOKEN_FILE")
    with pytest.raises(reducer.AuthError):
        reducer.Communicator([srv.address], 0, 1, connect_timeout=3)


def test_group_memory_is_capped(reducers):
    srv = reducers(1, max_group_bytes=8 << 20)[0]
    # window 4 x (world 1 + 2) x 1 MiB chunks = 12 MiB > 8 MiB: refused before anything is allocated
    with pytest.raises(reducer.MismatchError, match="would need 12 MiB"):
        reducer.Communicator([srv.address], 0, 1, group="huge", chunk_bytes=1 << 20, connect_timeout=3)
    with reducer.Communicator([srv.address], 0, 1, group="small", chunk_bytes=256 << 10) as comm:
        a = np.ones(1 << 20, np.float32)
        comm.allreduce(a)
        assert a[0] == 1
    # The buffers go when the last member has left (the reducer sees the goodbye asynchronously).
    for _ in range(100):
        if srv.stats()["memory_bytes"] == 0:
            break
        time.sleep(0.02)
    assert srv.stats()["memory_bytes"] == 0
