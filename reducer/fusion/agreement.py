"""Which submitted tensors the workers agree to send, and where their fused buffers are cut.

A partly filled buffer is never cut on one worker's say-so. Before each batch of data rounds
the workers run a 16-byte *probe* all-reduce (int64, op min) of ``[entries submitted here,
-(1 if this worker wants a flush)]``. Its result is identical on every worker: ``C`` = the number
of entries every worker has submitted, ``F`` = whether any worker wants a flush. Each worker then
plans entries up to ``C`` (reducer.fusion.planner), and if ``F`` also cuts every partly filled
buffer. A worker wants a flush when a caller waits (``Handle.wait``, ``synchronize``) on an entry
that is not cut yet, or when its oldest waiting entry is older than ``cycle_time_ms``. So the
cycle timer, and where each worker calls ``wait``, only decide *when* a probe is sent; where
buffers are cut is a function of agreed values only. Probes are sequential: the next one is
wanted once the previous one's cuts are handed to the network thread.

Ownership: ``Agreement`` owns the submission queue, the planner's open buffers and the cut
rounds not yet handed to the network thread. Caller threads append (``submit_locked``,
``request_flush_locked``); the probe thread reads the probe values; the fusion thread does the
rest. Every method here expects the engine lock held (reducer.fusion.lifecycle): no I/O here.
"""

from __future__ import annotations

from collections import deque

from ..errors import MismatchError
from .planner import Cut, Planner
from .rounds import Entry, Round, round_of

__all__ = ["Agreement"]


class Agreement:
    """The submitted entries on their way to agreed, cut rounds (see the module docstring)."""

    def __init__(self, threshold: int, cycle: float | None) -> None:
        self.threshold = threshold
        self.fusion_off = threshold == 0  # no probes: every entry goes alone as soon as it is submitted
        self._cycle = cycle  # seconds after which a worker wants its oldest uncut entry flushed; None: never
        self._submitted: deque[Entry] = deque()  # not yet planned, in order
        self.count = 0  # entries ever submitted
        self._unagreed_bytes = 0
        self._flush_upto = 0  # a caller waits for entries below this index
        self._agreed = 0  # C of the last probe: entries below it are planned
        self._planner: Planner[Entry] = Planner(threshold)  # the fused buffers being filled
        self._plan: deque[Round] = deque()  # cut, not yet handed to the network thread
        self._probe_out = False  # a probe is wanted or running (probe_started sets, the agreed cut clears)

    # -- caller threads ---------------------------------------------------------------------
    def submit_locked(self, e: Entry, now: float) -> bool:
        """Append `e` (numbering it); True if the fusion thread must wake: this entry changes what
        it waits for (fusion off: plan it now; the first entry not yet agreed: starts the cycle
        timer; a threshold's worth of entries not yet agreed: probe now). Waking it per entry only
        costs the caller time."""
        e.index = self.count
        self.count += 1
        e.t = now
        self._submitted.append(e)
        before = self._unagreed_bytes
        self._unagreed_bytes += e.nbytes
        return self.fusion_off or len(self._submitted) == 1 or before < self.threshold <= self._unagreed_bytes

    def request_flush_locked(self, upto: int) -> bool:
        """A caller waits for every entry below index `upto`; True if that is news."""
        if upto > self._flush_upto:
            self._flush_upto = upto
            return True
        return False

    # -- probe thread -----------------------------------------------------------------------
    def probe_values_locked(self, now: float) -> tuple[int, int]:
        """This worker's probe values: [entries submitted, -(1 if it wants a flush)]."""
        return self.count, -1 if self.wants_flush_locked(now) else 0

    # -- fusion thread ----------------------------------------------------------------------
    def wants_flush_locked(self, now: float) -> bool:
        if self._flush_upto > self._min_uncut():
            return True
        if self._cycle is None:
            return False
        oldest = self._oldest()
        return oldest is not None and now - oldest >= self._cycle

    def want_probe_locked(self, now: float) -> bool:
        """Whether to send the next probe now (never while one is out or cuts wait for the network)."""
        if self.fusion_off or self._probe_out or self._plan:
            return False
        if not self._submitted and not self._planner.has_open():
            return False
        if self._unagreed_bytes >= self.threshold and self._submitted:
            return True
        return self.wants_flush_locked(now)

    def probe_started_locked(self) -> None:
        self._probe_out = True

    def sleep_for_locked(self, now: float) -> float | None:
        """How long the fusion thread may sleep before the cycle timer asks for a probe (None: until woken)."""
        if self._cycle is None or self._probe_out or self._plan or self.fusion_off:
            return None
        oldest = self._oldest()
        if oldest is None:
            return None
        return max(0.0005, oldest + self._cycle - now)

    def has_work_locked(self) -> bool:
        """Entries to plan at once (fusion off) or cut rounds to hand to the network thread."""
        return bool((self.fusion_off and self._submitted) or self._plan)

    def plan_submitted_locked(self) -> None:
        """Fusion off: every entry submitted goes alone, no probe."""
        self.cut_locked(self.count, flush=False)

    def agreed_locked(self, agreed: int, flush: bool) -> None:
        """A probe's agreed values arrived: cut up to them; the next probe may go."""
        self._probe_out = False
        self.cut_locked(agreed, flush)

    def cut_locked(self, agreed: int, flush: bool) -> None:
        """Plan entries [agreed so far, agreed). Deterministic given agreed values."""
        if agreed < self._agreed or agreed > self.count:
            raise MismatchError(
                f"fusion probes disagree: the workers agreed on {agreed} tensors but this worker has planned "
                f"{self._agreed} and submitted {self.count} (was a worker restarted?)"
            )
        cuts: list[Cut[Entry]] = []
        for _ in range(agreed - self._agreed):
            e = self._submitted.popleft()
            self._unagreed_bytes -= e.nbytes
            cuts += self._planner.add(e)
        self._agreed = agreed
        if flush:
            cuts += self._planner.flush()
        self._plan.extend(round_of(c) for c in cuts)

    def take_cut_locked(self) -> Round | None:
        """The oldest cut round not yet handed to the network thread."""
        return self._plan.popleft() if self._plan else None

    def clear_locked(self) -> None:
        """Forget everything not yet sent (the engine failed or stopped)."""
        self._submitted.clear()
        self._planner.clear()
        self._plan.clear()

    def _uncut_heads(self) -> list[Entry]:
        """The oldest entry not yet planned and the first entry of every buffer being filled."""
        heads = list(self._planner.heads())
        if self._submitted:
            heads.append(self._submitted[0])
        return heads

    def _oldest(self) -> float | None:
        """Submission time of the oldest entry not yet cut."""
        return min((e.t for e in self._uncut_heads()), default=None)

    def _min_uncut(self) -> int:
        return min((e.index for e in self._uncut_heads()), default=self.count)
