"""A worker process with two clients of one job (the fusion engine's data group and its probe
group, "<group>/fusion-probe") survives a reducer kill whichever client each worker happens to
be driving. When a reducer dies while rank 1 waits on its data client and rank 0 on its probe
client, each failover exchange needs the other worker's idle client: an idle client only moves
inside calls, so both waited until the connect timeout and raised ("waiting for all workers of
the group"). Now every client of a Communicator reads its links while idle
(Client.progress_while_idle, a C++ thread: reducer.communicator._client); here the test's
clients do the same.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from test_failover import Victim, on_threads

import reducer
from reducer._native import core
from reducer.communicator import IDLE_PROGRESS_S

pytestmark = [pytest.mark.timeout(120), pytest.mark.sanitize]

WORLD = 2
CONNECT_TIMEOUT = 8.0  # the old code waited this long, then raised
ready = threading.Event()  # rank 0 has round 2's results and the victim is dead


def make_clients(addrs: list[str], group: str, idle_progress: bool = True) -> list[Any]:
    clients = on_threads(
        lambda r: core.Client(addrs, r, WORLD, group, "local", 30.0, CONNECT_TIMEOUT, "", 1, 1 << 14), WORLD
    )
    for c in clients:
        assert not isinstance(c, BaseException), c
        if idle_progress:
            c.progress_while_idle(IDLE_PROGRESS_S)
    return clients


def allreduce(client: Any, rank: int, n: int, step: int) -> np.ndarray:
    a = np.arange(n, dtype=np.int64) * (rank + 1) + step
    client.allreduce_ptr(int(a.ctypes.data), a.nbytes, "int64", "sum", step)
    return a


def expected(n: int, step: int) -> np.ndarray:
    return sum(np.arange(n, dtype=np.int64) * (r + 1) + step for r in range(WORLD))


def run_cross_wait(rank: int, data: list[Any], probe: list[Any], victim: Victim, n: int) -> np.ndarray:
    """Rank 1 starts data round 2 and leaves it to the network thread; rank 0 finishes it; the
    reducer dies; then rank 0 runs probe round 3 (its data client idle) while rank 1 waits for
    data round 2 and only then runs probe 3 (its probe client idle meanwhile)."""
    mine = np.arange(n, dtype=np.int64) * (rank + 1) + 2
    if rank == 1:
        rid = data[1].start_ptr(int(mine.ctypes.data), mine.nbytes, "int64", "sum", 2)
        ready.wait(60)  # rank 0 has its results and the victim is dead
        data[1].wait(rid)  # the failover exchange needs rank 0's idle data client
        allreduce(probe[1], rank, n, 3)
        return mine
    data[0].allreduce_ptr(int(mine.ctypes.data), mine.nbytes, "int64", "sum", 2)
    victim.kill()
    ready.set()
    allreduce(probe[0], rank, n, 3)  # its failover exchange needs rank 1's idle probe client
    return mine


def test_a_reducer_kill_while_each_worker_waits_on_a_different_client(reducers):
    victim = Victim()
    try:
        addrs = [f"127.0.0.1:{reducers(1)[0].port}", victim.address]
        n = 16_000  # 8 chunks over both reducers
        data = make_clients(addrs, "xg")
        probe = make_clients(addrs, "xg/fusion-probe")
        for step, group in enumerate((data, probe)):  # both sessions are up on both reducers
            out = on_threads(lambda r: allreduce(group[r], r, n, step), WORLD)
            for a in out:
                assert not isinstance(a, BaseException), a
                np.testing.assert_array_equal(a, expected(n, step))
        ready.clear()
        out = on_threads(lambda r: run_cross_wait(r, data, probe, victim, n), WORLD, timeout=60)
        for a in out:
            assert not isinstance(a, BaseException), a  # before progress(): a connect timeout
            np.testing.assert_array_equal(a, expected(n, 2))
        for step, group in ((4, data), (5, probe)):  # both groups go on, on the survivor
            out = on_threads(lambda r: allreduce(group[r], r, n, step), WORLD, timeout=60)
            for a in out:
                assert not isinstance(a, BaseException), a
                np.testing.assert_array_equal(a, expected(n, step))
        for c in data + probe:
            c.close()
    finally:
        victim.kill()


def test_an_error_an_idle_pass_meets_is_raised_by_the_next_start():
    """The only reducer dies while both workers are idle: their idle passes drop the session, and
    the next start() raises the loss at once (not a reconnect that waits for a dead reducer)."""
    victim = Victim()
    try:
        clients = make_clients([victim.address], "idle-error")
        out = on_threads(lambda r: allreduce(clients[r], r, 1000, 0), WORLD)
        for a in out:
            assert not isinstance(a, BaseException), a
        victim.kill()
        time.sleep(10 * IDLE_PROGRESS_S)  # the idle passes read the closed connections
        for c in clients:
            assert not c.connected
        t0 = time.monotonic()
        for r, c in enumerate(clients):
            with pytest.raises(reducer.PeerLostError, match="every reducer is lost"):
                allreduce(c, r, 1000, 1)
        assert time.monotonic() - t0 < CONNECT_TIMEOUT / 2
        for c in clients:
            c.close()
    finally:
        victim.kill()


def test_idle_progress_needs_a_sane_period_and_failover(reducers):
    addrs = [f"127.0.0.1:{reducers(1)[0].port}"]
    clients = on_threads(
        lambda r: core.Client(addrs, r, WORLD, "idle-cfg", "local", 30.0, 8.0, "", 1, failover=False), WORLD
    )
    for c in clients:
        assert not isinstance(c, BaseException), c
        for bad in (0.0, -1.0, float("nan"), float("inf"), 1e9):
            with pytest.raises(reducer.ConfigError, match="idle progress period"):
                c.progress_while_idle(bad)
        c.progress_while_idle(IDLE_PROGRESS_S)  # without failover: nothing (no thread)
    out = on_threads(lambda r: allreduce(clients[r], r, 1000, 0), WORLD)
    for a in out:
        assert not isinstance(a, BaseException), a
        np.testing.assert_array_equal(a, expected(1000, 0))
    for c in clients:
        c.close()
        c.progress_while_idle(IDLE_PROGRESS_S)  # after close: nothing
