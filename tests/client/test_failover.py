"""Reducer failover (issue 13): a reducer killed at any point of large rounds costs nothing.

The workers run as threads of this process (the core releases the GIL), the surviving
reducers in-process, the victim in a process of its own that the test SIGKILLs at a random
point of a batch of large rounds in flight (start, middle, while results stream back). Every
worker's bytes must equal, bit for bit, those of the same batch run without the failure on the
same cluster (the survivors fold in rank order like the lost reducer did), and be close to the
float64 reference.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import async_tasks
import numpy as np
import pytest
from attack_tools import ERR_SHUTDOWN
from conftest import addresses
from lying_reducer import Header, LyingReducer, error_frame
from tasks import make_data, reference
from test_fusion import run_workers

import reducer
from reducer._native import core

pytestmark = pytest.mark.timeout(300)

# A batch: several rounds in flight at once, mixed dtypes, ops, sizes, compression and segments.
BATCH: tuple[tuple[str, str, int, str, int], ...] = (
    # dtype, op, elements, compression, segments
    ("float32", "sum", 3_000_000, "", 1),
    ("int64", "max", 700_001, "", 3),
    ("float32", "avg", 2_000_000, "bf16", 1),
    ("bfloat16", "sum", 1_500_000, "", 2),
    ("float64", "min", 900_000, "", 1),
    ("int32", "sum", 1_200_000, "", 1),
    ("float16", "sum", 1_000_001, "", 1),
    ("float32", "sum", 1_300_000, "fp16", 2),
)


def inputs(rank: int, seed: int) -> list[list[np.ndarray]]:
    out = []
    for i, (dtype, _op, n, _comp, parts) in enumerate(BATCH):
        a = make_data(dtype, n, rank, seed=seed * 100 + i)
        out.append([np.array(p, copy=True) for p in np.array_split(a, parts)])
    return out


def run_batch(client: Any, bufs: list[list[np.ndarray]]) -> dict[str, Any]:
    """Starts every round of the batch, then waits for all of them."""
    try:
        ids = []
        for (dtype, op, _n, comp, _parts), pieces in zip(BATCH, bufs):
            if len(pieces) == 1:
                ids.append(client.start_ptr(pieces[0].ctypes.data, pieces[0].nbytes, dtype, op, compression=comp))
            else:
                ids.append(
                    client.start_segments([(p.ctypes.data, p.nbytes) for p in pieces], dtype, op, compression=comp)
                )
        for i in ids:
            client.wait(i)
        return {"ok": True}
    except Exception as exc:  # reported, not raised, so every thread is joined
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def on_threads(fn: Callable[[int], Any], world: int, timeout: float = 120.0) -> list[Any]:
    return run_workers(world, fn, timeout)


class Victim:
    """A reducer in its own process, killed with SIGKILL."""

    def __init__(self, port: int = 0) -> None:
        ctx = mp.get_context("spawn")
        self.tmp = tempfile.mkdtemp()
        port_file = os.path.join(self.tmp, "port")
        self.proc = ctx.Process(target=async_tasks.serve_on, args=(port_file, port), daemon=True)
        self.proc.start()
        async_tasks._wait_for(port_file, 60)
        self.port = int(open(port_file).read())
        self.address = f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)


def connect(addrs: Sequence[str], world: int, group: str, timeout: float = 20.0) -> list[Any]:
    clients = on_threads(
        lambda r: core.Client(list(addrs), r, world, group, "local", timeout, 60.0, "", 1, 1 << 20), world
    )
    for c in clients:
        assert not isinstance(c, BaseException), c
    return clients


def bits(a: np.ndarray) -> bytes:
    return a.tobytes()


@pytest.mark.parametrize("survivors,world,trials", [(1, 2, 3), (2, 3, 3), (2, 4, 2)])
def test_reducer_killed_mid_batch_gives_bit_identical_results(reducers, survivors, world, trials):
    """R = survivors + 1 reducers; one is killed at a random point of a batch of rounds in flight."""
    good = addresses(reducers(survivors))
    rng = random.Random(1000 * survivors + world)
    for trial in range(trials):
        victim = Victim()
        try:
            addrs = list(good)
            addrs.insert(rng.randrange(len(addrs) + 1), victim.address)  # the victim's place varies
            group = f"fo-{survivors}-{world}-{trial}"
            clients = connect(addrs, world, group)
            seed = trial + 7
            # The batch without a failure: the bytes to match, and how long it takes.
            ref = [inputs(r, seed) for r in range(world)]
            t0 = time.monotonic()
            res = on_threads(lambda r: run_batch(clients[r], ref[r]), world)
            healthy = time.monotonic() - t0
            assert all(x["ok"] for x in res), res
            # The same batch, the victim killed at a random point of it.
            got = [inputs(r, seed) for r in range(world)]
            kill_at = rng.uniform(0.0, 1.0) * healthy
            # After the batch each worker waits only for the kill (not for the other workers)
            # and goes on to one more round, as a training loop does: a worker that got every
            # result of the batch before the kill is pulled into the failover at that call, and
            # a kill after the batch is noticed there. A barrier between the two (joining the
            # threads) would leave a worker that saw the loss mid-batch waiting for the others
            # until its timeout.
            after = [np.full(1000, float(r + 1), np.float32) for r in range(world)]
            killed = threading.Event()

            def kill() -> None:
                victim.kill()
                killed.set()

            def batch_then_one_more(r: int) -> dict[str, Any]:
                out = run_batch(clients[r], got[r])
                if out["ok"]:
                    try:
                        assert killed.wait(60), "the victim was not killed"
                        clients[r].wait(clients[r].start(after[r], "float32", "sum"))
                    except Exception as exc:
                        out = {"ok": False, "error": f"after the batch: {type(exc).__name__}: {exc}"}
                return out

            killer = threading.Timer(kill_at, kill)
            killer.start()
            res = on_threads(batch_then_one_more, world)
            killer.join()
            assert all(x["ok"] for x in res), (kill_at, healthy, res)
            for r in range(world):
                for i, (want, have) in enumerate(zip(ref[r], got[r])):
                    for a, b in zip(want, have):
                        assert bits(a) == bits(b), f"rank {r} round {i} differs after a kill at {kill_at:.3f}s"
            assert all(float(a[0]) == world * (world + 1) / 2 for a in after)
            stats = [c.stats() for c in clients]
            for s in stats:
                assert s["reducer_failovers"] == 1, (kill_at, healthy, stats)
                assert s["reducers_active"] == survivors
            for c in clients:
                c.close()
        finally:
            victim.kill()


@pytest.mark.sanitize
def test_results_match_the_float64_reference_after_a_failover(reducers):
    """Not only equal to the healthy run: right (float64 reference, exact for integers)."""
    good = addresses(reducers(1))
    victim = Victim()
    try:
        world = 2
        clients = connect([victim.address] + good, world, "fo-ref")
        bufs = [
            [np.array(make_data(d, 2_000_000, r, seed=5 + i), copy=True)]
            for i, d in enumerate(("float32", "int64"))
            for r in range(world)
        ]
        per_rank = [[bufs[0 * world + r][0], bufs[1 * world + r][0]] for r in range(world)]
        ids: list[list[int]] = [[], []]

        def start(r: int) -> None:
            ids[r] = [
                clients[r].start(per_rank[r][0], "float32", "sum"),
                clients[r].start(per_rank[r][1], "int64", "sum"),
            ]

        on_threads(start, world)
        victim.kill()  # the rounds are in flight (or, on a fast machine, just done: then the next one fails over)
        res = on_threads(lambda r: [clients[r].wait(i) for i in ids[r]], world)
        assert all(not isinstance(x, BaseException) for x in res), res
        for r in range(world):
            np.testing.assert_allclose(
                per_rank[r][0], reference("float32", "sum", 2_000_000, world, seed=5), rtol=1e-5, atol=1e-5
            )
            assert np.array_equal(per_rank[r][1], reference("int64", "sum", 2_000_000, world, seed=6))
        for c in clients:
            c.close()
    finally:
        victim.kill()


def test_no_reducer_left_fails_with_the_cause():
    victim = Victim()
    try:
        clients = connect([victim.address], 2, "fo-none", timeout=5.0)
        victim.kill()
        arrays = [np.ones(1 << 20, np.float32) for _ in range(2)]
        res = on_threads(lambda r: run_batch_one(clients[r], arrays[r]), 2)
        for x in res:
            assert isinstance(x, reducer.PeerLostError), res
            assert "every reducer is lost" in str(x)
    finally:
        victim.kill()


def run_batch_one(client: Any, a: np.ndarray) -> BaseException | None:
    try:
        client.allreduce(a, "float32", "sum")
    except BaseException as exc:
        return exc
    return None


def test_failover_off_fails_the_round(reducers):
    good = addresses(reducers(1))
    victim = Victim()
    try:
        clients = on_threads(
            lambda r: core.Client(
                [victim.address] + good, r, 2, "fo-off", "local", 10.0, 30.0, "", 1, 1 << 20, failover=False
            ),
            2,
        )
        victim.kill()
        res = on_threads(lambda r: run_batch_one(clients[r], np.ones(1 << 20, np.float32)), 2)
        assert all(isinstance(x, reducer.PeerLostError) for x in res), res
        assert all(c.stats()["reducer_failovers"] == 0 for c in clients)
    finally:
        victim.kill()


def test_mixed_failover_settings_are_refused(reducers):
    addrs = addresses(reducers(1))
    errors: list[Any] = []

    def make(r: int) -> Any:
        try:
            return core.Client(addrs, r, 2, "fo-mixed", "local", 5.0, 5.0, "", 1, 1 << 20, failover=(r == 0))
        except BaseException as exc:
            errors.append(exc)
            return None

    on_threads(make, 2)
    # The later one is refused with the reason; the earlier one then waits for it in vain.
    assert len(errors) == 2, errors
    assert any(isinstance(e, reducer.MismatchError) and "RS_FAILOVER" in str(e) for e in errors), errors


@pytest.mark.parametrize("victim_at", [0, 1])
def test_async_fusion_survives_a_reducer_kill(reducers, victim_at):
    """allreduce_async (tensor fusion, several fused rounds in flight) finishes on the survivor,
    whichever reducer dies: the fusion engine's agreement probes fail over too (they once ran on
    one reducer, picked from the group name, and died with it)."""
    good = addresses(reducers(1))
    victim = Victim()
    try:
        world = 2
        tensors = [
            [make_data("float32", n, r, seed=40 + i) for i, n in enumerate([300_000] * 40)] for r in range(world)
        ]
        addrs = list(good)
        addrs.insert(victim_at, victim.address)
        comms = on_threads(
            lambda r: reducer.Communicator(addrs, r, world, group="fo-fusion", timeout=20, fusion_threshold=4 << 20),
            world,
        )

        # Warm up: the engines' probe clients exist before the kill (one made after a reducer died
        # cannot connect: a new client waits for every reducer, docs/worker-library.md).
        on_threads(lambda r: comms[r].allreduce_async(np.ones(10, np.float32)).wait(), world)

        def step(r: int) -> Any:
            handles = [comms[r].allreduce_async(t) for t in tensors[r]]
            if r == 0:
                victim.kill()
            for h in handles:
                h.wait()
            return comms[r].stats()

        stats = on_threads(step, world)
        assert all(isinstance(s, dict) for s in stats), stats
        # (A kill after the fused rounds finished is noticed by the next one.)
        on_threads(lambda r: comms[r].allreduce(np.ones(10, np.float32)), world)
        stats = [c.stats() for c in comms]
        for i, n in enumerate([300_000] * 40):
            want = reference("float32", "sum", n, world, seed=40 + i)
            for r in range(world):
                np.testing.assert_allclose(tensors[r][i], want, rtol=1e-5, atol=1e-5)
        assert all(s["reducers_active"] == 1 for s in stats), stats
        for c in comms:
            c.close()
    finally:
        victim.kill()


def test_a_restarted_reducer_rejoins_at_an_agreed_boundary(reducers):
    """Killed, the job goes on on the survivor; restarted at its address, it is taken back at a
    rejoin check (every 32 rounds, the same round on every worker) and used again. Restarted
    before round 5: the check at RoundId 32 (the first after the failover) starts the probes,
    which reach it; the check at 64 reads them and takes it back (70 rounds cover both)."""
    good = addresses(reducers(1))
    victim = Victim()
    restarted: Victim | None = None
    try:
        world = 2
        clients = connect([victim.address] + good, world, "fo-rejoin")
        victim.kill()
        restarted_box: list[Victim] = []

        def rounds(r: int, count: int, restart_after: int = -1) -> list[float]:
            out = []
            for k in range(count):
                if r == 0 and k == restart_after:
                    restarted_box.append(Victim(victim.port))
                a = np.full(50_000, float(r + 1 + k), np.float32)
                clients[r].allreduce(a, "float32", "sum")
                out.append(float(a[-1]))
            return out

        res = on_threads(lambda r: rounds(r, 70, restart_after=5), world)
        assert all(isinstance(x, list) for x in res), res
        for x in res:
            assert x == [float(sum(r + 1 + k for r in range(world))) for k in range(70)]
        restarted = restarted_box[0] if restarted_box else None
        stats = [c.stats() for c in clients]
        for s in stats:
            assert s["reducer_failovers"] == 1, stats
            assert s["reducer_rejoins"] == 1, stats
            assert s["reducers_active"] == 2, stats
        for c in clients:
            c.close()
    finally:
        victim.kill()
        if restarted is not None:
            restarted.kill()


def start_when_room(client: Any, a: np.ndarray, limit: float = 60.0) -> int:
    """try_start_ptr of `a` (a sum) until the client takes it: it refuses (None) while rounds are
    in flight at a rejoin check and while the check waits for the other workers. The round id."""
    deadline = time.monotonic() + limit  # a guard against a hang, not a measurement
    while time.monotonic() < deadline:
        rid = client.try_start_ptr(a.ctypes.data, a.nbytes, str(a.dtype), "sum")
        if rid is not None:
            return int(rid)
        time.sleep(0.001)
    raise AssertionError(f"try_start did not take the round within {limit} s")


def test_try_start_at_a_rejoin_check_does_not_wait_for_a_late_worker(reducers):
    """The session runs on fewer reducers than configured, so RoundId 32 is a rejoin check, whose
    MIN all-reduce completes only once every worker reached it. try_start (the NCCL plugin's
    iallreduce calls it on NCCL's proxy thread, which must never block) must not wait for that:
    rank 1 is held back until rank 0's try_start calls at the check have returned, so a call that
    waited for rank 1 would not return (the watchdog lets rank 1 go after 10 s, so the test fails
    instead of hanging). They return None ("no room"); once rank 1 is there the round starts on
    both, and every round's result is exact. A check left open is dropped by close()."""
    good = addresses(reducers(1))
    victim = Victim()
    try:
        world, n, check = 2, 1000, 32
        clients = connect([victim.address] + good, world, "fo-late")
        victim.kill()
        arrived = threading.Event()  # rank 1 may go on to the check

        def data(r: int, k: int) -> np.ndarray:
            return np.full(n, r + 1 + k, np.int64)

        def expect(a: np.ndarray, k: int) -> None:
            assert np.array_equal(a, np.full(n, sum(q + 1 + k for q in range(world)), np.int64)), (k, a[:4])

        def blocking(r: int, first: int, last: int) -> None:
            for k in range(first, last):
                a = data(r, k)
                clients[r].allreduce(a, "int64", "sum")
                expect(a, k)

        def non_blocking(r: int, first: int, last: int) -> None:
            for k in range(first, last):
                a = data(r, k)
                clients[r].wait(start_when_room(clients[r], a))
                expect(a, k)

        # Round 0 finds the loss (the session goes on on the survivor), then up to the check.
        assert on_threads(lambda r: blocking(r, 0, check), world) == [None] * world
        assert all(c.stats()["reducers_active"] == 1 for c in clients)
        refused: list[Any] = []

        def rank0() -> dict[str, Any]:
            a = data(0, check)
            calls: list[Any] = []

            def call() -> None:
                for _ in range(3):  # the first enqueues the check's exchange, the later ones move it on
                    calls.append(clients[0].try_start_ptr(a.ctypes.data, a.nbytes, "int64", "sum"))
                    if calls[-1] is not None:
                        return

            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            caller.join(10.0)
            blocked = caller.is_alive()
            state = {"blocked": blocked, "in_flight": clients[0].in_flight, "rounds": clients[0].stats()["rounds"]}
            arrived.set()
            caller.join(60.0)  # (the old behaviour: it returns once rank 1 got there)
            refused.extend(calls)
            if not blocked:
                clients[0].wait(start_when_room(clients[0], a))
                expect(a, check)
                non_blocking(0, check + 1, check + 8)
            return state

        def rank1() -> None:
            assert arrived.wait(60.0)
            non_blocking(1, check, check + 8)

        res = on_threads(lambda r: rank0() if r == 0 else rank1(), world)
        assert isinstance(res[0], dict), res
        assert not res[0]["blocked"], "try_start blocked at the rejoin check until the late worker arrived"
        assert refused == [None, None, None], refused  # no room: nothing started, the check under way
        assert res[0]["in_flight"] == 0 and res[0]["rounds"] == check, res[0]
        assert res[1] is None, res
        stats = [c.stats() for c in clients]
        for s in stats:
            assert (s["rounds"], s["reducer_failovers"], s["reducers_active"], s["rejoin_probes"]) == (
                check + 8,
                1,
                1,
                1,
            ), stats

        # The next check (64), left open by try_start on rank 0 alone, then close() drops it.
        assert on_threads(lambda r: blocking(r, check + 8, 2 * check), world) == [None] * world
        a = data(0, 2 * check)
        assert clients[0].try_start_ptr(a.ctypes.data, a.nbytes, "int64", "sum") is None
        for c in clients:
            c.close()
            assert not c.connected
        assert clients[0].stats()["rounds"] == 2 * check
    finally:
        victim.kill()


def test_a_reducer_lost_while_a_rejoin_check_is_open(reducers):
    """Three reducers, one killed (the session runs on two, so RoundId 32 is a rejoin check):
    rank 0's try_start at the check leaves the check's exchange round open (None), then a second
    reducer dies before the other worker got there. The loss is handled by the usual failover,
    which drops the open exchange round (the check is over without a rejoin) or, if the exchange
    did not touch the dead reducer, by the next round's; every round's result is exact."""
    good = addresses(reducers(1))
    first, second = Victim(), Victim()
    try:
        world, n, check = 2, 1000, 32
        clients = connect([first.address, good[0], second.address], world, "fo-late-loss")
        first.kill()

        def run(r: int, lo: int, hi: int, non_blocking: bool) -> None:
            for k in range(lo, hi):
                a = np.full(n, r + 1 + k, np.int64)
                if non_blocking:
                    clients[r].wait(start_when_room(clients[r], a))
                else:
                    clients[r].allreduce(a, "int64", "sum")
                assert np.array_equal(a, np.full(n, sum(q + 1 + k for q in range(world)), np.int64)), (k, a[:4])

        assert on_threads(lambda r: run(r, 0, check, False), world) == [None] * world
        assert all(c.stats()["reducers_active"] == 2 for c in clients)
        a = np.full(n, 1 + check, np.int64)
        assert clients[0].try_start_ptr(a.ctypes.data, a.nbytes, "int64", "sum") is None  # rank 1 is not there
        second.kill()
        assert on_threads(lambda r: run(r, check, check + 8, True), world) == [None] * world
        for s in (c.stats() for c in clients):
            assert (s["rounds"], s["reducer_failovers"], s["reducers_active"]) == (check + 8, 2, 1), s
        for c in clients:
            c.close()
    finally:
        first.kill()
        second.kill()


SYN_SENT = "02"  # the state column of /proc/net/tcp


def sockets_to(port: int) -> dict[int, str]:
    """This process's TCP sockets whose remote port is `port`: inode -> state (/proc/net/tcp)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(int(link[len("socket:[") : -1]))
    out: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                inode = int(cols[9])
                if int(cols[2].rsplit(":", 1)[1], 16) == port and inode in mine:
                    out[inode] = cols[3]
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_rejoin_check_never_waits_for_a_probe(reducers):
    """The lost reducer's address black-holed (a listener whose accept queue is full drops every
    SYN, so a connect to it stays under way): try_start at a rejoin check returns a round while
    the probe it started is still connecting (it did not wait for it); the next check counts that
    probe as not reached, closes it and starts a new one; close() and the destructor close them."""
    good = addresses(reducers(1))
    victim = Victim()
    hole: socket.socket | None = None
    filler: socket.socket | None = None
    try:
        world, n = 2, 1000
        clients = connect([victim.address] + good, world, "fo-probe")
        victim.kill()

        def rounds(r: int, first: int, check: int) -> int:
            """Rounds first..check-1 with allreduce, then round `check` with try_start."""
            for k in range(first, check):
                a = np.full(n, float(r + 1 + k), np.float32)
                clients[r].allreduce(a, "float32", "sum")
                assert (a == sum(q + 1 + k for q in range(world))).all(), (k, a[:4])
            a = np.full(n, float(r + 1 + check), np.float32)
            rid = start_when_room(clients[r], a)  # refused until the other worker reached the check
            clients[r].wait(rid)
            assert (a == sum(q + 1 + check for q in range(world))).all(), (check, a[:4])
            return rid

        # Round 0 finds the loss; the session continues on the survivor.
        assert on_threads(lambda r: rounds(r, 0, 1), world) == [1, 1]
        hole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hole.bind(("127.0.0.1", victim.port))
        hole.listen(0)
        filler = socket.create_connection(("127.0.0.1", victim.port), timeout=10)  # the queue's one place
        assert list(sockets_to(victim.port).values()) == ["01"]  # the filler, established; no probe yet
        idle_fds = open_fds()
        assert all(c.stats()["rejoin_probes"] == 0 for c in clients)

        # The first check after the failover has no probe to read: it starts one per worker.
        assert on_threads(lambda r: rounds(r, 2, 32), world) == [32, 32]
        first = {i: st for i, st in sockets_to(victim.port).items() if st != "01"}
        assert len(first) == world and set(first.values()) == {SYN_SENT}, first
        assert open_fds() == idle_fds + world
        stats = [c.stats() for c in clients]
        probes = [(s["rejoin_probes"], s["reducer_rejoins"], s["reducers_active"]) for s in stats]
        assert probes == [(1, 0, 1)] * world, stats

        # The next check reads them (still connecting: not reached), closes them, starts new ones.
        assert on_threads(lambda r: rounds(r, 33, 64), world) == [64, 64]
        second = {i: st for i, st in sockets_to(victim.port).items() if st != "01"}
        assert len(second) == world and set(second.values()) == {SYN_SENT}, second
        assert not set(first) & set(second)
        assert open_fds() == idle_fds + world
        stats = [c.stats() for c in clients]
        probes = [(s["rejoin_probes"], s["reducer_rejoins"], s["reducers_active"]) for s in stats]
        assert probes == [(2, 0, 1)] * world, stats

        clients[0].close()
        assert len([st for st in sockets_to(victim.port).values() if st == SYN_SENT]) == 1
        clients.clear()  # the destructors (client 1 was not closed)
        assert [st for st in sockets_to(victim.port).values() if st == SYN_SENT] == []
    finally:
        victim.kill()
        for s in (filler, hole):
            if s is not None:
                s.close()


def test_an_impostor_at_a_lost_reducers_address_is_not_taken_back(reducers):
    """Hostile peer: after a reducer dies, something else listens at its address, accepts and
    answers with garbage. The rejoin probe reaches it, but the rejoin's handshake must refuse it:
    the workers go on on the survivor, every result exact, nothing hangs."""
    import socket
    import threading

    good = addresses(reducers(1))
    victim = Victim()
    stop = threading.Event()
    accepted: list[int] = []
    try:
        world = 2
        clients = connect([victim.address] + good, world, "fo-impostor")
        victim.kill()
        imp = socket.socket()
        imp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        imp.bind(("127.0.0.1", victim.port))
        imp.listen(16)
        imp.settimeout(0.2)

        def serve() -> None:
            while not stop.is_set():
                try:
                    c, _ = imp.accept()
                except OSError:
                    continue
                accepted.append(1)
                with c:
                    try:
                        c.sendall(b"\xffNOT A REDUCER\x00" * 64)
                    except OSError:
                        pass

        server = threading.Thread(target=serve, daemon=True)
        server.start()

        def rounds(r: int, count: int) -> list[int]:
            out = []
            for k in range(count):
                a = np.full(50_000, r + 1 + k, np.int64)
                clients[r].allreduce(a, "int64", "sum")
                out.append(int(a[-1]))
            return out

        res = on_threads(lambda r: rounds(r, 100), world, timeout=180.0)
        assert all(isinstance(x, list) for x in res), res
        for x in res:
            assert x == [sum(r + 1 + k for r in range(world)) for k in range(100)]
        assert accepted, "the rejoin probes never reached the impostor's address"
        for s in (c.stats() for c in clients):
            assert s["reducers_active"] == 1, s
            assert s["rejoin_probes"] >= 1, s
        for c in clients:
            c.close()
    finally:
        stop.set()
        victim.kill()


@pytest.mark.sanitize
def test_a_released_round_is_repaired_from_its_copy_not_the_callers_memory(reducers):
    """Early release (docs/protocol.md section 6, "Early release of small rounds"): a small round goes back to its
    caller as soon as its results are in, before the reducers' CLEAR, and the caller may reuse the
    buffer at once. Here the last result of reducer A's shard never reaches worker 1 (a proxy drops
    it), so A never clears the round; worker 0 gets the round back and overwrites its buffer, then
    A is killed: worker 1's missing chunk is copied from worker 0 on the survivor, and must be the
    sum, not what worker 0's caller wrote afterwards; worker 0's buffer keeps what its caller wrote."""
    from mitm_proxy import TO_WORKER, Proxy

    survivor = addresses(reducers(1))
    victim = Victim()

    def drop_last_result(d: str, _c: int, _i: int, f: bytes) -> list[bytes]:
        last_of_round_0 = f[0] == 2 and f[3] & 1 and int.from_bytes(f[8:16], "little") == 0  # RESULT, flags, round
        return [] if d == TO_WORKER and last_of_round_0 else [f]

    proxy = Proxy(victim.port, tags=False, tamper=drop_last_result)
    try:
        world = 2
        addrs = [[victim.address] + survivor, [proxy.address] + survivor]  # worker 1 reaches A via the proxy
        clients = on_threads(
            lambda r: core.Client(addrs[r], r, world, "fo-release", "local", 20.0, 60.0, "", 1, 1 << 20), world
        )
        for c in clients:
            assert not isinstance(c, BaseException), c
        n = 64 << 10  # 256 KiB of float32: a shard on each reducer, small enough to be released early
        x = [np.arange(n, dtype=np.float32) % 1000 + 1000 * r for r in range(world)]  # sums are exact
        want = x[0] + x[1]
        garbage = np.float32(-7.0)
        handed_back = threading.Event()
        killed = threading.Event()
        after = [np.full(1000, float(r + 1), np.float32) for r in range(world)]

        def worker(r: int) -> Any:
            clients[r].wait(clients[r].start(x[r], "float32", "sum"))  # worker 1: only through the failover
            got = x[r].copy()
            if r == 0:
                assert not killed.is_set(), "worker 0 got the round back only after the failover"
                x[0][:] = garbage  # the caller reuses its memory at once
                handed_back.set()
                assert killed.wait(30.0)
            clients[r].wait(clients[r].start(after[r], "float32", "sum"))
            return got

        def killer() -> None:
            handed_back.wait(20.0)  # (the code before early release: only the kill lets worker 0 go)
            victim.kill()
            killed.set()

        threading.Thread(target=killer, daemon=True).start()
        res = on_threads(worker, world, timeout=90.0)
        for r in range(world):
            assert not isinstance(res[r], BaseException), res
            bad = np.flatnonzero(res[r] != want)
            assert bad.size == 0, f"rank {r}: {bad.size} elements differ, first at {bad[:1]}: {res[r][bad[:3]]}"
        assert (x[0] == garbage).all(), "the client wrote into a buffer it had handed back"
        assert all(float(a[0]) == 3.0 for a in after)
        stats = [c.stats() for c in clients]
        assert stats[0]["early_releases"] >= 1 and stats[0]["reducer_failovers"] == 1, stats
        assert stats[1]["reducer_failovers"] == 1 and stats[1]["repaired_bytes"] > 0, stats
        for c in clients:
            c.close()
    finally:
        proxy.close()
        victim.kill()


def test_the_done_of_a_released_round_leaves_with_the_next_round(reducers):
    """A DONE that only a released round waits for is written with MSG_MORE: the kernel keeps it
    for the link's next write. Worker 0 pauses 100 ms between two small rounds; a proxy records
    when each of its frames reaches the reducer: round 0's DONE comes with round 1's data, not
    right after round 0's results (then the reducer would wake for it alone)."""
    from mitm_proxy import TO_REDUCER, Proxy

    server = reducers(1)[0]
    seen: list[tuple[float, int, int]] = []  # (arrival, frame type, round) from worker 0

    def record(d: str, _c: int, _i: int, f: bytes) -> list[bytes]:
        if d == TO_REDUCER:
            seen.append((time.monotonic(), f[0], int.from_bytes(f[8:16], "little")))
        return [f]

    proxy = Proxy(server.port, tags=False, tamper=record)
    try:
        world = 2
        addrs = [[proxy.address], [server.address]]
        clients = on_threads(
            lambda r: core.Client(addrs[r], r, world, "fo-cork", "local", 10.0, 30.0, "", 1, 1 << 20), world
        )
        for c in clients:
            assert not isinstance(c, BaseException), c
        started: list[float] = []

        def worker(r: int) -> list[float]:
            out = []
            for k in range(2):
                if r == 0 and k == 1:
                    time.sleep(0.1)
                    started.append(time.monotonic())
                a = np.full(1024, float(10 * k + r), np.float32)
                clients[r].allreduce(a, "float32", "sum")
                out.append(float(a[0]))
            return out

        res = on_threads(worker, world, timeout=30.0)
        assert res == [[1.0, 21.0], [1.0, 21.0]], res
        assert clients[0].stats()["early_releases"] == 2
        data, done = 1, 5  # frame types
        done0 = [t for t, kind, rnd in seen if kind == done and rnd == 1]  # DONE(1): round 0 is held
        data1 = [t for t, kind, rnd in seen if kind == data and rnd == 1]
        assert done0 and data1, seen
        assert done0[0] >= started[0], (done0[0] - started[0], seen)  # not before round 1 started ...
        assert done0[0] - data1[0] < 0.05, seen  # ... but with its data
        for c in clients:
            c.close()
    finally:
        proxy.close()


