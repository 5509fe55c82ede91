"""The GPU check's benchmark phase (``python -m reducer.gpucheck --bench``, ``scripts/gpu-check.sh
--bench``): NCCL all-reduce at full speed through three nets, two NCCL hosts on one GPU over
loopback, each variant a phase of its own (reducer.gpucheck.phases: reducers and two worker
processes started by the library's launcher, the worker's ``bench`` task):

- ``collnet``     the plugin loaded, NCCL_COLLNET_ENABLE=1, --bench-reducers reducers: CollNet;
- ``socket``      NCCL alone (NCCL_NET_PLUGIN=none, NCCL_NET=Socket, CollNet off);
- ``plugin-p2p``  the plugin loaded, CollNet off: NCCL's ring over the plugin's p2p net.

Each size (float32 sum) is timed as the first call, then warm-up calls, then timed calls between
CUDA events; a row is the slowest rank's median (reducer.gpucheck.bench_report). Before the
phases, two CPU probes on this machine (the limits the verdict compares against): one loopback
TCP stream's rate and the reducer's float32 sum kernel on one core.
"""

from __future__ import annotations

import argparse
import logging
import socket
import threading
import time
from typing import Any

import numpy as np

from reducer import _core

from . import bench_report as B
from . import verdict as V

log = logging.getLogger("reducer.gpucheck")

