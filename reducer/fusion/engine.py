"""The fusion engine: the threads behind ``Communicator.allreduce_async`` and its handles.

Four threads share the work:

* the caller's thread only appends an *entry* (host memory, dtypes, op, name, fingerprint) to
  the submission list;
* the *fusion thread* decides when to probe, has the planner (reducer.fusion.planner) cut the
  agreed entries into rounds, turns each round into (address, length) *segments*, and on
  completion completes handles. A round's segments are the entries' own memory (the caller's
  CPU arrays, or the pinned buffer a device array was staged into): no packing copy, no
  unpacking copy, no cast. Compression (float32 sent as bfloat16/float16) is the transport's:
  a round of float32 entries sent as 16 bits passes their float32 segments with
  ``compression=``, and the client narrows each chunk as it sends it and widens each result
  chunk straight back into the segments;
* the *network thread* is the only one that calls the data client: it starts every round handed
  over as scatter-gather client rounds (``try_start_segments``: sent with writev straight from
  the segments, results received straight back into them; a round above CLIENT_ROUND_BYTES as
  several), several at once, and waits for the oldest (GIL released). So round n+1 streams while
  round n drains; rounds finish, and handles complete, in submission order;
* the *probe thread* runs the agreement probes on a client of its own (reducer group
  ``<group>/fusion-probe``), so a probe never queues behind data in flight.

Memory: rounds in flight are bounded by the client's ``max_rounds_in_flight``; the engine
allocates no data buffers of its own (the client's per-connection staging chunks for
compression are the transport's).

Agreed flush points. A partly filled buffer is never cut on one worker's say-so. Before each
batch of data rounds the workers run a 16-byte *probe* all-reduce (int64, op min) of
``[entries submitted here, -(1 if this worker wants a flush)]``. Its result is identical on every
worker: ``C`` = the number of entries every worker has submitted, ``F`` = whether any worker wants
a flush. Each worker then plans entries up to ``C``, and if ``F`` also cuts every partly filled
buffer. A worker wants a flush when a caller waits (``Handle.wait``, ``synchronize``) on an entry
that is not cut yet, or when its oldest waiting entry is older than ``cycle_time_ms``. So the
cycle timer, and where each worker calls ``wait``, only decide *when* a probe is sent; where
buffers are cut is a function of agreed values only. Probes are sequential (the next one is
sent once the previous one's cuts are handed to the network thread), while data rounds of
earlier batches are still in flight.

After an error the asynchronous path stops: every pending handle fails with the error (a
mismatch first goes through reducer.fusion.diagnosis, which names the differing tensor), later
``allreduce_async`` calls raise it. The blocking ``allreduce`` keeps working (the C++ client
reconnects to the group on its next call).
"""
from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Tuple

import numpy as np

from ..dtypes import BFLOAT16, check_op, wire_name
from ..errors import ConfigError, MismatchError, ReductionError, ReductionTimeout
from ..frameworks import stage
from ..lifetime import join_threads
from .diagnosis import Described, Diagnosis, History, fingerprint, round_tag
from .planner import Cut, Planner

log = logging.getLogger(__name__)

__all__ = ["Handle", "FusionEngine", "compression_dtype"]

PROBE_TAG = 0x3145424F52505352  # b"RSPROBE1", little-endian
_PROBE = 2  # a round kind besides the planner's FUSED and ALONE: the agreement probe
# A round larger than this on the wire goes to the client as several consecutive rounds of at most
# this many wire bytes (same cut on every worker; a compressed round's float32 segments hold twice
# as many bytes). The client plans chunks from a round's shard size on the wire (about shard/64,
# up to chunk_bytes): measured on loopback (docs/worker-library.md), 64 MiB rounds moved 8-13%
# slower than the same bytes as per-tensor rounds, and 8 MiB pieces as fast or faster.
CLIENT_ROUND_BYTES = 8 << 20


