"""Prometheus metrics of a reducer (`serve --metrics-port`), read from the core at scrape time.

Every metric is listed in docs/operations.md. The collector asks ReducerServer.stats() and
group_stats() on each scrape (a few microseconds under the core's lock), so the data path does
nothing for the metrics. Keys of stats() this table does not know become gauges under their own
name; nested dicts (``limits``) become one gauge with a ``name`` label. Per-group series (job and
group labels) are kept for at most `max_groups` groups (RS_METRICS_GROUPS, 0 = none); the rest are
counted in reduction_server_group_series_omitted. The endpoint is reducer.control.http's bounded
server (docs/security.md, "Control port and metrics port").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from reducer import config
from reducer.addresses import connect_host, format_address

from . import import_prometheus
from .http import MetricsServer
from .lifecycle import STATES, Lifecycle
from .limits import ConnectionTable, PeerRateLimiter, SideLimits, configured_limits
from .rows import group_rows

prometheus_client = import_prometheus()
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily  # noqa: E402
from prometheus_client.exposition import choose_encoder  # noqa: E402
from prometheus_client.registry import Collector, CollectorRegistry  # noqa: E402

PREFIX = "reduction_server"

# stats() key -> (metric name without prefix, help). Counters only grow while the process lives.
COUNTERS: dict[str, tuple[str, str]] = {
    "bytes_received": ("received_bytes", "Bytes received from workers (all groups, all streams)."),
    "bytes_sent": ("sent_bytes", "Bytes sent to workers (all groups, all streams)."),
    "rounds_completed": ("rounds", "All-reduce rounds completed (all groups)."),
    "chunks_reduced": ("chunks_reduced", "Pipeline chunks reduced (all groups)."),
}
# stats() key -> cause label of reduction_server_errors_total.
ERRORS: dict[str, str] = {
    "errors": "connection",  # a data connection closed because of an error
    "rejected": "handshake_rejected",  # a handshake refused: auth, version, conflicts, garbage
}
GAUGES: dict[str, tuple[str, str]] = {
    "connections": ("connections", "Open data connections (after the handshake)."),
    "connected_workers": ("workers_connected", "Workers connected (stream-0 connections: one per worker process)."),
    "groups": ("groups", "Live groups (job, group) with members."),
    "memory_bytes": ("memory_bytes", "Memory held by the groups' reduction buffers (arenas)."),
    "chunks_in_flight": (
        "chunks_in_flight",
        "Chunk slots claimed and not yet released: the reducer's chunk queue depth.",
    ),
}
HISTOGRAMS: dict[str, tuple[str, str]] = {
    "round_latency_seconds": (
        "round_latency_seconds",
        "Round latency on the reducer: first chunk claimed to last result written (stream 0).",
    ),
}


# Names this collector makes itself: a stats() key that would collide with one is left out.
_OWN = {
    "state",
    "errors",
    "group_world_size",
    "group_connected_ranks",
    "group_rounds",
    "group_received_bytes",
    "group_sent_bytes",
    "group_age_seconds",
    "group_failed",
    "group_series_omitted",
}


def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


def _other_key(key: str) -> str | None:
    """The metric suffix of a stats() key this module does not know (None: not exportable)."""
    suffix = re.sub(r"[^a-zA-Z0-9_]", "_", str(key))
    taken = _OWN | {s for s, _ in COUNTERS.values()} | {s for s, _ in GAUGES.values()}
    return None if not suffix or suffix in taken else suffix


class ReducerCollector(Collector):
    """Turns one ReducerServer (and its Lifecycle, if any) into metric families on every scrape.

    max_groups: groups with their own series (default RS_METRICS_GROUPS, else 100; 0 = none)."""

    def __init__(self, server: Any, lifecycle: Lifecycle | None = None, max_groups: int | None = None) -> None:
        self.server = server
        self.lifecycle = lifecycle
        self.max_groups = int(config.get("metrics_groups", max_groups))
        if self.max_groups < 0:
            raise ValueError(f"max_groups must be >= 0, got {self.max_groups}")

    def collect(self) -> Iterator[Any]:
        stats = self.server.stats()
        for key, (suffix, text) in COUNTERS.items():
            if key in stats:
                yield CounterMetricFamily(_name(suffix), text, value=stats[key])
        errors = CounterMetricFamily(_name("errors"), "Errors by cause (see docs/operations.md).", labels=["cause"])
        for key, cause in ERRORS.items():
            if key in stats:
                errors.add_metric([cause], stats[key])
        yield errors
        for key, (suffix, text) in GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(_name(suffix), text, value=stats[key])
        for key, (suffix, text) in HISTOGRAMS.items():
            if key in stats:
                yield _histogram(_name(suffix), text, stats[key])
        known = set(COUNTERS) | set(ERRORS) | set(GAUGES) | set(HISTOGRAMS)
        for key, value in stats.items():
            other = None if key in known else _other_key(key)
            if other is None:
                continue
            if isinstance(value, dict):
                family = GaugeMetricFamily(_name(other), f"ReducerServer.stats()[{key!r}] entries.", labels=["name"])
                for sub, v in value.items():
                    if isinstance(v, (int, float)):
                        family.add_metric([str(sub)], float(v))
                yield family
            elif isinstance(value, (int, float)):
                yield GaugeMetricFamily(_name(other), f"ReducerServer.stats()[{key!r}].", value=float(value))
        yield from self._groups()
        if self.lifecycle is not None:
            state = GaugeMetricFamily(
                _name("state"), "1 for the reducer's current state (serving, draining, drained).", labels=["state"]
            )
            for name in STATES:
                state.add_metric([name], 1.0 if self.lifecycle.state == name else 0.0)
            yield state

    def _groups(self) -> Iterator[Any]:
        labels = ["job", "group"]
        world = GaugeMetricFamily(_name("group_world_size"), "Workers a group expects.", labels=labels)
        connected = GaugeMetricFamily(_name("group_connected_ranks"), "Workers of a group connected.", labels=labels)
        rounds = CounterMetricFamily(_name("group_rounds"), "Rounds a group completed.", labels=labels)
        received = CounterMetricFamily(
            _name("group_received_bytes"), "Bytes a group's workers sent here.", labels=labels
        )
        sent = CounterMetricFamily(_name("group_sent_bytes"), "Bytes sent back to a group's workers.", labels=labels)
        age = GaugeMetricFamily(_name("group_age_seconds"), "Seconds since a group was created.", labels=labels)
        failed = GaugeMetricFamily(
            _name("group_failed"), "1 if a group has an error (see GetStats last_error).", labels=labels
        )
        # One series per (job, group): group_rows lists a live group before an ended one of the same name.
        rows, seen = [], set()
        for r in group_rows(self.server.group_stats()):
            if (r.job, r.group) not in seen:
                seen.add((r.job, r.group))
                rows.append(r)
        shown = rows[: self.max_groups]
        omitted = GaugeMetricFamily(
            _name("group_series_omitted"),
            "Groups left out of the per-group series (RS_METRICS_GROUPS).",
            value=len(rows) - len(shown),
        )
        for row in shown:
            key = [row.job, row.group]
            world.add_metric(key, row.world_size)
            connected.add_metric(key, row.connected)
            rounds.add_metric(key, row.rounds)
            received.add_metric(key, row.bytes_received)
            sent.add_metric(key, row.bytes_sent)
            age.add_metric(key, row.age_s)
            failed.add_metric(key, 1.0 if row.last_error else 0.0)
        yield from (world, connected, rounds, received, sent, age, failed, omitted)


def _histogram(name: str, text: str, h: dict[str, Any]) -> Any:
    """A Prometheus histogram from the core's per-bucket counts (bounds[i] = upper bound of counts[i];
    the last count is above the last bound)."""
    buckets, total = [], 0
    for bound, count in zip(list(h["bounds"]) + [float("inf")], h["counts"]):
        total += int(count)
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=float(h["sum"]))


def reducer_registry(server: Any, lifecycle: Lifecycle | None = None, max_groups: int | None = None) -> Any:
    """A registry holding only this reducer's metrics (plus the process metrics of this process)."""
    registry = CollectorRegistry()
    registry.register(ReducerCollector(server, lifecycle, max_groups))
    prometheus_client.ProcessCollector(registry=registry)
    return registry


class MetricsEndpoint:
    """Serves a registry in Prometheus text format over HTTP on host:port (0 = any free port), within
    `limits` (default: the settings; reducer.control.limits.configured_limits)."""

    def __init__(self, registry: Any, host: str = "0.0.0.0", port: int = 0, limits: SideLimits | None = None) -> None:
        self.registry = registry
        self.host = host
        self.limits = limits if limits is not None else configured_limits()
        table = ConnectionTable(self.limits.metrics_connections, self.limits.per_peer)
        self._server = MetricsServer(host, port, self._render, table, PeerRateLimiter(self.limits.rate)).start()

    def _render(self, accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        host = connect_host(self.host)
        return f"http://{format_address(host, self.port)}/metrics"

    def stop(self) -> None:
        self._server.stop()
