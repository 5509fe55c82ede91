"""Vertex AI CustomJob spec with a reducer pool (the `reduction-server vertex-job` logic).

Vertex AI's workerPoolSpecs are positional (docs/deploy.md): pool 0 = the primary
(one replica), pool 1 = the other workers, pool 2 = the reducers. A pool that is
not used stays in the list as an empty entry `{}` so the later pools keep their
index. Every replica gets CLUSTER_SPEC from Vertex AI; reducer.cluster reads it.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import ConfigError
from ..wording import install_hint
from .bandwidth import WorkerBandwidth, worker_bandwidth
from .planner import DEFAULT_REDUCER_MACHINE, REDUCER_MACHINES, Plan, plan_reducers

logger = logging.getLogger(__name__)

KNOWN_ACCELERATORS = (
    "NVIDIA_TESLA_K80",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB",
    "NVIDIA_L4",
    "NVIDIA_H100_80GB",
    "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB",
)


@dataclass(frozen=True)
class VertexJob:
    """A generated CustomJobSpec plus how its reducer count was chosen."""

    spec: dict[str, Any]  # camelCase CustomJobSpec, as gcloud --config expects
    reducers: int
    plan: Plan | None  # None when the reducer count was given explicitly
    worker_bandwidth: WorkerBandwidth | None = None  # the figure the plan assumed, and why


def _machine_spec(machine_type: str, accelerator_type: str | None, accelerator_count: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"machineType": machine_type}
    if accelerator_type:
        spec["acceleratorType"] = accelerator_type
        spec["acceleratorCount"] = accelerator_count
    return spec


def _container_env(env: Mapping[str, str] | None) -> dict[str, Any]:
    """containerSpec's `env` entry ({} when there is nothing to set); names checked."""
    if not env:
        return {}
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"--env {name!r}: not an environment variable name (letters, digits, _)")
    return {"env": [{"name": k, "value": str(v)} for k, v in env.items()]}


def build_custom_job(
    workers: int,
    machine_type: str,
    image: str,
    reducer_image: str,
    accelerator_type: str | None = None,
    accelerator_count: int = 1,
    reducers: int | None = None,
    reducer_machine: str = DEFAULT_REDUCER_MACHINE,
    worker_gbps: float | None = None,
    args: Sequence[str] | None = None,
    reducer_gbps: float | None = None,
    core_gbps: float | None = None,
    reducer_threads: int | None = None,
    env: Mapping[str, str] | None = None,
) -> VertexJob:
    """The CustomJobSpec of `workers` GPU workers plus a pool of reducers.

    With `reducers` None the count comes from plan_reducers(); the worker bandwidth is
    `worker_gbps`, else looked up from the machine type, GPU model and GPU count
    (bandwidth.worker_bandwidth; ConfigError if unknown); the reducer bandwidth is
    `reducer_gbps`, else the planner's value for `reducer_machine`, and at most what its
    threads sum (`core_gbps`, `reducer_threads`: see plan_reducers). `env` goes into every
    pool's containerSpec.env (RS_AUTH_TOKEN must reach the workers and the reducers alike).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be an integer >= 1, got {workers!r}")
    for flag, value in (
        ("--machine-type", machine_type),
        ("--image", image),
        ("--reducer-image", reducer_image),
        ("--reducer-machine", reducer_machine),
    ):
        if not value or not str(value).strip():
            raise ConfigError(f"{flag} must not be empty")
    if accelerator_type:
        if not re.fullmatch(r"[A-Z0-9_]+", accelerator_type):
            raise ConfigError(
                f"--accelerator-type {accelerator_type!r} is not a Vertex AI accelerator name "
                f"(e.g. {', '.join(KNOWN_ACCELERATORS[:5])}, ...)"
            )
        if accelerator_type not in KNOWN_ACCELERATORS:
            logger.warning("accelerator type %s is not in this tool's list; passing it through", accelerator_type)
        if isinstance(accelerator_count, bool) or not isinstance(accelerator_count, int) or accelerator_count < 1:
            raise ConfigError(f"--accelerator-count must be an integer >= 1, got {accelerator_count!r}")

    plan: Plan | None = None
    bandwidth: WorkerBandwidth | None = None
    if reducers is None:
        if worker_gbps is not None:
            bandwidth = WorkerBandwidth(float(worker_gbps), "given with --worker-gbps")
        else:
            bandwidth = worker_bandwidth(machine_type, accelerator_type, accelerator_count)
        logger.debug("worker bandwidth %g Gbps: %s", bandwidth.gbps, bandwidth.reason)
        plan = plan_reducers(
            workers,
            bandwidth.gbps,
            reducer_machine=reducer_machine,
            reducer_gbps=reducer_gbps,
            core_gbps=core_gbps,
            reducer_threads=reducer_threads,
        )
        reducers = plan.reducers
    else:
        if isinstance(reducers, bool) or not isinstance(reducers, int) or reducers < 1:
            raise ConfigError(f"--reducers must be an integer >= 1, got {reducers!r}")
        if reducer_machine not in REDUCER_MACHINES:
            logger.warning("reducer machine %s is not in the planner's table", reducer_machine)

    worker_container: dict[str, Any] = {"imageUri": image, **_container_env(env)}
    if args:
        worker_container["args"] = list(args)
    worker_machine = _machine_spec(machine_type, accelerator_type, accelerator_count)

    pools: list[dict[str, Any]] = [
        {"machineSpec": dict(worker_machine), "replicaCount": 1, "containerSpec": copy.deepcopy(worker_container)},
    ]
    if workers > 1:
        pools.append(
            {
                "machineSpec": dict(worker_machine),
                "replicaCount": workers - 1,
                "containerSpec": copy.deepcopy(worker_container),
            }
        )
    else:
        pools.append({})  # keeps the reducers at index 2
    pools.append(
        {
            "machineSpec": {"machineType": reducer_machine},
            "replicaCount": reducers,
            "containerSpec": {"imageUri": reducer_image, **_container_env(env)},
        }
    )
    logger.debug("vertex job: %d workers, %d reducers", workers, reducers)
    return VertexJob(spec={"workerPoolSpecs": pools}, reducers=reducers, plan=plan, worker_bandwidth=bandwidth)


def gcloud_command(config_path: str, display_name: str, region: str = "REGION") -> str:
    """The command that submits a spec written by render_spec()."""
    return (
        "gcloud ai custom-jobs create"
        f" --region={shlex.quote(region)}"
        f" --display-name={shlex.quote(display_name)}"
        f" --config={shlex.quote(config_path)}"
    )


def render_spec(spec: dict[str, Any], fmt: str = "yaml", header: Sequence[str] | None = None) -> str:
    """The spec as YAML (with `header` lines as # comments) or JSON."""
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    if fmt != "yaml":
        raise ConfigError(f"unknown format {fmt!r}; use yaml or json")

    body = yaml.safe_dump(spec, sort_keys=False, default_flow_style=False)
    lines = [f"# {h}".rstrip() for h in (header or [])]
    return "\n".join(lines + [body]) if lines else body


def to_sdk_spec(spec: dict[str, Any]) -> Any:
    """Parse a spec into google.cloud.aiplatform_v1.types.CustomJobSpec (validates it offline)."""
    try:
        from google.cloud.aiplatform_v1.types import CustomJobSpec
    except ImportError as exc:
        raise ConfigError(
            f"validating a spec needs google-cloud-aiplatform: {install_hint('vertex', 'google-cloud-aiplatform')}"
        ) from exc
    return CustomJobSpec.from_json(json.dumps(spec))
