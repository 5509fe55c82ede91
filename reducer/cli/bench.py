"""`reduction-server bench`: argument parsing only (the benchmark lives in reducer.bench)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeVar

from reducer.bench import BenchConfig, BenchError, parse_sizes
from reducer.bench import run as run_bench
from reducer.bench.congestion import parse_congestion
from reducer.bench.models import MODELS
from reducer.bench.poller import DEFAULT_INTERVAL_S
from reducer.config import COMPRESSION_NAMES, parse_size
from reducer.dtypes import OPS, SUPPORTED
from reducer.errors import ConfigError

T = TypeVar("T")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", "-w", type=int, default=4, help="worker processes (ranks) (default 4)")
    p.add_argument("--reducers", "-r", type=int, default=4, help="reducer processes for rs (default 4)")
    p.add_argument(
        "--sizes",
        default="4K:256M",
        help="buffer sizes in bytes: MIN:MAX doubling (MIN:MAX:FACTOR), or a list 4K,64K,1M (default 4K:256M)",
    )
    p.add_argument("--dtype", default="float32", choices=SUPPORTED)
    p.add_argument("--op", default="sum", choices=OPS)
    p.add_argument("--iters", type=int, default=10, help="timed iterations per size (default 10)")
    p.add_argument(
        "--iters-bytes",
        default="4M",
        help="and at least this many bytes of timed all-reduces per size, at most 200 iterations: "
        "small rounds vary by 30-60%% from one iteration to the next, so their median needs more "
        "samples (default 4M: 64 at 64 KiB, 16 at 256 KiB; 0: --iters alone)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default 3)")
    p.add_argument(
        "--warmup-bytes",
        default="32M",
        help="and at least this many bytes of untimed all-reduces per size, at most 1000 iterations: "
        "small sizes need hundreds of rounds before new TCP connections are warm (default 32M; "
        "0: --warmup alone)",
    )
    p.add_argument(
        "--algos",
        default=None,
        help="comma list of rs, ring, gloo, gloo-bf16 (with --model: rs, rs+bf16, ring, gloo) "
        "(default: rs, ring, gloo, and gloo-bf16 with --compression; gloo and, with --model, rs and "
        "rs+bf16 need torch)",
    )
    p.add_argument(
        "--compression",
        default=None,
        choices=COMPRESSION_NAMES,
        help="rs sends the float32 buffer as bfloat16 / float16 on the wire (converted chunk by chunk "
        "in the transport); gloo-bf16 is its baseline: gloo all-reducing a bfloat16 copy",
    )
    _add_model_arguments(p)
    p.add_argument(
        "--emulate-gbps",
        type=float,
        default=None,
        metavar="B",
        help="run every worker and reducer in its own network namespace with a B Gbit/s "
        "full-duplex link (needs root and iproute2)",
    )
    for flag, what in (
        ("--emulate-delay-ms", "one-way delay added to every path between emulated hosts, ms"),
        ("--emulate-jitter-ms", "+- this much (uniform) on that delay, ms, at most the delay; no reordering"),
        ("--emulate-loss", "fraction of packets dropped on every path, in [0, 1)"),
    ):
        p.add_argument(flag, type=float, default=0.0, metavar="X", help=what + " (needs --emulate-gbps)")
    p.add_argument(
        "--congestion",
        default=None,
        metavar="NAME[,NAME]",
        help="TCP congestion control, e.g. cubic, bbr, or 'default' (the kernel's); a comma list runs "
        "every algorithm once per name (an A/B in one run). With --emulate-gbps it applies to every "
        "connection of the emulated hosts (gloo's too), else to rs's and the ring's sockets "
        "(RS_TCP_CONGESTION) (default: leave it alone)",
    )
    _add_control_plane_arguments(p)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE", help="write the rows as JSON")
    p.add_argument(
        "--plot",
        dest="plot_path",
        default=None,
        metavar="FILE.png",
        help="write algbw vs size (log-log), with --model step times as bars, as an image (needs matplotlib)",
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds without progress before an all-reduce fails (default 60)"
    )
    p.add_argument(
        "--ring-chunk-bytes",
        default=None,
        help="pipeline chunk of the ring (default: RS_CHUNK_BYTES, the largest chunk rs uses)",
    )
    p.add_argument("--netns-prefix", default="rsb", help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model and its options: one DDP training step's buckets instead of --sizes."""
    m = p.add_argument_group("training step (--model): one step's gradient traffic as PyTorch DDP produces it")
    m.add_argument(
        "--model",
        default=None,
        choices=list(MODELS),
        help="replay one training step of this model (its DDP buckets) instead of --sizes",
    )
    m.add_argument(
        "--bucket-cap-mb",
        default="25",
        help="DDP bucket_cap_mb, MiB; a comma list measures each (e.g. 25,64) (default 25)",
    )
    m.add_argument(
        "--first-bucket-mb",
        type=float,
        default=1.0,
        help="DDP's first_bucket_bytes_cap in MiB (torch's default 1 MiB) (default 1)",
    )
    m.add_argument(
        "--compute-ms",
        default="0",
        help="backward time in ms over which the buckets are released (in proportion to their "
        "size); a comma list measures each; 'gloo' = gloo's communication time measured in "
        "this run (e.g. 0,gloo) (default 0)",
    )
    m.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink every tensor and bucket limit by this factor (0 < S <= 1; for tests)",
    )


