"""The entries submitted and not completed, their fingerprints, and the completion of their handles.

Ownership: ``Ledger`` owns the pending table (index -> entry) and the fingerprint history
(reducer.fusion.diagnosis), both guarded by the engine lock (reducer.fusion.lifecycle): the
caller's thread registers an entry, the fusion thread completes it, whoever stops the engine
fails what is left. Handles are marked done outside the engine lock, then ``completion`` (a
condition of its own, never nested with the engine lock) wakes the callers waiting in
``await_handles``: once for many handles.
"""

from __future__ import annotations

import functools
import threading
import time

from .diagnosis import History
from .handle import Handle
from .rounds import Entry, describe

__all__ = ["Ledger"]


class Ledger:
    """lock: the engine lock (reducer.fusion.lifecycle)."""

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._pending: dict[int, Entry] = {}  # submitted, not completed
        self.history = History()  # fingerprints, for the diagnosis
        self.completion = threading.Condition(threading.Lock())  # handles done (waited on by callers)

    def register_locked(self, e: Entry) -> None:
        """Track a newly numbered entry until it completes or fails."""
        self._pending[e.index] = e
        self.history.add(
            e.fp,
            functools.partial(describe, e.index, e.name, e.src, e.shape, e.op, e.wire),
            functools.partial(self.lowest_pending_locked, e.index + 1),
        )

    def lowest_pending_locked(self, count: int) -> int:
        """Index of the first entry not completed (`count`, the entries submitted, if none)."""
        return min(self._pending) if self._pending else count

    def handles_locked(self) -> list[Handle]:
        """The handles of every entry not completed, in submission order."""
        return [e.handle for e in self._pending.values()]

    def complete(self, entries: list[Entry]) -> None:
        """A data round succeeded: its results are in place; complete its handles."""
        for e in entries:
            e.staged.after_write()
        with self._lock:
            for e in entries:
                self._pending.pop(e.index, None)
        for e in entries:
            e.handle._set(None)
        self._notify_done()

    def take_all_locked(self) -> list[Entry]:
        """Stop tracking every entry not completed; the caller fails them (``fail``)."""
        entries = list(self._pending.values())
        self._pending.clear()
        return entries

    def fail(self, entries: list[Entry], err: BaseException) -> None:
        """Fail `entries` (taken with ``take_all_locked``) with `err`, releasing their staging."""
        for e in entries:
            try:
                e.staged.release()
            except Exception:  # pragma: no cover - best effort
                pass
            e.handle._set(err)
        self._notify_done()

    def await_handles(self, handles: list[Handle], timeout: float | None) -> bool:
        """Wait until every handle is done; False if `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.completion:
            for h in handles:
                while not h._done:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.completion.wait(left)
        return True

    def _notify_done(self) -> None:
        with self.completion:
            self.completion.notify_all()