def test_a_worker_idle_after_a_released_round_holds_up_the_others_for_a_bounded_time(reducers):
    """The kernel keeps a held DONE for about 200 ms at most. Worker 1 has a pool of one copy and
    a proxy that delivers the first CLEAR only after the next frame, so its second round's
    results find the pool full: that round waits for its CLEAR, hence for worker 0's DONE.
    Worker 0 released both rounds and then waits for worker 1 by other means (an event), making
    no call that would carry the DONE. Worker 1 must still finish, long before its timeout
    (10 s: the kill of a held DONE would be a timeout), with the exact sums."""
    from mitm_proxy import TO_WORKER, Proxy

    server = reducers(1)[0]
    clear = 6  # frame type CLEAR
    held: dict[str, Any] = {"frame": None, "once": False}

    def late_first_clear(d: str, _c: int, _i: int, f: bytes) -> list[bytes]:
        if d != TO_WORKER:
            return [f]
        if f[0] == clear and not held["once"]:  # the first CLEAR waits for the next frame
            held["frame"], held["once"] = f, True
            return []
        if held["frame"] is not None:
            out, held["frame"] = [f, held["frame"]], None
            return out
        return [f]

    proxy = Proxy(server.port, tags=False, tamper=late_first_clear)
    world = 2
    limits = [8, 1]
    addrs = [[server.address], [proxy.address]]
    clients = on_threads(
        lambda r: core.Client(
            addrs[r], r, world, "fo-idle", "local", 10.0, 30.0, "", 1, 1 << 20, max_rounds_in_flight=limits[r]
        ),
        world,
    )
    for c in clients:
        assert not isinstance(c, BaseException), c
    finished = threading.Event()

    def worker(r: int) -> Any:
        out: list[Any] = []
        for k in range(2):
            a = np.full(1024, float(10 * k + r), np.float32)
            clients[r].allreduce(a, "float32", "sum")
            out.append(float(a[0]))
        if r == 0:
            out.append(finished.wait(15.0))  # no call into the client meanwhile
        else:
            finished.set()
        return out

    try:
        res = on_threads(worker, world, timeout=60.0)
        assert res == [[1.0, 21.0, True], [1.0, 21.0]], res
        assert clients[1].stats()["early_releases"] == 1  # its second round did wait for the CLEAR
        for c in clients:
            c.close()
    finally:
        proxy.close()


