#!/usr/bin/env python3
"""What the Python API adds to one small all-reduce: Communicator.allreduce vs the core's calls.

    python -m benchmarks.bench_call_overhead --nbytes 64K --calls 3000 --repeat 5

One in-process ReducerServer(threads=1) and one worker (world size 1) on loopback, so a call is
a whole round (start, send, reduce, result) with no other worker to wait for. Three ways to
reduce the same numpy buffer, interleaved `--repeat` times, each timed over `--calls` calls:

    core        the transport alone: client.wait(client.start_ptr(...)) (the baseline)
    raw         Communicator.allreduce_raw(ptr, nbytes, dtype): the API's checks and settings
    allreduce   Communicator.allreduce(numpy array): also turns the array into host memory

Prints each one's median time per call and what it adds to the baseline measured in the same
run. Small rounds are where this matters (DDP's first buckets, the fusion engine's probes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import reducer
from reducer.config import parse_size


def per_call_us(fn: Callable[[], None], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nbytes", type=parse_size, default=64 * 1024, help="buffer size (default 64K)")
    ap.add_argument("--calls", type=int, default=3000, help="calls per timing (default 3000)")
    ap.add_argument("--repeat", type=int, default=5, help="interleaved timings of each way (default 5)")
    a = ap.parse_args(argv)
    x = np.ones(max(1, a.nbytes // 4), dtype=np.float32)
    with reducer.ReducerServer(host="127.0.0.1", port=0, threads=1) as srv:
        comm = reducer.Communicator([f"127.0.0.1:{srv.port}"], rank=0, world_size=1, group="call-overhead")
        try:
            client, ptr, nbytes = comm._client, int(x.ctypes.data), int(x.nbytes)
            ways: dict[str, Callable[[], None]] = {
                "core": lambda: client.wait(client.start_ptr(ptr, nbytes, "float32", "sum", 0, compression="")),
                "raw": lambda: comm.allreduce_raw(ptr, nbytes, "float32"),
                "allreduce": lambda: comm.allreduce(x),
            }
            times: dict[str, list[float]] = {k: [] for k in ways}
            for fn in ways.values():  # warm-up
                per_call_us(fn, max(1, a.calls // 10))
            for _ in range(a.repeat):
                for k, fn in ways.items():
                    times[k].append(per_call_us(fn, a.calls))
        finally:
            comm.close()
    base = statistics.median(times["core"])
    print(f"# {x.nbytes} bytes, world size 1, loopback; median of {a.repeat} timings of {a.calls} calls each")
    print(f"# load average before exit: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'way':12s} {'us/call':>9s} {'spread':>8s} {'added to core':>14s} {'ratio':>7s}")
    for k, ts in times.items():
        med = statistics.median(ts)
        spread = (max(ts) - min(ts)) / med if med else 0.0
        print(f"{k:12s} {med:9.1f} {spread:7.0%} {med - base:11.1f} us {med / base:6.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
