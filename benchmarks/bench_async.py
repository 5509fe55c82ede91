"""Asynchronous client benchmark: rounds one after another vs several in flight.

    python -m benchmarks.bench_async                      # W=2, R=2, 16 x 4 MiB, loopback
    python -m benchmarks.bench_async --rounds 64 --size 256K --steps 9

Each step reduces `rounds` float32 buffers of `size` bytes, in two modes, interleaved step by
step (rotating which goes first) so that load changes on the machine affect both alike:

  serial    allreduce() of each buffer in turn (each round waits for the previous one:
            pipeline fill and drain every round)
  inflight  start() of every buffer, then wait() for each (up to --max-in-flight rounds
            stream at once: round n+1 streams while round n drains)

W worker processes and R reducers (ReducerServer in this process) talk over loopback. Printed
per mode: the median step time of the slowest worker, GB/s of buffer reduced, and the ratio
serial / inflight. Results are checked against the exact sum on every step.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

import reducer
from reducer._native import core
from reducer.config import parse_size

MODES = ("serial", "inflight")


def _worker(
    rank: int, world: int, addrs: list[str], rounds: int, nbytes: int, steps: int, max_in_flight: int, queue: mp.Queue
) -> None:
    try:
        client = core.Client(
            addrs, rank, world, "bench-async", "local", 60.0, 60.0, "", 1, max_rounds_in_flight=max_in_flight
        )
        bufs = [np.empty(nbytes // 4, np.float32) for _ in range(rounds)]
        ptrs = [(b.ctypes.data, b.nbytes) for b in bufs]
        times: dict[str, list[float]] = {m: [] for m in MODES}
        expect = sum(1.0 + r for r in range(world))
        ok = True
        for step in range(steps + 1):  # step 0 warms up (page faults, connections)
            order = MODES if step % 2 == 0 else MODES[::-1]
            for mode in order:
                for b in bufs:
                    b.fill(1.0 + rank)
                t0 = time.perf_counter()
                if mode == "serial":
                    for p, n in ptrs:
                        client.allreduce_ptr(p, n, "float32", "sum")
                else:
                    ids = [client.start_ptr(p, n, "float32", "sum") for p, n in ptrs]
                    for i in ids:
                        client.wait(i)
                dt = time.perf_counter() - t0
                ok &= all(float(b[0]) == expect and float(b[-1]) == expect for b in bufs)
                if step:
                    times[mode].append(dt)
        client.close()
        queue.put((rank, times, ok, ""))
    except BaseException as exc:  # report instead of hanging the parent
        queue.put((rank, {}, False, repr(exc)))
        raise


def main(argv: list[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reducers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=16, help="buffers per step")
    ap.add_argument("--size", default="4M", help="bytes per buffer (suffixes K, M)")
    ap.add_argument("--steps", type=int, default=7, help="timed steps per mode (after one warm-up)")
    ap.add_argument("--max-in-flight", type=int, default=8, help="the client's max_rounds_in_flight")
    args = ap.parse_args(argv)

    nbytes = parse_size(args.size)
    if nbytes <= 0 or nbytes % 4:
        ap.error("--size must be a positive multiple of 4 bytes")
    servers = [reducer.ReducerServer(host="127.0.0.1", port=0).start() for _ in range(args.reducers)]
    addrs = [s.address for s in servers]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker, args=(r, args.workers, addrs, args.rounds, nbytes, args.steps, args.max_in_flight, queue)
        )
        for r in range(args.workers)
    ]
    print(
        f"# W={args.workers} workers (processes), R={args.reducers} reducers, loopback, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; {args.rounds} x {nbytes} B float32 sum per step; "
        f"max_rounds_in_flight {args.max_in_flight}; {args.steps} timed steps per mode (interleaved), "
        f"median of the slowest worker"
    )
    for p in procs:
        p.start()
    per_rank = []
    try:
        for _ in range(args.workers):
            rank, times, ok, err = queue.get(timeout=1800)
            if err:
                raise SystemExit(f"worker {rank} failed: {err}")
            if not ok:
                raise SystemExit(f"worker {rank}: wrong result")
            per_rank.append(times)
    finally:
        for p in procs:
            p.join(60)
        for s in servers:
            s.stop()
    med = {m: statistics.median(max(ts) for ts in zip(*[t[m] for t in per_rank])) for m in MODES}
    total = args.rounds * nbytes
    print(f"{'mode':<10} {'step (ms)':>10} {'GB/s':>6}")
    for m in MODES:
        print(f"{m:<10} {med[m] * 1e3:>10.1f} {total / 1e9 / med[m]:>6.2f}")
    print(
        f"# inflight speed-up over serial: {med['serial'] / med['inflight']:.2f}x "
        f"(load average now {os.getloadavg()[0]:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
