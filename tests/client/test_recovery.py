"""Recovery from what a cluster does to a job whose workers keep their Communicator (issue 29).

Reducers run in processes of their own that the tests SIGKILL and start again on the same
ports; workers are processes that loop over all-reduces on one Communicator, retrying after an
error (as a training loop that catches ReductionError would), and report what they saw in a
status file. Every result is checked bit for bit against numpy (integer-valued float32, so the
sum is exact in any order).

 - test_whole_pool_restarted_workers_converge (29.1): one worker has failed over to the
   surviving reducer when that one dies too; after both restart, the workers must meet again
   (a reconnect starts from the configured reducer list and the base group, never from a
   failover session the others cannot reach).
 - test_reducer_failure_after_a_reconnect (29.2): a worker is restarted (the other reconnects),
   then a reducer is killed and restarted: the failover and the rejoin checks run on round
   numbers every worker agrees on (they restart at the reconnect), so no MismatchError, and the
   restarted reducer is taken back.
 - test_reducer_restarted_while_idle (29.5): every reducer restarted while the workers are idle:
   the first call afterwards reconnects and works.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from test_failover import Victim

import reducer

pytestmark = pytest.mark.timeout(240)

N = 1 << 14  # float32 elements per round: a shard on every reducer, released early (small)
TIMEOUT = 5.0  # the workers' no-progress timeout
CONNECT_TIMEOUT = 8.0  # and their bound on waiting for the group


def data(rank: int) -> np.ndarray:
    return (np.arange(N, dtype=np.float32) % 251 + 1000 * rank).astype(np.float32)


def expected(world: int) -> np.ndarray:
    return np.sum([data(r).astype(np.float64) for r in range(world)], axis=0).astype(np.float32)


def _write_json(path: str, obj: Any) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(obj, fh)
    os.replace(path + ".tmp", path)


def loop_worker(rank: int, world: int, addrs: Sequence[str], group: str, ctl: str, idle_after: int = 0) -> None:
    """All-reduces on one Communicator until ctl/stop appears, retrying after every error; writes
    ctl/w<rank>.json (good and bad results, errors with their time, stats). With idle_after, it
    makes no call after that many good results until ctl/go appears (status "idle")."""
    status = os.path.join(ctl, f"w{rank}.json")
    want = expected(world)
    comm: Any = None
    good = bad = 0
    errors: list[list[Any]] = []
    idle = False

    def report() -> None:
        stats = comm.stats() if comm is not None else {}
        _write_json(
            status,
            {
                "rank": rank,
                "good": good,
                "bad": bad,
                "errors": errors,
                "stats": stats,
                "idle": idle,
                "pid": os.getpid(),
            },
        )

    while not os.path.exists(os.path.join(ctl, "stop")):
        if idle_after and good >= idle_after and not os.path.exists(os.path.join(ctl, "go")):
            idle = True
            report()
            time.sleep(0.05)
            continue
        idle = False
        try:
            if comm is None:
                comm = reducer.Communicator(
                    list(addrs), rank, world, group=group, timeout=TIMEOUT, connect_timeout=CONNECT_TIMEOUT
                )
            a = data(rank)
            comm.allreduce(a)
            if np.array_equal(a, want):
                good += 1
            else:
                bad += 1
        except reducer.ReductionError as exc:
            errors.append([time.time(), type(exc).__name__, str(exc)[:400]])
        report()
        time.sleep(0.01)  # gentle on a shared machine
    if comm is not None:
        comm.close()


class Workers:
    """`world` loop_worker processes (spawned), each restartable."""

    def __init__(self, world: int, addrs: Sequence[str], group: str, idle_after: int = 0) -> None:
        self.ctl = tempfile.mkdtemp()
        self.args = (world, list(addrs), group, self.ctl, idle_after)
        self.ctx = mp.get_context("spawn")
        self.procs: dict[int, Any] = {}
        for r in range(world):
            self.start(r)

    def start(self, rank: int) -> None:
        world, addrs, group, ctl, idle_after = self.args
        path = os.path.join(ctl, f"w{rank}.json")
        if os.path.exists(path):
            os.remove(path)
        p = self.ctx.Process(target=loop_worker, args=(rank, world, addrs, group, ctl, idle_after), daemon=True)
        p.start()
        self.procs[rank] = p

    def status(self, rank: int) -> dict[str, Any]:
        try:
            with open(os.path.join(self.ctl, f"w{rank}.json")) as fh:
                return dict(json.load(fh))
        except (OSError, ValueError):
            return {"rank": rank, "good": 0, "bad": 0, "errors": [], "stats": {}, "idle": False}

    def wait_for(self, what: str, ok: Any, seconds: float) -> list[dict[str, Any]]:
        """Polls until ok(status) holds for every worker; fails with every status after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            st = [self.status(r) for r in sorted(self.procs)]
            if all(ok(s) for s in st):
                return st
            for r, p in self.procs.items():
                assert p.is_alive() or p.exitcode == 0 or r < 0, f"worker {r} died: exit {p.exitcode}"
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not within {seconds} s; worker status: {summary(st)}")
            time.sleep(0.1)

    def kill(self, rank: int) -> None:
        self.procs[rank].kill()
        self.procs[rank].join(10)

    def signal(self, rank: int, sig: int) -> None:
        os.kill(self.procs[rank].pid, sig)

    def stop(self) -> None:
        for r in self.procs:
            try:
                self.signal(r, signal.SIGCONT)
            except (ProcessLookupError, TypeError):
                pass
        open(os.path.join(self.ctl, "stop"), "w").close()
        for p in self.procs.values():
            p.join(CONNECT_TIMEOUT + TIMEOUT + 5)
            if p.is_alive():
                p.kill()
                p.join(5)


