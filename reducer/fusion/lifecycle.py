"""The fusion engine's lock and life cycle: running, closing, or stopped by an error.

Lock discipline of the whole engine (reducer.fusion.*), written down once here:

* ``Lifecycle.cv`` (a ``threading.Condition``) is *the engine lock*. Every mutable attribute of
  ``Lifecycle``, ``Agreement`` (reducer.fusion.agreement), ``Ledger``'s pending table
  (reducer.fusion.ledger), ``FusionStats.counters`` (reducer.fusion.stats), and the hand-over
  queues of ``Sender`` (reducer.fusion.network), ``Prober`` (reducer.fusion.probe) and
  ``FusionCycle`` (reducer.fusion.cycle) is read and written only with it held. Methods whose
  name ends in ``_locked`` expect the caller to hold it; every other method takes it itself.
  ``notify_all`` on it wakes the three engine threads, each of which re-checks its own predicate.
* It is never held across a client call, a staging hook (``before_read``/``after_write``/
  ``release``) or a handle's completion, so no thread blocks on the network while holding it.
* ``Ledger.completion`` is a second condition, only for callers waiting on handles; it is never
  acquired while the engine lock is held, nor the other way round.
* The error is sticky: once set it never changes and every thread ends. ``error`` and
  ``closing`` may be read without the lock as a hint (the fusion thread does after each finished
  round); whatever must not race re-reads them under it (``stopped_locked``, ``fail`` keeps the
  first error).
* Not under the engine lock: ``FusionStats.peaks`` (written by the network thread alone),
  ``Sender.client`` (replaced only before the first round), a ``Handle``'s fields
  (reducer.fusion.handle).
"""

from __future__ import annotations

import threading

from ..errors import ReductionError

__all__ = ["Lifecycle", "copy_error"]


def copy_error(err: BaseException) -> BaseException:
    """A fresh exception of the same class (one instance raised in many threads would share a traceback)."""
    try:
        return type(err)(str(err))
    except Exception:  # pragma: no cover - every library error takes one message
        return ReductionError(str(err))


class Lifecycle:
    """Owns the engine lock and the two ways the engine ends: ``close`` and a sticky error."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.error: BaseException | None = None  # sticky: the engine has stopped
        self.closing = False
        # Set once an error's clean-up has failed every pending handle (callers that saw the
        # error wait for it, so no handle of a failed step is still pending when they raise).
        self.settled = threading.Event()

    def stopped_locked(self) -> bool:
        """The engine threads should end (closing, or an error)."""
        return self.closing or self.error is not None

    def check_usable_locked(self) -> None:
        """Raise the engine's error, or that it is closed."""
        if self.error is not None:
            raise copy_error(self.error)
        if self.closing:
            raise ReductionError("the communicator is closed")

    def close(self) -> None:
        with self.cv:
            self.closing = True
            self.cv.notify_all()

    def fail(self, err: BaseException) -> BaseException:
        """Record `err` unless an error was recorded before; returns the recorded one."""
        with self.cv:
            if self.error is None:
                self.error = err
            self.cv.notify_all()
            return self.error
