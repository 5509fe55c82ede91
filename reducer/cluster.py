"""Cluster discovery: who am I, who are the reducers, who are the workers.

Sources, first match wins (docs/configuration.md, "Cluster discovery"):

1. ``CLUSTER_SPEC`` (Vertex AI): workers are ``workerpool0`` then ``workerpool1`` (node rank 0 is
   the primary, 1 + i is worker i), reducers are ``workerpool2``, ``workerpool3`` (evaluators) is
   never part of the all-reduce group.
2. ``TF_CONFIG``: ``chief`` (or ``master``) then ``worker`` are workers, ``ps`` are the reducers,
   ``evaluator`` is excluded.
3. ``RS_REDUCERS`` + ``RS_RANK`` + ``RS_WORLD_SIZE`` (or the matching arguments). Here the rank
   and world size are already *global* (per process, not per node).

The text of CLUSTER_SPEC / TF_CONFIG is read, checked and mapped to roles by the C++ reader the
NCCL plugin uses too (``reducer._core.cluster``, csrc/cluster/spec.h): one implementation, the same
answers and messages from both. This module adds what follows from it: ranks, ports, reducers.

Several processes per node: with (1) and (2) the global rank is
``node_rank * local_world_size + local_rank`` where ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` come
from torchrun (or the arguments). An explicit argument always wins over the environment.
The port workers use to reach the reducers is ``reducer_port``, else ``RS_PORT`` (the port the
reducers bind), else the port of the pool-2 / ``ps`` entries.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import config
from ._native import core
from .addresses import check_port, format_address, parse_address, resolve_job_id
from .errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "ClusterInfo",
    "discover",
    "discover_worker",
    "discover_reducer",
]

WORKER = "worker"
REDUCER = "reducer"
EVALUATOR = "evaluator"

_NO_CLUSTER = (
    "no cluster found: set CLUSTER_SPEC (Vertex AI), TF_CONFIG, or RS_REDUCERS with RS_RANK and "
    "RS_WORLD_SIZE (or pass reducers=, rank= and world_size=)"
)

Reducers = str | Sequence[str] | None


@dataclass(frozen=True)
class ClusterInfo:
    """What this process learned about the cluster.

    ``rank`` and ``world_size`` are meaningful for workers only (-1 and 0 otherwise).
    ``bind_port`` is set for reducers only: the port it should listen on (RS_PORT if set, else the
    port of its own entry in the cluster description).
    """

    role: str  # "worker", "reducer", "evaluator"
    reducers: list[str]  # "host:port" addresses of the reducers, in pool order
    workers: list[str]  # worker node addresses (pool0 then pool1); [] in RS_REDUCERS mode
    node_rank: int  # index among worker nodes (reducer: index in the reducer pool)
    num_nodes: int  # number of worker nodes (reducer: size of the reducer pool)
    local_rank: int
    local_world_size: int
    rank: int  # global rank = node_rank * local_world_size + local_rank (workers only)
    world_size: int  # num_nodes * local_world_size (workers only)
    job_id: str
    source: str  # "CLUSTER_SPEC", "TF_CONFIG" or "RS_REDUCERS"
    bind_port: int | None = None
    task_type: str = ""  # as written in the description: "workerpool2", "ps", ... ("" for RS_REDUCERS)


# -- local ranks and reducer lists (settings read from `env` with config.get) ------------------


def _local(local_rank: int | None, local_world_size: int | None, env: Mapping[str, str]) -> tuple[int, int]:
    lr = config.get("local_rank", local_rank, env)
    lws = config.get("local_world_size", local_world_size, env)
    lws_env = config.SETTINGS["local_world_size"].env
    lr_env = config.SETTINGS["local_rank"].env
    if lws is None:
        if lr is not None and lr > 0:
            raise ConfigError(
                f"{lr_env}={lr} but {lws_env} (processes per node) is not set: set {lws_env} or pass local_world_size="
            )
        lws = 1
    if lr is None:
        lr = 0
    if lws < 1:
        raise ConfigError(f"{lws_env}={lws} is not valid: need at least 1 process per node")
    if lr < 0:
        raise ConfigError(f"{lr_env}={lr} is not valid: must be >= 0")
    if lr >= lws:
        raise ConfigError(f"{lr_env}={lr} is out of range for {lws_env}={lws}: local rank must be < local world size")
    return int(lr), int(lws)


def _explicit_reducers(reducers: Reducers) -> list[str] | None:
    if reducers is None:
        return None
    if isinstance(reducers, str):
        return [a.strip() for a in reducers.split(",") if a.strip()]
    return [str(a).strip() for a in reducers]


def _check_reducers(addrs: list[str], where: str) -> list[str]:
    if not addrs:
        raise ConfigError(f"{where}: the reducer pool is empty; at least one reducer address is needed")
    seen: dict[tuple[str, int], str] = {}
    for a in addrs:
        try:
            key = parse_address(a)
        except ConfigError as exc:
            raise ConfigError(f"{where}: bad reducer address: {exc}") from None
        if key in seen:
            raise ConfigError(f"{where}: reducer address {a!r} is listed twice")
        seen[key] = a
    return list(addrs)


def _with_port(addrs: list[str], port: int | None, where: str) -> list[str]:
    out = []
    for a in addrs:
        try:
            host, own = parse_address(a)
        except ConfigError as exc:
            raise ConfigError(f"{where}: bad reducer address: {exc}") from None
        out.append(format_address(host, port if port is not None else own))
    return out


# -- discovery ----------------------------------------------------------------------------------


def _from_spec(
    spec: Any,
    *,
    env: Mapping[str, str],
    reducers: Reducers,
    rank: int | None,
    world_size: int | None,
    local_rank: int | None,
    local_world_size: int | None,
    reducer_port: int | None,
    job_id: str | None,
) -> ClusterInfo:
    """ClusterInfo from `spec`, a parsed description (reducer._core.cluster.Spec)."""
    pools: dict[str, list[str]] = {name: list(addrs) for name, addrs in spec.pools}
    src = spec.source
    worker_pools: list[str] = list(spec.worker_pools)
    role = spec.role

    workers: list[str] = []
    for p in worker_pools:
        workers.extend(pools.get(p, []))

    port = reducer_port if reducer_port is not None else config.get("port", None, env)
    if port is not None:
        port = check_port(port, "reducer_port" if reducer_port is not None else config.SETTINGS["port"].env)

    explicit = _explicit_reducers(reducers)
    pool2 = pools.get(spec.reducer_pool, [])
    where = src
    if explicit is not None:
        if reducer_port is not None:
            explicit = _with_port(explicit, check_port(reducer_port, "reducer_port"), "reducers argument")
        reducer_addrs = _check_reducers(explicit, "reducers argument")
    else:
        if role == WORKER and not pool2:
            raise ConfigError(f"{spec.missing_reducers()} (or pass reducers=)")
        reducer_addrs = _check_reducers(_with_port(pool2, port, where), where) if pool2 else []

    bind_port: int | None = None
    if role == WORKER:
        if src == "CLUSTER_SPEC" and not pools.get("workerpool0"):
            raise ConfigError(
                f"CLUSTER_SPEC has no workerpool0 (primary): found pools {spec.pool_list()}; every "
                f"Vertex AI job needs workerPoolSpecs[0] with exactly one replica"
            )
        offset = 0
        for p in worker_pools:
            if p == spec.task_type:
                break
            offset += len(pools.get(p, []))
        node_rank = offset + spec.index
        num_nodes = len(workers)
        lr, lws = _local(local_rank, local_world_size, env)
        g_rank = node_rank * lws + lr if rank is None else rank
        g_world = num_nodes * lws if world_size is None else world_size
        _check_rank(g_rank, g_world, "rank", "world_size")
    else:
        own = pools.get(spec.task_type, [])
        node_rank = spec.index
        num_nodes = max(len(own), spec.index + 1)
        lr, lws = 0, 1
        g_rank, g_world = -1, 0
        if role == REDUCER:
            _, entry_port = parse_address(own[spec.index])
            bind_port = port if port is not None else entry_port

    return ClusterInfo(
        role=role,
        reducers=reducer_addrs,
        workers=workers,
        node_rank=node_rank,
        num_nodes=num_nodes,
        local_rank=lr,
        local_world_size=lws,
        rank=g_rank,
        world_size=g_world,
        job_id=resolve_job_id(job_id, env),
        source=src,
        bind_port=bind_port,
        task_type=spec.task_type,
    )


def _check_rank(rank: Any, world_size: Any, rank_name: str, world_name: str) -> None:
    for name, value in ((rank_name, rank), (world_name, world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}={value!r} is not an integer")
    if world_size < 1:
        raise ConfigError(f"{world_name}={world_size} is not valid: the group needs at least one worker")
    if not 0 <= rank < world_size:
        raise ConfigError(
            f"{rank_name}={rank} is out of range for {world_name}={world_size}: need 0 <= rank < world size"
        )


def _from_rs(
    env: Mapping[str, str],
    *,
    reducers: Reducers,
    rank: int | None,
    world_size: int | None,
    local_rank: int | None,
    local_world_size: int | None,
    reducer_port: int | None,
    job_id: str | None,
) -> ClusterInfo | None:
    red_env = config.SETTINGS["reducers"].env
    rank_env = config.SETTINGS["rank"].env
    world_env = config.SETTINGS["world_size"].env
    explicit = _explicit_reducers(reducers)
    addrs = explicit if explicit is not None else config.get("reducers", None, env)
    if addrs is None:
        found = [config.SETTINGS[n].env for n in ("rank", "world_size") if config.env_text(n, env) is not None]
        if found:
            raise ConfigError(f"{_NO_CLUSTER}; found {' and '.join(found)} but {red_env} is not set")
        return None
    where = "reducers argument" if explicit is not None else red_env
    if reducer_port is not None:
        addrs = _with_port(addrs, check_port(reducer_port, "reducer_port"), where)
    addrs = _check_reducers(addrs, where)
    g_rank = config.get("rank", rank, env)
    g_world = config.get("world_size", world_size, env)
    missing = [n for n, v in ((rank_env, g_rank), (world_env, g_world)) if v is None]
    if missing:
        raise ConfigError(
            f"{where} gives {len(addrs)} reducer(s) but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: set {rank_env} and {world_env} "
            f"(global: one rank per process) or pass rank= and world_size="
        )
    _check_rank(
        g_rank, g_world, rank_env if rank is None else "rank", world_env if world_size is None else "world_size"
    )
    lr, lws = _local(local_rank, local_world_size, env)
    return ClusterInfo(
        role=WORKER,
        reducers=addrs,
        workers=[],
        node_rank=g_rank // lws,
        num_nodes=-(-g_world // lws),
        local_rank=lr,
        local_world_size=lws,
        rank=g_rank,
        world_size=g_world,
        job_id=resolve_job_id(job_id, env),
        source="RS_REDUCERS",
    )


def has_cluster(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment describes a cluster at all (CLUSTER_SPEC, TF_CONFIG or RS_REDUCERS)."""
    env = os.environ if env is None else env
    return core.cluster.spec_from_env(env.get) is not None or bool(env.get("RS_REDUCERS", "").strip())