def summary(st: list[dict[str, Any]]) -> str:
    out = []
    for s in st:
        errs = s.get("errors", [])
        last = [e[1] + ": " + e[2][:160] for e in errs[-3:]]
        keys = ("reducers_active", "reducer_failovers", "reducer_rejoins", "reconnects")
        stats = {k: s.get("stats", {}).get(k) for k in keys}
        out.append(f"good={s.get('good')} bad={s.get('bad')} errors={len(errs)} {stats} last={last}")
    return " | ".join(out)


def errors_since(s: dict[str, Any], t: float) -> list[list[Any]]:
    return [e for e in s.get("errors", []) if e[0] >= t]


def restart(victims: list[Victim], i: int) -> None:
    victims[i] = Victim(port=victims[i].port)


@pytest.fixture
def pool_of():
    """Factory: n reducer processes (Victim); every one still running is killed after the test."""
    made: list[list[Victim]] = []

    def make(n: int) -> list[Victim]:
        vs = [Victim() for _ in range(n)]
        made.append(vs)
        return vs

    yield make
    for vs in made:
        for v in vs:
            v.kill()


def test_whole_pool_restarted_workers_converge(pool_of):
    """Issue 29.1: worker 1 fails over to reducer 1 (worker 0 is stopped, so the failover session
    waits for it), then reducer 1 dies too; both reducers restart and worker 0 continues. Worker 0
    last asked for the base group on both reducers, worker 1 for its failover group on one: the
    next reconnect of each must start from the configured list and the base group, so they meet."""
    victims = pool_of(2)
    addrs = [v.address for v in victims]
    w = Workers(2, addrs, "pool")
    try:
        w.wait_for("first rounds", lambda s: s["good"] >= 10, 60)
        w.signal(0, signal.SIGSTOP)
        time.sleep(0.2)  # worker 1 now waits in a round for worker 0
        victims[0].kill()
        time.sleep(1.0)  # worker 1 noticed, and waits in its failover session on reducer 1
        victims[1].kill()
        time.sleep(0.5)  # worker 1 lost that one too: every reducer of its session is gone
        restart(victims, 0)
        restart(victims, 1)
        base = [w.status(r)["good"] for r in range(2)]
        w.signal(0, signal.SIGCONT)
        t_back = time.time()
        st = w.wait_for(
            "both workers compute again after the pool restarted",
            lambda s: s["good"] >= base[s["rank"]] + 10 and s["stats"].get("reducers_active") == 2,
            4 * CONNECT_TIMEOUT + 20,
        )
        print(f"29.1: both workers computing {time.time() - t_back:.1f} s after the pool was back")
        for s in st:
            assert s["bad"] == 0, summary(st)
            # A round or two fail (every reducer lost; a wait for the group), not a storm.
            assert len(errors_since(s, t_back - 5)) <= 4, summary(st)
    finally:
        w.stop()


