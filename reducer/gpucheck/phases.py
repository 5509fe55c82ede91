"""One phase of the GPU check: reducers and two worker processes run by the library's local
launcher (reducer.launch, what ``reduction-server launch`` runs), then what they left behind is
collected: the workers' result files, their NCCL logs, and the reducers' final stats (each
``reduction-server serve`` logs ``final stats: bytes_received=...`` at DEBUG when the launcher
stops it)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reducer.launch import launch

from .nccl_log import NcclLog, parse_file

log = logging.getLogger("reducer.gpucheck")

WORLD = 2
_STATS = re.compile(r"^\[reducer (\d+)\] .*final stats: (.*)$")
_COUNTER = re.compile(r"\b([a-z_]+)=(-?\d+)\b")
_STOPPED = re.compile(r"^\[reducer (\d+)\] .*stopped after (\d+) rounds \(([\d.]+) MB received, ([\d.]+) MB sent\)")


@dataclass
class PhaseResult:
    name: str
    run_dir: str
    status: int | None = None  # the launcher's exit status; None = not run
    error: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)  # one per rank that wrote one
    logs: list[NcclLog] = field(default_factory=list)  # per rank
    reducer_stats: list[dict[str, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "run_dir": self.run_dir,
            "reducer_stats": self.reducer_stats,
            "nccl": [lg.to_dict() for lg in self.logs],
            "workers": [{k: v for k, v in r.items() if k not in ("sums", "ddp", "bench")} for r in self.results],
        }


def parse_reducer_stats(lines: Sequence[str], reducers: int) -> list[dict[str, int]]:
    """The reducers' counters from the launcher's output: the DEBUG 'final stats:' line (exact),
    else the INFO 'stopped after ... MB received' line (to 0.1 MB). Missing reducers get {}."""
    found: dict[int, dict[str, int]] = {}
    rough: dict[int, dict[str, int]] = {}
    for line in lines:
        m = _STATS.match(line)
        if m:
            text = re.sub(r"limits=\{[^}]*\}", "", m.group(2))
            found[int(m.group(1))] = {k: int(v) for k, v in _COUNTER.findall(text)}
            continue
        m = _STOPPED.match(line)
        if m:
            rough[int(m.group(1))] = {
                "rounds_completed": int(m.group(2)),
                "bytes_received": int(float(m.group(3)) * 1e6),
                "bytes_sent": int(float(m.group(4)) * 1e6),
                "approximate": 1,
            }
    return [found.get(i, rough.get(i, {})) for i in range(reducers)]


def read_results(run_dir: str, world: int = WORLD) -> list[dict[str, Any]]:
    out = []
    for rank in range(world):
        path = os.path.join(run_dir, f"result-rank{rank}.json")
        try:
            with open(path, encoding="utf-8") as fh:
                out.append(json.load(fh))
        except (OSError, ValueError):
            continue
    return out


def worker_command(task: str, run_dir: str, timeout: float, extra: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reducer.gpucheck.worker",
        "--task",
        task,
        "--run-dir",
        run_dir,
        "--timeout",
        f"{timeout:g}",
        *extra,
    ]


def run_phase(
    name: str,
    work_dir: str,
    command: Sequence[str],
    env: Mapping[str, str],
    reducers: int,
    timeout: float,
    world: int = WORLD,
    reducer_threads: int | None = 1,
) -> PhaseResult:
    """Run `command` as `world` worker nodes with `reducers` reducers (`reducer_threads` event-loop
    threads each; None: the reducer's default); never longer than
    `timeout` (+ the launcher's grace period): after it, SIGTERM to this process makes the
    launcher stop every child (its own signal handling)."""
    run_dir = os.path.join(work_dir, name)
    os.makedirs(run_dir, exist_ok=True)
    result = PhaseResult(name, run_dir)
    out_path = os.path.join(run_dir, "launch.log")
    timer = threading.Timer(timeout, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    log.info("phase %s: %d reducer(s), %d workers: %s", name, reducers, world, " ".join(command))
    try:
        with open(out_path, "w", encoding="utf-8") as out:
            timer.start()
            try:
                result.status = launch(
                    list(command),
                    workers=world,
                    reducers=reducers,
                    procs_per_worker=1,
                    reducer_threads=reducer_threads,
                    log_level="DEBUG",
                    out=out,
                    err=out,
                    env=dict(env),
                    grace_period=10.0,
                    ready_timeout=60.0,
                )
            finally:
                timer.cancel()
    except Exception as exc:  # a launcher refusal (ConfigError, OSError): the phase failed, the check goes on
        result.error = f"{type(exc).__name__}: {exc}"
        log.error("phase %s could not run: %s", name, result.error)
    if result.status is not None and result.status == 128 + signal.SIGTERM:
        result.error = f"stopped after the phase timeout of {timeout:g}s"
    with open(out_path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    result.reducer_stats = parse_reducer_stats(lines, reducers)
    result.results = read_results(run_dir, world)
    result.logs = [parse_file(os.path.join(run_dir, f"nccl-rank{r}.log")) for r in range(world)]
    log.info("phase %s: status %s%s", name, result.status, f" ({result.error})" if result.error else "")
    return result
