"""Soak: thousands of all-reduce rounds while reducers and workers are killed and restarted.

    python -m benchmarks.soak --rounds 10000 --workers 4 --reducers 3

W worker processes run rounds of random sizes, dtypes, ops and compression (every worker the
same sequence, from the seed) against R reducer processes on loopback. Meanwhile a driver
SIGKILLs a random reducer every few hundred rounds and restarts it at its address a little later
(the workers fail over and take it back), and now and then SIGKILLs a worker: that ends the
group's session for everybody (a dead worker is not something failover can hide), so the driver
starts every worker again from the last round they all finished, as a training job restarts from a
checkpoint. Every result is checked on every worker: bit for bit against a numpy model of the
reducers' arithmetic (inputs rounded to the wire type, folded in rank order in float32 for 16-bit
types, rounded once), with a tolerance only for avg. It reports rounds, wrong results, failovers,
rejoins, errors by cause and the reducers' peak RSS; it exits 1 on any wrong result, hang or worker crash.
Each worker reports on a pipe of its own that only the driver reads: a multiprocessing.Queue
shares one write lock among its writers, and a worker SIGKILLed while holding it would block the
other workers' reports for good (the driver would see a hang that is not the workers').
A hang is no round finished for --hang-seconds, which must exceed the longest wait the workers
bound themselves (--connect-timeout + --timeout: a worker whose peer dies just before a failover
session waits for it there up to connect_timeout, then raises).
Results: docs/performance.md ("Soak").
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import random
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import reducer
from reducer.config import compression_wire
from reducer.dtypes import numpy_dtype

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
OPS = ("sum", "avg", "min", "max")


def spec(seed: int, i: int, max_elems: int) -> tuple[str, str, int, str]:
    """Round i: (dtype, op, elements, compression), the same on every worker."""
    rng = random.Random(seed * 1_000_003 + i)
    dtype = rng.choice(DTYPES)
    op = rng.choice(OPS)
    n = int(10 ** rng.uniform(0, np.log10(max_elems)))
    comp = rng.choice(("", "", "bf16", "fp16")) if dtype == "float32" and op in ("sum", "avg") else ""
    return dtype, op, n, comp


def data(seed: int, i: int, rank: int, dtype: str, n: int) -> np.ndarray:
    rng = np.random.default_rng([seed, i, rank])
    if dtype.startswith("int"):
        return rng.integers(-(2**20), 2**20, size=n).astype(numpy_dtype(dtype))
    return rng.standard_normal(n).astype(np.float32).astype(numpy_dtype(dtype))


def expected(seed: int, i: int, world: int, dtype: str, op: str, n: int, comp: str) -> np.ndarray:
    """The reducers' arithmetic: inputs on the wire type, folded in rank order (16-bit types in
    float32), rounded once."""
    wire_name = compression_wire(comp)
    wire = None if wire_name is None else numpy_dtype(wire_name)
    xs = [data(seed, i, r, dtype, n) for r in range(world)]
    if wire is not None:
        xs = [x.astype(wire) for x in xs]
    acc_type = np.float32 if (wire is not None or dtype in ("float16", "bfloat16")) else xs[0].dtype
    acc = xs[0].astype(acc_type)
    fold = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum}[op]
    for x in xs[1:]:
        acc = fold(acc, x.astype(acc_type))
    if op == "avg":
        acc = (acc / world).astype(acc_type) if not dtype.startswith("int") else acc // world
    out_type = wire if wire is not None else numpy_dtype(dtype)
    return acc.astype(out_type).astype(numpy_dtype(dtype))


def wrong(got: np.ndarray, want: np.ndarray, op: str, dtype: str) -> str | None:
    if op == "avg" and not dtype.startswith("int"):
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-2, atol=2e-2)
    elif op == "avg":
        ok = bool(np.all(np.abs(got.astype(np.int64) - want.astype(np.int64)) <= 1))
    else:
        ok = got.tobytes() == want.tobytes()
    if ok:
        return None
    bad = int(np.flatnonzero(got.astype(np.float64) != want.astype(np.float64))[0]) if got.size else 0
    return f"element {bad}: {got[bad]} != {want[bad]}"


def serve(port_file: str, port: int) -> None:
    srv = reducer.ReducerServer(host="127.0.0.1", port=port).start()
    with open(port_file + ".tmp", "w") as fh:
        fh.write(str(srv.port))
    os.replace(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


def worker(
    rank: int,
    world: int,
    addrs: list[str],
    group: str,
    seed: int,
    first: int,
    last: int,
    max_elems: int,
    timeouts: tuple[float, float],
    events: Any,
) -> None:
    """Runs rounds [first, last); reports ("done", rank, i, wrong_text) per round, then ("stats", ...),
    on `events`: the write end of this worker's own pipe (see the module's docstring)."""
    try:
        comm = reducer.Communicator(addrs, rank, world, group=group, timeout=timeouts[0], connect_timeout=timeouts[1])
    except Exception as exc:  # noqa: BLE001 - reported by cause
        events.send(("error", rank, first, f"{type(exc).__name__}: {str(exc)[:120]}"))
        return
    for i in range(first, last):
        dtype, op, n, comp = spec(seed, i, max_elems)
        a = data(seed, i, rank, dtype, n)
        try:
            comm.allreduce(a, op, compression=comp or "none")
        except Exception as exc:  # noqa: BLE001
            events.send(("error", rank, i, f"{type(exc).__name__}: {str(exc)[:120]}"))
            events.send(("stats", rank, -1, dict(comm.stats())))  # its failovers still count
            comm.close()
            return
        events.send(("done", rank, i, wrong(a, expected(seed, i, world, dtype, op, n, comp), op, dtype)))
    events.send(("stats", rank, 0, dict(comm.stats())))
    comm.close()


def drain(conns: dict[Any, int], handle: Callable[..., None], timeout: float = 0.2, budget: int = 1000) -> int:
    """Waits up to `timeout` for the workers' read ends in `conns`, then passes up to `budget` of
    the messages ready to handle(kind, rank, round, payload). A pipe at EOF (its worker ended, or
    was killed, perhaps mid-message) leaves `conns`. Returns the messages handled."""
    handled = 0
    for conn in mpc.wait(list(conns), timeout=timeout):
        while handled < budget and conn.poll():
            try:
                msg = conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                del conns[conn]
                break
            handled += 1
            handle(*msg)
    return handled


class Reducer:
    def __init__(self, ctx: Any, tmp: str, index: int) -> None:
        self.ctx, self.tmp, self.index = ctx, tmp, index
        self.port = 0
        self.proc: Any = None
        self.peak_rss = 0

    def start(self) -> None:
        port_file = os.path.join(self.tmp, f"reducer{self.index}")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.proc = self.ctx.Process(target=serve, args=(port_file, self.port), daemon=True)
        self.proc.start()
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reducer {self.index} did not start")
            time.sleep(0.02)
        self.port = int(open(port_file).read())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def sample_rss(self) -> None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        self.peak_rss = max(self.peak_rss, int(line.split()[1]) * 1024)
        except (OSError, AttributeError):
            pass

    def kill(self) -> None:
        if self.alive():
            self.sample_rss()
            self.proc.kill()
            self.proc.join(10)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--reducers", type=int, default=3)
    p.add_argument("--max-elems", type=int, default=1 << 20, help="largest round, in elements")
    p.add_argument("--reducer-kill-every", type=int, default=400, help="mean rounds between reducer kills")
    p.add_argument("--worker-kill-every", type=int, default=2500, help="mean rounds between worker kills")
    p.add_argument("--timeout", type=float, default=20.0, help="the workers' timeout (no progress in a round)")
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=120.0,
        help="the workers' connect_timeout: the group rendezvous, also of a failover session",
    )
    p.add_argument("--hang-seconds", type=float, default=180.0, help="no round finished for this long = a hang")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    # A worker whose peer dies just before a failover session waits there for it up to
    # connect_timeout (docs/protocol.md), after up to `timeout` to notice the loss: bounded, not a hang.
    if args.hang_seconds <= args.connect_timeout + args.timeout:
        p.error(
            f"--hang-seconds {args.hang_seconds:g} must exceed the workers' longest bounded wait, "
            f"--connect-timeout + --timeout = {args.connect_timeout + args.timeout:g} s "
            f"(a smaller --connect-timeout, or a larger --hang-seconds)"
        )
    return args


class Epoch:
    """One start of every worker, from round `first` (the last round they all finished): the
    rounds each has finished since, who has ended, and the rounds at which to kill next."""

    def __init__(
        self, first: int, procs: list[Any], conns: list[Any], rng: random.Random, args: argparse.Namespace
    ) -> None:
        self.first, self.procs = first, procs
        self.conns: dict[Any, int] = {c: w for w, c in enumerate(conns)}  # read ends still open -> rank
        self.done_by_rank: dict[int, int] = {w: first for w in range(len(procs))}  # rounds finished (checked)
        self.ended: set = set()
        self.last_progress = time.monotonic()
        self.next_reducer_kill = first + max(1, int(rng.expovariate(1 / args.reducer_kill_every)))
        self.next_worker_kill = first + max(1, int(rng.expovariate(1 / args.worker_kill_every)))


class Soak:
    """The reducers, the random kills and restarts, and the counts the report shows, over every epoch."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ctx = mp.get_context("spawn")
        self.rng = random.Random(args.seed)
        tmp = tempfile.mkdtemp(prefix="rs-soak-")
        self.reducers = [Reducer(self.ctx, tmp, k) for k in range(args.reducers)]
        for r in self.reducers:
            r.start()
        self.addrs = [f"127.0.0.1:{r.port}" for r in self.reducers]
        self.finished = 0  # rounds every worker finished
        self.wrong_results: list[str] = []
        self.errors: collections.Counter = collections.Counter()
        self.failovers = self.rejoins = self.epochs = self.hangs = self.reducer_kills = self.worker_kills = 0
        self.crashes = 0  # workers that exited on an error of their own
        self.restarts: list[tuple[float, Reducer]] = []  # (when, reducer) killed, to start again
        self.t0 = time.monotonic()

    def run(self) -> int:
        args = self.args
        print(
            f"soak: {args.rounds} rounds, {args.workers} workers, {args.reducers} reducers, seed {args.seed}; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        while self.finished < args.rounds:
            self.run_epoch()
            if self.hangs or self.crashes:
                break
            for _when, r in list(self.restarts):  # the next epoch starts with every reducer up
                r.start()
            self.restarts.clear()
        for r in self.reducers:
            r.kill()
        return self.report()

    def run_epoch(self) -> None:
        """Every worker from the last round they all finished, until each has ended (or a hang)."""
        args = self.args
        self.epochs += 1
        first = self.finished
        group = f"soak-{args.seed}-{self.epochs}"
        pipes = [self.ctx.Pipe(duplex=False) for _ in range(args.workers)]  # (read end, write end)
        procs = [
            self.ctx.Process(
                target=worker,
                args=(
                    w,
                    args.workers,
                    self.addrs,
                    group,
                    args.seed,
                    first,
                    args.rounds,
                    args.max_elems,
                    (args.timeout, args.connect_timeout),
                    pipes[w][1],
                ),
                daemon=True,
            )
            for w in range(args.workers)
        ]
        for pr, (_, w_end) in zip(procs, pipes):
            try:  # room for ~20k reports: a worker's rounds never wait while the driver restarts a reducer
                fcntl.fcntl(w_end.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
            except OSError:
                pass  # above /proc/sys/fs/pipe-max-size: the default 64 KiB (~1300 reports)
            pr.start()
            w_end.close()  # the worker holds the only write end: its exit or death reads as EOF
        ep = Epoch(first, procs, [r_end for r_end, _ in pipes], self.rng, args)
        while len(ep.ended) < args.workers:
            if not self.tick(ep):
                break
        for pr in procs:
            if pr.is_alive():
                pr.kill()
            pr.join(10)
        for conn in pipes:
            conn[0].close()
        self.finished = max(self.finished, min(ep.done_by_rank.values()))
        print(
            f"soak: epoch {self.epochs}: rounds {first}..{self.finished}, failovers so far {self.failovers}, "
            f"errors {sum(self.errors.values())}, {time.monotonic() - self.t0:.0f} s",
            flush=True,
        )

    def tick(self, ep: Epoch) -> bool:
        """Restart the reducers due, take the workers' messages, kill what is due; False on a hang."""
        now = time.monotonic()
        for when, r in list(self.restarts):
            if now >= when:
                r.start()
                self.restarts.remove((when, r))
        for r in self.reducers:
            if r.alive():
                r.sample_rss()
        drain(ep.conns, lambda *msg: self.record(ep, now, *msg))
        self.kill_if_due(ep, min(ep.done_by_rank.values()))
        for w, pr in enumerate(ep.procs):
            if w in ep.ended or pr.is_alive() or not pr.exitcode:
                continue
            ep.ended.add(w)  # killed (exitcode < 0): the others see the group fail
            if pr.exitcode > 0:  # the soak's own code failed (its traceback is on stderr): stop
                self.crashes += 1
                print(f"soak: worker {w} exited with code {pr.exitcode} without a report", flush=True)
                return False
        if time.monotonic() - ep.last_progress > self.args.hang_seconds:
            self.hangs += 1
            print(f"soak: no round finished for {self.args.hang_seconds:.0f} s: a hang", flush=True)
            return False
        return True

    def record(self, ep: Epoch, now: float, kind: str, rank: int, i: int, payload: Any) -> None:
        """One worker message: a round done (and checked), an error, or its final stats."""
        if kind == "done":
            ep.done_by_rank[rank] = i + 1
            ep.last_progress = now
            if payload:
                self.wrong_results.append(
                    f"round {i} rank {rank}: {spec(self.args.seed, i, self.args.max_elems)}: {payload}"
                )
        elif kind == "error":
            self.errors[payload.split(":")[0] + ": " + payload.split(":", 1)[-1][:60].strip()] += 1
            ep.ended.add(rank)
        elif kind == "stats":
            self.failovers += payload["reducer_failovers"]
            self.rejoins += payload.get("reducer_rejoins", 0)
            if i >= 0:
                ep.ended.add(rank)

    def kill_if_due(self, ep: Epoch, progress: int) -> None:
        """At its round: SIGKILL a random reducer (none while one is down), or once per epoch a worker."""
        rng, args = self.rng, self.args
        if progress >= ep.next_reducer_kill and not self.restarts:
            victim = rng.choice(self.reducers)
            victim.kill()
            self.reducer_kills += 1
            self.restarts.append((time.monotonic() + rng.uniform(0.2, 3.0), victim))
            ep.next_reducer_kill = progress + max(1, int(rng.expovariate(1 / args.reducer_kill_every)))
        if progress >= ep.next_worker_kill and len(ep.ended) == 0:
            ep.procs[rng.randrange(len(ep.procs))].kill()
            self.worker_kills += 1
            ep.next_worker_kill = 1 << 62

    def report(self) -> int:
        """Print the totals; 1 on any wrong result, hang or worker crash."""
        elapsed = time.monotonic() - self.t0
        print(f"\nsoak finished in {elapsed:.0f} s (load average {os.getloadavg()[0]:.2f})")
        print(f"  rounds checked on every worker: {self.finished} ({self.epochs} epochs)")
        print(f"  wrong results: {len(self.wrong_results)}")
        for w in self.wrong_results[:10]:
            print(f"    {w}")
        print(f"  reducer kills: {self.reducer_kills}, worker kills: {self.worker_kills}")
        print(f"  failovers (summed over workers): {self.failovers}, rejoins: {self.rejoins}")
        print(f"  hangs: {self.hangs}, worker crashes: {self.crashes}")
        print("  errors by cause (every worker counts its own):")
        for cause, count in self.errors.most_common():
            print(f"    {count:5d}  {cause}")
        print("  reducers' peak RSS: " + ", ".join(f"{r.peak_rss / 2**20:.0f} MiB" for r in self.reducers))
        return 1 if self.wrong_results or self.hangs or self.crashes else 0


def main(argv: list[str] | None = None) -> int:
    return Soak(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
