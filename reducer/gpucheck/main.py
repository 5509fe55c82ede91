"""The GPU check's entry point (``python -m reducer.gpucheck``, ``scripts/gpu-check.sh``).

On one machine with one CUDA GPU: installs the NCCL plugin, then runs phases, each with its own
reducers and two worker processes that are two NCCL hosts on the same GPU (reducer.gpucheck.phases):

1. ``collnet-sums``  plugin + 2 reducers: exact sums (float32/bfloat16/float16, 4 KiB-256 MiB);
   NCCL's log must show the plugin, CollNet connected and AllReduce on CollNet, and the
   reducers' counters the bytes;
2. ``no-reducers``   plugin, NCCL_COLLNET_ENABLE=1, no reducer addresses: init, an all-reduce,
   teardown, exit 0;
3. ``collnet-ddp`` / ``plain-ddp``  the same DDP steps with the plugin and with NCCL alone;
   losses must agree;
4. ``forced-collnet`` only when the tuner never chose CollNet in 1: the sums again with
   NCCL_ALGO=allreduce:CollNetChain,CollNetDirect (NCCL >= 2.24), to tell "the plugin does not
   work" from "the tuner prefers a ring here".

``--bench`` runs the benchmark phases instead (reducer.gpucheck.bench: all-reduce busbw through
CollNet, NCCL's Socket net and the plugin's p2p net; a table, the JSON with the rows, then the
``GPU CHECK`` line and a ``GPU BENCH`` line on the target; exit 0 when every variant was measured
with exact sums, whatever the target's verdict).

Prints the JSON summary, then one verdict line; exit 0 PASS, 1 FAIL, 3 no GPU / no PyTorch
with NCCL. The JSON also goes to --out, else $OUT/gpu-check.json when $OUT is a directory.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tarfile
import tempfile
import time
from typing import Any

from . import bench
from . import verdict as V
from .environment import NEEDS, install_plugin, probe
from .phases import PhaseResult, run_phase, worker_command

log = logging.getLogger("reducer.gpucheck")

EXIT_PASS, EXIT_FAIL, EXIT_NO_GPU = 0, 1, 3
KiB, MiB = 1024, 1024 * 1024
FULL_SIZES = [4 * KiB * 4**k for k in range(9)]  # 4 KiB, 16 KiB, ..., 256 MiB
QUICK_SIZES = [4 * KiB, 1 * MiB, 64 * MiB]
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV,COLL,TUNING"}
FORCE_ALGO = "allreduce:CollNetChain,CollNetDirect"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m reducer.gpucheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} only and 5 DDP steps")
    p.add_argument("--sizes", default=None, help="comma-separated byte sizes (overrides --quick's/the full list)")
    p.add_argument("--ddp-steps", type=int, default=None, help="DDP steps (default 20, --quick 5)")
    p.add_argument(
        "--out",
        default=None,
        help="write the JSON summary here (default: $OUT/gpu-check.json, with --bench $OUT/gpu-bench.json, "
        "when $OUT is a directory)",
    )
    p.add_argument(
        "--work-dir",
        default=None,
        help="logs and results (default: a new temporary directory; "
        "when $OUT is a directory they are also packed into "
        "$OUT/gpu-check-logs.tar.gz)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=540.0,
        help="seconds for all phases together; a phase that would start later is skipped (default %(default)s)",
    )
    p.add_argument("--no-force", action="store_true", help="do not run the forced-collnet phase")
    p.add_argument("--log-level", default="INFO")
    bench.add_arguments(p)
    args = p.parse_args(argv)
    try:
        bench.parse_sizes(args.bench_sizes)
    except ValueError as exc:
        p.error(str(exc))
    return args


def _out_dir() -> str | None:
    out = os.environ.get("OUT")
    return out if out and os.path.isdir(out) else None


class Plan:
    """Runs the phases within the budget and keeps their results."""

    def __init__(self, args: argparse.Namespace, work_dir: str, plugin_env: dict[str, str]) -> None:
        self.args = args
        self.work_dir = work_dir
        self.base = dict(os.environ, **NCCL_DEBUG_ENV)
        self.plugin_env = dict(self.base, **plugin_env)
        self.plain_env = dict(self.base, NCCL_NET_PLUGIN="none", NCCL_COLLNET_ENABLE="0")
        self.deadline = time.monotonic() + args.budget
        self.phases: dict[str, PhaseResult] = {}

    def run(
        self,
        name: str,
        task: str,
        env: dict[str, str],
        reducers: int,
        limit: float,
        extra: list[str] | None = None,
        reducer_threads: int | None = 1,
    ) -> PhaseResult:
        left = self.deadline - time.monotonic()
        if left < 30:
            res = PhaseResult(name, os.path.join(self.work_dir, name), error="skipped: out of the time budget")
            log.warning("phase %s skipped: %.0fs of the budget left", name, left)
        else:
            timeout = min(limit, left)
            cmd = worker_command(task, os.path.join(self.work_dir, name), max(20.0, timeout - 15), extra or [])
            res = run_phase(name, self.work_dir, cmd, env, reducers, timeout, reducer_threads=reducer_threads)
        self.phases[name] = res
        return res


def run_checks(args: argparse.Namespace, work_dir: str, environment: dict[str, Any]) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes.split(",") if s] if args.sizes else QUICK_SIZES if args.quick else FULL_SIZES
    steps = args.ddp_steps or (5 if args.quick else 20)
    dtypes = ["float32", "bfloat16", "float16"]
    warnings: list[str] = []
    plan = _install(args, work_dir, environment)
    if isinstance(plan, dict):
        return plan
    sums_args = ["--sizes", ",".join(map(str, sizes)), "--dtypes", ",".join(dtypes)]
    plan.run("collnet-sums", "sums", plan.plugin_env, 2, 300, sums_args)
    plan.run("no-reducers", "teardown", plan.plugin_env, 1, 120, ["--no-reducers"])
    ddp_args = ["--steps", str(steps)]
    ddp = plan.run("collnet-ddp", "ddp", plan.plugin_env, 2, 180, ddp_args)
    plan.run("plain-ddp", "ddp", plan.plain_env, 1, 180, ddp_args)

    checks = build_checks(plan.phases, sizes, dtypes)
    collnet = checks[0]
    ddp_collnet = [t for t in (ddp.logs[0].allreduce_choices() if ddp.logs else []) if t.collnet]
    if not ddp_collnet:
        warnings.append("no DDP all-reduce went through CollNet (the tuner's choice for those sizes)")
    if collnet.ok is False and not args.no_force and _nccl_at_least(environment.get("nccl", ""), (2, 24)):
        forced = plan.run("forced-collnet", "sums", dict(plan.plugin_env, NCCL_ALGO=FORCE_ALGO), 2, 180, sums_args)
        forced_check = V.check_collnet(forced.logs)
        forced_check.name = "forced_collnet_diagnostic"
        forced_check.ok = None  # a diagnosis, never a pass: the verdict stays what the tuner did
        forced_check.data["sums"] = V.asdict(V.check_sums(forced.results, sizes, dtypes))
        forced_check.data["reducer_stats"] = forced.reducer_stats
        checks.append(forced_check)
    phases = {name: res.summary() for name, res in plan.phases.items()}
    return V.summarize(checks, environment, phases, warnings)


def _install(args: argparse.Namespace, work_dir: str, environment: dict[str, Any]) -> Plan | dict[str, Any]:
    """The plugin installed under work_dir and the Plan of phases using it, or (it failed) the
    summary saying why."""
    try:
        plugin_env = install_plugin(os.path.join(work_dir, "plugin"))
    except (RuntimeError, OSError) as exc:
        return V.summarize([V.Check("plugin_install", False, str(exc))], environment, {})
    environment["plugin_env"] = plugin_env
    return Plan(args, work_dir, plugin_env)


def run_bench(args: argparse.Namespace, work_dir: str, environment: dict[str, Any]) -> dict[str, Any]:
    """--bench: the benchmark phases (reducer.gpucheck.bench) instead of the checks."""
    plan = _install(args, work_dir, environment)
    if isinstance(plan, dict):
        return plan
    return bench.run_bench(plan, args, environment)


def build_checks(phases: dict[str, PhaseResult], sizes: list[int], dtypes: list[str]) -> list[V.Check]:
    """The checks from the four main phases (collnet first)."""
    sums, bare = phases["collnet-sums"], phases["no-reducers"]
    ddp, plain = phases["collnet-ddp"], phases["plain-ddp"]
    return [
        V.check_collnet(sums.logs),
        V.check_reducer_bytes(sums.reducer_stats, sums.logs[0].collnet_bytes() if sums.logs else 0),
        V.check_sums(sums.results, sizes, dtypes),
        V.check_teardown("teardown_with_reducers", sums.status, sums.results, why=sums.error),
        V.check_teardown("teardown_without_reducers", bare.status, bare.results, why=bare.error),
        V.check_ddp(ddp.results, plain.results),
        V.check_teardown("teardown_ddp_with_plugin", ddp.status, ddp.results, why=ddp.error),
        V.check_teardown("teardown_ddp_without_plugin", plain.status, plain.results, why=plain.error),
        V.check_plain_network(plain.logs[0] if plain.logs else V.NcclLog()),
    ]


def _nccl_at_least(version: str, wanted: tuple) -> bool:
    try:
        return tuple(int(x) for x in version.split(".")[:2]) >= wanted
    except ValueError:
        return False


def write_summary(summary: dict[str, Any], path: str | None, name: str = "gpu-check") -> str | None:
    if path is None:
        out = _out_dir()
        path = os.path.join(out, f"{name}.json") if out else None
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(V.to_json(summary) + "\n")
    return path


def pack_logs(work_dir: str, name: str = "gpu-check") -> str | None:
    """$OUT/<name>-logs.tar.gz with the phases' logs and results (one file: $OUT takes few)."""
    out = _out_dir()
    if not out:
        return None

    path = os.path.join(out, f"{name}-logs.tar.gz")
    try:
        with tarfile.open(path, "w:gz") as tar:
            tar.add(work_dir, arcname="gpu-check-logs", filter=lambda ti: None if ti.name.endswith(".so") else ti)
    except OSError as exc:
        log.warning("cannot pack the logs into %s: %s", path, exc)
        return None
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s gpu-check %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    found = probe()
    if not found.ok:
        print(
            f"gpu-check: cannot run here: {found.reason}.\n{NEEDS}; run it on a machine with one CUDA GPU "
            f"(see docs/nccl-plugin.md, 'GPU check').",
            file=sys.stderr,
        )
        return EXIT_NO_GPU
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="rs-gpucheck-")
    os.makedirs(work_dir, exist_ok=True)
    environment = dict(
        found.info, python=sys.version.split()[0], work_dir=work_dir, cpus=os.cpu_count(), quick=bool(args.quick)
    )
    log.info(
        "GPU %s, torch %s, NCCL %s; logs in %s",
        found.info.get("gpu"),
        found.info.get("torch"),
        found.info.get("nccl"),
        work_dir,
    )
    t0 = time.monotonic()
    summary = (run_bench if args.bench else run_checks)(args, work_dir, environment)
    summary["environment"]["seconds"] = round(time.monotonic() - t0, 1)
    table = bench.report_text(summary)
    if table:
        print(table)
    print(V.to_json(summary))
    name = "gpu-bench" if args.bench else "gpu-check"
    path = write_summary(summary, args.out, name)
    if path:
        print(f"gpu-check: JSON summary written to {path}", file=sys.stderr)
    packed = pack_logs(work_dir, name)
    if packed:
        print(f"gpu-check: logs packed into {packed}", file=sys.stderr)
    print(V.verdict_line(summary))
    if "bench" in summary:
        print(summary["bench"]["verdict"])
    return EXIT_PASS if summary["verdict"] == "PASS" else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
