"""What frame integrity costs (docs/security.md "Frame integrity mode", docs/performance.md).

    python -m benchmarks.bench_integrity                     # W=2, R=1, 8 x 16 MiB rounds, loopback
    python -m benchmarks.bench_integrity --size 64M --steps 7 --workers 2

Two measurements in one run:

1. The same loopback all-reduce with integrity off and on. W worker processes each hold two
   clients (both authenticated, one asking for integrity) to the same R reducers (in this
   process, integrity offered); every step runs `rounds` float32 all-reduces of `size` bytes on
   each, alternating which goes first, so load changes on the machine affect both alike. Printed:
   median step time of the slowest worker, GB/s of buffer reduced, and the ratio on/off.
   Results are checked against the exact sum on every step.
2. The reducer's CPU per byte (benchmarks/bench_reducer_cpu.py's measurement: contribution
   bytes received per reducer CPU second, one reducer thread) with integrity off and on: this is
   what sizes reducers (docs/deploy.md), and unlike wall-clock rates it holds on a loaded machine.
3. Raw GMAC throughput of one core (the core's FrameAuth via reducer._core.frame_tags: header
   tag + trailer over a `--gmac-size` payload) against a memory copy of the same size (numpy),
   best of `--repeat`.
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
from benchmarks.bench_reducer_cpu import measure
from reducer._native import core
from reducer.config import parse_size

MODES = ("off", "on")
SECRET = "bench-integrity-secret"


def _worker(rank: int, world: int, addrs: list[str], rounds: int, nbytes: int, steps: int, queue: mp.Queue) -> None:
    try:
        clients = {
            m: core.Client(
                addrs, rank, world, f"bench-integrity-{m}", "bench", 120.0, 120.0, SECRET, 1, integrity=(m == "on")
            )
            for m in MODES
        }
        buf = np.empty(nbytes // 4, np.float32)
        expect = float(sum(1 + r for r in range(world)))
        times: dict[str, list[float]] = {m: [] for m in MODES}
        ok = True
        for step in range(steps + 1):  # step 0 warms up (page faults, connections)
            for mode in MODES if step % 2 == 0 else MODES[::-1]:
                t0 = time.perf_counter()
                for _ in range(rounds):
                    buf.fill(1.0 + rank)
                    clients[mode].allreduce(buf, "float32", "sum")
                    ok = ok and bool(buf[0] == expect and buf[-1] == expect)
                if step > 0:
                    times[mode].append(time.perf_counter() - t0)
        for c in clients.values():
            c.close()
        queue.put((rank, times, ok, None))
    except BaseException as exc:  # reported by the parent
        queue.put((rank, {}, False, repr(exc)))


def allreduce_ratio(
    workers: int, reducers: int, rounds: int, nbytes: int, steps: int, threads: int
) -> dict[str, float]:
    servers = [
        reducer.ReducerServer(host="127.0.0.1", port=0, threads=threads, auth_token=SECRET, integrity="on").start()
        for _ in range(reducers)
    ]
    try:
        addrs = [s.address for s in servers]
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(r, workers, addrs, rounds, nbytes, steps, queue)) for r in range(workers)
        ]
        for p in procs:
            p.start()
        results = [queue.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    finally:
        for s in servers:
            s.stop()
    errors = [err for _, _, _, err in results if err]
    if errors:
        raise RuntimeError("; ".join(errors))
    if not all(ok for _, _, ok, _ in results):
        raise RuntimeError("wrong all-reduce result")
    out: dict[str, float] = {}
    for mode in MODES:
        # Per step, the slowest worker decides; the median over steps.
        per_step = [max(times[mode][i] for _, times, _, _ in results) for i in range(steps)]
        out[mode] = statistics.median(per_step)
    return out


def gmac_vs_memcpy(nbytes: int, repeat: int) -> dict[str, float]:
    payload = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(payload)
    key, header = bytes(range(32)), bytes(48)
    core.frame_tags(key, 0, 0, header, payload, 2)  # warm up
    np.copyto(dst, payload)
    best = {"gmac": float("inf"), "memcpy": float("inf")}
    inner = 8
    for _ in range(repeat):
        t0 = time.perf_counter()
        core.frame_tags(key, 0, 0, header, payload, inner)
        best["gmac"] = min(best["gmac"], (time.perf_counter() - t0) / inner)
        t0 = time.perf_counter()
        for _ in range(inner):
            np.copyto(dst, payload)
        best["memcpy"] = min(best["memcpy"], (time.perf_counter() - t0) / inner)
    return {k: nbytes / v / 1e9 for k, v in best.items()}


def main(argv: list[str] | None = None) -> int:
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reducers", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="event loops per reducer")
    p.add_argument("--rounds", type=int, default=8, help="all-reduces per step and mode")
    p.add_argument("--size", default="16M", help="bytes per all-reduce")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--gmac-size", default="4M")
    p.add_argument("--cpu-nbytes", type=parse_size, default=64 << 20, help="reducer CPU measurement: buffer per worker")
    p.add_argument("--cpu-iters", type=int, default=10)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    nbytes = parse_size(args.size)
    gsize = parse_size(args.gmac_size)

    g = gmac_vs_memcpy(gsize, args.repeat)
    print(
        f"one core, {gsize >> 20} MiB: GMAC (header tag + trailer) {g['gmac']:.2f} GB/s, "
        f"memcpy {g['memcpy']:.2f} GB/s, GMAC/memcpy {g['gmac'] / g['memcpy']:.2f}"
    )

    cpu = {m: measure("float32", args.workers, args.cpu_nbytes, args.cpu_iters, SECRET, m == "on") for m in MODES}
    print(f"reducer CPU per byte, W={args.workers}, {args.cpu_nbytes >> 20} MiB x {args.cpu_iters}, 1 thread:")
    for m in MODES:
        print(f"  integrity {m:3s}  {cpu[m]['core_GBps']:6.2f} GB/s of contributions per reducer core")
    print(f"  reducer core GB/s on/off = {cpu['on']['core_GBps'] / cpu['off']['core_GBps']:.2f}")

    t = allreduce_ratio(args.workers, args.reducers, args.rounds, nbytes, args.steps, args.threads)
    gbps = {m: args.rounds * nbytes / t[m] / 1e9 for m in MODES}
    print(
        f"all-reduce W={args.workers} R={args.reducers} {args.rounds} x {nbytes >> 20} MiB float32, loopback, "
        f"median of {args.steps} steps:"
    )
    for m in MODES:
        print(f"  integrity {m:3s}  {t[m] * 1e3:8.1f} ms/step  {gbps[m]:6.2f} GB/s")
    print(f"  throughput on/off = {gbps['on'] / gbps['off']:.2f}  (cost {100 * (1 - gbps['on'] / gbps['off']):.0f}%)")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
