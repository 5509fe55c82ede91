"""The fusion engine: the coordinator behind ``Communicator.allreduce_async`` and its handles.

``FusionEngine`` wires small parts together, each with one job and its own module:

* ``agreement`` (``Agreement``): the submitted entries, the agreement probes' values and the
  planner's cuts: which tensors the workers agree to send and where fused buffers end;
* ``rounds``: entries, rounds and their (address, length) segments: the entries' own memory (the
  caller's CPU arrays, or the pinned buffer a device array was staged into), no packing copy, no
  cast. Compression (float32 sent as bfloat16/float16) is the transport's: a compressed round
  passes its float32 segments with ``compression=``, the client narrows and widens chunk by chunk;
* ``cycle`` (``FusionCycle``, the *fusion thread*): decides when to probe, turns agreed cuts into
  segments, hands them to the network thread, completes finished rounds;
* ``network`` (``Sender``, the *network thread*): the only thread that calls the data client;
  several rounds in flight, results in submission order;
* ``probe`` (``Prober``, the *probe thread*): the agreement probes, on a client of their own
  (reducer group ``<group>/fusion-probe``), so a probe never queues behind data in flight;
* ``ledger`` (``Ledger``) and ``handle`` (``Handle``): entries not completed, their fingerprints,
  handle completion; ``stats`` (``FusionStats``): the counters;
* ``lifecycle`` (``Lifecycle``): the engine lock, closing and the sticky error. Its docstring
  states the lock discipline every part follows.

The caller's thread only appends an entry (``submit``) and waits on handles. Memory: rounds in
flight are bounded by the client's ``max_rounds_in_flight``; the engine allocates no data buffers
of its own (the client's per-connection staging chunks for compression are the transport's).

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
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import config
from ..dtypes import check_op, numpy_dtype
from ..errors import ConfigError, ReductionError, ReductionTimeout
from ..frameworks import stage
from ..lifetime import join_threads
from .agreement import Agreement
from .cycle import FusionCycle, Results
from .diagnosis import Diagnosis
from .handle import Handle
from .ledger import Ledger
from .lifecycle import Lifecycle, copy_error
from .network import Sender
from .probe import Prober
from .rounds import CLIENT_ROUND_BYTES, PROBE_TAG, new_entry
from .stats import FusionStats

log = logging.getLogger(__name__)

__all__ = ["Handle", "FusionEngine", "compression_dtype", "PROBE_TAG", "CLIENT_ROUND_BYTES"]

# Seconds synchronize() waits, after seeing the engine's error, for its clean-up to fail every
# pending handle (it closes the probe connection first: normally milliseconds).
_SETTLE_WAIT = 10.0


def compression_dtype(compression: str | None) -> np.dtype | None:
    """The 16-bit wire dtype for float32 under `compression` (None, 'bf16', 'fp16', ...: the names
    of config.compression_wire); ConfigError for an unknown name."""
    wire = config.compression_wire(compression)
    return None if wire is None else numpy_dtype(wire)


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
        compression: str | None = None,
        rank: int = 0,
        timeout: float = 30.0,
        probe_client: Callable[[], Any] | None = None,
        diag_client: Callable[[], Any] | None = None,
    ) -> None:
        if threshold < 0:
            raise ConfigError(f"fusion threshold must be >= 0 bytes, got {threshold}")
        cycle = float(cycle_time_ms)
        if math.isnan(cycle) or cycle < 0:
            raise ConfigError(f"cycle time must be >= 0 ms (inf: no timer), got {cycle_time_ms}")
        if threshold > 0 and probe_client is None:
            raise ConfigError("fusion needs a client for its agreement probes (probe_client)")
        self.threshold = int(threshold)
        self.cycle_time_ms = cycle
        self.compression = compression_dtype(compression)
        self.rank = rank
        self.timeout = float(timeout)

        self._life = Lifecycle()
        self._cv = self._life.cv  # the engine lock (reducer.fusion.lifecycle)
        self._stats = FusionStats()
        # Counters identical on every worker (they follow the agreed rounds), and peaks that depend on timing.
        self.stats = self._stats.counters
        self.peaks = self._stats.peaks
        self._agreement = Agreement(self.threshold, None if math.isinf(cycle) else cycle / 1000.0)
        self._ledger = Ledger(self._cv)
        results = Results(self._cv)
        self._sender = Sender(client, self._life, self._stats, results.report_locked)
        self._prober = Prober(probe_client, self._life, self._agreement, self._stats, results.report_locked)
        self._fusion_cycle = FusionCycle(
            self._life,
            self._agreement,
            self._ledger,
            results,
            self._sender,
            self._prober,
            self._stats,
            die=self._die,
            diagnose=self._diagnose,
        )
        self._diagnosis: Diagnosis | None = None
        if diag_client is not None:
            agreement = self._agreement
            self._diagnosis = Diagnosis(
                diag_client,
                rank=rank,
                threshold=self.threshold,
                lock=self._cv,
                history=self._ledger.history,
                count=lambda: agreement.count,
            )

        self._fusion_thread = threading.Thread(
            target=self._fusion_cycle.run, name=f"reducer-fusion-{rank}", daemon=True
        )
        self._net_thread = threading.Thread(target=self._sender.run, name=f"reducer-net-{rank}", daemon=True)
        self._probe_thread = threading.Thread(target=self._prober.run, name=f"reducer-probe-{rank}", daemon=True)
        self._threads = (self._fusion_thread, self._net_thread, self._probe_thread)
        for th in self._threads:
            th.start()

    @property
    def _client(self) -> Any:
        """The data client the network thread starts rounds on (tests replace it with a spy)."""
        return self._sender.client

    @_client.setter
    def _client(self, client: Any) -> None:
        self._sender.client = client

    # ================================================================ caller side
    def submit(self, array: Any, op: str = "sum", name: str | None = None) -> Handle:
        op = check_op(op)
        if name is not None and not isinstance(name, str):
            name = str(name)
        with self._cv:
            self._life.check_usable_locked()
        staged = stage(array)
        e = new_entry(staged, op, name, self.compression)
        handle = Handle(self, e, array, name)
        e.handle = handle
        with self._cv:
            try:
                self._life.check_usable_locked()
            except BaseException:
                staged.release()
                raise
            wake = self._agreement.submit_locked(e, time.monotonic())
            handle.index = e.index
            self._ledger.register_locked(e)
            if wake:
                self._cv.notify_all()
        return handle

    def request_flush(self, upto: int) -> None:
        """Ask for every entry below index `upto` to be sent now (wait/synchronize)."""
        with self._cv:
            if self._agreement.request_flush_locked(upto):
                self._cv.notify_all()

    def synchronize(self, timeout: float | None = None, raise_errors: bool = True) -> None:
        """Wait until everything submitted so far is reduced; raise the first error."""
        with self._cv:
            err = self._life.error
        if raise_errors and err is not None:
            # The step is incomplete even if no handle is pending. Every handle of the step fails
            # first (_die fails them just after recording the error), then this raises.
            self._life.settled.wait(_SETTLE_WAIT if timeout is None else min(timeout, _SETTLE_WAIT))
            raise copy_error(err)
        with self._cv:
            if raise_errors and self._life.closing:
                raise ReductionError("the communicator is closed")
            handles = self._ledger.handles_locked()
            if self._agreement.request_flush_locked(self._agreement.count):
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
            raise copy_error(first_error)

    def await_handles(self, handles: list[Handle], timeout: float | None) -> bool:
        """Wait until every handle is done; False if `timeout` seconds passed first."""
        return self._ledger.await_handles(handles, timeout)

    def stop(self, join_timeout: float | None = None) -> None:
        """Stop the three threads; handles still pending fail. Idempotent."""
        self._life.close()
        self._prober.close_conn()
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

    # ================================================================ failure
    def _die(self, err: BaseException) -> None:
        """Stop the engine with `err` (the first error sticks) and fail every pending handle."""
        first = self._life.fail(err)
        try:
            self._prober.close_conn()
            self._fail_all(first)
        finally:
            self._life.settled.set()  # a synchronize() that saw the error may raise it now

    def _fail_all(self, err: BaseException) -> None:
        with self._cv:
            entries = self._ledger.take_all_locked()
            self._agreement.clear_locked()
            self._sender.clear_locked()
        self._ledger.fail(entries, err)

    def _diagnose(self, err: BaseException) -> BaseException:
        """Turn a failed round into the most useful error: name the first differing tensor."""
        if self._diagnosis is None:
            return err
        with self._cv:
            base = self._ledger.lowest_pending_locked(self._agreement.count)
        return self._diagnosis.explain(err, base)
