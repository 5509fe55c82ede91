"""`reduction-server plan`: how many reducers the workers' bandwidth needs."""

from __future__ import annotations

import argparse
import math
import sys

from reducer.config import parse_size
from reducer.deploy.bandwidth import worker_bandwidth
from reducer.deploy.planner import (
    DEFAULT_REDUCER_MACHINE,
    REDUCER_CORE_GBPS,
    REDUCER_DEFAULT_MAX_THREADS,
    format_machine_table,
    format_plan,
    format_prediction,
    plan_reducers,
)
from reducer.errors import ConfigError


def add_reducer_cpu_args(p: argparse._ActionsContainer) -> None:
    """--reducer-core-gbps / --reducer-threads: the CPU side of a reducer's bandwidth."""
    p.add_argument(
        "--reducer-core-gbps",
        type=float,
        default=None,
        help=f"Gbit/s of worker data one reducer thread sums (default {REDUCER_CORE_GBPS:g}, "
        "measured by benchmarks/bench_reducer_cpu.py; see docs/performance.md)",
    )
    p.add_argument(
        "--reducer-threads",
        type=int,
        default=None,
        help=f"reducer threads (default: the reducer's own, min(vCPUs, {REDUCER_DEFAULT_MAX_THREADS}), "
        "for a machine of the table)",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "plan",
        help="size the reducer pool from the workers' network bandwidth",
        description="Prints how many reducers are needed so that their total bandwidth is at least "
        "the workers' total bandwidth: ceil(workers * worker_gbps / reducer_gbps), where "
        "one reducer's bandwidth is the slower of its NIC (egress cap) and its cores "
        "(threads x --reducer-core-gbps); then the machine types the planner knows.",
    )
    p.add_argument("--workers", type=int, required=True, help="number of worker machines (nodes)")
    p.add_argument(
        "--worker-gbps",
        type=float,
        default=None,
        help="network bandwidth of one worker machine, Gbps (a2-highgpu-8g: 100; default: looked up "
        "from --machine-type, as vertex-job does)",
    )
    p.add_argument("--machine-type", default=None, help="worker machine type, e.g. a2-highgpu-8g, n1-highmem-96")
    p.add_argument(
        "--accelerator-type", default=None, help="worker GPU type, e.g. NVIDIA_TESLA_V100 (with --machine-type)"
    )
    p.add_argument("--accelerator-count", type=int, default=1, help="GPUs per worker (default 1)")
    group = p.add_argument_group(f"reducer bandwidth (default: {DEFAULT_REDUCER_MACHINE})")
    group.add_argument(
        "--reducer-machine",
        default=None,
        help=f"reducer machine type from the table (default {DEFAULT_REDUCER_MACHINE})",
    )
    group.add_argument(
        "--reducer-gbps", type=float, default=None, help="egress bandwidth of one reducer, Gbps (overrides the table)"
    )
    group.add_argument(
        "--tier1", action="store_true", help="reducers use per-VM Tier_1 networking (N2 with >= 30 vCPUs)"
    )
    add_reducer_cpu_args(group)
    p.add_argument(
        "--predict-size",
        default="64M",
        help="simulate one all-reduce of this size on the recommended pool against the ring (default 64M; "
        "'0' skips it; needs SimGrid, see `reduction-server simulate`)",
    )
    p.set_defaults(func=run)


def _worker_gbps(args: argparse.Namespace) -> float:
    """--worker-gbps, else the bandwidth of --machine-type (ConfigError naming the flags)."""
    for flag, value in (
        ("--worker-gbps", args.worker_gbps),
        ("--reducer-gbps", args.reducer_gbps),
        ("--reducer-core-gbps", args.reducer_core_gbps),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag}={value:g} must be a positive number of Gbit/s")
    for flag, count in (("--workers", args.workers), ("--reducer-threads", args.reducer_threads)):
        if count is not None and count < 1:
            raise ConfigError(f"{flag}={count} must be at least 1")
    if args.worker_gbps is not None:
        return float(args.worker_gbps)
    if args.machine_type is None:
        raise ConfigError("give --worker-gbps or --machine-type (the workers' network bandwidth)")
    bandwidth = worker_bandwidth(args.machine_type, args.accelerator_type, args.accelerator_count)
    print(f"worker bandwidth: {bandwidth.reason}")
    return bandwidth.gbps


def run(args: argparse.Namespace) -> int:
    try:
        predict = parse_size(args.predict_size)
        plan = plan_reducers(
            args.workers,
            _worker_gbps(args),
            reducer_machine=args.reducer_machine,
            reducer_gbps=args.reducer_gbps,
            tier1=args.tier1,
            core_gbps=args.reducer_core_gbps,
            reducer_threads=args.reducer_threads,
        )
    except ConfigError as exc:
        print(f"reduction-server plan: error: {exc}", file=sys.stderr)
        return 2
    print(format_plan(plan))
    if predict:
        print(format_prediction(plan, predict))
    print()
    print("known reducer machine types (per-VM egress caps):")
    print(format_machine_table())
    return 0
