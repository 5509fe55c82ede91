"""Windows that fill long paths (issue 31 point 2): a worker keeps as many chunks in flight on a link
as the path's bandwidth-delay product needs (proto::path_window, from the socket's TCP_INFO), never
fewer than the configured window, and sums stay exact when that window is far beyond the reducer's
group slots."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import reducer
from reducer._native import core

KiB, MiB = 1 << 10, 1 << 20


def test_path_window_follows_the_bandwidth_delay_product():
    # 0.5 Gbit/s (62.5 MB/s) x 40 ms = 2.5 MB; twice that in 32 KiB chunks: 153 chunks.
    assert core.path_window(4, 32 * KiB, 40_000, 62_500_000) == 153
    # Twice the round trip, twice the window; twice the chunk, half of it.
    assert core.path_window(4, 32 * KiB, 80_000, 62_500_000) == 306
    assert core.path_window(4, 64 * KiB, 40_000, 62_500_000) == 77
    # A LAN (100 us at 1 Gbit/s: 12.5 KB) keeps the configured window; so does an unknown path.
    assert core.path_window(4, 32 * KiB, 100, 125_000_000) == 4
    assert core.path_window(2, 32 * KiB, 0, 62_500_000) == 2
    assert core.path_window(2, 32 * KiB, 40_000, 0) == 2
    # Never below the configured window, never 0.
    assert core.path_window(64, 32 * KiB, 1_000, 10_000_000) == 64
    assert core.path_window(0, 32 * KiB, 0, 0) == 1


def test_path_window_is_bounded():
    # At most 1024 chunks (RS_WINDOW's bound) and 64 MiB in flight per link.
    assert core.path_window(4, 4 * KiB, 10**6, 10**10) == 1024
    assert core.path_window(4, 1 * MiB, 10**6, 10**10) == 64
    assert core.path_window(4, 64 * MiB, 10**6, 10**10) == 4
    # Huge measurements (TCP_INFO's full ranges) do not overflow.
    assert core.path_window(4, 8, 2**32 - 1, 2**64 - 1) == 1024


@pytest.mark.timeout(180)
def test_windows_far_beyond_the_group_slots_sum_exactly(reducers):
    """W = 4 workers on R = 1 reducer with 2 group slots, each keeping up to 1024 chunks in flight
    (what path_window gives a long fat path): the reducer holds back with TCP back-pressure,
    float32 and int64 sums stay exact, rounds back to back."""
    W = 4
    addrs = [s.address for s in reducers(1, group_slots=2)]
    n = (8 * MiB) // 4
    errors: list[str] = []

    def work(rank: int) -> None:
        try:
            with reducer.Communicator(
                addrs, rank, W, group="longpath", timeout=90, connect_timeout=60, window=1024
            ) as c:
                for i in range(2):
                    a = np.arange(n, dtype=np.float32) % 1024 + rank + i
                    c.allreduce(a)
                    want = (np.arange(n, dtype=np.float32) % 1024) * W + sum(range(W)) + W * i
                    if not np.array_equal(a, want):
                        errors.append(f"rank {rank} round {i}: float32 sum differs")
                b = np.arange(n // 2, dtype=np.int64) * (rank + 1)
                c.allreduce(b)
                if not np.array_equal(b, np.arange(n // 2, dtype=np.int64) * sum(range(1, W + 1))):
                    errors.append(f"rank {rank}: int64 sum differs")
        except Exception as e:  # reported below
            errors.append(f"rank {rank}: {type(e).__name__}: {e}")

    th = [threading.Thread(target=work, args=(r,)) for r in range(W)]
    for t in th:
        t.start()
    for t in th:
        t.join(170)
    assert not any(t.is_alive() for t in th), "a worker still runs"
    assert not errors, errors
