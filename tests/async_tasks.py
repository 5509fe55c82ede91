"""Worker-side functions of tests/client/test_async_client.py (the asynchronous C++ client, core.Client).

They run in separate processes (conftest.run_ranks) and use the client directly: start()
returns a round id at once, test()/wait() drive every round in flight.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from tasks import DTYPES, OPS, check, digest, make_data

import reducer
from reducer._native import core

# Element counts of the mixed rounds: empty, odd, smaller than one minimum shard (one
# reducer, rotated), a few shards, and several chunks per shard.
COUNTS = (0, 1, 7, 1000, 20_000, 100_003, 300_000)


def client(
    addrs: Sequence[str],
    rank: int,
    world: int,
    group: str,
    timeout: float = 30.0,
    streams: int = 1,
    chunk_bytes: int = 1 << 20,
    window: int = 4,
    max_rounds_in_flight: int = 8,
    failover: bool = True,
) -> Any:
    return core.Client(
        list(addrs),
        rank,
        world,
        group,
        "local",
        timeout,
        30.0,
        "",
        streams,
        chunk_bytes,
        window=window,
        max_rounds_in_flight=max_rounds_in_flight,
        failover=failover,
    )


def round_specs(seed: int, rounds: int) -> list[tuple[str, str, int, int]]:
    """(dtype, op, count, segments) per round: the same on every rank."""
    rng = random.Random(seed)
    return [(rng.choice(DTYPES), rng.choice(OPS), rng.choice(COUNTS), rng.choice((1, 1, 3))) for _ in range(rounds)]


def split(a: np.ndarray, parts: int) -> list[np.ndarray]:
    """`a` copied into `parts` separate arrays (separate allocations: a real scatter-gather round)."""
    return [np.array(p, copy=True) for p in np.array_split(a, parts)] if a.size else [a.copy()]


def many_rounds(
    rank: int,
    world: int,
    addrs: Sequence[str],
    group: str,
    seed: int = 1,
    rounds: int = 64,
    streams: int = 1,
    chunk_bytes: int = 1 << 20,
    window: int = 4,
    max_rounds_in_flight: int = 16,
) -> dict[str, Any]:
    """Start every round (mixed sizes, dtypes, ops; some scatter-gather), then finish them in a
    rank-specific random order with test() and wait(); check each against the reference."""
    specs = round_specs(seed, rounds)
    c = client(
        addrs,
        rank,
        world,
        group,
        streams=streams,
        chunk_bytes=chunk_bytes,
        window=window,
        max_rounds_in_flight=max_rounds_in_flight,
    )
    ids: list[int] = []
    bufs: list[list[np.ndarray]] = []  # kept alive until every round is done
    for i, (dtype, op, n, parts) in enumerate(specs):
        pieces = split(make_data(dtype, n, rank, seed=seed * 1000 + i), parts)
        bufs.append(pieces)
        if len(pieces) == 1:
            ids.append(c.start_ptr(pieces[0].ctypes.data, pieces[0].nbytes, dtype, op))
        else:
            ids.append(c.start_segments([(p.ctypes.data, p.nbytes) for p in pieces], dtype, op))
    most_in_flight = c.in_flight
    order = list(range(rounds))
    random.Random(rank * 7919 + seed).shuffle(order)
    for k, i in enumerate(order):
        if k % 2:
            c.wait(ids[i])
        else:
            while not c.test(ids[i]):
                time.sleep(0.0002)
    errors: list[str] = []
    digests: list[str] = []
    for i, (dtype, op, n, _) in enumerate(specs):
        result = np.concatenate(bufs[i]) if n else bufs[i][0]
        err = check(result, dtype, op, n, world, seed=seed * 1000 + i)
        if err:
            errors.append(f"round {i}: {err}")
        digests.append(digest(result))
    stats = c.stats()
    c.close()
    return {
        "errors": errors,
        "digests": digests,
        "stats": stats,
        "most_in_flight": most_in_flight,
        "in_flight_after": c.in_flight,
    }


def wait_each(c: Any, ids: Sequence[int]) -> tuple[list[str], list[float]]:
    """wait() for each round in turn: "ok" or "ErrorClass: message", and seconds since the first wait."""
    outcome: list[str] = []
    elapsed: list[float] = []
    t0 = time.monotonic()
    for i in ids:
        try:
            c.wait(i)
            outcome.append("ok")
        except reducer.ReductionError as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")
        elapsed.append(time.monotonic() - t0)
    return outcome, elapsed


def mismatch_mid_stream(
    rank: int, world: int, addrs: Sequence[str], group: str, bad: int = 2, rounds: int = 5
) -> dict[str, Any]:
    """Rounds of 1 MiB; in round `bad` the last rank reduces int32 instead of float32. Reports
    each round's outcome, then runs one matching round on the reconnected session."""
    c = client(addrs, rank, world, group, timeout=20.0)
    n = 1 << 18
    arrays = [np.ones(n, np.float32) for _ in range(rounds)]
    ids = []
    for i, a in enumerate(arrays):
        dtype = "int32" if (i == bad and rank == world - 1) else "float32"
        ids.append(c.start(a, dtype, "sum"))
    outcome, _ = wait_each(c, ids)
    again = np.full(1000, float(rank + 1), np.float32)
    c.allreduce(again, "float32", "sum")
    stats = c.stats()
    c.close()
    return {"outcome": outcome, "again": float(again[0]), "reconnects": stats["reconnects"]}


