"""The network thread: the only thread of the fusion engine that calls the data client.

It starts every round handed over as scatter-gather client rounds (``try_start_segments``:
sent with writev straight from the segments, results received straight back into them; a round
above CLIENT_ROUND_BYTES as several), up to the client's ``max_rounds_in_flight``, then waits for
the oldest (GIL released), and again. So round n+1 streams while round n drains, results are
reported in submission order, and once a round has failed no later round is started (the client
would reconnect for it).

Ownership: ``Sender`` owns the queue of rounds handed over and not fully started, and the first
network error; both are guarded by the engine lock (reducer.fusion.lifecycle): the fusion thread
appends (``hand_over_locked``), this thread pops. The rounds started and not finished, and
``client``, are this thread's alone (``client`` is replaced only before the first round, by
tests that spy on it). Finished rounds go back through ``report_locked``, in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .lifecycle import Lifecycle
from .rounds import Round, Segments, client_failure
from .stats import FusionStats

__all__ = ["Sender"]

# (round, client round id or None, error, whether it is the round's last piece)
_Started = deque[tuple[Round, int | None, BaseException | None, bool]]
Report = Callable[[Round, BaseException | None], None]  # called with the engine lock held


class Sender:
    def __init__(self, client: Any, life: Lifecycle, stats: FusionStats, report_locked: Report) -> None:
        self.client = client  # the C++ client: start_segments, try_start_segments, wait, in_flight, connected
        self._life = life
        self._cv = life.cv
        self._stats = stats
        self._report_locked = report_locked
        self._queue: deque[Round] = deque()  # ready to start, in the agreed order
        self._error: BaseException | None = None  # the first round that failed: nothing more is sent

    def hand_over_locked(self, batch: list[Round]) -> None:
        """Rounds with their segments, in order: all of them are started before the thread blocks on the oldest."""
        self._queue.extend(batch)
        self._cv.notify_all()

    def clear_locked(self) -> None:
        self._queue.clear()

    def run(self) -> None:
        """The thread's body: until the engine stops."""
        started: _Started = deque()
        failed: Round | None = None  # a round already reported failed (its later pieces are dropped)
        while True:
            with self._cv:
                while not started and not self._queue and not self._life.stopped_locked():
                    self._cv.wait()
                if self._life.stopped_locked():
                    return
            self._start_ready(started)
            if not started:
                continue
            rnd, rid, err, last = started.popleft()
            if err is None and rid is not None:
                try:
                    self.client.wait(rid)
                except BaseException as exc:
                    err = client_failure(exc)
            if rnd is failed or (err is None and not last):
                continue
            if err is not None:
                failed = rnd
            with self._cv:
                if err is None and rnd.nbytes:  # a round of 0 bytes is never sent, nor counted
                    self._stats.count_round_locked(rnd)
                if err is not None and self._error is None:
                    self._error = err
                self._report_locked(rnd, err)

    def _start_ready(self, started: _Started) -> None:
        """Start the rounds handed over, piece by piece in order, while the client takes more."""
        while True:
            if started and not self.client.connected:
                # A round in flight failed inside an earlier call (the client dropped the session):
                # starting another would reconnect this worker alone. Its wait() reports the error.
                return
            with self._cv:
                if not self._queue or self._life.stopped_locked():
                    return
                rnd = self._queue[0]
                err = self._error
                if err is not None or not rnd.pieces:  # after an error nothing more is sent; 0 bytes: nothing
                    self._queue.popleft()
            if err is not None or not rnd.pieces:
                started.append((rnd, None, err, True))
                continue
            try:
                rid = self._start(rnd, rnd.pieces[rnd.next_piece], block=not started)
            except BaseException as exc:
                err = client_failure(exc)
                with self._cv:
                    if self._error is None:
                        self._error = err
                    if self._queue and self._queue[0] is rnd:
                        self._queue.popleft()
                started.append((rnd, None, err, True))
                continue
            if rid is None:  # the client has max_rounds_in_flight rounds: wait for the oldest first
                return
            rnd.next_piece += 1
            last = rnd.next_piece == len(rnd.pieces)
            if last:
                with self._cv:
                    if self._queue and self._queue[0] is rnd:
                        self._queue.popleft()
            started.append((rnd, rid, None, last))
            self._stats.note_in_flight(int(self.client.in_flight))

    def _start(self, rnd: Round, segments: Segments, block: bool) -> int | None:
        """Start one client round of `rnd`: `segments`, sent and received in place; None if the
        client has no room (only when `block` is false). The one call that puts data on the wire.

        A compressed round (float32 entries sent as 16 bits) passes its float32 segments with
        ``compression=`` its wire dtype: the client narrows each chunk as it sends it and widens
        each result chunk straight back into the segments (docs/worker-library.md, "Compression").
        """
        if block:
            return int(self.client.start_segments(segments, rnd.src, rnd.op, rnd.tag, compression=rnd.compression))
        rid = self.client.try_start_segments(segments, rnd.src, rnd.op, rnd.tag, compression=rnd.compression)
        return None if rid is None else int(rid)
