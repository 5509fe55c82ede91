"""W worker threads doing back-to-back float32 and int64 rounds on one set of reducers, every result
checked exactly: the shared body of the tests that only change the pipeline's shape (test_scale,
test_path_window)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

import reducer


def run_exact_rounds(addrs: Sequence[str], world: int, n: int, join_s: float, **comm: Any) -> list[str]:
    """Two float32 rounds of `n` elements and one int64 round of n/2 on `world` threads, each a
    Communicator(addrs, rank, world, **comm); returns the errors (empty when every sum is exact)."""
    errors: list[str] = []

    def work(rank: int) -> None:
        try:
            with reducer.Communicator(list(addrs), rank, world, **comm) as c:
                for i in range(2):
                    a = np.arange(n, dtype=np.float32) % 1024 + rank + i
                    c.allreduce(a)
                    want = (np.arange(n, dtype=np.float32) % 1024) * world + sum(range(world)) + world * i
                    if not np.array_equal(a, want):
                        errors.append(f"rank {rank} round {i}: float32 sum differs")
                b = np.arange(n // 2, dtype=np.int64) * (rank + 1)
                c.allreduce(b)
                if not np.array_equal(b, np.arange(n // 2, dtype=np.int64) * sum(range(1, world + 1))):
                    errors.append(f"rank {rank}: int64 sum differs")
        except Exception as e:  # reported to the caller
            errors.append(f"rank {rank}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    if any(t.is_alive() for t in threads):
        errors.append("a worker still runs")
    return errors
