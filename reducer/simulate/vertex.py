"""Predictions for Vertex AI jobs: worker machine types and the reducer pool the planner sizes.

Worker bandwidths come from reducer.deploy.bandwidth, the reducer count and machine from
reducer.deploy.planner (its rule: the reducers' total egress >= the workers'); the links are the
machines' published caps at TCP payload efficiency, 100 us round trips, and no incast losses
(Network.queue_s None: fan-in kept within the switch queues).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..deploy.bandwidth import worker_bandwidth
from ..deploy.planner import Plan, plan_reducers
from .model import Network, Reducers
from .rows import simulate

# (label, machine type, accelerator, count) of the worker types predicted in docs/performance.md
WORKERS = [
    ("n1-standard-96 + 8 x V100", "n1-standard-96", "NVIDIA_TESLA_V100", 8),
    ("a2-highgpu-8g", "a2-highgpu-8g", None, 1),
    ("a3-highgpu-8g", "a3-highgpu-8g", None, 1),
]
REDUCERS = [("n1-highcpu-16", False), ("n2-highcpu-32", True)]
SIZES_W = [64, 128, 256, 512, 1024]


@dataclass(frozen=True)
class Prediction:
    plan: Plan
    nbytes: int
    rs_seconds: float
    ring_seconds: float
    rs_pct_of_bound: float

    @property
    def speedup(self) -> float:
        return self.ring_seconds / self.rs_seconds


def network_for(plan: Plan, latency: float = 100e-6) -> Network:
    return Network(plan.worker_gbps, plan.reducer_nic_gbps, latency=latency, efficiency=0.95, queue_s=None)


def predict(plan: Plan, nbytes: int, worker_frame_us: float = 0.0) -> Prediction:
    """rs on the plan's pool against the ring among its workers, one all-reduce of `nbytes`
    (`worker_frame_us`: Reducers.worker_frame_us, 0 = the workers' CPU not modelled)."""
    cpu = Reducers(threads=plan.reducer_threads or 8, core_gbps=plan.core_gbps, worker_frame_us=worker_frame_us)
    rows = simulate(plan.workers, plan.reducers, [nbytes], network_for(plan), ("rs", "ring"), cpu)
    rs, ring = rows
    return Prediction(plan, nbytes, rs["seconds"], ring["seconds"], rs["pct_of_bound"])


def sweep(nbytes: int, workers: list[int] | None = None, worker_frame_us: float = 0.0) -> list[dict[str, Any]]:
    """Predictions over worker counts, worker types and reducer types (rows for JSON and the plot)."""
    out = []
    for label, machine, acc, count in WORKERS:
        gbps = worker_bandwidth(machine, acc, count).gbps
        for reducer, tier1 in REDUCERS:
            for w in workers or SIZES_W:
                p = predict(plan_reducers(w, gbps, reducer_machine=reducer, tier1=tier1), nbytes, worker_frame_us)
                out.append(
                    {
                        "worker": label,
                        "worker_gbps": gbps,
                        "reducer": reducer + (" (Tier_1)" if tier1 else ""),
                        "reducer_gbps": p.plan.reducer_nic_gbps,
                        "workers": w,
                        "reducers": p.plan.reducers,
                        "bytes": nbytes,
                        "rs_seconds": p.rs_seconds,
                        "ring_seconds": p.ring_seconds,
                        "rs_pct_of_bound": p.rs_pct_of_bound,
                        "speedup": p.speedup,
                    }
                )
    return out
