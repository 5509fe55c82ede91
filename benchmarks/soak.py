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
rejoins, errors by cause and the reducers' peak RSS; it exits 1 on any wrong result or hang.
Results: docs/performance.md ("Soak").
"""
from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import queue
import random
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
OPS = ("sum", "avg", "min", "max")


def spec(seed: int, i: int, max_elems: int) -> Tuple[str, str, int, str]:
    """Round i: (dtype, op, elements, compression), the same on every worker."""
    rng = random.Random(seed * 1_000_003 + i)
    dtype = rng.choice(DTYPES)
    op = rng.choice(OPS)
    n = int(10 ** rng.uniform(0, np.log10(max_elems)))
    comp = rng.choice(("", "", "bf16", "fp16")) if dtype == "float32" and op in ("sum", "avg") else ""
    return dtype, op, n, comp


def data(seed: int, i: int, rank: int, dtype: str, n: int) -> np.ndarray:
    from reducer.dtypes import numpy_dtype

    rng = np.random.default_rng([seed, i, rank])
    if dtype.startswith("int"):
        return rng.integers(-(2 ** 20), 2 ** 20, size=n).astype(numpy_dtype(dtype))
    return rng.standard_normal(n).astype(np.float32).astype(numpy_dtype(dtype))


def expected(seed: int, i: int, world: int, dtype: str, op: str, n: int, comp: str) -> np.ndarray:
    """The reducers' arithmetic: inputs on the wire type, folded in rank order (16-bit types in
    float32), rounded once."""
    import ml_dtypes

    from reducer.dtypes import numpy_dtype

    wire = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}.get(comp)
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


def wrong(got: np.ndarray, want: np.ndarray, op: str, dtype: str) -> Optional[str]:
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
    import reducer

    srv = reducer.ReducerServer(host="127.0.0.1", port=port).start()
    with open(port_file + ".tmp", "w") as fh:
        fh.write(str(srv.port))
    os.replace(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


def worker(rank: int, world: int, addrs: List[str], group: str, seed: int, first: int, last: int,
           max_elems: int, events: Any) -> None:
    """Runs rounds [first, last); reports ("done", rank, i, wrong_text) per round, then ("stats", ...)."""
    import reducer

    try:
        comm = reducer.Communicator(addrs, rank, world, group=group, timeout=20, connect_timeout=120)
    except Exception as exc:  # noqa: BLE001 - reported by cause
        events.put(("error", rank, first, f"{type(exc).__name__}: {str(exc)[:120]}"))
        return
    for i in range(first, last):
        dtype, op, n, comp = spec(seed, i, max_elems)
        a = data(seed, i, rank, dtype, n)
        try:
            comm.allreduce(a, op, compression=comp or "none")
        except Exception as exc:  # noqa: BLE001
            events.put(("error", rank, i, f"{type(exc).__name__}: {str(exc)[:120]}"))
            events.put(("stats", rank, -1, dict(comm.stats())))  # its failovers still count
            comm.close()
            return
        events.put(("done", rank, i, wrong(a, expected(seed, i, world, dtype, op, n, comp), op, dtype)))
    events.put(("stats", rank, 0, dict(comm.stats())))
    comm.close()


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


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--reducers", type=int, default=3)
    p.add_argument("--max-elems", type=int, default=1 << 20, help="largest round, in elements")
    p.add_argument("--reducer-kill-every", type=int, default=400, help="mean rounds between reducer kills")
    p.add_argument("--worker-kill-every", type=int, default=2500, help="mean rounds between worker kills")
    p.add_argument("--hang-seconds", type=float, default=180.0, help="no round finished for this long = a hang")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="rs-soak-")
    reducers = [Reducer(ctx, tmp, k) for k in range(args.reducers)]
    for r in reducers:
        r.start()
    addrs = [f"127.0.0.1:{r.port}" for r in reducers]
    events: Any = ctx.Queue()
    done_by_rank: Dict[int, int] = {}     # rounds finished (checked) per rank in the current epoch
    finished = 0                          # rounds every worker finished
    wrong_results: List[str] = []
    errors: collections.Counter = collections.Counter()
    failovers = rejoins = epochs = hangs = reducer_kills = worker_kills = 0
    restarts: List[Tuple[float, Reducer]] = []
    t0 = time.monotonic()
    print(f"soak: {args.rounds} rounds, {args.workers} workers, {args.reducers} reducers, seed {args.seed}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    while finished < args.rounds:
        epochs += 1
        first = finished
        group = f"soak-{args.seed}-{epochs}"
        procs = [ctx.Process(target=worker, args=(w, args.workers, addrs, group, args.seed, first, args.rounds,
                                                  args.max_elems, events), daemon=True)
                 for w in range(args.workers)]
        for pr in procs:
            pr.start()
        done_by_rank = {w: first for w in range(args.workers)}
        ended = set()
        last_progress = time.monotonic()
        next_reducer_kill = first + max(1, int(rng.expovariate(1 / args.reducer_kill_every)))
        next_worker_kill = first + max(1, int(rng.expovariate(1 / args.worker_kill_every)))
        while len(ended) < args.workers:
            now = time.monotonic()
            for when, r in list(restarts):
                if now >= when:
                    r.start()
                    restarts.remove((when, r))
            for r in reducers:
                if r.alive():
                    r.sample_rss()
            try:
                kind, rank, i, payload = events.get(timeout=0.2)
            except queue.Empty:
                kind = ""
            if kind == "done":
                done_by_rank[rank] = i + 1
                last_progress = now
                if payload:
                    wrong_results.append(f"round {i} rank {rank}: {spec(args.seed, i, args.max_elems)}: {payload}")
            elif kind == "error":
                errors[payload.split(":")[0] + ": " + payload.split(":", 1)[-1][:60].strip()] += 1
                ended.add(rank)
            elif kind == "stats":
                failovers += payload["reducer_failovers"]
                rejoins += payload.get("reducer_rejoins", 0)
                if i >= 0:
                    ended.add(rank)
            progress = min(done_by_rank.values())
            if progress >= next_reducer_kill and not restarts:
                victim = rng.choice(reducers)
                victim.kill()
                reducer_kills += 1
                restarts.append((time.monotonic() + rng.uniform(0.2, 3.0), victim))
                next_reducer_kill = progress + max(1, int(rng.expovariate(1 / args.reducer_kill_every)))
            if progress >= next_worker_kill and len(ended) == 0:
                procs[rng.randrange(len(procs))].kill()
                worker_kills += 1
                next_worker_kill = 1 << 62
            for w, pr in enumerate(procs):
                if not pr.is_alive() and w not in ended and pr.exitcode is not None and pr.exitcode < 0:
                    ended.add(w)  # killed: the others see the group fail
            if time.monotonic() - last_progress > args.hang_seconds:
                hangs += 1
                print(f"soak: no round finished for {args.hang_seconds:.0f} s: a hang", flush=True)
                break
        for pr in procs:
            if pr.is_alive():
                pr.kill()
            pr.join(10)
        finished = max(finished, min(done_by_rank.values()))
        print(f"soak: epoch {epochs}: rounds {first}..{finished}, failovers so far {failovers}, "
              f"errors {sum(errors.values())}, {time.monotonic() - t0:.0f} s", flush=True)
        if hangs:
            break
        for when, r in list(restarts):  # the next epoch starts with every reducer up
            r.start()
        restarts.clear()
    for r in reducers:
        r.kill()
    elapsed = time.monotonic() - t0
    print(f"\nsoak finished in {elapsed:.0f} s (load average {os.getloadavg()[0]:.2f})")
    print(f"  rounds checked on every worker: {finished} ({epochs} epochs)")
    print(f"  wrong results: {len(wrong_results)}")
    for w in wrong_results[:10]:
        print(f"    {w}")
    print(f"  reducer kills: {reducer_kills}, worker kills: {worker_kills}")
    print(f"  failovers (summed over workers): {failovers}, rejoins: {rejoins}")
    print(f"  hangs: {hangs}")
    print("  errors by cause (every worker counts its own):")
    for cause, count in errors.most_common():
        print(f"    {count:5d}  {cause}")
    print("  reducers' peak RSS: " + ", ".join(f"{r.peak_rss / 2**20:.0f} MiB" for r in reducers))
    return 1 if wrong_results or hangs else 0


if __name__ == "__main__":
    sys.exit(main())