def _add_control_plane_arguments(p: argparse.ArgumentParser) -> None:
    """--control-plane and its options: the reducers also serve gRPC and /metrics while polled."""
    c = p.add_argument_group("control plane (docs/operations.md): does serving it cost the data path anything?")
    c.add_argument(
        "--control-plane",
        default="off",
        choices=("off", "on", "ab"),
        help="on: the rs reducers also serve the gRPC control plane and Prometheus /metrics, polled "
        "(GetStats + a scrape of every reducer) every --poll-interval-ms while they run; ab: rs "
        "measured both ways in one run, off (rs) and on (rs+cp) in alternating passes A B B A, "
        "with a table of on/off per size (default off)",
    )
    c.add_argument(
        "--poll-interval-ms",
        type=float,
        default=1e3 * DEFAULT_INTERVAL_S,
        help="ms between the poller's rounds of requests; Prometheus scrapes every 15-60 s: the "
        "default is pessimistic on purpose (default %(default)g)",
    )
    c.add_argument(
        "--ab-passes",
        type=int,
        default=2,
        help="with --control-plane ab: passes of each variant over all sizes (default 2: A B B A)",
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark rs vs ring vs gloo all-reduce (nccl-tests-style tables, or DDP training steps)",
        description="Benchmark this project's reduction server (rs) against a ring all-reduce over the same "
        "transport (ring) and torch.distributed's gloo, in the same run on the same hosts. "
        "See docs/performance.md.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def size_flag(flag: str, text: str, parse: Callable[[str], T]) -> T:
    """parse(text), or a ConfigError that names the flag and says what a size looks like."""
    try:
        return parse(text)
    except (ConfigError, ValueError) as exc:
        why = str(exc)
        if "convert" in why or "invalid literal" in why:  # float() / int() of a word: say it plainly
            why = "not a size"
        raise ConfigError(
            f"bad {flag} {text!r}: {why} (sizes are bytes with an optional K, M or G suffix, e.g. 4K, 64M, 1G)"
        ) from None


def config_from_args(args: argparse.Namespace):
    try:
        caps = [float(c) for c in args.bucket_cap_mb.split(",") if c.strip()]
    except ValueError:
        raise ConfigError(f"bad --bucket-cap-mb {args.bucket_cap_mb!r}: MiB, or a comma list") from None
    return BenchConfig(
        workers=args.workers,
        reducers=args.reducers,
        sizes=size_flag("--sizes", args.sizes, parse_sizes),
        dtype=args.dtype,
        op=args.op,
        iters=args.iters,
        iters_bytes=size_flag("--iters-bytes", args.iters_bytes, parse_size),
        warmup=args.warmup,
        warmup_bytes=size_flag("--warmup-bytes", args.warmup_bytes, parse_size),
        algos=[a.strip() for a in args.algos.split(",") if a.strip()] if args.algos else None,
        emulate_gbps=args.emulate_gbps,
        emulate_delay_ms=args.emulate_delay_ms,
        emulate_jitter_ms=args.emulate_jitter_ms,
        emulate_loss=args.emulate_loss,
        json_path=args.json_path,
        plot_path=args.plot_path,
        timeout=args.timeout,
        chunk_bytes=size_flag("--ring-chunk-bytes", args.ring_chunk_bytes, parse_size)
        if args.ring_chunk_bytes
        else None,
        netns_prefix=args.netns_prefix,
        compression=args.compression,
        progress=not args.no_progress and sys.stderr.isatty(),
        model=args.model,
        bucket_cap_mb=caps,
        first_bucket_mb=args.first_bucket_mb,
        compute_ms=args.compute_ms,
        scale=args.scale,
        congestion=parse_congestion(args.congestion) if args.congestion else None,
        control_plane=args.control_plane,
        poll_interval=args.poll_interval_ms / 1e3,
        ab_passes=args.ab_passes,
    )


def run(args: argparse.Namespace) -> int:
    try:
        run_bench(config_from_args(args))
    except ConfigError as exc:
        print(f"reduction-server bench: error: {exc}", file=sys.stderr)
        return 2
    except BenchError as exc:
        print(f"reduction-server bench: {exc}", file=sys.stderr)
        return 1
    return 0
