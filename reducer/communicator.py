"""Communicator: the worker side of the reduction server (blocking all-reduce)."""
from __future__ import annotations

import logging
import os
from typing import Any, List, Optional, Sequence

import numpy as np

from . import config
from ._native import core
from .dtypes import check_op, wire_name
from .errors import ConfigError

log = logging.getLogger(__name__)


def _default_job_id() -> str:
    return os.environ.get("CLOUD_ML_JOB_ID") or "local"


class Communicator:
    """Connects this worker to every reducer and reduces buffers with the group.

    reducers: "host:port" addresses ("[v6]:port" for IPv6); rank/world_size: this
    worker's place in the group; group/job_id: which group to join on the reducers
    (a reducer serves many groups at once); timeout: seconds without progress
    before an operation raises; streams: TCP connections per reducer.
    Every argument left as None takes its RS_* environment variable, then its
    default (docs/configuration.md). The constructor returns once every worker of
    the group has connected (bounded by connect_timeout).
    """

    def __init__(
        self,
        reducers: Sequence[str],
        rank: int,
        world_size: int,
        group: Optional[str] = None,
        job_id: Optional[str] = None,
        timeout: Optional[float] = None,
        auth_token: Optional[str] = None,
        streams: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        connect_timeout: Optional[float] = None,
    ) -> None:
        if isinstance(reducers, str):
            reducers = [a.strip() for a in reducers.split(",") if a.strip()]
        self.reducers: List[str] = list(reducers)
        if not self.reducers:
            raise ConfigError("no reducer addresses given")
        self.rank = int(rank)
        self.world_size = int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not in range for world size {self.world_size}")
        self.group: str = config.get("group", group)
        self.job_id: str = config.get("job_id", job_id) or _default_job_id()
        self.timeout = float(config.get("timeout", timeout))
        self.streams = int(config.get("streams", streams))
        self.chunk_bytes = int(config.get("chunk_bytes", chunk_bytes))
        ct = config.get("connect_timeout", connect_timeout)
        self.connect_timeout = float(ct)
        token = config.resolve_auth_token(auth_token)
        log.debug("rank %d/%d connecting to %d reducers (%s)", self.rank, self.world_size, len(self.reducers),
                  ", ".join(self.reducers))
        self._client = core.Client(self.reducers, self.rank, self.world_size, self.group, self.job_id,
                                   self.timeout, self.connect_timeout, token or "", self.streams, self.chunk_bytes)

    # -- blocking all-reduce ------------------------------------------------------------------
    def allreduce(self, array: Any, op: str = "sum") -> Any:
        """Reduce `array` in place across the group and return it.

        Accepts numpy arrays (float32/64, float16, ml_dtypes.bfloat16, int32/64) and
        other C-contiguous buffers; see reducer.arrays for framework tensors.
        """
        from .arrays import host_view

        view = host_view(array)
        self.allreduce_raw(view.ptr, view.nbytes, view.dtype, op)
        return array

    def allreduce_raw(self, ptr: int, nbytes: int, dtype: str, op: str = "sum", tag: int = 0) -> None:
        """All-reduce `nbytes` of wire dtype `dtype` at address `ptr` (host memory), in place."""
        self._client.allreduce_ptr(int(ptr), int(nbytes), dtype, check_op(op), int(tag) & (2**64 - 1))

    def stats(self) -> dict:
        return dict(self._client.stats())

    def close(self) -> None:
        """Say goodbye to the reducers. Idempotent."""
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, world_size={self.world_size}, group={self.group!r}, "
                f"reducers={len(self.reducers)})")


def init(**overrides: Any) -> Communicator:
    """Discover the cluster (CLUSTER_SPEC, TF_CONFIG or RS_*) and connect.

    Keyword arguments override what discovery finds (reducers, rank, world_size,
    local_rank, local_world_size, reducer_port, job_id) and the Communicator's own
    options (group, timeout, auth_token, streams, chunk_bytes, connect_timeout).
    """
    from .cluster import discover_worker

    discovery_keys = ("reducers", "rank", "world_size", "local_rank", "local_world_size", "reducer_port", "job_id")
    disc = {k: overrides.pop(k) for k in discovery_keys if k in overrides}
    info = discover_worker(**disc)
    comm_kwargs = {k: overrides.pop(k) for k in list(overrides)
                   if k in ("group", "timeout", "auth_token", "streams", "chunk_bytes", "connect_timeout")}
    if overrides:
        raise ConfigError(f"unknown arguments to reducer.init(): {', '.join(sorted(overrides))}")
    log.info("rank %d of %d (from %s), %d reducers", info.rank, info.world_size, info.source, len(info.reducers))
    return Communicator(info.reducers, info.rank, info.world_size, job_id=info.job_id, **comm_kwargs)
