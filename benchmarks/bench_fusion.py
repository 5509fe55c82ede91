"""Tensor fusion benchmark: one training step's gradients, fusion on vs off.

    python -m benchmarks.bench_fusion                    # ResNet-50, BERT-base, small1000; W=2, R=2, loopback
    python -m benchmarks.bench_fusion --models resnet50 --steps 15 --thresholds 64M,16M,1M
    python -m benchmarks.bench_fusion --compression bf16   # float32 gradients sent as bfloat16

Every step submits each gradient of the model with ``comm.allreduce_async`` (in backward
order: last layer first) and calls ``comm.synchronize()``, as a training loop would after its
backward pass. "fusion on" rows use the given thresholds (default: 64M, the default setting,
and 4M) with the default 5 ms cycle time; "fusion off" is ``fusion_threshold=0``: one
all-reduce round per gradient (still asynchronous, several rounds in flight). Both send every
float32 gradient straight from its own memory (scatter-gather rounds, no packing copy; with
``--compression`` the transport narrows them to 16 bits chunk by chunk, still no copy). The
modes are interleaved step by step so that load changes on the machine affect them alike. W
worker processes and R reducers (ReducerServer in this process) talk over loopback. Printed per
model and mode: tensors, MB, all-reduce rounds per step (``fusion_stats()["rounds"]``:
data rounds plus agreement probes, which run on their own connection), probes per step, the
most rounds this worker had in flight at once, median step time of the slowest worker, the
speed-up of fusion over fusion off, and the median CPU time per step of the busier worker
process (a load-independent check: on a busy machine step times vary, CPU time much less).
The load average is printed at the start and at the end.

The parameter shapes come from reducer.bench.models: ResNet-50 exactly as torchvision's
``resnet50().named_parameters()`` (161 tensors, 25,557,032 parameters) and BERT-base as
Hugging Face's ``BertModel`` (embeddings, 12 identical encoder layers of 16 tensors, pooler:
199 tensors, 109,482,240 parameters). ``small1000`` (1,000 tensors of 1 KiB) shows the case
fusion is for: many tensors too small to fill the network on their own.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

import reducer
from reducer.bench.models import Shapes, parameters
from reducer.config import COMPRESSION_NAMES

# Not a model: 1,000 tensors of 256 float32 (1 KiB each), where per-round latency dominates (the
# case tensor fusion exists for, like the biases and norm weights of a large model).
SMALL1000: Shapes = [(f"small.{i}", (256,)) for i in range(1000)]

MODELS: dict[str, Shapes] = {
    "resnet50": parameters("resnet50"),
    "bert-base": parameters("bert-base"),
    "small1000": SMALL1000,
}


def _worker(
    rank: int,
    world: int,
    addrs: list[str],
    models: list[str],
    modes: list[str],
    steps: int,
    compression: str | None,
    queue: mp.Queue,
) -> None:
    try:
        for model in models:
            shapes = MODELS[model]
            grads = [np.full(s, 1.0 + rank, np.float32) for _, s in shapes]
            comms = {}
            for mode in modes:  # one communicator (reducer group) per mode, all open at once
                threshold = 0 if mode == "off" else mode
                comms[mode] = reducer.Communicator(
                    addrs,
                    rank,
                    world,
                    group=f"bench-{model}-{mode}",
                    fusion_threshold=threshold,
                    compression=compression,
                )
            times: dict[str, list[float]] = {m: [] for m in modes}
            cpu: dict[str, list[float]] = {m: [] for m in modes}
            rounds: dict[str, list[int]] = {m: [] for m in modes}
            ok = True
            for step in range(steps + 1):  # step 0 warms up (page faults, fusion buffers)
                # interleave the modes, rotating their order, so load drift hits them alike
                for mode in modes[step % len(modes) :] + modes[: step % len(modes)]:
                    comm = comms[mode]
                    for g in grads:
                        g.fill(1.0 + rank)
                    r0 = comm.fusion_stats().get("rounds", 0)
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    for (name, _), g in zip(reversed(shapes), reversed(grads)):  # backward order
                        comm.allreduce_async(g, name=name)
                    comm.synchronize()
                    dt = time.perf_counter() - t0
                    dc = time.process_time() - c0
                    expect = sum(1.0 + r for r in range(world))
                    ok &= all(float(g.flat[0]) == expect and float(g.flat[-1]) == expect for g in grads)
                    if step:
                        times[mode].append(dt)
                        cpu[mode].append(dc)
                        rounds[mode].append(comm.fusion_stats()["rounds"] - r0)
            fstats = {m: comms[m].fusion_stats(peaks=True) for m in modes}
            for c in comms.values():
                c.close()
            queue.put((rank, model, times, rounds, ok, fstats, cpu))
    except BaseException as exc:  # report instead of hanging the parent
        queue.put((rank, "error", repr(exc), {}, False, {}, {}))
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert-base,small1000", help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reducers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=7, help="timed steps per model and mode (after one warm-up)")
    ap.add_argument(
        "--thresholds",
        default="64M,4M",
        help="fusion thresholds to compare with fusion off (default: 64M, the default setting, and 4M)",
    )
    ap.add_argument(
        "--compression",
        default=None,
        choices=(*COMPRESSION_NAMES, "none"),
        help="wire compression of the float32 gradients (default: RS_COMPRESSION, else none)",
    )
    args = ap.parse_args(argv)

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}")
    modes = [t.strip() for t in args.thresholds.split(",") if t.strip()] + ["off"]
    servers = [reducer.ReducerServer(host="127.0.0.1", port=0).start() for _ in range(args.reducers)]
    addrs = [s.address for s in servers]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, args.workers, addrs, models, modes, args.steps, args.compression, queue))
        for r in range(args.workers)
    ]
    print(
        f"# W={args.workers} workers (processes), R={args.reducers} reducers, loopback, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; cycle time {reducer.config.get('cycle_time_ms')} ms; "
        f"compression {reducer.config.get('compression', args.compression) or 'none'}; "
        f"{args.steps} timed steps per row (modes interleaved), median of the slowest worker"
    )
    t_start = time.time()
    for p in procs:
        p.start()
    results: dict[str, list] = {}
    try:
        for _ in range(len(models) * args.workers):
            rank, model, times, rounds, ok, fstats, cpu = queue.get(timeout=1800)
            if model == "error":
                raise SystemExit(f"worker {rank} failed: {times}")
            if not ok:
                raise SystemExit(f"worker {rank}: wrong result for {model}")
            results.setdefault(model, []).append((times, rounds, fstats, cpu))
    finally:
        for p in procs:
            p.join(60)
        red_rounds = [s.stats()["rounds_completed"] for s in servers]
        for s in servers:
            s.stop()

    print(
        f"{'model':<10} {'tensors':>7} {'MB':>6} {'fusion':>10} {'rounds/step':>11} {'probes':>6} {'inflight':>8} "
        f"{'step (ms)':>9} {'GB/s':>5} {'vs off':>6} {'cpu (ms)':>8}"
    )
    for m in models:
        shapes = MODELS[m]
        mb = sum(math.prod(s) for _, s in shapes) * 4 / 1e6
        per_rank = results[m]
        med = {}
        for mode in modes:
            step_times = [max(ts) for ts in zip(*[t[mode] for t, _, _, _ in per_rank])]
            med[mode] = statistics.median(step_times)
        for mode in modes:
            rounds = statistics.median(per_rank[0][1][mode])
            probes = per_rank[0][2][mode].get("probes", 0) / (args.steps + 1)
            inflight = max(p[2][mode].get("max_in_flight", 0) for p in per_rank)
            cpu = statistics.median(max(cs) for cs in zip(*[p[3][mode] for p in per_rank]))
            label = "off" if mode == "off" else f"on {mode}"
            ratio = f"{med['off'] / med[mode]:.2f}x" if mode != "off" else ""
            print(
                f"{m:<10} {len(shapes):>7} {mb:>6.1f} {label:>10} {rounds:>11.0f} {probes:>6.1f} {inflight:>8} "
                f"{med[mode] * 1e3:>9.1f} {mb / 1e3 / med[mode]:>5.2f} {ratio:>6} {cpu * 1e3:>8.1f}"
            )
    print(
        f"# rounds completed per reducer (warm-up included): {red_rounds}; {time.time() - t_start:.0f} s; "
        f"load average at the end {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