def _wait_for(path: str, seconds: float) -> None:
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > seconds:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.02)


def _touch(path: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write("1")
    os.replace(path + ".tmp", path)


def rounds_when_reducer_dies(
    rank: int, world: int, addrs: Sequence[str], group: str, marks: str, stalled: int = 6, timeout: float = 20.0
) -> dict[str, Any]:
    """Rank 0 starts `stalled` rounds that the other ranks never start (so they stay in flight)
    and tells the test (file marks/started); the test kills a reducer. Every outstanding round
    must raise. After the test restarted the reducer (marks/restarted), every rank runs a
    round on a new session (retrying while the group re-forms). Failover is off: with it, the
    rounds rank 0 started alone would be carried over to the survivors (tests/client/test_failover.py)."""
    c = client(addrs, rank, world, group, timeout=timeout, failover=False)
    warm = np.ones(1000, np.float32)
    c.allreduce(warm, "float32", "sum")  # the whole group is there and working
    outcome: list[str] = []
    elapsed: list[float] = []
    in_flight = 0
    if rank == 0:
        arrays = [np.ones(1 << 18, np.float32) for _ in range(stalled)]
        ids = [c.start(a, "float32", "sum") for a in arrays]
        in_flight = c.in_flight
        _touch(os.path.join(marks, "started"))
        outcome, elapsed = wait_each(c, ids)
    _wait_for(os.path.join(marks, "restarted"), 60)
    value: float | None = None
    attempts: list[str] = []
    for _ in range(4):
        a = np.full(1000, float(rank + 1), np.float32)
        try:
            c.allreduce(a, "float32", "sum")
            value = float(a[0])
            break
        except reducer.ReductionError as exc:
            attempts.append(f"{type(exc).__name__}: {exc}")
    stats = c.stats()
    c.close()
    return {
        "outcome": outcome,
        "elapsed": elapsed,
        "in_flight": in_flight,
        "value": value,
        "attempts": attempts,
        "reconnects": stats["reconnects"],
    }


def serve_on(port_file: str, port: int = 0) -> None:
    """A reducer process (the test kills it) on `port` (0 = any); writes its port to port_file."""
    srv = reducer.ReducerServer(host="127.0.0.1", port=port).start()
    with open(port_file + ".tmp", "w") as fh:
        fh.write(str(srv.port))
    os.replace(port_file + ".tmp", port_file)
    time.sleep(600)


def start_compute_wait(rank: int, world: int, addrs: Sequence[str], group: str, timeout: float = 4.0) -> float:
    """Rank 0 starts a round, 'computes' for longer than the timeout, then waits; the last rank
    starts only after that wait has begun. Time outside the client's calls is not "no progress",
    so the round succeeds."""
    c = client(addrs, rank, world, group, timeout=timeout)
    a = np.full(1 << 16, float(rank + 1), np.float32)
    if rank == 0:
        i = c.start(a, "float32", "sum")
        time.sleep(1.5 * timeout)
        c.wait(i)
    else:
        time.sleep(1.5 * timeout + 0.4 * timeout)
        c.allreduce(a, "float32", "sum")
    c.close()
    return float(a[0])


def threaded_rounds(
    rank: int, world: int, addrs: Sequence[str], group: str, rounds: int = 48, seed: int = 5
) -> dict[str, Any]:
    """One thread starts the rounds, another polls test() on them, a third wait()s on every
    third one (the NCCL proxy pattern: start and test from different threads)."""
    import queue
    import threading

    specs = round_specs(seed, rounds)
    c = client(addrs, rank, world, group, max_rounds_in_flight=4)
    arrays = [make_data(dtype, n, rank, seed=seed * 1000 + i) for i, (dtype, op, n, _) in enumerate(specs)]
    to_test: queue.Queue[int | None] = queue.Queue()
    to_wait: queue.Queue[int | None] = queue.Queue()
    failures: list[str] = []

    def starter() -> None:
        for i, (dtype, op, _, _) in enumerate(specs):
            rid = c.start_ptr(arrays[i].ctypes.data, arrays[i].nbytes, dtype, op)
            (to_wait if i % 3 == 0 else to_test).put(rid)
        to_test.put(None)
        to_wait.put(None)

    def tester() -> None:
        pending: list[int] = []
        closed = False
        while not closed or pending:
            try:
                rid = to_test.get(timeout=0.001)
                if rid is None:
                    closed = True
                else:
                    pending.append(rid)
            except queue.Empty:
                pass
            pending = [p for p in pending if not c.test(p)]

    def waiter() -> None:
        while (rid := to_wait.get()) is not None:
            c.wait(rid)

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported to the test
                failures.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")

        return run

    threads = [threading.Thread(target=guarded(f)) for f in (starter, tester, waiter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [
        f"round {i}: {e}"
        for i, (dtype, op, n, _) in enumerate(specs)
        if (e := check(arrays[i], dtype, op, n, world, seed=seed * 1000 + i))
    ]
    digests = [digest(a) for a in arrays]
    c.close()
    return {"failures": failures, "errors": errors, "digests": digests, "alive": any(t.is_alive() for t in threads)}
