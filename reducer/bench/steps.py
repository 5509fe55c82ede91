"""`reduction-server bench --model`: one training step's gradient traffic, as DDP produces it.

The model's parameter list (reducer.bench.models) is cut into DDP's buckets
(reducer.bench.buckets) for each ``bucket_cap_mb``; every case (bucket plan x backward time)
is replayed by the runner's rank processes (reducer.bench.rank.step_once): bucket k is
all-reduced once its share of the backward time has passed, and the step ends when every
bucket is averaged. Algorithms: ``rs`` (reducer.torch.allreduce_hook), ``rs+bf16``
(reducer.torch.bf16_compress_hook), ``ring`` (this project's C++ ring, one bucket after
another), ``gloo`` (torch.distributed all_reduce per bucket, asynchronous, as DDP does).

A backward time of ``gloo`` means: gloo's communication time for the same bucket plan, as
measured in this run with no compute (gloo runs first; the cases that need it follow).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import report
from .buckets import MIB, Bucket, plan_buckets, release_times
from .models import MODELS, numel, parameters

ALGOS = ("rs", "rs+bf16", "ring", "gloo")
ELEMENT_SIZE = 4  # float32 gradients
GLOO = "gloo"  # a backward time taken from gloo's measured communication time


@dataclass
class StepCase:
    key: int
    bucket_cap_mb: float
    compute_ms: float
    compute_from: str  # "given", or "gloo": gloo's communication time for this bucket plan
    buckets: list[Bucket]

    def job(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "counts": [b.count for b in self.buckets],
            "release_s": release_times(self.buckets, self.compute_ms / 1e3),
        }

    @property
    def label(self) -> str:
        return f"cap {self.bucket_cap_mb:g} MiB, compute {self.compute_ms:.1f} ms"


def parse_compute(text: str) -> list[Any]:
    """'0', '0,120', '0,gloo' -> [0.0, 120.0] / [0.0, 'gloo'] (milliseconds)."""
    out: list[Any] = []
    for part in (p.strip().lower() for p in str(text).split(",")):
        if not part:
            continue
        if part == GLOO:
            out.append(GLOO)
            continue
        try:
            v = float(part)
        except ValueError:
            raise ConfigError(f"bad --compute-ms value {part!r}: milliseconds, or 'gloo'") from None
        if not math.isfinite(v) or v < 0:
            raise ConfigError(f"--compute-ms must be >= 0 ms, got {part}")
        out.append(v)
    if not out:
        raise ConfigError("--compute-ms: no value given")
    return list(dict.fromkeys(out))


class StepPlan:
    """The model, its bucket plans and every case the run measures (keys are unique per run)."""

    def __init__(
        self, model: str, bucket_cap_mb: Sequence[float], first_bucket_mb: float, compute_ms: str, scale: float = 1.0
    ):
        if model not in MODELS:
            raise ConfigError(f"unknown model {model!r}: choose from {', '.join(MODELS)}")
        if not 0 < scale <= 1:
            raise ConfigError(f"--scale must be in (0, 1], got {scale}")
        if not bucket_cap_mb or any(c <= 0 for c in bucket_cap_mb) or first_bucket_mb <= 0:
            raise ConfigError("--bucket-cap-mb and --first-bucket-mb must be > 0")
        self.model, self.scale = model, scale
        self.shapes = parameters(model, scale)
        self.counts = [numel(s) for _, s in self.shapes]
        self.elements = sum(self.counts)
        self.nbytes = self.elements * ELEMENT_SIZE
        self.caps = list(dict.fromkeys(float(c) for c in bucket_cap_mb))
        self.first_bucket_mb = float(first_bucket_mb)
        self.compute = parse_compute(compute_ms)
        self.first_bucket_bytes = max(1, int(first_bucket_mb * MIB * scale))
        self.plans = {
            cap: plan_buckets(self.counts, ELEMENT_SIZE, max(1, int(cap * MIB * scale)), self.first_bucket_bytes)
            for cap in self.caps
        }
        self.cases: dict[int, StepCase] = {}

    @property
    def needs_gloo(self) -> bool:
        return GLOO in self.compute

    def case(self, cap: float, compute_ms: float, source: str = "given") -> StepCase:
        c = StepCase(len(self.cases), cap, float(compute_ms), source, self.plans[cap])
        self.cases[c.key] = c
        return c

    def given_cases(self) -> list[StepCase]:
        """Cases with a given backward time (0 included when 'gloo' needs gloo's communication time)."""
        given = [c for c in self.compute if c != GLOO]
        if self.needs_gloo and 0.0 not in given:
            given.insert(0, 0.0)
        return [self.case(cap, ms) for cap in self.caps for ms in given]

    def gloo_cases(self, rows: Sequence[dict[str, Any]]) -> list[StepCase]:
        """One case per bucket plan whose backward time is gloo's zero-compute step time."""
        out = []
        for cap in self.caps:
            comm = next(
                (
                    r["time_us"]
                    for r in rows
                    if r["algo"] == "gloo" and r["bucket_cap_mb"] == cap and r["compute_ms"] == 0.0
                ),
                None,
            )
            if comm is not None:
                out.append(self.case(cap, comm / 1e3, GLOO))
        return out

    def describe(self) -> list[str]:
        info = MODELS[self.model]
        lines = [
            f"# model: {self.model}: {info.description}; {len(self.shapes)} tensors, {self.elements:,} "
            f"float32 parameters = {self.nbytes / 1e6:.1f} MB of gradients per step"
            + (f" (scaled by {self.scale:g}, bucket limits too)" if self.scale != 1 else "")
        ]
        for cap, buckets in self.plans.items():
            sizes = [b.count * ELEMENT_SIZE for b in buckets]
            lines.append(
                f"# DDP buckets, bucket_cap_mb={cap:g}, first-bucket limit {self.first_bucket_mb:g} MiB: "
                f"{len(buckets)} buckets, in all-reduce order (MB): " + " ".join(f"{s / 1e6:.2f}" for s in sizes)
            )
        return lines

    def work(self, cases: Sequence[StepCase]) -> dict[str, Any]:
        """The part of a rank's job that describes these cases."""
        return {"steps": [c.job() for c in cases], "elements": self.elements}

    def make_row(self, cfg: Any) -> Any:
        """A runner RowMaker for step results."""

        def row(algo: str, key: Any, msgs: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
            case = self.cases[int(key)]
            cpu = next((m.get("cpu_percent") for m in msgs if m.get("cpu_percent") is not None), None)
            r = report.make_row(
                algo,
                self.nbytes,
                self.elements,
                "float32",
                "avg",
                cfg.workers,
                cfg.reducers,
                [m["samples_us"] for m in msgs],
                sum(int(m["wrong"]) for m in msgs),
                cpu_percent=cpu,
                wall_s=wall_s,
                emulate_gbps=cfg.emulate_gbps,
                iters=cfg.iters,
                warmup=cfg.warmup,
            )
            step_us = r["time_us"]
            r.update(
                mode="step",
                model=self.model,
                scale=self.scale,
                tensors=len(self.shapes),
                label=case.label,
                bucket_cap_mb=case.bucket_cap_mb,
                first_bucket_bytes=self.first_bucket_bytes,
                buckets=len(case.buckets),
                bucket_bytes=[b.count * ELEMENT_SIZE for b in case.buckets],
                compute_ms=case.compute_ms,
                compute_from=case.compute_from,
                step_us=step_us,
                exposed_us=max(0.0, step_us - case.compute_ms * 1e3),
                steps_per_s=1e6 / step_us if step_us > 0 else None,
            )
            return r

        return row


def passes(plan: StepPlan, algos: Sequence[str], rows: list[dict[str, Any]]) -> Iterator[tuple[str, list[StepCase]]]:
    """(algorithm, cases) in run order. `rows` is the run's row list, read as it grows: with a
    backward time of 'gloo', gloo runs its given cases first and the cases derived from its
    communication time follow for every algorithm (gloo last)."""
    given = plan.given_cases()
    if not plan.needs_gloo:
        for a in algos:
            yield a, given
        return
    yield GLOO, given
    derived = plan.gloo_cases(rows)
    for a in algos:
        if a != GLOO:
            yield a, given + derived
    yield GLOO, derived


def finish(rows: list[dict[str, Any]]) -> None:
    """Add what compares rows: speed-up over gloo (same bucket plan and backward time) and, for a
    backward time > 0, how much of the algorithm's own communication (its step time with no
    compute, same bucket plan) stays exposed."""

    def find(algo: str, cap: float, compute: float) -> dict[str, Any] | None:
        return next(
            (r for r in rows if r["algo"] == algo and r["bucket_cap_mb"] == cap and r["compute_ms"] == compute), None
        )

    for r in rows:
        gloo = find("gloo", r["bucket_cap_mb"], r["compute_ms"])
        r["speedup_vs_gloo"] = gloo["step_us"] / r["step_us"] if gloo and r["step_us"] else None
        alone = find(r["algo"], r["bucket_cap_mb"], 0.0)
        r["comm_us"] = alone["step_us"] if alone else None
        if r["compute_ms"] > 0 and alone and alone["step_us"]:
            r["exposed_fraction"] = r["exposed_us"] / alone["step_us"]
            r["hidden_fraction"] = max(0.0, 1.0 - r["exposed_fraction"])
        else:
            r["exposed_fraction"] = r["hidden_fraction"] = None


def sort_key(r: dict[str, Any]) -> tuple[float, float, int]:
    order = {a: i for i, a in enumerate(ALGOS)}
    return (r["bucket_cap_mb"], r["compute_ms"], order.get(r["algo"], len(order)))
