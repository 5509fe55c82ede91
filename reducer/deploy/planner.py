"""Reducer sizing: how many reducer nodes keep up with the workers' network bandwidth.

Rule (from the Vertex AI Reduction Server guidance): the reducers' total egress
bandwidth should match or exceed the workers' total bandwidth, so

    reducers = ceil(workers * worker_gbps / reducer_gbps)

where one reducer's usable bandwidth is the slower of its NIC and its cores:

    reducer_gbps = min(egress cap, threads * REDUCER_CORE_GBPS)

(a reducer receives as many bytes as it sends, and every received byte costs CPU).
The per-VM egress caps below are Compute Engine's published maximums for traffic
inside a VPC network (docs/deploy.md cites the pages). They are upper bounds, not
measured throughput. REDUCER_CORE_GBPS is measured (docs/performance.md).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from ..errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_REDUCER_MACHINE = "n1-highcpu-16"

# CPU per byte of a reducer: Gbit/s of worker contributions one reducer thread receives, sums
# and sends back per CPU second (float32; bfloat16/float16 cost about 1.5x the CPU per byte).
# Measured: python benchmarks/bench_reducer_cpu.py --workers 2 --nbytes 64M --iters 10
# (loopback, ReducerServer(threads=1)), 2-core AMD EPYC dev VM: see docs/performance.md,
# "CPU per byte on the reducer". Override with --reducer-core-gbps.
REDUCER_CORE_GBPS = 8 * 1.9
# ReducerServer's default thread count: the CPUs, at most 8 (csrc/server/server.cc).
REDUCER_DEFAULT_MAX_THREADS = 8


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    egress_gbps: float  # default per-VM egress cap
    tier1_gbps: float | None = None  # with per-VM Tier_1 networking; None = not offered


# Reducer candidates. N1/N2: 2 Gbps per vCPU, capped at 32 Gbps by default.
# Compute Engine offers Tier_1 networking only on N2/N2D/C2/C2D/C3 VMs with >= 30 vCPUs,
# so no N1 type has a Tier_1 value.
REDUCER_MACHINES: dict[str, MachineType] = {
    m.name: m
    for m in (
        MachineType("n1-highcpu-8", 8, 16.0),
        MachineType("n1-highcpu-16", 16, 32.0),
        MachineType("n1-highcpu-32", 32, 32.0),
        MachineType("n2-highcpu-8", 8, 16.0),
        MachineType("n2-highcpu-16", 16, 32.0),
        MachineType("n2-highcpu-32", 32, 32.0, tier1_gbps=50.0),
    )
}


@dataclass(frozen=True)
class Plan:
    """The result of plan_reducers()."""

    workers: int
    worker_gbps: float
    reducer_machine: str | None  # None when only --reducer-gbps was given
    reducer_gbps: float  # usable bandwidth of one reducer: min(NIC, cores)
    tier1: bool
    reducers: int
    reducer_nic_gbps: float = 0.0  # egress cap of one reducer
    reducer_threads: int | None = None  # None: CPU not known (custom machine)
    core_gbps: float = REDUCER_CORE_GBPS

    @property
    def reducer_cores_gbps(self) -> float | None:
        """What one reducer's threads can sum, Gbps (None if its CPU count is unknown)."""
        return None if self.reducer_threads is None else self.reducer_threads * self.core_gbps

    @property
    def limited_by(self) -> str:
        cores = self.reducer_cores_gbps
        return "cores" if cores is not None and cores < self.reducer_nic_gbps else "NIC"

    @property
    def workers_total_gbps(self) -> float:
        return self.workers * self.worker_gbps

    @property
    def reducers_total_gbps(self) -> float:
        return self.reducers * self.reducer_gbps

    @property
    def connections_per_worker(self) -> int:
        """Each worker talks to every reducer."""
        return self.reducers


def reducer_egress_gbps(machine: str, tier1: bool = False) -> float:
    """Per-VM egress cap of a known reducer machine type (ConfigError if unknown/unsupported)."""
    spec = REDUCER_MACHINES.get(machine)
    if spec is None:
        raise ConfigError(
            f"unknown reducer machine type {machine!r}; known: {', '.join(REDUCER_MACHINES)} "
            "(or give the per-reducer bandwidth with --reducer-gbps)"
        )
    if not tier1:
        return spec.egress_gbps
    if spec.tier1_gbps is None:
        tier1_types = [m.name for m in REDUCER_MACHINES.values() if m.tier1_gbps is not None]
        raise ConfigError(
            f"Tier_1 networking is not available on {machine!r} (Compute Engine offers it on "
            f"N2/N2D/C2/C2D/C3 VMs with at least 30 vCPUs); known Tier_1 types: "
            f"{', '.join(tier1_types)}, or give --reducer-gbps"
        )
    return spec.tier1_gbps


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