def compression_dtype(compression: Optional[str]) -> Optional[np.dtype]:
    """The 16-bit wire dtype for float32 under `compression` (None, 'bf16', 'fp16')."""
    if compression is None:
        return None
    c = str(compression).strip().lower()
    if c in ("", "none", "off", "no", "0", "false"):
        return None
    if c in ("bf16", "bfloat16"):
        return BFLOAT16
    if c in ("fp16", "float16", "half"):
        return np.dtype(np.float16)
    raise ConfigError(f"unknown compression {compression!r}; use 'bf16', 'fp16' or none")


def _copy_error(err: BaseException) -> BaseException:
    """A fresh exception of the same class (one instance raised in many threads would share a traceback)."""
    try:
        return type(err)(str(err))
    except Exception:  # pragma: no cover - every library error takes one message
        return ReductionError(str(err))


class Handle:
    """The pending result of one ``allreduce_async``.

    ``wait(timeout=None)`` returns the caller's array once it holds the reduced values (and
    asks for the buffer holding it to be sent now, rather than when it is full or the cycle
    time passes); ``done()`` tells without blocking. If the round failed, ``wait`` raises
    that error (every handle of the round, and every later one, gets it).
    """

    __slots__ = ("_engine", "_entry", "array", "name", "index", "_done", "_error", "_finished")

    def __init__(self, engine: "FusionEngine", entry: "_Entry", array: Any, name: Optional[str]) -> None:
        self._engine = engine
        self._entry: Optional[_Entry] = entry
        self.array = array  # what wait() returns: the caller's own array, reduced in place
        self.name = name
        self.index = -1  # position in the submitted sequence (0-based, per communicator)
        self._done = False  # set once, by the fusion thread (then the engine's _completion is notified)
        self._error: Optional[BaseException] = None
        self._finished = False

    def done(self) -> bool:
        return self._done

    def exception(self) -> Optional[BaseException]:
        """The error of a finished, failed handle (None while pending or on success)."""
        return self._error if self._done else None

    def wait(self, timeout: Optional[float] = None) -> Any:
        if not self._done:
            self._engine.request_flush(self.index + 1)
            if not self._engine.await_handles([self], timeout):
                raise ReductionTimeout(f"all-reduce of {self._describe()} not finished after {timeout} s")
        self._finish()
        if self._error is not None:
            raise _copy_error(self._error)
        return self.array

    # -- internal -----------------------------------------------------------------------
    def _finish(self) -> None:
        """Runs once on the waiting thread: e.g. make the current CUDA stream wait for the copy back."""
        if self._finished:
            return
        self._finished = True
        entry, self._entry = self._entry, None
        if entry is not None and self._error is None:
            entry.staged.finish()

    def _describe(self) -> str:
        entry = self._entry
        return entry.describe() if entry is not None else (repr(self.name) if self.name else "a tensor")

    def _set(self, error: Optional[BaseException]) -> None:
        """Mark done (the caller then notifies the engine's _completion, once for many handles)."""
        self._error = error
        self._done = True

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error else "done")
        return f"<reducer.Handle {self._describe()} {state}>"


class _Entry:
    __slots__ = ("index", "host", "wire", "wire_dt", "op", "nbytes", "name", "shape", "src", "staged", "handle", "t",
                 "fp")
    # host: the entry's memory (flat), of dtype src; wire / wire_dt: what travels (differs from src
    # only for float32 under compression, narrowed by the transport); nbytes: bytes on the wire

    def describe(self) -> str:
        return _describe(self.index, self.name, self.src, self.shape, self.op, self.wire)


def _describe(index: int, name: Optional[str], src: str, shape: Tuple[int, ...], op: str, wire: str) -> str:
    """How errors name a submitted tensor."""
    dims = "x".join(str(d) for d in shape) or "scalar"
    text = f"tensor #{index}"
    if name:
        text += f" {name!r}"
    text += f" ({src}[{dims}], op {op}"
    if wire != src:
        text += f", sent as {wire}"
    return text + ")"


