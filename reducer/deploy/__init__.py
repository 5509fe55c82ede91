"""Deployment helpers: reducer sizing (planner) and Vertex AI job specs (vertex).

Pure Python with no dependency on the C++ core, so `reduction-server plan` and
`vertex-job` work on a laptop without a build.
"""

from .bandwidth import WorkerBandwidth, worker_bandwidth
from .planner import (
    DEFAULT_REDUCER_MACHINE,
    REDUCER_CORE_GBPS,
    REDUCER_MACHINES,
    MachineType,
    Plan,
    format_machine_table,
    format_plan,
    plan_reducers,
    reducer_egress_gbps,
)
from .vertex import VertexJob, build_custom_job, render_spec

__all__ = [
    "DEFAULT_REDUCER_MACHINE",
    "REDUCER_CORE_GBPS",
    "REDUCER_MACHINES",
    "MachineType",
    "Plan",
    "VertexJob",
    "build_custom_job",
    "format_machine_table",
    "format_plan",
    "plan_reducers",
    "reducer_egress_gbps",
    "render_spec",
    "worker_bandwidth",
    "WorkerBandwidth",
]