def discover(
    env: Mapping[str, str] | None = None,
    *,
    reducers: Reducers = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    reducer_port: int | None = None,
    job_id: str | None = None,
) -> ClusterInfo:
    """Discover the cluster from CLUSTER_SPEC, else TF_CONFIG, else RS_REDUCERS/RS_RANK/RS_WORLD_SIZE.

    `env` defaults to os.environ. Explicit arguments override what the environment says; `rank` and
    `world_size` are global. Returns the info for any role (worker, reducer, evaluator).
    """
    env = os.environ if env is None else env
    kwargs: dict[str, Any] = dict(
        reducers=reducers,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        reducer_port=reducer_port,
        job_id=job_id,
    )
    spec = core.cluster.spec_from_env(env.get)
    info = _from_spec(spec, env=env, **kwargs) if spec is not None else _from_rs(env, **kwargs)
    if info is None:
        raise ConfigError(_NO_CLUSTER)
    logger.debug(
        "discovered cluster from %s: role=%s node=%d/%d local=%d/%d rank=%d/%d reducers=%s bind_port=%s job_id=%s",
        info.source,
        info.role,
        info.node_rank,
        info.num_nodes,
        info.local_rank,
        info.local_world_size,
        info.rank,
        info.world_size,
        ",".join(info.reducers),
        info.bind_port,
        info.job_id,
    )
    return info