class _Round:
    """One round in the agreed sequence: a probe, or a planner cut (FUSED or ALONE) of entries."""

    __slots__ = ("kind", "entries", "src", "wire", "compression", "op", "nbytes", "tag", "pieces", "next_piece",
                 "values")

    def __init__(self, kind: int, entries: List[_Entry], src: str, wire: str, op: str, nbytes: int) -> None:
        self.kind = kind
        self.entries = entries
        self.src = src  # the dtype of the segments' memory (the client's dtype argument)
        self.wire = wire  # the dtype on the wire
        # the client's compression argument: the 16-bit wire dtype of a float32 round, or ""
        self.compression = wire if wire != src else ""
        self.op = op
        self.nbytes = nbytes  # on the wire
        self.tag = 0
        # the client rounds this round is sent as: (address, length) segments, CLIENT_ROUND_BYTES at most
        # each on the wire
        self.pieces: List[List[Tuple[int, int]]] = []
        self.next_piece = 0  # pieces started so far (network thread)
        self.values: Optional[np.ndarray] = None  # the probe's two int64


def _split(segments: List[Tuple[int, int]], limit: int) -> List[List[Tuple[int, int]]]:
    """Segments cut into consecutive client rounds of at most `limit` bytes (a multiple of 8, so
    every cut falls between elements). Deterministic: the same round gives the same pieces."""
    out: List[List[Tuple[int, int]]] = [[]]
    room = limit
    for ptr, n in segments:
        while n:
            if room == 0:
                out.append([])
                room = limit
            take = min(n, room)
            out[-1].append((ptr, take))
            ptr, n, room = ptr + take, n - take, room - take
    return out if out[0] else []


