"""Communicator: the worker side of the reduction server (blocking all-reduce)."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from . import config, lifetime
from ._native import core
from .addresses import resolve_job_id
from .arrays import host_view
from .cluster import discover_worker
from .dtypes import check_op
from .errors import ConfigError, ReductionError
from .fusion import FusionEngine

log = logging.getLogger(__name__)

PROBE_CHUNK_BYTES = 4096  # the fusion probe group's chunk size: its rounds are 16 bytes
EXIT_GRACE = 1.0  # seconds a round in flight at interpreter exit gets to finish before it fails
# How often a client that no call drives reads its links (a reducer's loss, the failover exchange).
IDLE_PROGRESS_S = 0.05


def _client(*args: Any, **kwargs: Any) -> Any:
    """A core.Client whose links are read while no call drives it (Client.progress_while_idle,
    with failover): a worker holds several clients of one job (the fusion engine's data and probe
    groups), and a failover exchange on one may need another worker's idle client of its group."""
    client = core.Client(*args, **kwargs)
    client.progress_while_idle(IDLE_PROGRESS_S)
    return client


class Communicator:
    """Connects this worker to every reducer and reduces buffers with the group.

    reducers: "host:port" addresses ("[v6]:port" for IPv6); rank/world_size: this
    worker's place in the group; group/job_id: which group to join on the reducers
    (a reducer serves many groups at once); timeout: seconds without progress
    before an operation raises; streams: TCP connections per reducer.
    Every argument left as None takes its RS_* environment variable, then its
    default (docs/configuration.md). The constructor returns once every worker of
    the group has connected (bounded by connect_timeout).

    fusion_threshold / cycle_time_ms configure allreduce_async (tensor fusion,
    docs/worker-library.md): fused buffer size in bytes (0 = fusion off), age in ms after
    which a partly filled buffer is flushed (inf = only on wait/synchronize). compression
    ('bf16', 'fp16' or None) is the wire compression of float32 buffers, for every all-reduce
    of this communicator unless a call says otherwise. integrity ('on' / 'required' / 'off')
    asks every reducer for frame integrity (AES-GMAC tags on every frame, needs auth_token;
    docs/security.md): a frame modified, replayed, reordered or dropped on the way then fails
    the round with a ProtocolError.
    """

    def __init__(
        self,
        reducers: Sequence[str],
        rank: int,
        world_size: int,
        group: str | None = None,
        job_id: str | None = None,
        timeout: float | None = None,
        auth_token: str | None = None,
        streams: int | None = None,
        chunk_bytes: int | None = None,
        connect_timeout: float | None = None,
        fusion_threshold: int | str | None = None,
        cycle_time_ms: float | None = None,
        compression: str | None = None,
        socket_buffer: int | None = None,
        window: int | None = None,
        max_rounds_in_flight: int | None = None,
        failover: bool | None = None,
        integrity: str | None = None,
    ) -> None:
        # First, so that close() / __del__ / _fusion() work on an object whose constructor failed.
        self._pid = os.getpid()  # a forked child's copy is the parent's: it closes nothing (_shutdown)
        self._closed = False
        self._client: Any = None
        self._engine: Any = None
        self._engine_lock = threading.Lock()
        if isinstance(reducers, str):
            reducers = [a.strip() for a in reducers.split(",") if a.strip()]
        self.reducers: list[str] = list(reducers)
        if not self.reducers:
            raise ConfigError("no reducer addresses given")
        self.rank = int(rank)
        self.world_size = int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not in range for world size {self.world_size}")
        self.group: str = config.get("group", group)
        self.job_id: str = resolve_job_id(job_id)
        self.timeout = float(config.get("timeout", timeout))
        self.streams = int(config.get("streams", streams))
        self.chunk_bytes = int(config.get("chunk_bytes", chunk_bytes))
        ct = config.get("connect_timeout", connect_timeout)
        self.connect_timeout = float(ct)
        token = config.resolve_auth_token(auth_token)
        self._auth_token = token or ""
        self.integrity: bool = config.worker_integrity(integrity)
        self.failover = bool(config.get("failover", failover))
        ft = config.get("fusion_threshold", fusion_threshold)
        self.fusion_threshold = config.parse_size(ft) if isinstance(ft, str) else int(ft)
        if self.fusion_threshold < 0:
            raise ConfigError(f"fusion_threshold must be >= 0 bytes, got {self.fusion_threshold}")
        self.cycle_time_ms = float(config.get("cycle_time_ms", cycle_time_ms))
        self.compression: str | None = config.get("compression", compression)
        # Validated now, not on the first all-reduce: the core's compression for float32.
        self._float32_wire = config.compression_wire(self.compression) or ""
        log.debug(
            "rank %d/%d connecting to %d reducers (%s)",
            self.rank,
            self.world_size,
            len(self.reducers),
            ", ".join(self.reducers),
        )
        self._client = _client(
            self.reducers,
            self.rank,
            self.world_size,
            group=self.group,
            job_id=self.job_id,
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
            auth_token=token or "",
            streams=self.streams,
            chunk_bytes=self.chunk_bytes,
            socket_buffer=config.socket_buffer_arg(socket_buffer),
            window=int(config.get("window", window)),
            max_rounds_in_flight=int(config.get("max_rounds_in_flight", max_rounds_in_flight)),
            failover=self.failover,
            integrity=self.integrity,
        )
        lifetime.close_at_exit(self, lifetime.CONNECTIONS)  # a process that never calls close()

    # -- blocking all-reduce ------------------------------------------------------------------
    def allreduce(self, array: Any, op: str = "sum", compression: str | None = None) -> Any:
        """Reduce `array` in place across the group and return it.

        Accepts numpy arrays (float32/64, float16, ml_dtypes.bfloat16, int32/64) and
        other C-contiguous buffers; see reducer.arrays for framework tensors.
        compression: 'bf16' / 'fp16' send a float32 array as 16-bit values (converted chunk by
        chunk in the transport; each input rounded once, summed in float32, rounded once);
        'none' sends it as it is; None takes the communicator's setting (RS_COMPRESSION).
        """
        view = host_view(array)
        self.allreduce_raw(view.ptr, view.nbytes, view.dtype, op, compression=compression)
        return array

    def allreduce_raw(
        self, ptr: int, nbytes: int, dtype: str, op: str = "sum", tag: int = 0, compression: str | None = None
    ) -> None:
        """All-reduce `nbytes` of wire dtype `dtype` at address `ptr` (host memory), in place.

        compression: as in allreduce (an explicit 'bf16' / 'fp16' needs dtype float32)."""
        self._client.wait(self._start(ptr, nbytes, dtype, op, tag, compression))

    def allreduce_raw_async(
        self, ptr: int, nbytes: int, dtype: str, op: str = "sum", tag: int = 0, compression: str | None = None
    ) -> RawRound:
        """Start allreduce_raw and return at once: a RawRound (.wait(), .done()).

        One round, no fusion; the memory must stay valid and untouched until the round is done.
        Rounds reach the reducers in the order they are started (after allreduce_async work
        submitted earlier), so every worker must start the same rounds in the same order."""
        return RawRound(self._client, self._start(ptr, nbytes, dtype, op, tag, compression))

    def _start(self, ptr: int, nbytes: int, dtype: str, op: str, tag: int, compression: str | None) -> int:
        wire = self._compression_for(dtype, compression)
        if self._engine is not None:
            # Rounds go to the reducers in program order: finish what allreduce_async queued first.
            self._engine.synchronize(raise_errors=False)
        return int(
            self._client.start_ptr(int(ptr), int(nbytes), dtype, check_op(op), int(tag) & (2**64 - 1), compression=wire)
        )

    def _compression_for(self, dtype: str, compression: str | None) -> str:
        """The core's compression argument ('' or a 16-bit wire name) for a round of `dtype`.

        The setting (compression=None) applies to float32 only; an explicit one to any dtype
        (the core refuses it for anything but float32, with a ConfigError)."""
        if compression is None:
            return self._float32_wire if dtype == "float32" else ""
        return config.compression_wire(compression) or ""

    # -- asynchronous all-reduce with tensor fusion (reducer.fusion) --------------------------
    def allreduce_async(self, array: Any, op: str = "sum", name: str | None = None) -> Any:
        """Start reducing `array` in place; returns a reducer.Handle (.wait(), .done()).

        Small arrays are fused per (dtype, op) and sent together as one round straight from
        their own memory (docs/worker-library.md). Every worker must submit the same sequence of arrays
        (sizes, dtypes, ops, names); a difference raises MismatchError on every worker,
        naming the first differing tensor. Do not touch `array` until the handle is done.
        Accepts numpy arrays, torch tensors (CPU and CUDA), CuPy arrays, DLPack objects.
        """
        return self._fusion().submit(array, op, name)

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for every allreduce_async submitted so far; raises the first error."""
        if self._engine is not None:
            self._engine.synchronize(timeout)

    def fusion_stats(self, peaks: bool = False) -> dict:
        """Counters of the asynchronous path, identical on every worker: rounds, probes, fused_rounds,
        tensors, bytes (on the wire), flushes, segments, compressed_tensors. With peaks=True also
        max_in_flight, which depends on timing (docs/worker-library.md)."""
        engine = self._engine
        if engine is None:
            return {}
        out = dict(engine.stats)
        if peaks:
            out.update(engine.peaks)
        return out

    def _fusion(self) -> Any:
        if os.getpid() != self._pid:  # the engine's threads are the parent's: a handle would never finish
            raise ConfigError(
                "this Communicator was made by the parent of this forked process: make a new one in the child"
            )
        engine = self._engine
        if engine is None:
            with self._engine_lock:
                engine = self._engine
                if engine is None:
                    if self._closed:
                        raise ReductionError("the communicator is closed")
                    engine = self._engine = FusionEngine(
                        self._client,
                        threshold=self.fusion_threshold,
                        cycle_time_ms=self.cycle_time_ms,
                        compression=self.compression,
                        rank=self.rank,
                        timeout=self.timeout,
                        probe_client=self._probe_client_factory(),
                        diag_client=self._diagnostic_client_factory(),
                    )
        return engine

    def _side_client_factory(self, suffix: str, reducers: Sequence[str], chunk_bytes: int) -> Any:
        """Makes a separate client for the fusion engine: reducer group `<group><suffix>`, one
        connection per reducer, connect bounded by the timeout.

        A partial, not a bound method: the engine's threads must not keep the Communicator alive."""
        return functools.partial(
            _client,
            list(reducers),
            self.rank,
            self.world_size,
            group=self.group + suffix,
            job_id=self.job_id,
            timeout=self.timeout,
            connect_timeout=min(self.connect_timeout, self.timeout),
            auth_token=self._auth_token,
            streams=1,
            chunk_bytes=chunk_bytes,
            failover=self.failover,
            integrity=self.integrity,
        )

    def _diagnostic_client_factory(self) -> Any:
        """Connections for the fusion fingerprint check (made when a round fails)."""
        return self._side_client_factory("/fusion-check", self.reducers, self.chunk_bytes)

    def _probe_client_factory(self) -> Any:
        """The connections the fusion agreement probes run on (16-byte rounds, small chunks).

        Every reducer, like the data rounds: a 16-byte round goes to one reducer (rounds are
        rotated over them, protocol/plan.h), and a lost reducer fails over like any other,
        so the probes survive the loss of any reducer but the last."""
        return self._side_client_factory("/fusion-probe", self.reducers, PROBE_CHUNK_BYTES)

    def stats(self) -> dict:
        return dict(self._client.stats())

    def close(self) -> None:
        """Say goodbye to the reducers. Idempotent. Stops the allreduce_async threads first
        (handles still pending then fail: call synchronize() before close()); a round in flight
        gets up to the timeout to finish. Every thread of this communicator has ended on return
        (or is named in a WARNING: docs/pytorch.md, "Shutdown")."""
        self._shutdown(grace=None)

    def close_at_exit(self) -> None:
        """close() at interpreter exit (reducer.lifetime), for a communicator never closed: a round
        still in flight gets EXIT_GRACE seconds, then fails."""
        self._shutdown(grace=EXIT_GRACE)

    def _shutdown(self, grace: float | None) -> None:
        self._closed = True
        if os.getpid() != self._pid:
            # A forked child (a DataLoader worker, ...): the connections, threads and locks are the
            # parent's. Nothing is sent, shut down, stopped or waited for (the core's client does the
            # same for itself: Client.inherited, docs/operations.md "fork").
            return
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.stop(join_timeout=grace)  # idle threads end at once
        if self._client is not None:
            self._client.close()  # rounds still in flight fail: a thread waiting for one returns
        if engine is not None:
            engine.join(lifetime.EXIT_JOIN_TIMEOUT)
        lifetime.forget(self)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"Communicator(rank={self.rank}, world_size={self.world_size}, group={self.group!r}, "
            f"reducers={len(self.reducers)})"
        )


