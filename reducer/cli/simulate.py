"""`reduction-server simulate`: predicted all-reduce times of rs and the ring on SimGrid."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from reducer.errors import ConfigError

PROG = "reduction-server simulate"


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="predict all-reduce times of large jobs (rs and the ring) on the SimGrid simulator",
        description="Simulates one all-reduce per size with rs (W workers, R reducers) and the ring over "
        "per-host links (or a fat tree) on SimGrid's flow-level TCP model, with this project's "
        "shards, chunks, windows and group slots (docs/performance.md, 'Simulated jobs'). Needs "
        "SimGrid: apt-get install python3-simgrid, or pip install 'reduction-server[sim]'.",
    )
    p.error = _fail  # type: ignore[method-assign]  # one line, exit 2
    p.add_argument("--workers", type=int, default=None, help="workers W (required, except with --vertex)")
    p.add_argument("--reducers", type=int, default=None, help="reducers R (default W)")
    p.add_argument(
        "--gbps", type=float, default=None, help="line rate of a worker's link, Gbit/s (required, except with --vertex)"
    )
    p.add_argument("--reducer-gbps", type=float, default=None, help="line rate of a reducer's link (default --gbps)")
    p.add_argument("--sizes", default="64M", help="sizes like the bench: 4M,16M or 1M:256M (default 64M)")
    p.add_argument("--algos", default="rs,ring", help="rs,ring (default both)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as a JSON list")
    net = p.add_argument_group("network model")
    net.add_argument("--latency-us", type=float, default=100.0, help="round trip between two hosts (default 100)")
    net.add_argument("--efficiency", type=float, default=0.956, help="TCP payload / line rate (default 0.956)")
    net.add_argument(
        "--topology", choices=("star", "fat-tree"), default="star", help="per-host links (star) or a fat tree"
    )
    net.add_argument("--leaf", type=int, default=16, help="fat tree: hosts per leaf switch (default 16)")
    net.add_argument("--uplinks", type=int, default=16, help="fat tree: spine links per leaf (default 16)")
    net.add_argument(
        "--queue-ms",
        default="20",
        help="a port's queue in ms of its rate, for incast losses ('none': no losses; default 20, the emulation's)",
    )
    net.add_argument(
        "--queue-burst",
        default="256K",
        help="bytes a port queues beyond --queue-ms (default 256K, the emulation's tbf bucket; 0 for a switch)",
    )
    net.add_argument("--rto-ms", type=float, default=200.0, help="retransmission timeout after a loss (default 200)")
    knobs = p.add_argument_group("pipeline (default: the code's defaults)")
    knobs.add_argument("--chunk-bytes", default=None, help="RS_CHUNK_BYTES")
    knobs.add_argument("--window", type=int, default=None, help="RS_WINDOW")
    knobs.add_argument("--group-slots", type=int, default=None, help="RS_GROUP_SLOTS")
    knobs.add_argument("--reducer-threads", type=int, default=8, help="reducer threads (default 8)")
    knobs.add_argument("--reducer-core-gbps", type=float, default=None, help="Gbit/s one reducer thread sums")
    knobs.add_argument(
        "--worker-frame-us",
        type=float,
        default=0.0,
        help="CPU a worker spends per frame sent or received, us (a chunk and its result: two); caps a worker "
        "at chunk / (2 x this) each way (default 0: not modelled; this project's loopback: about 5)",
    )
    vx = p.add_argument_group("Vertex AI predictions")
    vx.add_argument(
        "--vertex",
        action="store_true",
        help="instead: predict W=64-1,024 on Vertex worker types with the planner's reducer pools (one size)",
    )
    vx.add_argument("--plot", default=None, metavar="FILE.png", help="with --vertex: speed-up vs W (matplotlib)")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> Any:
    from reducer import config  # noqa: PLC0415 (the simulator and SimGrid load only when this command runs)
    from reducer.deploy.planner import REDUCER_CORE_GBPS  # noqa: PLC0415 (the simulator and SimGrid load only when this command runs)
    from reducer.simulate import Network, Reducers, Settings  # noqa: PLC0415 (the simulator and SimGrid load only when this command runs)

    queue = None if str(args.queue_ms).strip().lower() in ("none", "off") else float(args.queue_ms) / 1e3
    net = Network(
        1.0 if args.gbps is None else args.gbps,  # --vertex: each machine type's own rate
        args.reducer_gbps,
        latency=args.latency_us * 1e-6,
        efficiency=args.efficiency,
        topology=args.topology,
        leaf=args.leaf,
        uplinks=args.uplinks,
        queue_s=queue,
        queue_burst=config.parse_size(args.queue_burst),
        rto=args.rto_ms / 1e3,
    )
    chunk = config.parse_size(args.chunk_bytes) if args.chunk_bytes else None
    knobs = Settings(chunk_bytes=chunk, window=args.window, group_slots=args.group_slots)
    cpu = Reducers(
        args.reducer_threads, args.reducer_core_gbps or REDUCER_CORE_GBPS, worker_frame_us=args.worker_frame_us
    )
    for name, v in (
        ("--latency-us", args.latency_us),
        ("--rto-ms", args.rto_ms),
        ("--worker-frame-us", args.worker_frame_us),
    ):
        if v < 0:
            raise ConfigError(f"{name} must be >= 0")
    if not 0 < args.efficiency <= 1:
        raise ConfigError("--efficiency must be in (0, 1]")
    if args.reducer_threads < 1 or args.leaf < 1 or args.uplinks < 1:
        raise ConfigError("--reducer-threads, --leaf and --uplinks must be >= 1")
    if knobs.window is not None and knobs.window < 1 or knobs.group_slots is not None and knobs.group_slots < 1:
        raise ConfigError("--window and --group-slots must be >= 1")
    return net, cpu, knobs


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'algo':<5} {'size':>10} {'W':>5} {'R':>5} {'time ms':>11} {'% bound':>8} {'rs/ring':>8}")
    for r in rows:
        ratio = f"{r['speedup']:.2f}x" if "speedup" in r else ""
        print(
            f"{r['algo']:<5} {r['bytes']:>10} {r['workers']:>5} {r['reducers'] or '':>5} "
            f"{r['seconds'] * 1e3:>11.3f} {r['pct_of_bound']:>7.1f}% {ratio:>8}"
        )


def _vertex(args: argparse.Namespace, size: int) -> list[dict[str, Any]]:
    from reducer.simulate.vertex import sweep  # noqa: PLC0415 (the simulator and SimGrid load only when this command runs)

    rows = sweep(size, worker_frame_us=args.worker_frame_us)
    print(f"{'workers':<28} {'reducers':<24} {'W':>5} {'R':>5} {'rs ms':>9} {'ring ms':>9} {'speed-up':>9}")
    for r in rows:
        print(
            f"{r['worker']:<28} {r['reducer']:<24} {r['workers']:>5} {r['reducers']:>5} "
            f"{r['rs_seconds'] * 1e3:>9.2f} {r['ring_seconds'] * 1e3:>9.2f} {r['speedup']:>8.2f}x"
        )
    if args.plot:
        from reducer.simulate.plot import plot_speedup  # noqa: PLC0415 (the simulator and SimGrid load only when this command runs)

        plot_speedup(rows, args.plot, f"simulated all-reduce of {size >> 20} MiB: ring time / rs time")
        print(f"plot: {args.plot}")
    return rows


def run(args: argparse.Namespace) -> int:
    from reducer.bench.options import parse_sizes  # noqa: PLC0415 (the simulator and SimGrid load only when this command runs)
    from reducer.simulate import simulate  # noqa: PLC0415 (the simulator and SimGrid load only when this command runs)

    try:
        sizes = parse_sizes(args.sizes)
        if not args.vertex and (args.workers is None or args.gbps is None):
            raise ConfigError("--workers and --gbps are required (or --vertex)")
        net, cpu, knobs = _settings(args)
        if args.vertex:
            if len(sizes) != 1:
                raise ConfigError("--vertex predicts one size: give --sizes with one value")
            rows = _vertex(args, sizes[0])
        else:
            if args.plot:
                raise ConfigError("--plot goes with --vertex")
            algos = [a.strip() for a in args.algos.split(",") if a.strip()]
            reducers = args.workers if args.reducers is None else args.reducers
            rows = simulate(args.workers, reducers, sizes, net, algos, cpu, knobs)
            _print(rows)
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(rows, fh, indent=1)
        except OSError as exc:
            _fail(f"cannot write {args.json}: {exc.strerror}")
    return 0