def discover_worker(
    env: Mapping[str, str] | None = None,
    *,
    reducers: Reducers = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    reducer_port: int | None = None,
    job_id: str | None = None,
) -> ClusterInfo:
    """Like discover(), but this process must be a worker of the all-reduce group."""
    env = os.environ if env is None else env
    info = discover(
        env,
        reducers=reducers,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        reducer_port=reducer_port,
        job_id=job_id,
    )
    if info.role == EVALUATOR:
        raise ConfigError(f"this process is an evaluator ({info.task_type}) and is not part of the all-reduce group")
    if info.role == REDUCER:
        raise ConfigError(
            f"this process is a reducer ({info.task_type}, index {info.node_rank}), not a worker: "
            f"run `reduction-server serve` here instead of the training code"
        )
    return info


def discover_reducer(env: Mapping[str, str] | None = None) -> ClusterInfo:
    """For `reduction-server serve` without flags: this process must be workerpool2 (Vertex) or ps."""
    env = os.environ if env is None else env
    if core.cluster.spec_from_env(env.get) is None:
        raise ConfigError(
            "no cluster description found for a reducer: CLUSTER_SPEC (Vertex AI) and TF_CONFIG are "
            "not set; pass the listening port explicitly (--port / RS_PORT)"
        )
    info = discover(env)
    if info.role != REDUCER:
        expected = "workerpool2" if info.source == "CLUSTER_SPEC" else "ps"
        raise ConfigError(
            f"this process is {info.task_type} ({'an' if info.role == EVALUATOR else 'a'} {info.role}) in "
            f"{info.source}, not a reducer: "
            f"reducers must run as {expected}; pass --port to serve anyway"
        )
    return info
