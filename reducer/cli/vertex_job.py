"""`reduction-server vertex-job`: write a Vertex AI CustomJob spec with a reducer pool."""

from __future__ import annotations

import argparse
import shlex
import sys

from reducer.cli.plan import add_reducer_cpu_args
from reducer.deploy.planner import DEFAULT_REDUCER_MACHINE
from reducer.deploy.vertex import build_custom_job, gcloud_command, render_spec
from reducer.errors import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "vertex-job",
        help="write a Vertex AI CustomJob spec (workers + reducer pool) for gcloud",
        description="Writes a CustomJobSpec for `gcloud ai custom-jobs create --config FILE`: "
        "pool 0 = the primary worker, pool 1 = the other workers, pool 2 = the "
        "reducers (sized by the planner unless --reducers is given).",
    )
    p.add_argument("--workers", type=int, required=True, help="number of worker machines, the primary included")
    p.add_argument("--machine-type", required=True, help="worker machine type, e.g. a2-highgpu-8g")
    p.add_argument(
        "--accelerator-type", default=None, help="worker GPU type, e.g. NVIDIA_TESLA_A100 (omit for CPU-only workers)"
    )
    p.add_argument("--accelerator-count", type=int, default=1, help="GPUs per worker (default 1)")
    p.add_argument("--image", required=True, help="worker container image URI")
    p.add_argument("--reducer-image", required=True, help="reducer container image URI")
    p.add_argument("--reducers", type=int, default=None, help="number of reducers (default: from the planner)")
    p.add_argument(
        "--reducer-machine",
        default=DEFAULT_REDUCER_MACHINE,
        help=f"reducer machine type (default {DEFAULT_REDUCER_MACHINE})",
    )
    p.add_argument(
        "--reducer-gbps",
        type=float,
        default=None,
        help="egress of one reducer, Gbps (default: the planner's table; needed for reducer machines it does not know)",
    )
    p.add_argument(
        "--worker-gbps",
        type=float,
        default=None,
        help="worker network bandwidth, Gbps (default: looked up from --machine-type, "
        "--accelerator-type and --accelerator-count; unknown combinations need it)",
    )
    add_reducer_cpu_args(p)
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable of every container, workers and reducers (repeatable), e.g. "
        "--env RS_AUTH_TOKEN=... (better: a secret mounted as a file and --env RS_AUTH_TOKEN_FILE=PATH)",
    )
    p.add_argument("--format", choices=("yaml", "json"), default="yaml", help="output format")
    p.add_argument("--output", "-o", default=None, help="file to write (default: stdout)")
    p.add_argument("--display-name", default="reduction-server-job", help="job name used in the printed gcloud command")
    p.add_argument(
        "--args",
        nargs=argparse.REMAINDER,
        default=None,
        metavar="ARG",
        help="container args of the workers: everything after --args",
    )
    p.set_defaults(func=run)


def _command_line(args: argparse.Namespace) -> str:
    """The canonical command that reproduces this spec (for the YAML header)."""
    words = ["reduction-server", "vertex-job", "--workers", str(args.workers), "--machine-type", args.machine_type]
    if args.accelerator_type:
        words += ["--accelerator-type", args.accelerator_type, "--accelerator-count", str(args.accelerator_count)]
    words += ["--image", args.image, "--reducer-image", args.reducer_image]
    if args.reducers is not None:
        words += ["--reducers", str(args.reducers)]
    if args.reducer_machine != DEFAULT_REDUCER_MACHINE:
        words += ["--reducer-machine", args.reducer_machine]
    if args.reducer_gbps is not None:
        words += ["--reducer-gbps", f"{args.reducer_gbps:g}"]
    if args.worker_gbps is not None:
        words += ["--worker-gbps", f"{args.worker_gbps:g}"]
    if args.reducer_core_gbps is not None:
        words += ["--reducer-core-gbps", f"{args.reducer_core_gbps:g}"]
    if args.reducer_threads is not None:
        words += ["--reducer-threads", str(args.reducer_threads)]
    for item in args.env:
        words += ["--env", item]
    if args.format != "yaml":
        words += ["--format", args.format]
    if args.output:
        words += ["--output", args.output]
    if args.args:
        words += ["--args"] + list(args.args)
    return " ".join(shlex.quote(w) for w in words)


def _env(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--env {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def run(args: argparse.Namespace) -> int:
    try:
        job = build_custom_job(
            workers=args.workers,
            machine_type=args.machine_type,
            image=args.image,
            reducer_image=args.reducer_image,
            accelerator_type=args.accelerator_type,
            accelerator_count=args.accelerator_count,
            reducers=args.reducers,
            reducer_machine=args.reducer_machine,
            worker_gbps=args.worker_gbps,
            args=args.args,
            reducer_gbps=args.reducer_gbps,
            core_gbps=args.reducer_core_gbps,
            reducer_threads=args.reducer_threads,
            env=_env(args.env),
        )
    except ConfigError as exc:
        print(f"reduction-server vertex-job: error: {exc}", file=sys.stderr)
        return 2

    submit = gcloud_command(args.output or "FILE", args.display_name)
    sizing = (
        f"{job.reducers} reducers: {job.plan.workers} x {job.plan.worker_gbps:g} Gbps workers "
        f"<= {job.reducers} x {job.plan.reducer_gbps:g} Gbps {args.reducer_machine} "
        f"({job.plan.limited_by}-bound)"
        if job.plan
        else f"{job.reducers} reducers (given with --reducers)"
    )
    header = [
        "Vertex AI CustomJobSpec: pool 0 = primary, pool 1 = workers, pool 2 = reducers.",
        f"Generated by: {_command_line(args)}",
        f"Sizing: {sizing}",
    ]
    if job.worker_bandwidth is not None:
        header.append(f"Worker bandwidth assumed: {job.worker_bandwidth.gbps:g} Gbps: {job.worker_bandwidth.reason}")
    header.append(f"Submit: {submit}")
    text = render_spec(job.spec, args.format, header=header)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            print(f"reduction-server vertex-job: error: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"wrote {args.output} ({sizing})")
        if job.worker_bandwidth is not None:
            print(f"worker bandwidth assumed: {job.worker_bandwidth.gbps:g} Gbps: {job.worker_bandwidth.reason}")
        print(f"submit with: {submit}")
    else:
        sys.stdout.write(text)
        if job.worker_bandwidth is not None:
            print(
                f"# worker bandwidth assumed: {job.worker_bandwidth.gbps:g} Gbps: {job.worker_bandwidth.reason}",
                file=sys.stderr,
            )
        print(f"# submit with: {submit}", file=sys.stderr)
    return 0