def test_reducer_failure_after_a_reconnect(pool_of):
    """Issue 29.2: worker 1 is SIGKILLed and restarted (worker 0 reconnects on its Communicator,
    with its round counter far ahead of the new worker's), then reducer 1 is SIGKILLed and
    restarted. The failover and the every-32-rounds rejoin checks must line up on every worker:
    no MismatchError, and reducer 1 is taken back."""
    victims = pool_of(2)
    addrs = [v.address for v in victims]
    w = Workers(2, addrs, "after")
    try:
        w.wait_for("first rounds", lambda s: s["good"] >= 45, 60)
        w.kill(1)
        w.start(1)
        w.wait_for(
            "the group re-formed",
            lambda s: s["good"] >= 45 and (s["rank"] == 1 or s["stats"].get("reconnects", 0) >= 1),
            60,
        )
        before = {r: w.status(r)["good"] for r in range(2)}
        t_kill = time.time()
        victims[1].kill()
        time.sleep(1.0)
        restart(victims, 1)
        t_back = time.time()
        st = w.wait_for(
            "reducer 1 taken back by every worker",
            lambda s: s["stats"].get("reducers_active") == 2 and s["stats"].get("reducer_rejoins", 0) >= 1,
            60,
        )
        print(f"29.2: reducer 1 taken back {time.time() - t_back:.1f} s after it listened again")
        after = {r: st[r]["good"] for r in range(2)}
        st = w.wait_for("rounds on both reducers", lambda s: s["good"] >= max(after.values()) + 40, 60)
        for r, s in enumerate(st):
            assert s["bad"] == 0, summary(st)
            assert s["good"] > before[r], summary(st)
            errs = errors_since(s, t_kill)
            assert not [e for e in errs if e[1] == "MismatchError"], summary(st)
            assert len(errs) <= 2, summary(st)
    finally:
        w.stop()


def test_reducer_restarted_while_idle(pool_of):
    """Issue 29.5: the only reducer is restarted while both workers are idle (their
    Communicators' idle threads see it go): the first call afterwards reconnects and works."""
    victims = pool_of(1)
    w = Workers(2, [victims[0].address], "idle", idle_after=5)
    try:
        w.wait_for("idle after 5 rounds", lambda s: s["idle"] and s["good"] == 5, 60)
        victims[0].kill()
        time.sleep(1.0)  # the idle threads read the lost connections
        restart(victims, 0)
        time.sleep(1.0)
        open(os.path.join(w.ctl, "go"), "w").close()
        t_go = time.time()
        w.wait_for("the first call after the idle", lambda s: s["good"] > 5 or s["errors"], 4 * CONNECT_TIMEOUT)
        print(f"29.5: the first call after the idle returned within {time.time() - t_go:.2f} s")
        st = w.wait_for("rounds after the idle", lambda s: s["good"] >= 10 or s["errors"], 4 * CONNECT_TIMEOUT)
        for s in st:
            assert s["errors"] == [] and s["bad"] == 0, summary(st)
            assert s["stats"].get("reconnects") == 1, summary(st)
    finally:
        w.stop()