def test_a_worker_that_leaves_after_released_rounds_does_not_strand_the_others(reducers):
    """Worker 0 releases both rounds early and closes its client at once (goodbye, its last DONE
    possibly never written). Worker 1 (a pool of one copy, its first CLEAR delayed by a proxy) holds
    its second round unreleased, waiting for a CLEAR that needs worker 0's DONE. The reducer, seeing
    worker 0 leave between rounds, must clear worker 1 on worker 1's own DONE: worker 1 finishes with
    the exact sums, not with a timeout (seen in CI as 'round 16 made no progress' in the fusion tests)."""
    from mitm_proxy import TO_WORKER, Proxy

    server = reducers(1)[0]
    clear = 6  # frame type CLEAR
    held: dict[str, Any] = {"frame": None, "once": False}

    def late_first_clear(d: str, _c: int, _i: int, f: bytes) -> list[bytes]:
        if d != TO_WORKER:
            return [f]
        if f[0] == clear and not held["once"]:
            held["frame"], held["once"] = f, True
            return []
        if held["frame"] is not None:
            out, held["frame"] = [f, held["frame"]], None
            return out
        return [f]

    proxy = Proxy(server.port, tags=False, tamper=late_first_clear)
    world, limits = 2, [8, 1]
    addrs = [[server.address], [proxy.address]]
    clients = on_threads(
        lambda r: core.Client(
            addrs[r], r, world, "fo-leave", "local", 5.0, 30.0, "", 1, 1 << 20, max_rounds_in_flight=limits[r]
        ),
        world,
    )
    for c in clients:
        assert not isinstance(c, BaseException), c

    def worker(r: int) -> Any:
        out: list[Any] = []
        for k in range(2):
            a = np.full(1024, float(10 * k + r), np.float32)
            try:
                clients[r].allreduce(a, "float32", "sum")
                out.append(float(a[0]))
            except Exception as exc:  # noqa: BLE001 - reported below
                out.append(exc)
        if r == 0:
            clients[0].close()  # leaves between rounds, at once
        return out

    try:
        res = on_threads(worker, world, timeout=60.0)
        assert res == [[1.0, 21.0], [1.0, 21.0]], res
        clients[1].close()
    finally:
        proxy.close()


