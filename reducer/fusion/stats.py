"""The fusion engine's counters (``Communicator.fusion_stats()``).

``counters`` are identical on every worker: they follow the agreed rounds only. They are written
with the engine lock held (reducer.fusion.lifecycle; the network and probe threads both count)
and read without it by ``fusion_stats()`` (a copy of a dict of ints). ``peaks`` depend on timing;
they are written by the network thread alone.
"""

from __future__ import annotations

from .rounds import PROBE, Round

__all__ = ["FusionStats"]


class FusionStats:
    def __init__(self) -> None:
        self.counters: dict[str, int] = {
            "rounds": 0,
            "probes": 0,
            "fused_rounds": 0,
            "tensors": 0,
            "bytes": 0,
            "flushes": 0,
            "segments": 0,
            "compressed_tensors": 0,
        }
        self.peaks: dict[str, int] = {"max_in_flight": 0}

    def count_round_locked(self, rnd: Round) -> None:
        """Count a finished round."""
        st = self.counters
        st["rounds"] += 1
        if rnd.kind == PROBE:
            st["probes"] += 1
            return
        st["tensors"] += len(rnd.entries)
        st["bytes"] += rnd.nbytes
        st["segments"] += sum(len(p) for p in rnd.pieces)
        if rnd.compression:
            st["compressed_tensors"] += len(rnd.entries)
        if len(rnd.entries) > 1:
            st["fused_rounds"] += 1

    def count_flush_locked(self) -> None:
        self.counters["flushes"] += 1

    def note_in_flight(self, n: int) -> None:
        """The client's rounds in flight after a start (network thread only)."""
        self.peaks["max_in_flight"] = max(self.peaks["max_in_flight"], n)