def _segments(pieces: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """(address, length) pieces in order, empty ones dropped and adjacent ones merged."""
    out: List[Tuple[int, int]] = []
    for ptr, n in pieces:
        if n == 0:
            continue
        if out and out[-1][0] + out[-1][1] == ptr:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((ptr, n))
    return out


class FusionEngine:
    """The background machinery behind ``Communicator.allreduce_async`` (one per communicator).

    client: the C++ client (``try_start_segments``, ``start_segments``, ``wait``, ``in_flight``,
    ``connected``); threshold: fused buffer size in bytes (0 turns fusion off: one round per
    tensor, no probes); cycle_time_ms: age after which a worker asks for its partly filled buffers
    to be flushed (``inf`` = only on wait/synchronize); compression: None, 'bf16' or 'fp16';
    probe_client: makes the client the agreement probes run on (its own connection, so a probe
    never queues behind data; required unless fusion is off); diag_client: makes a fresh client
    for the fingerprint diagnosis (None disables it); timeout: bounds the diagnosis. Under
    compression, float32 entries go to the client as float32 segments with ``compression=``
    (the transport narrows and widens them chunk by chunk): the engine copies nothing.
    """

    def __init__(
        self,
        client: Any,
        *,
        threshold: int,
        cycle_time_ms: float,
        compression: Optional[str] = None,
        rank: int = 0,
        timeout: float = 30.0,
        probe_client: Optional[Callable[[], Any]] = None,
        diag_client: Optional[Callable[[], Any]] = None,
    ) -> None:
        if threshold < 0:
            raise ConfigError(f"fusion threshold must be >= 0 bytes, got {threshold}")
        cycle = float(cycle_time_ms)
        if math.isnan(cycle) or cycle < 0:
            raise ConfigError(f"cycle time must be >= 0 ms (inf: no timer), got {cycle_time_ms}")
        if threshold > 0 and probe_client is None:
            raise ConfigError("fusion needs a client for its agreement probes (probe_client)")
        self._client = client
        self._make_probe_client = probe_client
        self.threshold = int(threshold)
        self.cycle_time_ms = cycle
        self._cycle: Optional[float] = None if math.isinf(cycle) else cycle / 1000.0
        self.compression = compression_dtype(compression)
        self.rank = rank
        self.timeout = float(timeout)
        self._fusion_off = self.threshold == 0

        self._cv = threading.Condition()
        self._completion = threading.Condition(threading.Lock())  # handles done (waited on by callers)
        # submissions (caller threads, under _cv)
        self._submitted: Deque[_Entry] = deque()  # not yet planned, in order
        self._count = 0  # entries ever submitted
        self._unagreed_bytes = 0
        self._pending: Dict[int, _Entry] = {}  # submitted, not completed
        self._flush_upto = 0  # a caller waits for entries below this index
        self._history = History()  # fingerprints, for the diagnosis
        # planning (fusion thread, under _cv: the network thread reads it for the probe)
        self._agreed = 0  # C of the last probe: entries below it are planned
        self._planner: Planner[_Entry] = Planner(self.threshold)  # the fused buffers being filled
        self._plan: Deque[_Round] = deque()  # cut, not yet handed to the network thread
        self._probe_out = False  # a probe is wanted or running (fusion thread sets, completion clears)
        self._probe_next: Optional[_Round] = None  # handed to the probe thread
        self._probe_conn: Any = None  # the probe thread's client, made on the first probe
        self._probe_buf = np.zeros(2, np.int64)
        # network
        self._netq: Deque[_Round] = deque()  # ready to start, in the agreed order
        self._done: Deque[Tuple[_Round, Optional[BaseException]]] = deque()  # finished, in the same order
        self._net_error: Optional[BaseException] = None
        # life cycle
        self._error: Optional[BaseException] = None  # sticky: the engine has stopped
        self._closing = False
        # Counters identical on every worker (they follow the agreed rounds), and peaks that depend on timing.
        self.stats = {"rounds": 0, "probes": 0, "fused_rounds": 0, "tensors": 0, "bytes": 0, "flushes": 0,
                      "segments": 0, "compressed_tensors": 0}
        self.peaks = {"max_in_flight": 0}
        self._diagnosis: Optional[Diagnosis] = None
        if diag_client is not None:
            self._diagnosis = Diagnosis(diag_client, rank=rank, threshold=self.threshold, lock=self._cv,
                                        history=self._history, count=lambda: self._count)

        self._fusion_thread = threading.Thread(target=self._fusion_main, name=f"reducer-fusion-{rank}", daemon=True)
        self._net_thread = threading.Thread(target=self._net_main, name=f"reducer-net-{rank}", daemon=True)
        self._probe_thread = threading.Thread(target=self._probe_main, name=f"reducer-probe-{rank}", daemon=True)
        self._threads = (self._fusion_thread, self._net_thread, self._probe_thread)
        for th in self._threads:
            th.start()

    # ================================================================ caller side
    def submit(self, array: Any, op: str = "sum", name: Optional[str] = None) -> Handle:
        op = check_op(op)
        if name is not None and not isinstance(name, str):
            name = str(name)
        with self._cv:
            self._check_usable()
        staged = stage(array)
        host = staged.host
        src = wire_name(host.dtype)
        wire_dt = host.dtype
        if self.compression is not None and host.dtype == np.float32:
            wire_dt = self.compression
        e = _Entry()
        e.host = host.reshape(-1)
        e.src = src
        e.wire = wire_name(wire_dt)
        e.wire_dt = wire_dt
        e.op = op
        e.nbytes = int(e.host.size) * wire_dt.itemsize
        e.name = name
        e.shape = staged.shape
        e.staged = staged
        e.fp = fingerprint(Described(e.nbytes, src, e.wire, op, int(e.host.size), e.shape, name))
        handle = Handle(self, e, array, name)
        e.handle = handle
        with self._cv:
            try:
                self._check_usable()
            except BaseException:
                staged.release()
                raise
            e.index = handle.index = self._count
            self._count += 1
            e.t = time.monotonic()
            self._submitted.append(e)
            before = self._unagreed_bytes
            self._unagreed_bytes += e.nbytes
            self._pending[e.index] = e
            self._history.add(e.fp, functools.partial(_describe, e.index, name, src, e.shape, op, e.wire),
                              self._lowest_pending)
            # Wake the fusion thread only when this entry changes what it waits for: fusion off (plan
            # it now), the first entry not yet agreed (starts the cycle timer), or a threshold's worth
            # of entries not yet agreed (probe now). Waking it per entry only costs the caller time.
            if self._fusion_off or len(self._submitted) == 1 or before < self.threshold <= self._unagreed_bytes:
                self._cv.notify_all()
        return handle

    def request_flush(self, upto: int) -> None:
        """Ask for every entry below index `upto` to be sent now (wait/synchronize)."""
        with self._cv:
            if upto > self._flush_upto:
                self._flush_upto = upto
                self._cv.notify_all()

    def synchronize(self, timeout: Optional[float] = None, raise_errors: bool = True) -> None:
        """Wait until everything submitted so far is reduced; raise the first error."""
        with self._cv:
            if raise_errors and self._error is not None:
                raise _copy_error(self._error)  # the step is incomplete even if no handle is pending
            if raise_errors and self._closing:
                raise ReductionError("the communicator is closed")
            handles = [e.handle for e in self._pending.values()]
            if self._count > self._flush_upto:
                self._flush_upto = self._count
                self._cv.notify_all()
        if not self.await_handles(handles, timeout):
            if raise_errors:
                late = next(h for h in handles if not h._done)
                raise ReductionTimeout(f"synchronize: {late._describe()} not finished after {timeout} s")
            return
        first_error = None
        for h in handles:
            h._finish()
            if h._error is not None and first_error is None:
                first_error = h._error
        if raise_errors and first_error is not None:
            raise _copy_error(first_error)

    def await_handles(self, handles: List[Handle], timeout: Optional[float]) -> bool:
        """Wait until every handle is done; False if `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._completion:
            for h in handles:
                while not h._done:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._completion.wait(left)
        return True

    def _notify_done(self) -> None:
        with self._completion:
            self._completion.notify_all()

    def stop(self, join_timeout: Optional[float] = None) -> None:
        """Stop the three threads; handles still pending fail. Idempotent."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._close_probe_conn()
        t = self.timeout + 5.0 if join_timeout is None else join_timeout
        deadline = time.monotonic() + t  # idle threads end at once; one inside a round may take longer
        for th in self._threads:
            if th is not threading.current_thread():
                th.join(max(0.0, deadline - time.monotonic()))
        self._fail_all(ReductionError("the communicator was closed before this all-reduce finished"))

    def join(self, timeout: float) -> bool:
        """After stop(): wait up to `timeout` seconds for the threads to end (once the client is
        closed, none stays in a round); False, with a WARNING naming them, if one still runs."""
        return join_threads(self._threads, timeout, f"reducer.fusion (rank {self.rank})")

    # ================================================================ fusion thread
    def _fusion_main(self) -> None:
        try:
            while True:
                with self._cv:
                    while True:
                        if self._closing or self._error is not None:
                            return
                        now = time.monotonic()
                        if self._done or (self._fusion_off and self._submitted) or self._plan \
                                or self._want_probe(now):
                            break
                        self._cv.wait(self._sleep_for(now))
                    done = list(self._done)
                    self._done.clear()
                    if self._fusion_off:  # no probes: every entry goes alone as soon as it is submitted
                        self._plan_range(self._count, flush=False)
                for rnd, err in done:
                    self._complete(rnd, err)
                    if self._error is not None:
                        return
                self._prepare_ready()
                with self._cv:
                    if self._want_probe(time.monotonic()):
                        rnd = _Round(_PROBE, [], "int64", "int64", "min", 16)
                        rnd.tag = PROBE_TAG
                        rnd.values = self._probe_buf
                        self._probe_out = True
                        self._probe_next = rnd
                        self._cv.notify_all()
        except BaseException as exc:  # a bug or an interpreter shutdown: fail loudly, never hang
            log.exception("fusion thread failed")
            err = exc if isinstance(exc, ReductionError) else ReductionError(f"fusion thread failed: {exc!r}")
            self._die(err)

    def _uncut_heads(self) -> List[_Entry]:
        """The oldest entry not yet planned and the first entry of every buffer being filled (caller holds _cv)."""
        heads = list(self._planner.heads())
        if self._submitted:
            heads.append(self._submitted[0])
        return heads

    def _oldest(self) -> Optional[float]:
        """Submission time of the oldest entry not yet cut (caller holds _cv)."""
        return min((e.t for e in self._uncut_heads()), default=None)

    def _min_uncut(self) -> int:
        return min((e.index for e in self._uncut_heads()), default=self._count)

    def _lowest_pending(self) -> int:
        """Index of the first entry not completed (caller holds _cv)."""
        return min(self._pending) if self._pending else self._count

    def _wants_flush(self, now: float) -> bool:
        if self._flush_upto > self._min_uncut():
            return True
        if self._cycle is None:
            return False
        oldest = self._oldest()
        return oldest is not None and now - oldest >= self._cycle

    def _want_probe(self, now: float) -> bool:
        if self._fusion_off or self._probe_out or self._plan or self._error is not None:
            return False
        if not self._submitted and not self._planner.has_open():
            return False
        if self._unagreed_bytes >= self.threshold and self._submitted:
            return True
        return self._wants_flush(now)

    def _sleep_for(self, now: float) -> Optional[float]:
        if self._cycle is None or self._probe_out or self._plan or self._fusion_off:
            return None
        oldest = self._oldest()
        if oldest is None:
            return None
        return max(0.0005, oldest + self._cycle - now)

    def _round(self, cut: Cut[_Entry]) -> _Round:
        entries = cut.entries  # one planner key: the same (src, wire, op) for all of them
        e0 = entries[0]
        rnd = _Round(cut.kind, entries, e0.src, e0.wire, e0.op, cut.nbytes)
        rnd.tag = round_tag(cut.kind, rnd.wire, rnd.op, rnd.nbytes, ((e.index, e.fp.dhash) for e in entries))
        return rnd

    def _plan_range(self, agreed: int, flush: bool) -> None:
        """Plan entries [self._agreed, agreed) (caller holds _cv). Deterministic given agreed values."""
        if agreed < self._agreed or agreed > self._count:
            raise MismatchError(
                f"fusion probes disagree: the workers agreed on {agreed} tensors but this worker has planned "
                f"{self._agreed} and submitted {self._count} (was a worker restarted?)")
        cuts: List[Cut[_Entry]] = []
        for _ in range(agreed - self._agreed):
            e = self._submitted.popleft()
            self._unagreed_bytes -= e.nbytes
            cuts += self._planner.add(e)
        self._agreed = agreed
        if flush:
            self.stats["flushes"] += 1
            cuts += self._planner.flush()
        self._plan.extend(self._round(c) for c in cuts)

    def _prepare_ready(self) -> None:
        """Turn the cut rounds into segments and hand them to the network thread, in order, together:
        the network thread starts all of them before it blocks on the oldest one."""
        batch: List[_Round] = []
        while True:
            with self._cv:
                if not self._plan:
                    if batch:
                        self._netq.extend(batch)
                        self._cv.notify_all()
                    return
                rnd = self._plan.popleft()
            self._prepare(rnd)
            batch.append(rnd)

    def _prepare(self, rnd: _Round) -> None:
        """The round's segments: the entries' own memory (float32 bytes for a compressed round: the
        client narrows them), cut into client rounds of at most CLIENT_ROUND_BYTES on the wire."""
        pieces: List[Tuple[int, int]] = []
        for e in rnd.entries:
            e.staged.before_read()  # a device array's copy to the host has landed
            if e.nbytes:
                pieces.append((int(e.host.ctypes.data), int(e.host.nbytes)))
        e0 = rnd.entries[0]
        widen = e0.host.dtype.itemsize // e0.wire_dt.itemsize  # host bytes per wire byte: 2 compressed, else 1
        rnd.pieces = _split(_segments(pieces), CLIENT_ROUND_BYTES * widen)

    def _complete(self, rnd: _Round, err: Optional[BaseException]) -> None:
        if err is not None:
            if self._error is None:
                self._die(self._diagnose(err))
            return
        if rnd.kind == _PROBE:
            agreed, flush = int(rnd.values[0]), int(-rnd.values[1]) > 0
            with self._cv:
                self._probe_out = False
                self._plan_range(agreed, flush)
            return
        for e in rnd.entries:
            e.staged.after_write()
        with self._cv:
            for e in rnd.entries:
                self._pending.pop(e.index, None)
        for e in rnd.entries:
            e.handle._set(None)
        self._notify_done()

    # ================================================================ network thread
    # The network thread is the only thread of the engine that calls the client: it starts every
    # round handed over (up to the client's max_rounds_in_flight), then waits for the oldest, and
    # again. So round n+1 streams while round n drains, results are reported in submission order,
    # and once a round has failed no later round is started (the client would reconnect for it).
    def _net_main(self) -> None:
        # (round, client round id or None, error, whether it is the round's last piece)
        started: Deque[Tuple[_Round, Optional[int], Optional[BaseException], bool]] = deque()
        failed: Optional[_Round] = None  # a round already reported failed (its later pieces are dropped)
        while True:
            with self._cv:
                while not started and not self._netq and not self._closing and self._error is None:
                    self._cv.wait()
                if self._closing or self._error is not None:
                    return
            self._start_ready(started)
            if not started:
                continue
            rnd, rid, err, last = started.popleft()
            if err is None and rid is not None:
                try:
                    self._client.wait(rid)
                except BaseException as exc:
                    err = self._net_failure(rnd, exc)
            if rnd is failed or (err is None and not last):
                continue
            if err is not None:
                failed = rnd
            with self._cv:
                if err is None and rnd.nbytes:  # a round of 0 bytes is never sent, nor counted
                    self._count_round(rnd)
                if err is not None and self._net_error is None:
                    self._net_error = err
                self._done.append((rnd, err))
                self._cv.notify_all()

    def _start_ready(self, started: Deque[Tuple[_Round, Optional[int], Optional[BaseException], bool]]) -> None:
        """Start the rounds handed over, piece by piece in order, while the client takes more."""
        while True:
            if started and not self._client.connected:
                # A round in flight failed inside an earlier call (the client dropped the session):
                # starting another would reconnect this worker alone. Its wait() reports the error.
                return
            with self._cv:
                if not self._netq or self._closing or self._error is not None:
                    return
                rnd = self._netq[0]
                err = self._net_error
                if err is not None or not rnd.pieces:  # after an error nothing more is sent; 0 bytes: nothing
                    self._netq.popleft()
            if err is not None or not rnd.pieces:
                started.append((rnd, None, err, True))
                continue
            try:
                rid = self._start(rnd, rnd.pieces[rnd.next_piece], block=not started)
            except BaseException as exc:
                err = self._net_failure(rnd, exc)
                with self._cv:
                    if self._net_error is None:
                        self._net_error = err
                    if self._netq and self._netq[0] is rnd:
                        self._netq.popleft()
                started.append((rnd, None, err, True))
                continue
            if rid is None:  # the client has max_rounds_in_flight rounds: wait for the oldest first
                return
            rnd.next_piece += 1
            last = rnd.next_piece == len(rnd.pieces)
            if last:
                with self._cv:
                    if self._netq and self._netq[0] is rnd:
                        self._netq.popleft()
            started.append((rnd, rid, None, last))
            self.peaks["max_in_flight"] = max(self.peaks["max_in_flight"], int(self._client.in_flight))

    def _start(self, rnd: _Round, segments: List[Tuple[int, int]], block: bool) -> Optional[int]:
        """Start one client round of `rnd`: `segments`, sent and received in place; None if the
        client has no room (only when `block` is false). The one call that puts data on the wire.

        A compressed round (float32 entries sent as 16 bits) passes its float32 segments with
        ``compression=`` its wire dtype: the client narrows each chunk as it sends it and widens
        each result chunk straight back into the segments (docs/worker-library.md, "Compression").
        """
        if block:
            return int(self._client.start_segments(segments, rnd.src, rnd.op, rnd.tag, compression=rnd.compression))
        rid = self._client.try_start_segments(segments, rnd.src, rnd.op, rnd.tag, compression=rnd.compression)
        return None if rid is None else int(rid)

    def _net_failure(self, rnd: _Round, exc: BaseException) -> BaseException:
        """The error to report for a round the client failed (typed: the client's ReductionError subclasses)."""
        if not isinstance(exc, ReductionError):
            return ReductionError(f"all-reduce failed: {exc!r}")
        if rnd.kind == _PROBE and isinstance(exc, ReductionTimeout):
            return ReductionTimeout(
                f"{exc} [while agreeing on the next fused buffers: this worker has submitted "
                f"{self._count} tensors and waits for every other worker to submit more or to flush; "
                "all workers must submit the same sequence of tensors]")
        return exc

    def _count_round(self, rnd: _Round) -> None:
        """Count a finished round (caller holds _cv: the network and probe threads both count)."""
        st = self.stats
        st["rounds"] += 1
        if rnd.kind == _PROBE:
            st["probes"] += 1
            return
        st["tensors"] += len(rnd.entries)
        st["bytes"] += rnd.nbytes
        st["segments"] += sum(len(p) for p in rnd.pieces)
        if rnd.compression:
            st["compressed_tensors"] += len(rnd.entries)
        if len(rnd.entries) > 1:
            st["fused_rounds"] += 1

    # ================================================================ probe thread
    # Agreement probes run on their own client (reducer group ``<group>/fusion-probe``, failing
    # over like the data client), so a probe never waits behind the data rounds in flight: the next batch is cut
    # while the previous one streams. Probes are still strictly sequential and identical in number
    # and order on every worker (the next one is only sent after the previous one's cuts).
    def _probe_main(self) -> None:
        while True:
            with self._cv:
                while self._probe_next is None and not self._closing and self._error is None:
                    self._cv.wait()
                if self._closing or self._error is not None:
                    return
                rnd, self._probe_next = self._probe_next, None
            err: Optional[BaseException] = None
            try:
                client = self._probe_client()
                if client is None:
                    return  # closing
                with self._cv:  # the values go out at once: they are as fresh as they can be
                    rnd.values[0] = self._count
                    rnd.values[1] = -1 if self._wants_flush(time.monotonic()) else 0
                client.allreduce_ptr(int(rnd.values.ctypes.data), 16, "int64", "min", PROBE_TAG)
            except BaseException as exc:
                err = self._net_failure(rnd, exc)
            with self._cv:
                if err is None:
                    self._count_round(rnd)
                self._done.append((rnd, err))
                self._cv.notify_all()

    def _probe_client(self) -> Any:
        """The probe thread's client (connects on first use); None once the engine stops."""
        with self._cv:
            conn = self._probe_conn
        if conn is not None:
            return conn
        conn = self._make_probe_client()
        with self._cv:
            if not self._closing and self._error is None:
                self._probe_conn = conn
                return conn
        conn.close()
        return None

    def _close_probe_conn(self) -> None:
        """Close the probe client: a probe waiting for the other workers fails at once."""
        with self._cv:
            conn, self._probe_conn = self._probe_conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # pragma: no cover - best effort
                pass

    # ================================================================ failure
    def _die(self, err: BaseException) -> None:
        with self._cv:
            if self._error is None:
                self._error = err
            self._cv.notify_all()
        self._close_probe_conn()
        self._fail_all(self._error)

    def _fail_all(self, err: BaseException) -> None:
        with self._cv:
            entries = list(self._pending.values())
            self._pending.clear()
            self._submitted.clear()
            self._planner.clear()
            self._plan.clear()
            self._netq.clear()
        for e in entries:
            try:
                e.staged.release()
            except Exception:  # pragma: no cover - best effort
                pass
            e.handle._set(err)
        self._notify_done()

    def _check_usable(self) -> None:
        if self._error is not None:
            raise _copy_error(self._error)
        if self._closing:
            raise ReductionError("the communicator is closed")

    # ================================================================ mismatch diagnosis
    def _diagnose(self, err: BaseException) -> BaseException:
        """Turn a failed round into the most useful error: name the first differing tensor."""
        if self._diagnosis is None:
            return err
        with self._cv:
            base = self._lowest_pending()
        return self._diagnosis.explain(err, base)