PROBE_BYTES = 256 * B.MiB
SUM_PROBE_BYTES = 64 * B.MiB


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("benchmark (--bench; docs/nccl-plugin.md, 'GPU benchmark')")
    g.add_argument(
        "--bench",
        action="store_true",
        help="run the benchmark phases (CollNet vs Socket vs the plugin's p2p net) instead of the checks",
    )
    g.add_argument(
        "--bench-sizes",
        default=",".join(map(str, B.DEFAULT_SIZES)),
        help="comma-separated byte sizes (default 1 MiB-1 GiB, powers of 4)",
    )
    g.add_argument("--bench-iters", type=int, default=20, help="timed calls per size, at most (default %(default)s)")
    g.add_argument("--bench-warmup", type=int, default=5, help="warm-up calls per size, at most (default %(default)s)")
    g.add_argument(
        "--bench-bytes",
        type=int,
        default=2 << 30,
        help="about this many bytes of timed calls per size (at least 3 calls; default %(default)s)",
    )
    g.add_argument("--bench-reducers", type=int, default=2, help="reducers of the collnet variant (default 2)")
    g.add_argument(
        "--bench-reducer-threads",
        type=int,
        default=4,
        help="event-loop threads per reducer (0: the reducer's default; default %(default)s)",
    )
    g.add_argument(
        "--bench-phase-limit",
        type=float,
        default=150.0,
        help="seconds per variant, start-up and teardown included (default %(default)s)",
    )
    g.add_argument(
        "--bench-variants", default=",".join(B.VARIANTS), help=f"a subset of {','.join(B.VARIANTS)}, in this order"
    )
    g.add_argument("--worker-device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)


def parse_sizes(text: str) -> list[int]:
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if not sizes or any(s < 4 for s in sizes):
        raise ValueError(f"--bench-sizes: positive byte sizes of at least 4 expected, found {text!r}")
    return sizes


def loopback_rate(nbytes: int = PROBE_BYTES, timeout: float = 30.0) -> float | None:
    """Bytes per second of one TCP stream over 127.0.0.1 (sender on a thread); None on failure."""
    chunk = bytes(B.MiB)
    try:
        with socket.create_server(("127.0.0.1", 0)) as srv:
            srv.settimeout(timeout)
            port = srv.getsockname()[1]

            def send() -> None:
                with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
                    for _ in range(nbytes // len(chunk)):
                        c.sendall(chunk)

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(timeout)
                buf = bytearray(len(chunk))
                view, got, t0 = memoryview(buf), 0, time.perf_counter()
                while got < (nbytes // len(chunk)) * len(chunk):
                    n = conn.recv_into(view)
                    if not n:
                        break
                    got += n
                seconds = time.perf_counter() - t0
            sender.join(timeout)
    except OSError as exc:
        log.warning("loopback probe failed: %s", exc)
        return None
    return got / seconds if seconds > 0 and got else None


def sum_rate(nbytes: int = SUM_PROBE_BYTES, repeat: int = 3) -> float | None:
    """Bytes of float32 input per second the reducer's sum kernel adds (acc += x) on one core,
    best of `repeat`."""
    acc = np.ones(nbytes // 4, dtype=np.float32)
    x = np.ones_like(acc)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        _core.kernels_accumulate("float32", "sum", acc, x)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best if best > 0 else None


def variants(plan: Any, args: argparse.Namespace) -> list[tuple[str, dict[str, str], int]]:
    """(name, environment, reducers) of each variant asked for, in --bench-variants' order."""
    table = {
        "collnet": (dict(plan.plugin_env, NCCL_COLLNET_ENABLE="1"), args.bench_reducers),
        "socket": (dict(plan.plain_env, NCCL_NET="Socket"), 1),
        "plugin-p2p": (dict(plan.plugin_env, NCCL_COLLNET_ENABLE="0"), 1),
    }
    names = [v.strip() for v in args.bench_variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in table]
    if unknown:
        raise ValueError(f"--bench-variants: unknown {', '.join(unknown)} (known: {', '.join(B.VARIANTS)})")
    return [(v, *table[v]) for v in names]


def worker_args(args: argparse.Namespace, sizes: list[int]) -> list[str]:
    return [
        "--sizes",
        ",".join(map(str, sizes)),
        "--iters",
        str(args.bench_iters),
        "--warmup",
        str(args.bench_warmup),
        "--iters-bytes",
        str(args.bench_bytes),
        "--device",
        args.worker_device,
    ]


def run_bench(plan: Any, args: argparse.Namespace, environment: dict[str, Any]) -> dict[str, Any]:
    """Every variant as a phase of `plan` (main.Plan), then the rows, limits and verdict: the
    GPU check's summary with a "bench" part."""
    sizes = parse_sizes(args.bench_sizes)
    probes = {"loopback_Bps": loopback_rate(), "sum_Bps": sum_rate()}
    log.info("CPU probes: %s", {k: None if v is None else f"{v / 1e9:.2f} GB/s" for k, v in probes.items()})
    threads = args.bench_reducer_threads or None
    rows: list[dict[str, Any]] = []
    checks = []
    collnet_stats: list[dict[str, int]] = []
    for name, env, reducers in variants(plan, args):
        res = plan.run(
            f"bench-{name}", "bench", env, reducers, args.bench_phase_limit, worker_args(args, sizes), threads
        )
        collnet_stats = res.reducer_stats if name == "collnet" else collnet_stats
        got = B.variant_rows(name, res.results, res.logs[0] if res.logs else None)
        rows += got
        measured = [r for r in got if "seconds" in r]
        ok = bool(measured) and res.status == 0 and not any(r["wrong"] for r in measured)
        detail = f"{len(measured)} of {len(sizes)} sizes measured, exit status {res.status}"
        checks.append(V.Check(f"bench_{name}", ok, detail + (f" ({res.error})" if res.error else "")))
    limit_texts = B.limits(rows, probes, args.bench_reducers, reducer_stats=collnet_stats)
    verdict = B.target(rows, limit_texts)
    summary = V.summarize(checks, environment, {n: r.summary() for n, r in plan.phases.items()})
    summary["bench"] = {
        "rows": rows,
        "probes": probes,
        "collnet_call_bytes": B.call_bytes(collnet_stats),
        "settings": {
            "sizes": sizes,
            "iters": args.bench_iters,
            "warmup": args.bench_warmup,
            "iters_bytes": args.bench_bytes,
            "reducers": args.bench_reducers,
            "reducer_threads": threads,
        },
        "first_call": B.first_call_note(rows),
        "limits": limit_texts,
        "target": {"met": verdict["met"], "ratios": {str(k): v for k, v in verdict["ratios"].items()}},
        "verdict": verdict["line"],
    }
    return summary


def report_text(summary: dict[str, Any]) -> str:
    """The table and the notes printed before the JSON summary."""
    bench = summary.get("bench")
    if not bench:
        return ""
    lines = [B.format_table(bench["rows"]), f"# {bench['first_call']}"]
    lines += [f"# limit: {t}" for t in bench["limits"]]
    return "\n".join(lines)
