"""The fusion engine's staging memory: one reusable host buffer, used first in, first out.

Most entries go on the wire straight from their own memory (a scatter-gather round over the
callers' arrays). Only an entry whose wire dtype differs from its own (compression casts
float32 to 16 bits) is copied, once, into staging memory, and that copy is a segment of the
round. Rounds finish in the order they were started, so their staging regions are freed in the
order they were taken: a ring buffer with a FIFO of regions serves them without fragmentation.

The ring holds ``max(capacity, the largest single request)`` bytes: a request that does not fit
next to the regions in use waits (``take`` returns None) until earlier rounds finish; a request
larger than the ring waits until the ring is empty and then grows it. So staging memory stays
bounded by the capacity the engine asks for (2 x fusion_threshold) or one round if that is
larger, and a training loop allocates nothing after its first step. Not thread-safe: the
engine's fusion thread is its only user.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["StagingRing", "ALIGN"]

ALIGN = 64  # every staged entry starts on a cache line


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class StagingRing:
    """First-in, first-out regions of one aligned host buffer (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"staging capacity must be >= 0 bytes, got {capacity}")
        self.capacity = int(capacity)  # what the ring grows to at least, on first use
        self._buf = np.empty(0, np.uint8)
        self._regions: Deque[Tuple[int, int]] = deque()  # [start, end) in the order taken
        self.in_use = 0  # bytes of the regions taken and not released (alignment included)
        self.peak = 0

    @property
    def size(self) -> int:
        """Bytes allocated for the ring now (0 until the first request)."""
        return int(self._buf.size)

    def fits(self, sizes: Sequence[int]) -> bool:
        """Whether take(sizes) would succeed now."""
        return self._place(sum(_aligned(n) for n in sizes)) is not None

    def take(self, sizes: Sequence[int]) -> Optional[List[np.ndarray]]:
        """One region holding a uint8 view of each of `sizes` bytes (each ALIGN-aligned), or None
        if it does not fit until earlier regions are released. Sizes must be positive."""
        if not sizes or min(sizes) <= 0:
            raise ValueError(f"staging sizes must be positive, got {list(sizes)}")
        total = sum(_aligned(n) for n in sizes)
        start = self._place(total)
        if start is None:
            return None
        if start < 0:  # the ring is empty and too small: grow it
            self._grow(total)
            start = 0
        self._regions.append((start, start + total))
        self.in_use += total
        self.peak = max(self.peak, self.in_use)
        views, off = [], start
        for n in sizes:
            views.append(self._buf[off:off + n])
            off += _aligned(n)
        return views

    def release(self) -> None:
        """Free the oldest region (the round that took it has finished)."""
        start, end = self._regions.popleft()
        self.in_use -= end - start

    def clear(self) -> None:
        """Forget every region (the engine failed or stopped: no round uses them any more)."""
        self._regions.clear()
        self.in_use = 0

    def regions(self) -> int:
        return len(self._regions)

    # -- internal -----------------------------------------------------------------------
    def _place(self, total: int) -> Optional[int]:
        """Where a region of `total` bytes goes: an offset, -1 (grow the empty ring first) or None."""
        size = self.size
        if not self._regions:
            return 0 if total <= size else -1
        tail, head = self._regions[0][0], self._regions[-1][1]
        if tail < head:  # in use: [tail, head); free: [head, size) and [0, tail)
            if size - head >= total:
                return head
            return 0 if tail >= total else None
        # wrapped: in use [tail, size) and [0, head); free: [head, tail)
        return head if tail - head >= total else None

    def _grow(self, total: int) -> None:
        nbytes = max(self.capacity, total)
        raw = np.empty(nbytes + ALIGN, np.uint8)
        off = (-raw.ctypes.data) % ALIGN
        self._buf = raw[off:off + nbytes]