class RawRound:
    """A round started by Communicator.allreduce_raw_async: wait() blocks until its result is in
    place (bounded by the communicator's timeout), done() does not block; both raise the round's
    error (every time they are asked)."""

    __slots__ = ("_client", "_id", "_lock", "_finished", "_error")

    def __init__(self, client: Any, round_id: int) -> None:
        self._client = client
        self._id = round_id
        self._lock = threading.Lock()
        self._finished = False
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._settle(block=False)

    def wait(self) -> None:
        self._settle(block=True)

    def _settle(self, block: bool) -> bool:
        with self._lock:
            if not self._finished:  # the core forgets a round once it reported it: ask it once
                try:
                    if block:
                        self._client.wait(self._id)
                        self._finished = True
                    else:
                        self._finished = bool(self._client.test(self._id))
                except Exception as exc:
                    self._finished, self._error = True, exc
            if self._error is not None:
                raise self._error
            return self._finished

    def __repr__(self) -> str:
        state = "pending" if not self._finished else ("failed" if self._error else "done")
        return f"<reducer.RawRound {self._id} {state}>"


def _communicator_options() -> set[str]:
    """Communicator's keyword options, read off its signature (init() accepts exactly these)."""
    params = inspect.signature(Communicator.__init__).parameters
    return set(params) - {"self", "reducers", "rank", "world_size", "job_id"}


def init(**overrides: Any) -> Communicator:
    """Discover the cluster (CLUSTER_SPEC, TF_CONFIG or RS_*) and connect.

    Keyword arguments override what discovery finds (reducers, rank, world_size,
    local_rank, local_world_size, reducer_port, job_id) and take every keyword option of
    Communicator (group, timeout, failover, ...: its signature is the one list).
    """
    discovery_keys = ("reducers", "rank", "world_size", "local_rank", "local_world_size", "reducer_port", "job_id")
    disc = {k: overrides.pop(k) for k in discovery_keys if k in overrides}
    info = discover_worker(**disc)
    comm_kwargs = {k: overrides.pop(k) for k in list(overrides) if k in _communicator_options()}
    if overrides:
        raise ConfigError(f"unknown arguments to reducer.init(): {', '.join(sorted(overrides))}")
    log.info("rank %d of %d (from %s), %d reducers", info.rank, info.world_size, info.source, len(info.reducers))
    return Communicator(info.reducers, info.rank, info.world_size, job_id=info.job_id, **comm_kwargs)
