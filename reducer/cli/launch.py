"""`reduction-server launch`: a whole job (reducers + workers) on this machine (see reducer/launch.py)."""

from __future__ import annotations

import argparse
import sys

from reducer.errors import ConfigError
from reducer.launch import launch


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "launch",
        help="run R reducers and W x L workers of COMMAND on this machine",
        usage="reduction-server launch --workers W [--reducers R] [--procs-per-worker L] [options] -- COMMAND ...",
        description="Starts R reducer processes and W x L worker processes of COMMAND on this machine, "
        "each with a Vertex-AI-shaped CLUSTER_SPEC (workerpool0 = node 0, workerpool1 = nodes "
        "1..W-1, workerpool2 = the reducers) plus LOCAL_RANK/LOCAL_WORLD_SIZE and, as Vertex AI "
        "sets them for PyTorch, RANK = node index, WORLD_SIZE = W, MASTER_ADDR/MASTER_PORT, so "
        "the same script runs unchanged here and on Vertex AI. Output lines are prefixed with "
        "[reducer i] / [worker node.local]. Exits with 0 when every worker succeeds, else the "
        "status of the first failed worker; a failure (or Ctrl-C / SIGTERM) stops everything.",
        epilog="example: reduction-server launch --workers 2 --reducers 2 -- python examples/allreduce_numpy.py",
    )
    p.add_argument("--workers", type=int, required=True, metavar="W", help="worker nodes")
    p.add_argument("--reducers", type=int, default=1, metavar="R", help="reducer processes (default %(default)s)")
    p.add_argument(
        "--procs-per-worker",
        type=int,
        default=1,
        metavar="L",
        help="processes per worker node, like torchrun --nproc-per-node (default %(default)s)",
    )
    p.add_argument(
        "--base-port",
        type=int,
        default=None,
        metavar="P",
        help="reducers use ports P..P+R-1 and worker nodes P+R..P+R+W-1 (default: free ports)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address everything binds and connects to (default %(default)s)")
    p.add_argument(
        "--reducer-threads",
        type=int,
        default=1,
        metavar="T",
        help="event-loop threads per reducer; 0 = one per CPU (default %(default)s)",
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when stopping processes (default %(default)s)",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to wait for the reducers to listen (default %(default)s)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the worker command (a leading script.py runs with this Python)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return launch(
            args.command,
            workers=args.workers,
            reducers=args.reducers,
            procs_per_worker=args.procs_per_worker,
            base_port=args.base_port,
            host=args.host,
            reducer_threads=args.reducer_threads or None,
            grace_period=args.grace_period,
            ready_timeout=args.ready_timeout,
            log_level=getattr(args, "log_level", None),
        )
    except ConfigError as exc:
        print(f"reduction-server launch: error: {exc}", file=sys.stderr)
        return 2
