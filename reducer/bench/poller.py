"""The control-plane poller of `reduction-server bench --control-plane on|ab`.

What an operator's tooling does to a running reducer pool, much more often than it would: every
`interval` seconds it calls GetStats on every reducer's gRPC control plane and fetches every
reducer's Prometheus /metrics page. The default 100 ms is a pessimistic rate: Prometheus scrapes
every 15-60 s, Kubernetes probes every 10 s, `reduction-server status` refreshes every 2 s.

Runs in its own process (reducer.bench.rank, role "poller"; on its own emulated host with
--emulate-gbps, so its requests cross the reducers' shaped links) from before the workers connect
until the runner closes its stdin after the last timed iteration. A failed request is counted,
never fatal: the counts say whether the control plane answered all along.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_INTERVAL_S = 0.1


@dataclass
class PollCounts:
    """What one poller did; the runner sums these over the passes of the same variant."""

    cycles: int = 0  # rounds of requests (one GetStats + one scrape per reducer)
    get_stats: int = 0  # GetStats calls answered
    scrapes: int = 0  # /metrics pages fetched (HTTP 200, a reduction_server metric in them)
    errors: int = 0  # requests that failed or timed out
    late: int = 0  # cycles that started more than one interval late (the poller fell behind)
    rounds_seen: int = 0  # the most rounds_completed (summed over the reducers) GetStats reported
    metrics_bytes: int = 0  # bytes of /metrics text fetched
    seconds: float = 0.0  # how long it polled
    cpu_s: float = 0.0  # CPU time the poller's process used meanwhile (set by its runner)
    first_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge_counts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts of several passes as one (sums; the largest rounds_seen; the first error)."""
    out: dict[str, Any] = {}
    for p in parts:
        for k, v in p.items():
            if k == "rounds_seen":
                out[k] = max(out.get(k, 0), v)
            elif k == "first_error":
                out[k] = out.get(k) or v
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
            else:
                out.setdefault(k, v)
    return out


class Poller:
    """Polls the control plane (GetStats) and the metrics endpoint of every reducer, at a fixed rate."""

    def __init__(
        self, control: list[str], metrics: list[str], interval: float = DEFAULT_INTERVAL_S, timeout: float = 2.0
    ) -> None:
        from ..control.client import ControlClient

        if interval <= 0:
            raise ValueError(f"poll interval must be > 0, got {interval}")
        self.clients = [ControlClient(a, timeout=timeout) for a in control]
        self.urls = list(metrics)
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.counts = PollCounts()

    def _error(self, what: str, exc: BaseException) -> None:
        self.counts.errors += 1
        if not self.counts.first_error:
            self.counts.first_error = f"{what}: {type(exc).__name__}: {exc}"

    def poll_once(self) -> None:
        rounds = 0
        for client in self.clients:
            try:
                rounds += int(client.get_stats()["counters"].get("rounds_completed", 0))
                self.counts.get_stats += 1
            except Exception as exc:  # counted: the report shows how many failed and the first reason
                self._error(f"GetStats {client.address}", exc)
        for url in self.urls:
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                    body = resp.read()
                if resp.status != 200 or b"reduction_server_rounds" not in body:
                    raise RuntimeError(f"HTTP {resp.status}, {len(body)} bytes without reduction_server_rounds")
                self.counts.scrapes += 1
                self.counts.metrics_bytes += len(body)
            except Exception as exc:
                self._error(f"GET {url}", exc)
        self.counts.cycles += 1
        self.counts.rounds_seen = max(self.counts.rounds_seen, rounds)

    def run(self, stop: threading.Event) -> PollCounts:
        """Poll every `interval` seconds (a fixed schedule; a late cycle is counted) until `stop` is set,
        then once more: the last cycle sees the reducers' counters at the end of the run."""
        t0 = time.monotonic()
        due = t0
        while True:
            now = time.monotonic()
            if now > due + self.interval:
                self.counts.late += 1
                due = now
            self.poll_once()
            if stop.is_set():
                break
            due += self.interval
            stop.wait(max(0.0, due - time.monotonic()))
        self.counts.seconds = time.monotonic() - t0
        return self.counts

    def close(self) -> None:
        for c in self.clients:
            c.close()
