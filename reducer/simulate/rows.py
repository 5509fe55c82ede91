"""Simulated all-reduce rows: what ``reduction-server simulate`` prints and writes as JSON."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .model import DEFAULT_CPU, Network, Reducers, Result, simulate_ring, simulate_rs
from .params import DEFAULTS, Settings

ALGOS = ("rs", "ring")


def _row(r: Result, workers: int, reducers: int, net: Network) -> dict[str, Any]:
    row = {
        "algo": r.algo,
        "bytes": r.nbytes,
        "seconds": r.seconds,
        "workers": workers,
        "reducers": reducers if r.algo == "rs" else None,
        "worker_gbps": net.worker_gbps,
        "reducer_gbps": (net.reducer_gbps or net.worker_gbps) if r.algo == "rs" else None,
        "bound_seconds": r.bound,
        "pct_of_bound": 100.0 * r.bound / r.seconds if r.seconds > 0 else None,
        "algbw_gbs": r.nbytes / r.seconds / 1e9 if r.seconds > 0 else None,
        "simulated_hosts": r.simulated_hosts,
        "events": r.events,
    }
    row.update(r.extra)
    return row


def simulate(
    workers: int,
    reducers: int,
    sizes: list[int],
    net: Network,
    algos: tuple[str, ...] | list[str] = ALGOS,
    cpu: Reducers = DEFAULT_CPU,
    settings: Settings = DEFAULTS,
) -> list[dict[str, Any]]:
    """One row per size and algorithm (rs rows also get `speedup`, the ring's time over rs's, when
    the ring ran): `algo`, `bytes`, `seconds`, the link bound and more (see _row)."""
    if workers < 2 or reducers < 1:
        raise ConfigError(f"need at least 2 workers and 1 reducer, got {workers} and {reducers}")
    if not (net.worker_gbps > 0 and (net.reducer_gbps is None or net.reducer_gbps > 0)):
        raise ConfigError("link rates must be positive")
    unknown = [a for a in algos if a not in ALGOS]
    if unknown or not algos:
        raise ConfigError(f"unknown algorithm {', '.join(unknown) or '(none)'}: choose from {', '.join(ALGOS)}")
    if any(s < 4 or s % 4 for s in sizes):
        raise ConfigError("sizes must be whole float32 buffers: multiples of 4 bytes, at least 4")
    rows: list[dict[str, Any]] = []
    for size in sizes:
        done: dict[str, dict[str, Any]] = {}
        for algo in algos:
            if algo == "rs":
                res = simulate_rs(size, workers, reducers, net, cpu, settings)
            else:
                res = simulate_ring(size, workers, net, cpu, settings)
            done[algo] = _row(res, workers, reducers, net)
            rows.append(done[algo])
        if "rs" in done and "ring" in done:
            done["rs"]["speedup"] = done["ring"]["seconds"] / done["rs"]["seconds"]
    return rows
