"""Opt-in Prometheus metrics of a worker's Communicator (docs/operations.md, "Worker metrics").

    from reducer.control.worker_metrics import instrument
    metrics = instrument(comm)             # registers on a new registry (or pass registry=)
    metrics.serve(port=9400)               # optional: an HTTP endpoint of its own

Counters (rounds, bytes, reconnects, the asynchronous path's fusion counters) are read from
comm.stats() / comm.fusion_stats() at scrape time; the round latency is measured here, around
every blocking all-reduce (Communicator.allreduce / allreduce_raw). Nothing is recorded unless
instrument() is called.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from . import import_prometheus
from .metrics import MetricsEndpoint

prometheus_client = import_prometheus()
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: E402
from prometheus_client.registry import Collector, CollectorRegistry  # noqa: E402

PREFIX = "reduction_worker"
LABELS = ("job", "group", "rank")
# Seconds: 100 us .. 60 s.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

# Communicator.stats() key -> (metric name without prefix, help).
CLIENT_COUNTERS = {
    "rounds": ("rounds", "All-reduce rounds this worker completed (blocking and fused)."),
    "bytes_sent": ("sent_bytes", "Bytes this worker sent to the reducers."),
    "bytes_received": ("received_bytes", "Bytes this worker received from the reducers."),
    "reconnects": ("reconnects", "New sessions after a failed round (the next call reconnects)."),
    "reducer_failovers": ("reducer_failovers", "Sessions moved to the surviving reducers after a reducer was lost."),
    "reducer_rejoins": ("reducer_rejoins", "Lost reducers taken back after they came back at their address."),
    "rejoin_probes": ("rejoin_probes", "Non-blocking connects to lost reducers started by rejoin checks."),
    "early_releases": (
        "early_releases",
        "Small rounds handed back before the reducers' CLEAR (a copy of the results stands in).",
    ),
    "repaired_bytes": ("repaired_bytes", "Bytes of unfinished rounds copied or reduced again after failovers."),
}

# Communicator.stats() key -> (gauge name without prefix, help).
CLIENT_GAUGES = {
    "reducers_active": ("reducers_active", "Reducers the worker's current session uses."),
    "link_window_max": (
        "link_window_max",
        "Chunks in flight the widest link of the session last allowed (the pipeline's window, widened by the path).",
    ),
}


class _CommunicatorCollector(Collector):
    def __init__(self, comm: Any, labels: list) -> None:
        self.comm = comm
        self.labels = labels

    def collect(self) -> Iterator[Any]:
        stats = self.comm.stats()
        for key, value in stats.items():
            if key in CLIENT_GAUGES:
                suffix, text = CLIENT_GAUGES[key]
                family: Any = GaugeMetricFamily(f"{PREFIX}_{suffix}", text, labels=list(LABELS))
            else:
                suffix, text = CLIENT_COUNTERS.get(key, (key, f"Communicator.stats()[{key!r}]."))
                family = CounterMetricFamily(f"{PREFIX}_{suffix}", text, labels=list(LABELS))
            family.add_metric(self.labels, value)
            yield family
        for key, value in self.comm.fusion_stats().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family = CounterMetricFamily(
                    f"{PREFIX}_fusion_{key}",
                    f"allreduce_async: Communicator.fusion_stats()[{key!r}].",
                    labels=list(LABELS),
                )
                family.add_metric(self.labels, value)
                yield family


class CommunicatorMetrics:
    """The metrics of one Communicator; see instrument()."""

    def __init__(self, comm: Any, registry: Any | None = None) -> None:
        self.comm = comm
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = [str(comm.job_id), str(comm.group), str(comm.rank)]
        self.registry.register(_CommunicatorCollector(comm, labels))
        self.latency = prometheus_client.Histogram(
            f"{PREFIX}_allreduce_seconds",
            "Wall time of one blocking all-reduce, measured around the call.",
            labelnames=list(LABELS),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(*labels)
        self.endpoint: Any = None
        inner = comm.allreduce_raw  # the bound method; Communicator.allreduce calls allreduce_raw

        def timed_allreduce_raw(*args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            inner(*args, **kwargs)
            self.latency.observe(time.perf_counter() - start)  # completed rounds only

        comm.allreduce_raw = timed_allreduce_raw

    def serve(self, port: int = 0, host: str = "0.0.0.0") -> Any:
        """An HTTP endpoint for this registry (reducer.control.metrics.MetricsEndpoint)."""
        self.endpoint = MetricsEndpoint(self.registry, host=host, port=port)
        return self.endpoint

    def stop(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None


def instrument(comm: Any, registry: Any | None = None) -> CommunicatorMetrics:
    """Record metrics for `comm` (once per Communicator) on `registry` (default: a new one)."""
    return CommunicatorMetrics(comm, registry)
