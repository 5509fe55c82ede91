#!/usr/bin/env python3
"""CPU per byte on a reducer: GB/s of worker contributions one reducer core sums.

    python -m benchmarks.bench_reducer_cpu --workers 2 --nbytes 64M --iters 10

One ReducerServer(threads=1) in this process, W worker processes on loopback all-reducing
one buffer `--iters` times. The reducer's CPU time (user + system of this process, which does
nothing else meanwhile: it waits on a barrier) is read around the timed iterations together
with the reducer's bytes_received counter:

    GB/s per core = contribution bytes received / reducer CPU seconds

It covers everything a reducer does per byte: receive (syscalls, copies), the kernels, send the
result back to every worker. `reduction-server plan` turns this into a reducer machine's CPU
limit (reducer/deploy/planner.py: REDUCER_CORE_GBPS). For comparison the same run times the bare
kernel (kernels_accumulate) on one core. Wall-clock rates are printed too, but on a shared
machine only the CPU-time figure is meaningful.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import time
from typing import Any

import numpy as np

import reducer
from reducer import ReducerServer, _core
from reducer.config import parse_size
from reducer.dtypes import numpy_dtype

BARRIER_TIMEOUT = 300.0


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _worker(
    rank: int,
    world: int,
    addr: str,
    dtype: str,
    nbytes: int,
    iters: int,
    barrier: Any,
    out: Any,
    auth_token: str = "",
    integrity: bool = False,
) -> None:
    try:
        dt = numpy_dtype(dtype)
        a = np.ones(nbytes // dt.itemsize, dt)
        with reducer.Communicator(
            [addr],
            rank,
            world,
            group="cpu-bench",
            timeout=120,
            connect_timeout=30,
            auth_token=auth_token or None,
            integrity="on" if integrity else "off",
        ) as comm:
            comm.allreduce(a)  # warm up: connections, buffers
            barrier.wait(BARRIER_TIMEOUT)
            for _ in range(iters):
                a[...] = 1
                comm.allreduce(a)
            barrier.wait(BARRIER_TIMEOUT)
            expect = float(world)
            ok = bool(np.all(a.astype(np.float64) == expect))
        out.put((rank, None if ok else f"rank {rank}: wrong result"))
    except Exception as exc:  # reported by the parent
        out.put((rank, f"rank {rank}: {exc!r}"))
        barrier.abort()


def kernel_gbps(dtype: str, nbytes: int, rounds: int = 5) -> float:
    """Bare kernels_accumulate throughput (input bytes per second, one core, best of `rounds`)."""
    dt = numpy_dtype(dtype)
    n = nbytes // dt.itemsize
    acc = np.ones(n, np.float32 if dt.itemsize == 2 else dt)
    x = np.ones(n, dt)
    xb = x.view(np.uint16) if dt.itemsize == 2 else x
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        _core.kernels_accumulate(dtype, "sum", acc, xb)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def measure(
    dtype: str, workers: int, nbytes: int, iters: int, auth_token: str = "", integrity: bool = False
) -> dict[str, float]:
    """One run; with `integrity` (needs `auth_token`) every frame carries its GMAC tags."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    out = ctx.Queue()
    with ReducerServer(
        host="127.0.0.1", port=0, threads=1, auth_token=auth_token or None, integrity="on" if integrity else "off"
    ) as srv:
        procs = [
            ctx.Process(
                target=_worker,
                args=(r, workers, srv.address, dtype, nbytes, iters, barrier, out, auth_token, integrity),
            )
            for r in range(workers)
        ]
        for p in procs:
            p.start()
        try:
            barrier.wait(BARRIER_TIMEOUT)
            rx0, cpu0, t0 = srv.stats()["bytes_received"], _cpu_seconds(), time.perf_counter()
            barrier.wait(BARRIER_TIMEOUT)
            rx1, cpu1, t1 = srv.stats()["bytes_received"], _cpu_seconds(), time.perf_counter()
            errors = [out.get(timeout=BARRIER_TIMEOUT) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.terminate()
    bad = [e for _, e in errors if e]
    if bad:
        raise SystemExit("; ".join(bad))
    received = rx1 - rx0
    cpu, wall = cpu1 - cpu0, t1 - t0
    return {
        "received_GB": received / 1e9,
        "cpu_s": cpu,
        "wall_s": wall,
        "core_GBps": received / cpu / 1e9,
        "wall_GBps": received / wall / 1e9,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--nbytes", type=parse_size, default=64 << 20, help="buffer per worker (default 64M)")
    ap.add_argument("--iters", type=int, default=10, help="timed all-reduces (default 10)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated (default float32,bfloat16)")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    print(
        f"reducer CPU per byte: W={args.workers}, {args.nbytes} B per worker, {args.iters} iterations, "
        f"1 reducer thread; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    rows: list[tuple[str, dict[str, float], float]] = []
    for dtype in args.dtypes.split(","):
        r = measure(dtype, args.workers, args.nbytes, args.iters)
        rows.append((dtype, r, kernel_gbps(dtype, args.nbytes)))
    print(
        f"{'dtype':10s} {'received':>10s} {'cpu s':>7s} {'wall s':>7s} {'GB/s/core':>10s} "
        f"{'wall GB/s':>10s} {'kernel GB/s':>12s} {'reducer/kernel':>15s}"
    )
    for dtype, r, k in rows:
        print(
            f"{dtype:10s} {r['received_GB']:8.2f}GB {r['cpu_s']:7.2f} {r['wall_s']:7.2f} {r['core_GBps']:10.2f} "
            f"{r['wall_GBps']:10.2f} {k:12.2f} {r['core_GBps'] / k:14.2f}x"
        )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
