"""``Handle``: the pending result of one ``allreduce_async``.

A handle is marked done once, by the thread that completes or fails its entry (outside the
engine lock, reducer.fusion.lifecycle), before the ledger's ``completion`` condition is notified;
callers read ``_done`` under that condition or without a lock (a bool written once).
``_finish`` runs on the waiting caller's thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ReductionTimeout
from .lifecycle import copy_error

if TYPE_CHECKING:
    from .rounds import Entry

__all__ = ["Handle"]


class _Engine(Protocol):
    """What a handle asks of its engine."""

    def request_flush(self, upto: int) -> None: ...

    def await_handles(self, handles: list[Handle], timeout: float | None) -> bool: ...


class Handle:
    """The pending result of one ``allreduce_async``.

    ``wait(timeout=None)`` returns the caller's array once it holds the reduced values (and
    asks for the buffer holding it to be sent now, rather than when it is full or the cycle
    time passes); ``done()`` tells without blocking. If the round failed, ``wait`` raises
    that error (every handle of the round, and every later one, gets it).
    """

    __slots__ = ("_engine", "_entry", "array", "name", "index", "_done", "_error", "_finished")

    def __init__(self, engine: _Engine, entry: Entry, array: Any, name: str | None) -> None:
        self._engine = engine
        self._entry: Entry | None = entry
        self.array = array  # what wait() returns: the caller's own array, reduced in place
        self.name = name
        self.index = -1  # position in the submitted sequence (0-based, per communicator)
        self._done = False  # set once (then the ledger's completion is notified)
        self._error: BaseException | None = None
        self._finished = False

    def done(self) -> bool:
        return self._done

    def exception(self) -> BaseException | None:
        """The error of a finished, failed handle (None while pending or on success)."""
        return self._error if self._done else None

    def wait(self, timeout: float | None = None) -> Any:
        if not self._done:
            self._engine.request_flush(self.index + 1)
            if not self._engine.await_handles([self], timeout):
                raise ReductionTimeout(f"all-reduce of {self._describe()} not finished after {timeout} s")
        self._finish()
        if self._error is not None:
            raise copy_error(self._error)
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

    def _set(self, error: BaseException | None) -> None:
        """Mark done (the caller then notifies the ledger's completion, once for many handles)."""
        self._error = error
        self._done = True

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error else "done")
        return f"<reducer.Handle {self._describe()} {state}>"
