"""The fusion thread: the cycle that turns agreed cuts into rounds on the wire and completes them.

Each turn it waits (engine lock held, reducer.fusion.lifecycle) until there is something to do:
finished rounds, entries to plan at once (fusion off), cuts to hand over, or a probe to send
(enough bytes not yet agreed, a caller waiting, or the cycle timer). Then, without the lock, it
processes the finished rounds in the agreed order (a probe's agreed values become cuts,
``Agreement``; a data round's handles complete, ``Ledger``; an error stops the engine), turns
the cut rounds into segments (reducer.fusion.rounds ``prepare``) and hands them to the network
thread together, and finally asks for the next probe if one is wanted.

Ownership: ``Results`` holds the rounds finished by the network and probe threads and not yet
processed, guarded by the engine lock; everything else ``FusionCycle`` touches belongs to the
parts it is given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from ..errors import ReductionError
from .agreement import Agreement
from .ledger import Ledger
from .lifecycle import Lifecycle
from .network import Sender
from .probe import Prober
from .rounds import PROBE, Round, prepare
from .stats import FusionStats

log = logging.getLogger(__name__)

__all__ = ["Results", "FusionCycle"]


class Results:
    """Rounds finished (or failed) by the network and probe threads, in the order they finished."""

    def __init__(self, cv: threading.Condition) -> None:
        self._cv = cv
        self._done: deque[tuple[Round, BaseException | None]] = deque()

    def report_locked(self, rnd: Round, err: BaseException | None) -> None:
        self._done.append((rnd, err))
        self._cv.notify_all()

    def any_locked(self) -> bool:
        return bool(self._done)

    def take_locked(self) -> list[tuple[Round, BaseException | None]]:
        done = list(self._done)
        self._done.clear()
        return done


class FusionCycle:
    """die: stops the engine with an error; diagnose: the error to report for a failed data round."""

    def __init__(
        self,
        life: Lifecycle,
        agreement: Agreement,
        ledger: Ledger,
        results: Results,
        sender: Sender,
        prober: Prober,
        stats: FusionStats,
        die: Callable[[BaseException], None],
        diagnose: Callable[[BaseException], BaseException],
    ) -> None:
        self._life = life
        self._cv = life.cv
        self._agreement = agreement
        self._ledger = ledger
        self._results = results
        self._sender = sender
        self._prober = prober
        self._stats = stats
        self._die = die
        self._diagnose = diagnose

    def run(self) -> None:
        """The thread's body: until the engine stops."""
        try:
            self._loop()
        except BaseException as exc:  # a bug or an interpreter shutdown: fail loudly, never hang
            log.exception("fusion thread failed")
            err = exc if isinstance(exc, ReductionError) else ReductionError(f"fusion thread failed: {exc!r}")
            self._die(err)

    def _loop(self) -> None:
        agreement, life, cv = self._agreement, self._life, self._cv
        while True:
            with cv:
                while True:
                    if life.stopped_locked():
                        return
                    now = time.monotonic()
                    if self._results.any_locked() or agreement.has_work_locked() or agreement.want_probe_locked(now):
                        break
                    cv.wait(agreement.sleep_for_locked(now))
                done = self._results.take_locked()
                if agreement.fusion_off:  # no probes: every entry goes alone as soon as it is submitted
                    agreement.plan_submitted_locked()
            for rnd, err in done:
                self._complete(rnd, err)
                if life.error is not None:
                    return
            self._hand_over_cuts()
            with cv:
                if life.error is None and agreement.want_probe_locked(time.monotonic()):
                    agreement.probe_started_locked()
                    self._prober.ask_locked()

    def _hand_over_cuts(self) -> None:
        """Turn the cut rounds into segments and hand them to the network thread, in order, together:
        the network thread starts all of them before it blocks on the oldest one."""
        batch: list[Round] = []
        while True:
            with self._cv:
                rnd = self._agreement.take_cut_locked()
                if rnd is None:
                    if batch:
                        self._sender.hand_over_locked(batch)
                    return
            prepare(rnd)
            batch.append(rnd)

    def _complete(self, rnd: Round, err: BaseException | None) -> None:
        if err is not None:
            if self._life.error is None:
                self._die(self._diagnose(err))
            return
        if rnd.kind == PROBE:
            assert rnd.values is not None
            agreed, flush = int(rnd.values[0]), int(-rnd.values[1]) > 0
            with self._cv:
                self._agreement.agreed_locked(agreed, flush)
                if flush:
                    self._stats.count_flush_locked()
            return
        self._ledger.complete(rnd.entries)
