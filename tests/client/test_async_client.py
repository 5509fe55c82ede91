"""The asynchronous worker client: several rounds in flight, test()/wait() in any order,
try_start at the limit, scatter-gather rounds, and errors failing every round in flight."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import threading
import time
from typing import Any

import async_tasks
import numpy as np
import pytest
from conftest import addresses, run_ranks, run_ranks_collect

import reducer

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("nred,streams,chunk,window", [(2, 1, 1 << 20, 4), (3, 2, 8192, 2)])
def test_many_rounds_in_flight_match_reference(pool, reducers, nred, streams, chunk, window):
    """64 rounds of mixed sizes, dtypes and ops (some scatter-gather) all started, then finished
    in a different random order on each worker: every result equals the float64 reference
    (exact for integers) and is bit-identical on every worker."""
    servers = reducers(nred)
    world = 3
    res = run_ranks(
        pool,
        async_tasks.many_rounds,
        world,
        timeout=200,
        addrs=addresses(servers),
        group=f"many-{nred}-{streams}",
        seed=nred,
        streams=streams,
        chunk_bytes=chunk,
        window=window,
    )
    for r in res:
        assert r["errors"] == [], r["errors"][:5]
        assert r["stats"]["rounds"] == 64
        assert r["stats"]["reconnects"] == 0
        assert r["in_flight_after"] == 0
    assert res[0]["digests"] == res[1]["digests"] == res[2]["digests"]
    # The rounds really were in flight together (start() returns before a round finishes).
    assert max(r["most_in_flight"] for r in res) > 1


def _pair(addrs: list[str], group: str, **kw: Any) -> list[Any]:
    """Two clients of one group in this process (each constructor waits for the other)."""
    out: list[Any] = [None, None]
    errs: list[BaseException] = []

    def make(rank: int) -> None:
        try:
            out[rank] = async_tasks.client(addrs, rank, 2, group, **kw)
        except BaseException as exc:  # reported below
            errs.append(exc)

    ts = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs, errs
    return out


def finish(rounds: list[Any], seconds: float = 60.0) -> None:
    """test() every (client, id) until all are done (bounded)."""
    t0 = time.monotonic()
    pending = list(rounds)
    while pending:
        assert time.monotonic() - t0 < seconds, f"{len(pending)} rounds still pending"
        pending = [(c, i) for c, i in pending if not c.test(i)]
        time.sleep(0.0005)


def test_try_start_refuses_at_the_limit(reducers):
    servers = reducers(2)
    a, b = _pair(addresses(servers), "limit", max_rounds_in_flight=2)
    try:
        xs = [np.full(100_000, float(i + 1), np.float32) for i in range(3)]
        ys = [np.full(100_000, 10.0 * (i + 1), np.float32) for i in range(3)]
        ids_a = [a.start(xs[0], "float32", "sum"), a.start(xs[1], "float32", "sum")]
        # Rank 1 has started nothing, so neither round can finish: rank 0 is at its limit.
        assert a.in_flight == 2
        assert a.try_start_ptr(xs[2].ctypes.data, xs[2].nbytes, "float32", "sum") is None
        assert a.in_flight == 2
        ids_b = [b.start(ys[0], "float32", "sum"), b.start(ys[1], "float32", "sum")]
        # Rounds progress inside the clients' calls: drive both (one thread, test() only).
        finish([(a, i) for i in ids_a] + [(b, i) for i in ids_b])
        assert a.in_flight == 0
        third_a = a.try_start_ptr(xs[2].ctypes.data, xs[2].nbytes, "float32", "sum")
        assert third_a is not None
        third_b = b.start(ys[2], "float32", "sum")
        finish([(a, third_a), (b, third_b)])
        for i in range(3):
            expect = 11.0 * (i + 1)
            assert (xs[i] == expect).all() and (ys[i] == expect).all(), (i, xs[i][:3], ys[i][:3])
        # A finished round is forgotten once reported.
        with pytest.raises(reducer.ConfigError, match="already waited for"):
            a.wait(ids_a[0])
        with pytest.raises(reducer.ConfigError, match="never started"):
            a.test(10_000)
    finally:
        a.close()
        b.close()


def test_mismatch_mid_stream_fails_every_worker(pool, reducers):
    """Round 2 of 5 disagrees (dtype): it and every later round raise MismatchError on every
    worker; the next round runs on a new session."""
    servers = reducers(2)
    res = run_ranks_collect(pool, async_tasks.mismatch_mid_stream, 2, addrs=addresses(servers), group="mm-async")
    for r in res:
        assert isinstance(r, dict), r
        out = r["outcome"]
        for o in out[2:]:
            assert o.startswith("MismatchError"), out
            assert "disagree" in o, out
        assert r["again"] == 3.0
        assert r["reconnects"] == 1


def test_reducer_killed_with_rounds_in_flight(pool, reducers):
    good = reducers(1)[0]
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        victim = ctx.Process(target=async_tasks.serve_on, args=(port_file,))
        victim.start()
        replacement = None
        try:
            async_tasks._wait_for(port_file, 30)
            port = int(open(port_file).read())
            os.remove(port_file)
            addrs = [good.address, f"127.0.0.1:{port}"]
            futs = [
                pool.submit(
                    async_tasks.rounds_when_reducer_dies, rank=r, world=2, addrs=addrs, group="rkill", marks=tmp
                )
                for r in range(2)
            ]
            async_tasks._wait_for(os.path.join(tmp, "started"), 60)
            victim.kill()
            victim.join(10)
            replacement = ctx.Process(target=async_tasks.serve_on, args=(port_file, port))
            replacement.start()
            async_tasks._wait_for(port_file, 30)
            async_tasks._touch(os.path.join(tmp, "restarted"))
            out = [f.result(timeout=120) for f in futs]
        finally:
            for p in (victim, replacement):
                if p is not None and p.is_alive():
                    p.kill()
                    p.join(5)
    r0 = out[0]
    assert r0["in_flight"] == 6
    assert len(r0["outcome"]) == 6
    for o in r0["outcome"]:
        assert o.startswith("PeerLostError"), r0["outcome"]
    # Well within the 20 s no-progress timeout: the loss is noticed, not waited out.
    assert max(r0["elapsed"]) < 10, r0["elapsed"]
    for r in out:
        assert r["value"] == 3.0, r
        assert r["reconnects"] >= 1, r


def test_time_between_calls_is_not_a_stall(pool, reducers):
    servers = reducers(2)
    res = run_ranks(pool, async_tasks.start_compute_wait, 2, addrs=addresses(servers), group="compute")
    assert res == [3.0, 3.0]


def test_start_and_test_from_different_threads(pool, reducers):
    servers = reducers(2)
    res = run_ranks(pool, async_tasks.threaded_rounds, 2, addrs=addresses(servers), group="threads")
    for r in res:
        assert r["failures"] == [] and not r["alive"], r["failures"]
        assert r["errors"] == [], r["errors"][:5]
    assert res[0]["digests"] == res[1]["digests"]
