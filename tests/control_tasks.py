"""Worker-side functions for tests/control/test_control.py, run in the pool's processes (conftest.run_ranks)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from tasks import check, make_data

import reducer


def _wait_for(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def reduce_and_hold(
    rank: int,
    world: int,
    addrs: Sequence[str],
    group: str,
    rounds: int,
    n: int,
    hold_dir: str | None = None,
    hold_timeout: float = 60.0,
) -> dict[str, Any]:
    """`rounds` float32 sums of n elements checked against the float64 reference; then, with
    hold_dir, writes <hold_dir>/<group>.<rank>.ready and stays connected until <hold_dir>/release
    exists (at most hold_timeout s), so the test can look at the live group."""
    errors = []
    with reducer.Communicator(addrs, rank, world, group=group, timeout=30, connect_timeout=30) as comm:
        for i in range(rounds):
            a = make_data("float32", n, rank, seed=i)
            comm.allreduce(a)
            err = check(a, "float32", "sum", n, world, seed=i)
            if err:
                errors.append(f"round {i}: {err}")
        stats = comm.stats()
        held = None
        if hold_dir is not None:
            ready = os.path.join(hold_dir, f"{group}.{rank}.ready")
            with open(ready + ".tmp", "w") as fh:
                fh.write("ready")
            os.replace(ready + ".tmp", ready)
            held = _wait_for(os.path.join(hold_dir, "release"), hold_timeout)
    return {"errors": errors, "stats": stats, "held": held}


def instrumented_rounds(rank: int, world: int, addrs: Sequence[str], group: str, rounds: int, n: int) -> dict[str, Any]:
    """A Communicator with worker metrics: `rounds` checked sums; returns the parsed samples."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from reducer.control.worker_metrics import instrument

    errors = []
    with reducer.Communicator(addrs, rank, world, group=group, timeout=30, connect_timeout=30) as comm:
        metrics = instrument(comm)
        before = generate_latest(metrics.registry).decode()
        for i in range(rounds):
            a = make_data("float32", n, rank, seed=100 + i)
            comm.allreduce(a)
            err = check(a, "float32", "sum", n, world, seed=100 + i)
            if err:
                errors.append(f"round {i}: {err}")
        after = generate_latest(metrics.registry).decode()
        stats = comm.stats()

    def samples(text: str) -> dict[str, float]:
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = s.name + ("{le=" + s.labels["le"] + "}" if "le" in s.labels else "")
                out[key] = s.value
                assert s.labels["rank"] == str(rank) and s.labels["group"] == group
        return out

    return {"errors": errors, "before": samples(before), "after": samples(after), "stats": stats}
