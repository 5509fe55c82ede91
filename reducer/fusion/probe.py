"""The probe thread: runs the agreement probes (reducer.fusion.agreement) on a client of its own.

Probes run on their own client (reducer group ``<group>/fusion-probe``, failing over like the
data client), so a probe never waits behind the data rounds in flight: the next batch is cut
while the previous one streams. Probes are still strictly sequential and identical in number and
order on every worker (the fusion thread asks for the next one only after the previous one's
cuts were handed to the network thread).

Ownership: ``Prober`` owns the probe asked for and not yet taken, and the probe client; both
are guarded by the engine lock (reducer.fusion.lifecycle). The probe's values are read from the
``Agreement`` under that lock at the moment the probe goes out (as fresh as they can be); the
client call itself runs without it. The result goes back through ``report_locked``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ReductionTimeout
from .agreement import Agreement
from .lifecycle import Lifecycle
from .network import Report
from .rounds import PROBE_TAG, Round, client_failure, probe_round
from .stats import FusionStats

__all__ = ["Prober"]


class Prober:
    """make_client: connects the probe client (on the first probe)."""

    def __init__(
        self,
        make_client: Callable[[], Any] | None,
        life: Lifecycle,
        agreement: Agreement,
        stats: FusionStats,
        report_locked: Report,
    ) -> None:
        self._make_client = make_client
        self._life = life
        self._cv = life.cv
        self._agreement = agreement
        self._stats = stats
        self._report_locked = report_locked
        self._next: Round | None = None  # asked for, not yet taken by the probe thread
        self._conn: Any = None  # the probe thread's client, made on the first probe
        self._buf = np.zeros(2, np.int64)

    def ask_locked(self) -> None:
        """Send the next probe (the fusion thread, once the previous one's cuts are handed over)."""
        self._next = probe_round(self._buf)
        self._cv.notify_all()

    def run(self) -> None:
        """The thread's body: until the engine stops."""
        while True:
            with self._cv:
                while self._next is None and not self._life.stopped_locked():
                    self._cv.wait()
                if self._life.stopped_locked():
                    return
                rnd, self._next = self._next, None
            assert rnd is not None and rnd.values is not None  # set by ask_locked
            err: BaseException | None = None
            try:
                client = self._client()
                if client is None:
                    return  # closing
                with self._cv:  # the values go out at once: they are as fresh as they can be
                    rnd.values[0], rnd.values[1] = self._agreement.probe_values_locked(time.monotonic())
                client.allreduce_ptr(int(rnd.values.ctypes.data), 16, "int64", "min", PROBE_TAG)
            except BaseException as exc:
                err = self._failure(exc)
            with self._cv:
                if err is None:
                    self._stats.count_round_locked(rnd)
                self._report_locked(rnd, err)

    def close_conn(self) -> None:
        """Close the probe client: a probe waiting for the other workers fails at once."""
        with self._cv:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # pragma: no cover - best effort
                pass

    def _client(self) -> Any:
        """The probe thread's client (connects on first use); None once the engine stops."""
        with self._cv:
            conn = self._conn
        if conn is not None:
            return conn
        assert self._make_client is not None  # the engine requires it unless fusion is off (no probes)
        conn = self._make_client()
        with self._cv:
            if not self._life.stopped_locked():
                self._conn = conn
                return conn
        conn.close()
        return None

    def _failure(self, exc: BaseException) -> BaseException:
        err = client_failure(exc)
        if not isinstance(err, ReductionTimeout):
            return err
        with self._cv:
            count = self._agreement.count
        return ReductionTimeout(
            f"{err} [while agreeing on the next fused buffers: this worker has submitted "
            f"{count} tensors and waits for every other worker to submit more or to flush; "
            "all workers must submit the same sequence of tensors]"
        )
