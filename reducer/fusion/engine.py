"""The fusion engine: the threads behind ``Communicator.allreduce_async`` and its handles.

Three threads share the work:

* the caller's thread only appends an *entry* (host memory, dtypes, op, name, fingerprint) to
  the submission list;
* the *fusion thread* runs the agreement probes, has the planner (reducer.fusion.planner) cut
  the agreed entries into rounds, packs fused rounds into two reusable fusion buffers (double
  buffering), unpacks results and completes handles;
* the *network thread* runs the blocking C++ all-reduce (the GIL is released) on one round
  at a time, in the order the fusion thread queued them. One round is on the wire while the
  fusion thread packs the next one and unpacks the previous one.

Agreed flush points. A partly filled buffer is never cut on one worker's say-so. Before each
batch of data rounds the workers run a 16-byte *probe* all-reduce (int64, op min) of
``[entries submitted here, -(1 if this worker wants a flush)]``. Its result is identical on every
worker: ``C`` = the number of entries every worker has submitted, ``F`` = whether any worker wants
a flush. Each worker then plans entries up to ``C``, and if ``F`` also cuts every partly filled
buffer. A worker wants a flush when a caller waits (``Handle.wait``, ``synchronize``) on an entry
that is not cut yet, or when its oldest waiting entry is older than ``cycle_time_ms``. So the
cycle timer, and where each worker calls ``wait``, only decide *when* a probe is sent; where
buffers are cut is a function of agreed values only.

After an error the asynchronous path stops: every pending handle fails with the error (a
mismatch first goes through reducer.fusion.diagnosis, which names the differing tensor), later
``allreduce_async`` calls raise it. The blocking ``allreduce`` keeps working (the C++ client
reconnects to the group on its next call).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from ..dtypes import BFLOAT16, check_op, wire_name
from ..errors import ConfigError, MismatchError, ReductionError, ReductionTimeout
from .diagnosis import Described, Diagnosis, History, fingerprint, round_tag
from .planner import Cut, Planner

log = logging.getLogger(__name__)

__all__ = ["Handle", "FusionEngine", "compression_dtype"]

PROBE_TAG = 0x3145424F52505352  # b"RSPROBE1", little-endian
_PROBE = 2  # a round kind besides the planner's FUSED and ALONE: the agreement probe


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

    __slots__ = ("_engine", "_entry", "array", "name", "index", "_event", "_error", "_finished")

    def __init__(self, engine: "FusionEngine", entry: "_Entry", array: Any, name: Optional[str]) -> None:
        self._engine = engine
        self._entry: Optional[_Entry] = entry
        self.array = array  # what wait() returns: the caller's own array, reduced in place
        self.name = name
        self.index = -1  # position in the submitted sequence (0-based, per communicator)
        self._event = threading.Event()
        self._error: Optional[BaseException] = None
        self._finished = False

    def done(self) -> bool:
        return self._event.is_set()

    def exception(self) -> Optional[BaseException]:
        """The error of a finished, failed handle (None while pending or on success)."""
        return self._error if self._event.is_set() else None

    def wait(self, timeout: Optional[float] = None) -> Any:
        if not self._event.is_set():
            self._engine.request_flush(self.index + 1)
            if not self._event.wait(timeout):
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
        self._error = error
        self._event.set()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error else "done")
        return f"<reducer.Handle {self._describe()} {state}>"


class _Entry:
    __slots__ = ("index", "host", "wire", "wire_dt", "op", "nbytes", "name", "shape", "src", "staged", "handle", "t",
                 "fp")

    def describe(self) -> str:
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        text = f"tensor #{self.index}"
        if self.name:
            text += f" {self.name!r}"
        text += f" ({self.src}[{shape}], op {self.op}"
        if self.wire != self.src:
            text += f", sent as {self.wire}"
        return text + ")"


class _Slot:
    """A reusable, 64-byte aligned fusion buffer that only ever grows."""

    __slots__ = ("buf", "cap")

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)
        self.cap = 0

    def reserve(self, nbytes: int) -> None:
        if nbytes > self.cap:
            raw = np.empty(nbytes + 64, np.uint8)
            off = (-raw.ctypes.data) % 64
            self.buf = raw[off:off + nbytes]
            self.cap = nbytes

    @property
    def ptr(self) -> int:
        return int(self.buf.ctypes.data)


class _Round:
    __slots__ = ("kind", "entries", "wire", "op", "nbytes", "tag", "slot", "ptr", "values")

    def __init__(self, kind: int, entries: List[_Entry], wire: str, op: str, nbytes: int) -> None:
        self.kind = kind
        self.entries = entries
        self.wire = wire
        self.op = op
        self.nbytes = nbytes
        self.tag = 0
        self.slot: Optional[_Slot] = None
        self.ptr = 0
        self.values: Optional[np.ndarray] = None

    def needs_slot(self) -> bool:
        if self.kind == _PROBE:
            return False
        if len(self.entries) > 1:
            return True
        e = self.entries[0]
        return e.wire != e.src  # a cast (compression) needs a buffer; one uncast entry goes in place

    def describe(self) -> str:
        if self.kind == _PROBE:
            return "the fusion agreement probe"
        first, last = self.entries[0].index, self.entries[-1].index
        what = f"tensor #{first}" if len(self.entries) == 1 else f"{len(self.entries)} tensors (#{first}..#{last})"
        return f"fused round of {what}, {self.wire} {self.op}, {self.nbytes} bytes"


class FusionEngine:
    """The background machinery behind ``Communicator.allreduce_async`` (one per communicator).

    client: the C++ client (``allreduce_ptr``); threshold: fused buffer size in bytes (0 turns
    fusion off: one round per tensor, no probes); cycle_time_ms: age after which a worker
    asks for its partly filled buffers to be flushed (``inf`` = only on wait/synchronize);
    compression: None, 'bf16' or 'fp16'; diag_client: makes a fresh client for the
    fingerprint diagnosis (None disables it); timeout: bounds the diagnosis.
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
        diag_client: Optional[Callable[[], Any]] = None,
    ) -> None:
        if threshold < 0:
            raise ConfigError(f"fusion threshold must be >= 0 bytes, got {threshold}")
        cycle = float(cycle_time_ms)
        if math.isnan(cycle) or cycle < 0:
            raise ConfigError(f"cycle time must be >= 0 ms (inf: no timer), got {cycle_time_ms}")
        self._client = client
        self.threshold = int(threshold)
        self.cycle_time_ms = cycle
        self._cycle: Optional[float] = None if math.isinf(cycle) else cycle / 1000.0
        self.compression = compression_dtype(compression)
        self.rank = rank
        self.timeout = float(timeout)
        self._fusion_off = self.threshold == 0

        self._cv = threading.Condition()
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
        self._plan: Deque[_Round] = deque()  # cut, not yet packed
        self._free: List[_Slot] = [_Slot(), _Slot()]
        self._probe_out = False
        self._probe_buf = np.zeros(2, np.int64)
        # network
        self._netq: Deque[_Round] = deque()
        self._done: Deque[Tuple[_Round, Optional[BaseException]]] = deque()
        self._net_error: Optional[BaseException] = None
        # life cycle
        self._error: Optional[BaseException] = None  # sticky: the engine has stopped
        self._closing = False
        self.stats = {"rounds": 0, "probes": 0, "fused_rounds": 0, "tensors": 0, "bytes": 0, "flushes": 0}
        self._diagnosis: Optional[Diagnosis] = None
        if diag_client is not None:
            self._diagnosis = Diagnosis(diag_client, rank=rank, threshold=self.threshold, lock=self._cv,
                                        history=self._history, count=lambda: self._count)

        self._fusion_thread = threading.Thread(target=self._fusion_main, name=f"reducer-fusion-{rank}", daemon=True)
        self._net_thread = threading.Thread(target=self._net_main, name=f"reducer-net-{rank}", daemon=True)
        self._fusion_thread.start()
        self._net_thread.start()

    # ================================================================ caller side
    def submit(self, array: Any, op: str = "sum", name: Optional[str] = None) -> Handle:
        from ..frameworks import stage

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
            self._unagreed_bytes += e.nbytes
            self._pending[e.index] = e
            self._history.add(e.fp, e.describe(), self._lowest_pending)
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
        deadline = None if timeout is None else time.monotonic() + timeout
        for h in handles:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not h._event.wait(left):
                if raise_errors:
                    raise ReductionTimeout(f"synchronize: {h._describe()} not finished after {timeout} s")
                return
        first_error = None
        for h in handles:
            h._finish()
            if h._error is not None and first_error is None:
                first_error = h._error
        if raise_errors and first_error is not None:
            raise _copy_error(first_error)

    def stop(self, join_timeout: Optional[float] = None) -> None:
        """Stop both threads; handles still pending fail. Idempotent."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        t = self.timeout + 5.0 if join_timeout is None else join_timeout
        for th in (self._fusion_thread, self._net_thread):
            if th is not threading.current_thread():
                th.join(t)
        self._fail_all(ReductionError("the communicator was closed before this all-reduce finished"))

    # ================================================================ fusion thread
    def _fusion_main(self) -> None:
        try:
            while True:
                with self._cv:
                    while True:
                        if self._closing or self._error is not None:
                            return
                        now = time.monotonic()
                        if self._done or (self._fusion_off and self._submitted) or self._can_pack() \
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
                self._pack_ready()
                with self._cv:
                    if self._want_probe(time.monotonic()):
                        rnd = _Round(_PROBE, [], "int64", "min", 16)
                        rnd.tag = PROBE_TAG
                        rnd.values = self._probe_buf
                        rnd.ptr = int(self._probe_buf.ctypes.data)
                        self._probe_out = True
                        self._netq.append(rnd)
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

    def _can_pack(self) -> bool:
        return bool(self._plan) and (bool(self._free) or not self._plan[0].needs_slot())

    def _round(self, cut: Cut[_Entry]) -> _Round:
        entries = cut.entries
        rnd = _Round(cut.kind, entries, entries[0].wire, entries[0].op, cut.nbytes)
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

    def _pack_ready(self) -> None:
        while True:
            with self._cv:
                if not self._can_pack():
                    return
                rnd = self._plan.popleft()
                slot = self._free.pop() if rnd.needs_slot() else None
            try:
                self._pack(rnd, slot)
            except BaseException:
                if slot is not None:
                    self._free.append(slot)
                raise
            with self._cv:
                self._netq.append(rnd)
                self._cv.notify_all()

    def _pack(self, rnd: _Round, slot: Optional[_Slot]) -> None:
        for e in rnd.entries:
            e.staged.before_read()
        if slot is None:
            e = rnd.entries[0]
            rnd.ptr = int(e.host.ctypes.data) if e.host.size else 0
            return
        slot.reserve(rnd.nbytes)
        rnd.slot = slot
        rnd.ptr = slot.ptr
        off = 0
        for e in rnd.entries:
            if e.nbytes:
                np.copyto(slot.buf[off:off + e.nbytes].view(e.wire_dt), e.host, casting="unsafe")
            off += e.nbytes

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
        slot = rnd.slot
        if slot is not None:
            off = 0
            for e in rnd.entries:
                if e.nbytes:
                    np.copyto(e.host, slot.buf[off:off + e.nbytes].view(e.wire_dt), casting="unsafe")
                off += e.nbytes
        for e in rnd.entries:
            e.staged.after_write()
        with self._cv:
            if slot is not None:
                rnd.slot = None
                self._free.append(slot)
            for e in rnd.entries:
                self._pending.pop(e.index, None)
        for e in rnd.entries:
            e.handle._set(None)

    # ================================================================ network thread
    def _net_main(self) -> None:
        while True:
            with self._cv:
                while not self._netq and not self._closing and self._error is None:
                    self._cv.wait()
                if self._closing or self._error is not None:
                    return
                rnd = self._netq.popleft()
                err = self._net_error
                if rnd.kind == _PROBE and err is None:
                    rnd.values[0] = self._count
                    rnd.values[1] = -1 if self._wants_flush(time.monotonic()) else 0
            if err is None and rnd.nbytes:
                try:
                    self._client.allreduce_ptr(rnd.ptr, rnd.nbytes, rnd.wire, rnd.op, rnd.tag)
                except ReductionError as exc:
                    err = exc
                    if rnd.kind == _PROBE and isinstance(exc, ReductionTimeout):
                        err = ReductionTimeout(
                            f"{exc} [while agreeing on the next fused buffers: this worker has submitted "
                            f"{self._count} tensors and waits for every other worker to submit more or to flush; "
                            "all workers must submit the same sequence of tensors]")
                except BaseException as exc:  # pragma: no cover - e.g. MemoryError
                    err = ReductionError(f"all-reduce failed: {exc!r}")
                if err is None:
                    st = self.stats
                    st["rounds"] += 1
                    if rnd.kind == _PROBE:
                        st["probes"] += 1
                    else:
                        st["tensors"] += len(rnd.entries)
                        st["bytes"] += rnd.nbytes
                        if len(rnd.entries) > 1:
                            st["fused_rounds"] += 1
            with self._cv:
                if err is not None and self._net_error is None:
                    self._net_error = err
                self._done.append((rnd, err))
                self._cv.notify_all()

    # ================================================================ failure
    def _die(self, err: BaseException) -> None:
        with self._cv:
            if self._error is None:
                self._error = err
            self._cv.notify_all()
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
