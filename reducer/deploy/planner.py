"""Reducer sizing: how many reducer nodes keep up with the workers' network bandwidth.

Rule (from the Vertex AI Reduction Server guidance): the reducers' total egress
bandwidth should match or exceed the workers' total bandwidth, so

    reducers = ceil(workers * worker_gbps / reducer_gbps)

The per-VM egress caps below are Compute Engine's published maximums for traffic
inside a VPC network (docs/deploy.md cites the pages). They are upper bounds, not
measured throughput.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_REDUCER_MACHINE = "n1-highcpu-16"


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    egress_gbps: float                 # default per-VM egress cap
    tier1_gbps: Optional[float] = None  # with per-VM Tier_1 networking; None = not offered


# Reducer candidates. N1/N2: 2 Gbps per vCPU, capped at 32 Gbps by default.
# Compute Engine offers Tier_1 networking only on N2/N2D/C2/C2D/C3 VMs with >= 30 vCPUs,
# so no N1 type has a Tier_1 value.
REDUCER_MACHINES: Dict[str, MachineType] = {
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
    reducer_machine: Optional[str]   # None when only --reducer-gbps was given
    reducer_gbps: float              # egress of one reducer used for the sizing
    tier1: bool
    reducers: int

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
    reducer_machine: Optional[str] = None,
    reducer_gbps: Optional[float] = None,
    tier1: bool = False,
) -> Plan:
    """Number of reducers whose total egress >= workers * worker_gbps.

    `reducer_gbps` overrides the table (the machine name, any name, is then only a label);
    with neither, the default machine n1-highcpu-16 (32 Gbps) is used.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    _positive("worker_gbps", worker_gbps)
    if reducer_gbps is not None:
        _positive("reducer_gbps", reducer_gbps)
        per_reducer = float(reducer_gbps)  # reducer_machine, if any, is only a label here
    else:
        if reducer_machine is None:
            reducer_machine = DEFAULT_REDUCER_MACHINE
        per_reducer = reducer_egress_gbps(reducer_machine, tier1)
    total = workers * float(worker_gbps)
    # round() guards against 800/32 = 25.000000000000004-style float noise.
    count = max(1, math.ceil(round(total / per_reducer, 9)))
    plan = Plan(workers, float(worker_gbps), reducer_machine, per_reducer, tier1, count)
    logger.debug("reducer plan: %s", plan)
    return plan


def _gbps(value: float) -> str:
    return f"{value:g} Gbps"


def format_plan(plan: Plan) -> str:
    """A human-readable summary of a Plan."""
    machine = plan.reducer_machine or "custom"
    tier = " (Tier_1)" if plan.tier1 else ""
    lines = [
        f"reducers needed:        {plan.reducers} x {machine}{tier}",
        f"workers' total:         {plan.workers} x {_gbps(plan.worker_gbps)} = {_gbps(plan.workers_total_gbps)}",
        f"reducers' total egress: {plan.reducers} x {_gbps(plan.reducer_gbps)} = {_gbps(plan.reducers_total_gbps)}",
        f"connections per worker: {plan.connections_per_worker} (one per reducer)",
    ]
    return "\n".join(lines)


def machine_table_rows() -> List[Tuple[str, int, str, str]]:
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
