#!/usr/bin/env python
"""All-reduce a few buffer sizes with reduction-server and check the sums.

Runs unchanged on one machine and on Vertex AI / Kubernetes: `reducer.init()` reads the cluster
from CLUSTER_SPEC (or TF_CONFIG, or RS_REDUCERS + RS_RANK + RS_WORLD_SIZE).

    reduction-server launch --workers 2 --reducers 2 -- python examples/allreduce_numpy.py
    python examples/allreduce_numpy.py --sizes 4K,1M,64M --iters 10 --dtype bfloat16

Worker r contributes pattern + r, where pattern[i] = i % 7, so every element of the sum is
W * pattern[i] + W(W-1)/2: small integers, exact in every dtype. Rank 0 prints one line per size
(nccl-tests style: algbw = bytes / time); every rank checks every result and the script exits 1
if any element is wrong (2 on a setup error, e.g. no cluster description).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

import reducer
from reducer.config import parse_size
from reducer.dtypes import SUPPORTED, numpy_dtype
from reducer.errors import ConfigError, ReductionError

DTYPES = SUPPORTED


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4K,256K,4M,16M", help="buffer sizes in bytes, K/M/G suffixes (default %(default)s)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--op", default="sum", choices=("sum",), help="reduction (the check assumes sum)")
    p.add_argument("--iters", type=int, default=5, help="timed all-reduces per size (default %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed all-reduces per size (default %(default)s)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    dtype = numpy_dtype(args.dtype)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        print(f"error: bad --sizes {args.sizes!r}", file=sys.stderr)
        return 2
    try:
        comm = reducer.init()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    rank, world = comm.rank, comm.world_size
    ok = True
    with comm:
        if rank == 0:
            print(f"all-reduce ({args.op}) of {args.dtype} over {world} worker(s) and {len(comm.reducers)} "
                  f"reducer(s): {', '.join(comm.reducers)}")
            print(f"{'size':>10} {'count':>12} {'type':>9} {'time(us)':>10} {'algbw(GB/s)':>12}  result")
        for nbytes in sizes:
            count = nbytes // dtype.itemsize
            pattern = (np.arange(count, dtype=np.int64) % 7)
            mine = (pattern + rank).astype(dtype)
            expected = (pattern * world + world * (world - 1) // 2).astype(np.float64)
            buf = np.empty(count, dtype=dtype)
            times = []
            try:
                for it in range(args.warmup + args.iters):
                    buf[...] = mine
                    t0 = time.perf_counter()
                    comm.allreduce(buf, op=args.op)
                    dt = time.perf_counter() - t0
                    if it >= args.warmup:
                        times.append(dt)
                    if not np.array_equal(buf.astype(np.float64), expected):
                        bad = np.flatnonzero(buf.astype(np.float64) != expected)
                        i = int(bad[0])
                        print(f"rank {rank}: WRONG result for {human(nbytes)} ({len(bad)} of {count} elements): "
                              f"element {i} is {buf[i]!r}, expected {expected[i]!r}", file=sys.stderr)
                        ok = False
                        break
            except ReductionError as exc:
                print(f"rank {rank}: all-reduce of {human(nbytes)} failed: {exc}", file=sys.stderr)
                return 1
            if not ok:
                break
            avg = sum(times) / len(times) if times else 0.0
            algbw = nbytes / avg / 1e9 if avg > 0 else 0.0
            if rank == 0:
                head = ", ".join(f"{v:g}" for v in buf[:3].astype(np.float64))
                print(f"{human(nbytes):>10} {count:>12} {args.dtype:>9} {avg * 1e6:>10.1f} {algbw:>12.3f}  "
                      f"[{head}{', ...' if count > 3 else ''}] OK")
    if ok:
        print(f"rank {rank} of {world}: all {len(sizes)} sizes correct")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