def test_a_reducer_that_withholds_clears_holds_at_most_max_rounds_of_copies(reducers):
    """Adversarial: CLEARs never reach worker 0 (a proxy drops them). Released rounds wait for their
    CLEARs with a copy each; at most max_rounds_in_flight of them: the next round is not released
    and fails after `timeout` (no reducer to fail over to), instead of copies piling up."""
    from mitm_proxy import TO_WORKER, Proxy

    server = reducers(1)[0]
    clear = 6  # frame type CLEAR
    proxy = Proxy(server.port, tags=False, tamper=lambda d, c, i, f: [] if d == TO_WORKER and f[0] == clear else [f])
    try:
        world, limit = 2, 2
        addrs = [[proxy.address], [server.address]]
        clients = on_threads(
            lambda r: core.Client(
                addrs[r], r, world, "fo-noclear", "local", 3.0, 30.0, "", 1, 1 << 20, max_rounds_in_flight=limit
            ),
            world,
        )
        for c in clients:
            assert not isinstance(c, BaseException), c
        outcomes: list[list[Any]] = [[], []]

        def worker(r: int) -> None:
            for k in range(limit + 1):
                a = np.full(1024, float(10 * k + r), np.float32)
                try:
                    clients[r].allreduce(a, "float32", "sum")
                    outcomes[r].append(float(a[0]))
                except Exception as exc:  # noqa: BLE001 - the expected timeout, checked below
                    outcomes[r].append(exc)
                if r == 0 and k == limit - 1:
                    outcomes[r].append(clients[0].stats()["early_releases"])

        on_threads(worker, world, timeout=60.0)
        assert outcomes[1] == [1.0, 21.0, 41.0], outcomes  # worker 1 gets its CLEARs
        assert outcomes[0][:3] == [1.0, 21.0, limit], outcomes  # released without their CLEARs
        assert isinstance(outcomes[0][3], reducer.ReductionTimeout), outcomes
        # The message names the link that owes the CLEAR (before: the round's list of links was empty).
        assert "127.0.0.1:" in str(outcomes[0][3]) and "no CLEAR yet" in str(outcomes[0][3]), outcomes
        for c in clients:
            c.close()
    finally:
        proxy.close()


