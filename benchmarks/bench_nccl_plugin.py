#!/usr/bin/env python3
"""NCCL plugin throughput on emulated hosts: a stream of iallreduce calls vs the project's ring.

    sudo python -m benchmarks.bench_nccl_plugin                 # 1 Gbit/s, W=4 heads, R=4, 64 MiB
    python -m benchmarks.bench_nccl_plugin --gbps 1 --size 64M --call 256K --iters 5 --repeat 2

W + R emulated hosts (reducer/bench/emulate.py: one network namespace per host, a rate-limited
full-duplex link each, the same as `reduction-server bench --emulate-gbps`; needs root). In
the same hosts and the same run:

  plugin  W head processes play NCCL's proxy through tests/nccl_harness.py (collnet_stream): the
          plugin library is dlopened, the heads connect through CollNet to R reducer processes and
          all-reduce `size` bytes of float32 as `size / call` iallreduce calls with up to 64
          outstanding, drained after each all-reduce; every result is checked exactly.
  ring    the project's C++ ring (the `--algos ring` machinery of reducer.bench.runner) on the
          W worker hosts, one all-reduce of `size` bytes.
  rs      (reference) the worker library's Communicator on the same W + R hosts.

Time = the slowest head's median over the timed all-reduces (warm-up ones dropped), as in the
bench. Printed: time, % of the rs link bound (S x max(1, W/R) / (0.956 x link rate): the bytes
one worker link carries, at the TCP payload rate tbf lets through), and ring / plugin. The
machine's load average is printed before and after: above 2 (other work on the cores) the numbers
are marked PRELIMINARY.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from reducer import config as rs_config
from reducer.addresses import format_address
from reducer.bench import emulate, options, procs, report, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")  # the heads import tests/nccl_harness.py (their PYTHONPATH, below)

LOAD_LIMIT = 2.0  # above this load average the numbers are preliminary


def _head_main(job_json: str) -> int:
    """Inside an emulated host: one head (see tests/nccl_harness.py collnet_stream)."""
    import nccl_harness as H  # noqa: PLC0415 (tests/nccl_harness.py: on the heads' PYTHONPATH only)

    job = json.loads(job_json)
    out = H.collnet_stream(**job)
    out.pop("log", None)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def run_plugin(
    hosts: Any,
    workers: int,
    reducers: int,
    size: int,
    call: int,
    passes: int,
    head_env: dict[str, str],
    reducer_env: dict[str, str],
    timeout: float,
    idle_sleep: float,
    ifname: str = "eth0",
) -> list[dict[str, Any]]:
    """Reducer processes on hosts W..W+R-1, heads on hosts 0..W-1; each head's collnet_stream result."""
    events: queue.Queue = queue.Queue()
    rprocs = []
    try:
        for k in range(reducers):
            h = workers + k
            rprocs.append(
                procs.spawn(
                    hosts,
                    h,
                    f"reducer {k}",
                    {"role": "reducer", "bind_host": hosts.bind_host(h), "threads": rs_config.get("threads")},
                    events,
                    extra_env=reducer_env,
                )
            )
        ready = procs.wait_all(events, rprocs, "ready", 120.0, watch=rprocs)
        addrs = ",".join(format_address(hosts.bind_host(workers + k), ready[p]["port"]) for k, p in enumerate(rprocs))
        with tempfile.TemporaryDirectory(prefix="rs-nccl-bench-") as rdv:
            heads = []
            for i in range(workers):
                job = {
                    "rank": i,
                    "world": workers,
                    "rdv": rdv,
                    "reducers": addrs,
                    "total_bytes": size,
                    "call_bytes": call,
                    "passes": passes,
                    "ifname": ifname,
                    "extra_env": head_env,
                    "idle_sleep": idle_sleep,
                }
                env = {"PYTHONPATH": os.pathsep.join([ROOT, TESTS]), "OMP_NUM_THREADS": "1"}
                argv = [sys.executable, "-m", "benchmarks.bench_nccl_plugin", "--head", json.dumps(job)]
                heads.append(hosts.popen(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            results = []
            deadline = time.monotonic() + timeout
            for i, p in enumerate(heads):
                try:
                    out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired as exc:
                    for q in heads:
                        q.kill()
                    raise RuntimeError(f"plugin head {i} did not finish within {timeout:.0f} s") from exc
                line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
                if p.returncode != 0 or line is None:
                    raise RuntimeError(f"plugin head {i} failed (exit {p.returncode}):\n{err[-3000:]}")
                results.append(json.loads(line[len("RESULT ") :]))
        for p in rprocs:
            p.close_stdin()
        rdone = procs.wait_all(events, rprocs, "done", 30.0)
        reducer_cpu = sum(rdone[p]["cpu_s"] - ready[p]["cpu_s"] for p in rprocs)
        for r in results:
            r["reducer_cpu_s"] = reducer_cpu
        return results
    finally:
        for p in rprocs:
            p.kill()


bound_seconds = report.rs_bound_seconds  # the bytes one worker link carries at tbf's TCP payload rate


def plugin_row(results: list[dict[str, Any]], warmup: int, args: argparse.Namespace) -> dict[str, Any]:
    samples = [[t * 1e6 for t in r["times"][warmup:]] for r in results]
    row = report.make_row(
        "plugin",
        args.size,
        args.size // 4,
        "float32",
        "sum",
        args.workers,
        args.reducers,
        samples,
        sum(r["wrong"] for r in results),
        emulate_gbps=args.gbps,
        call_bytes=args.call,
        nulls=sum(r["nulls"] for r in results),
        test_max_ms=1e3 * max(r["test_max_s"] for r in results),
        test_gap_p99_ms=1e3 * max(r["test_gap_p99_s"] for r in results),
        head_cpu_ms=1e3 * sum(r["cpu_s"] for r in results) / len(results) / len(results[0]["times"]),
        reducer_cpu_ms=1e3 * results[0]["reducer_cpu_s"] / args.reducers / len(results[0]["times"]),
    )
    row["algo"] = "plugin"
    return row


def run_once(args: argparse.Namespace, hosts: Any) -> dict[str, Any]:
    head_env = {
        k: v for k, v in (("RS_WINDOW", args.window), ("RS_STREAMS", args.streams), ("RS_CHUNK_BYTES", args.chunk)) if v
    }
    reducer_env = {"RS_GROUP_SLOTS": args.group_slots} if args.group_slots else {}
    passes = args.warmup + args.iters
    load_before = os.getloadavg()[0]
    rows: dict[str, dict[str, Any]] = {}
    results = run_plugin(
        hosts,
        args.workers,
        args.reducers,
        args.size,
        args.call,
        passes,
        head_env,
        reducer_env,
        args.timeout,
        args.idle_sleep,
    )
    rows["plugin"] = plugin_row(results, args.warmup, args)
    cfg = options.BenchConfig(
        workers=args.workers,
        reducers=args.reducers,
        sizes=[args.size],
        iters=args.iters,
        warmup=args.warmup,
        emulate_gbps=args.gbps,
        progress=False,
    )
    for algo in args.baselines:
        rid = uuid.uuid4().hex[:8]
        got, err = runner.run_sizes(algo, cfg, hosts, rid)
        if err or not got:
            raise RuntimeError(f"{algo}: {err}")
        rows[algo] = got[0]
    load_after = os.getloadavg()[0]
    return {"rows": rows, "load": (load_before, load_after)}


def format_run(run: dict[str, Any], args: argparse.Namespace) -> str:
    bound = bound_seconds(args.size, args.workers, args.reducers, args.gbps)
    rows = run["rows"]
    lb, la = run["load"]
    prelim = max(lb, la) > LOAD_LIMIT
    lines = [
        f"# load average {lb:.2f} before, {la:.2f} after" + ("  ** PRELIMINARY (load > 2) **" if prelim else ""),
        f"# {'algo':<7} {'time(ms)':>9} {'%rs-bound':>10} {'ring/this':>10} {'#wrong':>7}",
    ]
    ring = rows.get("ring", {}).get("time_us")
    for algo, r in rows.items():
        t = r["time_us"]
        ratio = f"{ring / t:>9.2f}x" if ring else f"{'-':>10}"
        lines.append(f"  {algo:<7} {t / 1e3:>9.1f} {100 * bound / (t * 1e-6):>9.1f}% {ratio} {r['wrong']:>7}")
    p = rows["plugin"]
    lines.append(
        f"# plugin: {args.size // args.call} calls of {args.call} B per all-reduce, NULL requests "
        f"{p['nulls']}, slowest test() {p['test_max_ms']:.1f} ms, 99th percentile of the gaps between "
        f"test() calls {p['test_gap_p99_ms']:.1f} ms; CPU per all-reduce: {p['head_cpu_ms']:.0f} ms per head, "
        f"{p['reducer_cpu_ms']:.0f} ms per reducer"
    )
    return "\n".join(lines)


def run_loopback(args: argparse.Namespace) -> list[dict[str, Any]]:
    """--loopback: for each size, the plugin's stream and rs's Communicator on 127.0.0.1, in turn."""
    hosts = procs.LoopbackHosts()
    head_env = {
        k: v for k, v in (("RS_WINDOW", args.window), ("RS_STREAMS", args.streams), ("RS_CHUNK_BYTES", args.chunk)) if v
    }
    reducer_env = {"RS_GROUP_SLOTS": args.group_slots} if args.group_slots else {}
    out = []
    for size in args.sizes:
        one = argparse.Namespace(**dict(vars(args), size=size, call=min(args.call, size), gbps=None))
        results = run_plugin(
            hosts,
            args.workers,
            args.reducers,
            size,
            one.call,
            args.warmup + args.iters,
            head_env,
            reducer_env,
            args.timeout,
            args.idle_sleep,
            ifname="lo",
        )
        cfg = options.BenchConfig(
            workers=args.workers,
            reducers=args.reducers,
            sizes=[size],
            iters=args.iters,
            warmup=args.warmup,
            iters_bytes=0,
            warmup_bytes=0,
            progress=False,
        )
        got, err = runner.run_sizes("rs", cfg, hosts, uuid.uuid4().hex[:8])
        if err or not got:
            raise RuntimeError(f"rs at {size} B: {err}")
        row = {"size": size, "plugin": plugin_row(results, args.warmup, one), "rs": got[0]}
        print(format_loopback_row(row, args), flush=True)
        out.append(row)
    return out


def format_loopback_row(row: dict[str, Any], args: argparse.Namespace) -> str:
    """One size of --loopback: plugin and rs times, their ratio, the plugin path's CPU."""
    p, r = row["plugin"], row["rs"]
    calls = args.iters + args.warmup
    rs_worker_ms = 1e3 * r.get("worker_cpu_s", 0.0) / args.workers / calls
    rs_reducer_ms = 1e3 * r.get("reducer_cpu_s", 0.0) / args.reducers / calls
    return (
        f"  {row['size']:>10} {p['time_us'] / 1e3:>10.1f} {r['time_us'] / 1e3:>9.1f} "
        f"{p['time_us'] / r['time_us']:>10.2f}x {row['size'] / p['time_us'] / 1e3:>9.2f} "
        f"{row['size'] / r['time_us'] / 1e3:>8.2f} {p['head_cpu_ms']:>8.1f} {rs_worker_ms:>8.1f} "
        f"{p['reducer_cpu_ms']:>8.1f} {rs_reducer_ms:>8.1f} {p['wrong'] + r['wrong']:>6}"
    )


def loopback_main(args: argparse.Namespace) -> int:
    """--loopback: the plugin path vs the worker library on this machine's loopback."""
    lb = os.getloadavg()
    print(
        f"# NCCL plugin stream vs the worker library (rs), loopback, W={args.workers} heads/workers, "
        f"R={args.reducers} reducers, float32 sum, plugin calls of {args.call} B (up to 64 outstanding); "
        f"iters={args.iters} warmup={args.warmup}; {options.machine_description()}"
    )
    print(f"# load average before: {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}")
    print(
        "# CPU ms = CPU seconds per all-reduce (warm-up included) of one head / worker and of one reducer; "
        "GB/s = buffer bytes / time"
    )
    print(
        f"# {'bytes':>10} {'plugin ms':>10} {'rs ms':>9} {'plugin/rs':>11} {'plug GB/s':>9} {'rs GB/s':>8} "
        f"{'head CPU':>8} {'rs wkr':>8} {'plug red':>8} {'rs red':>8} {'wrong':>6}"
    )
    rows = run_loopback(args)
    la = os.getloadavg()[0]
    print(f"# load average after: {la:.2f}" + ("  ** PRELIMINARY (load > 2) **" if max(lb[0], la) > LOAD_LIMIT else ""))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"load": [lb[0], la], "rows": rows}, f, indent=1)
    return 1 if any(r["plugin"]["wrong"] or r["rs"]["wrong"] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", help=argparse.SUPPRESS)
    ap.add_argument("--gbps", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=None, help="heads (W; default 4, --loopback 2)")
    ap.add_argument("--reducers", type=int, default=None, help="reducers (R; default 4, --loopback 2)")
    ap.add_argument("--size", type=rs_config.parse_size, default=64 << 20, help="bytes per all-reduce (64M)")
    ap.add_argument("--call", type=rs_config.parse_size, default=256 << 10, help="bytes per iallreduce (256K)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="measure plugin and baselines this many times in turn")
    ap.add_argument("--baselines", default="ring,rs", help="comma list of ring, rs ('' for none)")
    ap.add_argument("--window", default=None, help="RS_WINDOW for the plugin heads (default: the plugin's)")
    ap.add_argument("--streams", default=None, help="RS_STREAMS for the plugin heads")
    ap.add_argument("--chunk", default=None, help="RS_CHUNK_BYTES for the plugin heads")
    ap.add_argument("--group-slots", default=None, help="RS_GROUP_SLOTS for the plugin's reducers")
    ap.add_argument(
        "--idle-sleep",
        type=float,
        default=2e-4,
        help="seconds a head pauses when a pass over its requests moved nothing",
    )
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--prefix", default="rsnp", help="network namespace prefix")
    ap.add_argument("--json", default=None, help="write every run's rows here")
    ap.add_argument("--loopback", action="store_true", help="plugin vs rs on 127.0.0.1 per size (no root)")
    ap.add_argument("--sizes", default="1M:256M:4", help="--loopback's sizes (bench syntax; default 1M:256M:4)")
    args = ap.parse_args(argv)
    if args.head:
        return _head_main(args.head)
    default_hosts = 2 if args.loopback else 4
    args.workers = args.workers or default_hosts
    args.reducers = args.reducers or default_hosts
    if args.loopback:
        args.sizes = options.parse_sizes(args.sizes)
        return loopback_main(args)
    args.baselines = [b for b in args.baselines.split(",") if b]
    reason = emulate.unavailable_reason()
    if reason:
        print(f"emulated hosts unavailable: {reason}", file=sys.stderr)
        return 2
    print(
        f"# NCCL plugin vs ring: {args.gbps:g} Gbit/s emulated hosts, W={args.workers} heads, R={args.reducers} "
        f"reducers, {args.size} B float32 sum as {args.call} B iallreduce calls (up to 64 outstanding); "
        f"iters={args.iters} warmup={args.warmup}; {options.machine_description()}"
    )
    print(
        f"# rs link bound = S x max(1, W/R) / ({report.TCP_PAYLOAD_FRACTION} x {args.gbps:g} Gbit/s) = "
        f"{1e3 * bound_seconds(args.size, args.workers, args.reducers, args.gbps):.1f} ms"
    )
    runs = []
    with emulate.EmulatedHosts(args.workers + args.reducers, args.gbps, prefix=args.prefix) as emu:
        hosts = procs.NamespaceHosts(emu)
        for k in range(args.repeat):
            run = run_once(args, hosts)
            runs.append(run)
            print(f"# run {k + 1}/{args.repeat}")
            print(format_run(run, args), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([{"load": r["load"], "rows": r["rows"]} for r in runs], f, indent=1)
    bad = [a for r in runs for a, row in r["rows"].items() if row["wrong"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
