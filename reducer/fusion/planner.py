"""The cut rule of tensor fusion: where fused buffers begin and end. Pure and deterministic.

Every worker must cut its fused buffers at the same places, so the rule depends only on what
every worker knows: the submitted sequence (sizes, dtypes, wire dtypes, ops), the threshold, and
the agreed flush points. Entries are fed in submission order:

* an entry of at least ``threshold`` bytes (on the wire) goes alone (sent in place, no copy); it
  does not cut the buffer that is filling for its key;
* otherwise it joins the open buffer of its key, (dtype, wire dtype, op); a buffer is cut before
  the entry that would overflow it, and as soon as it is exactly full;
* a flush cuts every partly filled buffer, in the order of their first entries.

The key holds the caller's dtype and the wire dtype because together they define a round: a
float32 entry sent as bfloat16 (compression, narrowed by the transport) cannot share a round with
float32 sent as it is, nor with tensors that are bfloat16 already (for every other entry the two
are equal).

So threshold 0 (fusion off) sends every entry alone. How entries are handed over (one at a
time or in batches, when the agreement probes happen to run) does not change the cuts: only
flushes do. No locks, no clocks, no I/O here (the engine owns those).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

__all__ = ["FUSED", "ALONE", "Cut", "Planner"]

FUSED = 0  # a fused buffer: one round over its entries' memory (a scatter-gather round, no copy)
ALONE = 1  # one entry of at least `threshold` bytes, sent from its own memory


class Plannable(Protocol):
    """What the planner reads of an entry."""

    index: int  # position in the submitted sequence
    nbytes: int  # bytes on the wire
    src: str  # dtype name of the entry's memory
    wire: str  # wire dtype name (differs from src when the transport compresses float32)
    op: str


E = TypeVar("E", bound=Plannable)


@dataclass
class Cut(Generic[E]):
    """One round to send: FUSED (one or more entries of one (dtype, wire dtype, op)) or ALONE."""

    kind: int
    entries: list[E]

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


@dataclass
class _Open(Generic[E]):
    entries: list[E] = field(default_factory=list)
    nbytes: int = 0


class Planner(Generic[E]):
    """Applies the cut rule to entries fed in submission order (see the module docstring)."""

    def __init__(self, threshold: int) -> None:
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0 bytes, got {threshold}")
        self.threshold = threshold
        self._open: dict[tuple[str, str, str], _Open[E]] = {}

    def add(self, entry: E) -> list[Cut[E]]:
        """Plan the next entry; returns the rounds it completes (0, 1 or 2)."""
        thr = self.threshold
        if entry.nbytes >= thr:
            return [Cut(ALONE, [entry])]
        cuts: list[Cut[E]] = []
        key = (entry.src, entry.wire, entry.op)
        ob = self._open.get(key)
        if ob is None:
            ob = self._open[key] = _Open()
        elif ob.nbytes + entry.nbytes > thr:
            cuts.append(self._cut(key))
            ob = self._open[key] = _Open()
        ob.entries.append(entry)
        ob.nbytes += entry.nbytes
        if ob.nbytes == thr:
            cuts.append(self._cut(key))
        return cuts

    def add_all(self, entries: Iterable[E]) -> list[Cut[E]]:
        cuts: list[Cut[E]] = []
        for e in entries:
            cuts += self.add(e)
        return cuts

    def flush(self) -> list[Cut[E]]:
        """Cut every partly filled buffer, in the order of their first entries."""
        # A buffer enters the dict with its first entry, so the dict is in that order already.
        return [self._cut(k) for k in list(self._open)]

    def heads(self) -> Iterator[E]:
        """The first entry of every buffer that is filling (not cut yet)."""
        return (ob.entries[0] for ob in self._open.values())

    def has_open(self) -> bool:
        return bool(self._open)

    def clear(self) -> None:
        """Forget the buffers that are filling (the engine failed or stopped)."""
        self._open.clear()

    def _cut(self, key: tuple[str, str, str]) -> Cut[E]:
        return Cut(FUSED, self._open.pop(key).entries)
