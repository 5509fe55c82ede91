"""The fusion engine's parts (reducer/fusion/), one at a time, without reducers or sockets.

``Agreement``: what a worker puts in a probe and how agreed values become cuts (the clock is
passed in, so the cycle timer is tested without sleeping). ``Sender``: the network thread's
order and its stop after a failed round, against a fake client that takes one round at a time.
``Ledger``: completion and failure of handles.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from reducer.errors import MismatchError, ReductionError
from reducer.frameworks import Staged, stage
from reducer.fusion.agreement import Agreement
from reducer.fusion.engine import FusionEngine
from reducer.fusion.handle import Handle
from reducer.fusion.ledger import Ledger
from reducer.fusion.lifecycle import Lifecycle
from reducer.fusion.network import Sender
from reducer.fusion.planner import ALONE, FUSED, Cut
from reducer.fusion.rounds import Entry, Round, new_entry, prepare, round_of
from reducer.fusion.stats import FusionStats

pytestmark = pytest.mark.timeout(60)


def _entry(n: int, dtype: Any = np.float32) -> Entry:
    return new_entry(stage(np.arange(n, dtype=dtype)), "sum", None, None)


def _indices(rnd: Round | None) -> list[int]:
    assert rnd is not None
    return [e.index for e in rnd.entries]


# ---------------------------------------------------------------------------- Agreement
def test_agreement_probes_when_a_threshold_of_bytes_waits_and_cuts_only_agreed_entries():
    a = Agreement(threshold=100, cycle=None)
    wakes = [a.submit_locked(_entry(10), now=0.0) for _ in range(3)]  # 40 bytes each
    assert wakes == [True, False, True]  # the first entry, then the one that crosses the threshold
    assert a.want_probe_locked(0.0)
    assert a.probe_values_locked(0.0) == (3, 0)
    a.probe_started_locked()
    assert not a.want_probe_locked(0.0)  # one probe at a time
    a.agreed_locked(2, flush=False)  # the other worker had submitted 2: 80 bytes, no cut yet
    assert a.take_cut_locked() is None
    a.agreed_locked(3, flush=False)  # the third entry overflows the buffer: entries 0 and 1 are cut
    assert _indices(a.take_cut_locked()) == [0, 1] and a.take_cut_locked() is None
    assert not a.want_probe_locked(0.0)  # 40 bytes open, nobody waits
    assert a.request_flush_locked(3) and not a.request_flush_locked(3)
    assert a.want_probe_locked(0.0) and a.probe_values_locked(0.0) == (3, -1)
    a.agreed_locked(3, flush=True)
    rnd = a.take_cut_locked()
    assert _indices(rnd) == [2] and rnd is not None and rnd.kind == FUSED
    assert not a.want_probe_locked(0.0)


def test_agreement_refuses_agreed_values_it_cannot_have():
    a = Agreement(threshold=100, cycle=None)
    for _ in range(3):
        a.submit_locked(_entry(10), now=0.0)
    a.agreed_locked(2, flush=False)
    with pytest.raises(MismatchError, match="agreed on 1 tensors"):
        a.agreed_locked(1, flush=False)  # fewer than already planned
    with pytest.raises(MismatchError, match="agreed on 4 tensors"):
        a.agreed_locked(4, flush=False)  # more than submitted here


def test_agreement_cycle_timer_reads_the_oldest_uncut_entry():
    a = Agreement(threshold=1000, cycle=0.5)
    assert a.sleep_for_locked(10.0) is None  # nothing waits
    a.submit_locked(_entry(10), now=10.0)
    a.submit_locked(_entry(10), now=10.2)
    assert a.sleep_for_locked(10.1) == pytest.approx(0.4)
    assert not a.want_probe_locked(10.4) and a.want_probe_locked(10.5)
    a.probe_started_locked()
    a.agreed_locked(2, flush=False)  # planned into the open buffer: still uncut, still the oldest
    assert a.want_probe_locked(10.5) and a.probe_values_locked(10.5) == (2, -1)


def test_agreement_fusion_off_sends_every_entry_alone_without_probes():
    a = Agreement(threshold=0, cycle=None)
    assert all(a.submit_locked(_entry(n), now=0.0) for n in (0, 3, 5))
    assert a.has_work_locked() and not a.want_probe_locked(0.0)
    a.plan_submitted_locked()
    cuts = [a.take_cut_locked() for _ in range(3)]
    assert [_indices(r) for r in cuts] == [[0], [1], [2]] and all(r is not None and r.kind == ALONE for r in cuts)
    assert a.take_cut_locked() is None and not a.has_work_locked()


# ---------------------------------------------------------------------------- Sender
class _OneAtATime:
    """A client that holds one round in flight; `fail` names round ids whose wait raises."""

    connected = True

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.started: list[tuple[int, int]] = []  # (tag, bytes)
        self.in_flight = 0
        self._fail = fail

    def start_segments(
        self, segments: list[tuple[int, int]], dtype: str, op: str, tag: int, compression: str = ""
    ) -> int:
        assert self.in_flight == 0
        return self._begin(segments, tag)

    def try_start_segments(
        self, segments: list[tuple[int, int]], dtype: str, op: str, tag: int, compression: str = ""
    ) -> int | None:
        return None if self.in_flight else self._begin(segments, tag)

    def wait(self, rid: int) -> None:
        self.in_flight -= 1
        if rid in self._fail:
            raise ReductionError(f"round {rid} failed")

    def _begin(self, segments: list[tuple[int, int]], tag: int) -> int:
        self.in_flight += 1
        self.started.append((tag, sum(n for _, n in segments)))
        return len(self.started) - 1


def _send(rounds: list[Round], client: _OneAtATime) -> tuple[list[tuple[Round, BaseException | None]], FusionStats]:
    """Hand `rounds` to a Sender thread; the rounds it reports, once all are reported."""
    life, stats = Lifecycle(), FusionStats()
    reported: list[tuple[Round, BaseException | None]] = []
    all_in = threading.Event()

    def report_locked(rnd: Round, err: BaseException | None) -> None:
        reported.append((rnd, err))
        if len(reported) == len(rounds):
            all_in.set()

    sender = Sender(client, life, stats, report_locked)
    th = threading.Thread(target=sender.run, daemon=True)
    th.start()
    with life.cv:
        sender.hand_over_locked(rounds)
    assert all_in.wait(30)
    life.close()
    th.join(30)
    assert not th.is_alive()
    return reported, stats


def _rounds(sizes: list[int]) -> list[Round]:
    out = []
    for i, n in enumerate(sizes):
        e = _entry(n)
        e.index = i
        rnd = round_of(Cut(ALONE, [e]))
        prepare(rnd)
        out.append(rnd)
    return out


def test_sender_reports_rounds_in_order_and_skips_empty_ones():
    rounds = _rounds([4, 0, 8])
    client = _OneAtATime()
    reported, stats = _send(rounds, client)
    assert [r for r, _ in reported] == rounds and all(err is None for _, err in reported)
    assert client.started == [(rounds[0].tag, 16), (rounds[2].tag, 32)]  # the 0-byte round is not sent
    assert stats.counters["rounds"] == 2 and stats.counters["bytes"] == 48 and stats.peaks["max_in_flight"] == 1


def test_sender_starts_nothing_after_a_failed_round():
    rounds = _rounds([4, 4, 4])
    client = _OneAtATime(fail=(1,))
    reported, stats = _send(rounds, client)
    assert [r for r, _ in reported] == rounds
    errors = [err for _, err in reported]
    assert errors[0] is None and isinstance(errors[1], ReductionError) and errors[2] is errors[1]
    assert [tag for tag, _ in client.started] == [rounds[0].tag, rounds[1].tag]  # round 2 never went out
    assert stats.counters["rounds"] == 1


# ---------------------------------------------------------------------------- Ledger
class _Releases(Staged):
    released = 0

    def release(self) -> None:
        _Releases.released += 1


class _NoEngine:
    def request_flush(self, upto: int) -> None:
        raise AssertionError("not called")

    def await_handles(self, handles: list[Handle], timeout: float | None) -> bool:
        raise AssertionError("not called")


def _registered(ledger: Ledger, index: int) -> Entry:
    arr = np.ones(3, np.float32)
    e = new_entry(_Releases(arr, arr), "sum", None, None)
    e.index = index
    e.handle = Handle(_NoEngine(), e, arr, None)
    with ledger._lock:
        ledger.register_locked(e)
    return e


def test_ledger_completes_and_fails_handles():
    lock = threading.Condition()
    ledger = Ledger(lock)
    e0, e1, e2 = (_registered(ledger, i) for i in range(3))
    assert not ledger.await_handles([e0.handle], timeout=0)
    ledger.complete([e1])
    assert ledger.await_handles([e1.handle], timeout=0) and e1.handle.exception() is None
    with lock:
        assert ledger.lowest_pending_locked(3) == 0
        assert ledger.handles_locked() == [e0.handle, e2.handle]
        taken = ledger.take_all_locked()
        assert ledger.lowest_pending_locked(3) == 3 and ledger.handles_locked() == []
    before = _Releases.released
    err = ReductionError("boom")
    ledger.fail(taken, err)
    assert _Releases.released - before == 2
    assert ledger.await_handles([e0.handle, e2.handle], timeout=0)
    assert e0.handle.exception() is err and e2.handle.exception() is err


# ---------------------------------------------------------------------------- FusionEngine
class _BlockingProbe:
    """A probe client whose all-reduce never completes until it is closed."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def allreduce_ptr(self, *_args: Any) -> None:
        self.closed.wait(30)
        raise ReductionError("probe client closed")

    def close(self) -> None:
        self.closed.set()


def test_synchronize_after_an_error_raises_only_once_every_handle_failed():
    """The engine records its error, then (after closing the probe connection) fails the pending
    handles. A synchronize() arriving in between must not raise while handles of the step are still
    pending (seen 1 run in 10 in test_mismatch_shape_names_first_differing_tensor)."""
    engine = FusionEngine(object(), threshold=1 << 20, cycle_time_ms=float("inf"), probe_client=_BlockingProbe)
    handles = [engine.submit(np.ones(8, np.float32), name=f"t{i}") for i in range(3)]
    real_close = engine._prober.close_conn
    in_close = threading.Event()

    def slow_close() -> None:  # widens the window between the error and the handles' failure
        in_close.set()
        threading.Event().wait(0.5)
        real_close()

    engine._prober.close_conn = slow_close  # type: ignore[method-assign]
    killer = threading.Thread(target=engine._die, args=(ReductionError("boom"),))
    killer.start()
    assert in_close.wait(10)
    with pytest.raises(ReductionError, match="boom"):
        engine.synchronize()
    assert all(h.done() for h in handles)
    killer.join(10)
    engine.stop(join_timeout=10)
