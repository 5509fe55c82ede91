"""The fusion engine's staging ring (reducer/fusion/staging.py), without threads or sockets."""
from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest

from reducer.fusion.staging import ALIGN, StagingRing


def _span(views):
    return views[0].ctypes.data, views[-1].ctypes.data + views[-1].size


def test_regions_are_aligned_disjoint_and_freed_in_order():
    ring = StagingRing(1000)
    a = ring.take([10, 100])
    assert ring.size == 1000 and [v.size for v in a] == [10, 100]
    assert all(v.ctypes.data % ALIGN == 0 for v in a)
    assert a[1].ctypes.data - a[0].ctypes.data == 64  # 10 bytes, padded to a cache line
    b = ring.take([500])
    assert b[0].ctypes.data == a[0].ctypes.data + 192
    assert ring.in_use == 192 + 512 and ring.regions() == 2
    assert ring.take([300]) is None and not ring.fits([300])  # 1000 - 704 < 320, nothing before the first
    ring.release()  # frees a: 192 bytes at the start
    d = ring.take([150])  # still fits after b: [704, 896)
    assert d[0].ctypes.data == a[0].ctypes.data + 704
    c = ring.take([100])  # 104 bytes left at the end: wraps to the start
    assert c[0].ctypes.data == a[0].ctypes.data
    e = ring.take([50])  # wrapped: [128, 192) is free up to b
    assert e[0].ctypes.data == a[0].ctypes.data + 128
    assert ring.take([1]) is None
    for _ in range(4):
        ring.release()
    assert ring.in_use == 0 and ring.regions() == 0
    assert ring.peak == 1000 - 104


def test_grows_only_when_empty_and_stays_bounded():
    ring = StagingRing(256)
    ring.take([100])
    assert ring.take([1000]) is None  # larger than the ring: waits until it is empty
    ring.release()
    big = ring.take([1000])
    assert ring.size == 1024 and big[0].size == 1000  # max(capacity, the request), aligned
    ring.release()
    ring.take([64])
    assert ring.size == 1024  # never shrinks or grows for smaller requests


def test_random_fifo_use_never_overlaps():
    """Random FIFO traffic: live regions never overlap and stay inside the ring."""
    rnd = random.Random(7)
    ring = StagingRing(4096)
    live = deque()
    for _ in range(5000):
        if live and (rnd.random() < 0.45 or len(live) > 20):
            live.popleft()
            ring.release()
            continue
        sizes = [rnd.randint(1, 700) for _ in range(rnd.randint(1, 4))]
        views = ring.take(sizes)
        if views is None:
            assert live  # an empty ring always takes a request
            continue
        for v, n in zip(views, sizes):
            v[:] = len(live) & 0xFF  # writable, the requested size
            assert v.size == n
        live.append(_span(views))
        base = ring._buf.ctypes.data
        spans = sorted(live)
        assert spans[0][0] >= base and spans[-1][1] <= base + ring.size
        assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))
    assert ring.size == 4096


def test_bad_requests():
    with pytest.raises(ValueError):
        StagingRing(-1)
    with pytest.raises(ValueError):
        StagingRing(10).take([0])
    with pytest.raises(ValueError):
        StagingRing(10).take([])
    ring = StagingRing(10)
    ring.take([5])
    ring.clear()
    assert ring.in_use == 0 and ring.regions() == 0 and np.asarray(ring._buf).size == 64