def plan_reducers(
    workers: int,
    worker_gbps: float,
    reducer_machine: str | None = None,
    reducer_gbps: float | None = None,
    tier1: bool = False,
    core_gbps: float | None = None,
    reducer_threads: int | None = None,
) -> Plan:
    """Number of reducers whose total usable bandwidth >= workers * worker_gbps.

    One reducer's bandwidth is min(its egress cap, reducer_threads * core_gbps).
    `reducer_gbps` overrides the egress cap of the table (the machine name is then only a label,
    known or not); with neither, the default machine n1-highcpu-16 (32 Gbps) is used.
    `reducer_threads` defaults to the reducer's own default, min(vCPUs, 8), for a machine of the
    table; for another machine the CPU limit is left out unless it is given.
    `core_gbps` (Gbit/s one reducer thread sums) defaults to the measured REDUCER_CORE_GBPS.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    _positive("worker_gbps", worker_gbps)
    if core_gbps is None:
        core_gbps = REDUCER_CORE_GBPS
    _positive("core_gbps", core_gbps)
    if reducer_threads is not None and (
        isinstance(reducer_threads, bool) or not isinstance(reducer_threads, int) or reducer_threads < 1
    ):
        raise ConfigError(f"reducer_threads must be an integer >= 1, got {reducer_threads!r}")
    if reducer_gbps is not None:
        _positive("reducer_gbps", reducer_gbps)
        nic = float(reducer_gbps)  # reducer_machine, if any, is only a label here
    else:
        if reducer_machine is None:
            reducer_machine = DEFAULT_REDUCER_MACHINE
        nic = reducer_egress_gbps(reducer_machine, tier1)
    spec = REDUCER_MACHINES.get(reducer_machine) if reducer_machine else None
    if reducer_threads is None and spec is not None:
        reducer_threads = min(spec.vcpus, REDUCER_DEFAULT_MAX_THREADS)
    per_reducer = nic if reducer_threads is None else min(nic, reducer_threads * float(core_gbps))
    total = workers * float(worker_gbps)
    # round() guards against 800/32 = 25.000000000000004-style float noise.
    count = max(1, math.ceil(round(total / per_reducer, 9)))
    plan = Plan(
        workers,
        float(worker_gbps),
        reducer_machine,
        per_reducer,
        tier1,
        count,
        reducer_nic_gbps=nic,
        reducer_threads=reducer_threads,
        core_gbps=float(core_gbps),
    )
    logger.debug("reducer plan: %s", plan)
    return plan


def _gbps(value: float) -> str:
    return f"{value:g} Gbps"


def format_plan(plan: Plan) -> str:
    """A human-readable summary of a Plan."""
    machine = plan.reducer_machine or "custom"
    tier = " (Tier_1)" if plan.tier1 else ""
    cores = plan.reducer_cores_gbps
    if cores is None:
        per = f"{_gbps(plan.reducer_nic_gbps)} (NIC; CPU limit unknown for this machine: give --reducer-threads)"
    else:
        per = (
            f"min(NIC {_gbps(plan.reducer_nic_gbps)}, cores {plan.reducer_threads} threads x "
            f"{_gbps(round(plan.core_gbps, 2))} = {_gbps(round(cores, 2))}) = {_gbps(plan.reducer_gbps)}, "
            f"{plan.limited_by}-bound"
        )
    lines = [
        f"reducers needed:        {plan.reducers} x {machine}{tier}",
        f"workers' total:         {plan.workers} x {_gbps(plan.worker_gbps)} = {_gbps(plan.workers_total_gbps)}",
        f"one reducer:            {per}",
        f"reducers' total:        {plan.reducers} x {_gbps(plan.reducer_gbps)} = {_gbps(plan.reducers_total_gbps)}",
        f"connections per worker: {plan.connections_per_worker} (one per reducer)",
    ]
    return "\n".join(lines)


def machine_table_rows() -> list[tuple[str, int, str, str]]:
    """(name, vCPUs, default egress, Tier_1 egress) for every known reducer machine."""
    return [
        (m.name, m.vcpus, _gbps(m.egress_gbps), _gbps(m.tier1_gbps) if m.tier1_gbps else "-")
        for m in REDUCER_MACHINES.values()
    ]


def format_machine_table() -> str:
    header = ("machine type", "vCPUs", "egress", "Tier_1 egress")
    rows = [header] + [(n, str(v), e, t) for n, v, e, t in machine_table_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_prediction(plan: Plan, nbytes: int) -> str:
    """The simulated all-reduce of `nbytes` on the plan's pool against the ring among its workers
    (reducer.simulate on SimGrid), or why there is none (SimGrid not installed)."""
    from ..simulate import SimulatorUnavailable  # noqa: PLC0415 (reducer.simulate loads the C++ core)
    from ..simulate.vertex import predict  # noqa: PLC0415

    size = f"{nbytes / (1 << 20):g} MiB"
    try:
        p = predict(plan, nbytes)
    except SimulatorUnavailable as exc:
        return f"predicted all-reduce:   none ({exc})"
    return (
        f"predicted all-reduce:   {size} in {p.rs_seconds * 1e3:.2f} ms ({p.rs_pct_of_bound:.0f}% of the link bound); "
        f"the ring {p.ring_seconds * 1e3:.2f} ms: {p.speedup:.2f}x faster (simulated, SimGrid; "
        "docs/performance.md 'Simulated jobs')"
    )