@pytest.mark.sanitize
def test_a_session_lost_while_draining_for_a_rejoin_check_raises_its_own_error():
    """The session fails inside start() while it drains for a rejoin check, and every round in
    flight was released early (its caller has it, nobody else hears the error): start() raises
    that error (every reducer lost). The old code returned round id 0 there, so the caller's
    wait() said "round 0 was already waited for" instead (seen in soaks with reducer kills)."""
    last_tag = 31  # the round before the first rejoin check (at RoundId 32)
    marked: dict[str, int] = {}

    def lose_b(conn: int, h: Header, payload: bytes) -> bytes | None:
        return error_frame(ERR_SHUTDOWN, b"reducer b shutting down")

    def note_last(conn: int, h: Header, payload: bytes) -> bytes | None:
        if h.tag == last_tag:
            marked["wire"] = h.round
        return None

    def shut_down_after_last(conn: int, h: Header) -> bytes | None:
        # The DONE covering the last round gets no CLEAR: reducer a shuts down instead.
        if "wire" in marked and h.round > marked["wire"]:
            return error_frame(ERR_SHUTDOWN, b"reducer a shutting down")
        return None

    with LyingReducer(note_last, on_done=shut_down_after_last) as a, LyingReducer(lose_b) as b:
        client = core.Client([a.address, b.address], 0, 1, "drain-loss", "local", 10.0, 10.0, "", 1, 1 << 20)
        try:
            for k in range(last_tag + 1):  # round 0 fails over to a alone; 1..31 run on it
                x = np.full(1024, float(k), np.float32)
                client.wait(client.start(x, "float32", "sum", tag=k))
                assert float(x[0]) == float(k)
            assert client.stats()["reducers_active"] == 1
            assert client.stats()["early_releases"] >= 1
            with pytest.raises(reducer.PeerLostError, match="every reducer is lost"):
                rid = client.start(np.zeros(1024, np.float32), "float32", "sum", tag=last_tag + 1)
                client.wait(rid)  # the old code: ConfigError "round 0 was already waited for"
        finally:
            client.close()
        assert not a.errors and not b.errors
