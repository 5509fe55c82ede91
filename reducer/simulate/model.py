"""One simulated all-reduce: the job (hosts, links, pipeline) turned into an engine spec, scaled down
when the job is large.

Scale model (rs). With a non-blocking switch and per-host links, every worker and every reducer of
a round behaves alike, and what sets a connection's progress is its share of the two links it
crosses (B_w / R at the worker, B_r / W at the reducer), its chunks and its window. A job of W_s
workers and R_s reducers whose links run at B_w x R_s / R and B_r x W_s / W, each reducer with the
real shard, chunks and window, gives every connection the same shares, bytes and latency, so the
same timeline (exact when W_s / W = R_s / R); the reducer's summing capacity is scaled by W_s / W
too. The ring: every rank does the same, so a ring of n_s ranks running the real ring's 2(n-1)
steps of S/n bytes each has its timeline. The engine then simulates at most `MAX_HOSTS` hosts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from . import engine
from .params import DEFAULTS, Settings, ring_pipeline, rs_pipeline, with_path_window

MAX_WORKERS = 8  # simulated workers, reducers or ring ranks at most; larger jobs use the scale model
# A fat tree is simulated host by host (placement decides what crosses the spines, so the scale
# model does not apply): at most this many workers (and as many reducers); slow near the limit.
MAX_FAT_TREE_WORKERS = 32
GBPS = 1e9 / 8  # bytes/s per Gbit/s


@dataclass(frozen=True)
class Network:
    """Links of the simulated hosts: payload rate = `efficiency` x the line rate."""

    worker_gbps: float
    reducer_gbps: float | None = None  # None: the workers' rate
    latency: float = 100e-6  # round trip between two hosts, seconds
    efficiency: float = 0.956  # TCP payload / line rate (1448 / 1514 bytes per frame)
    topology: str = "star"  # "star": per-host links into a non-blocking switch; "fat-tree"
    leaf: int = 16  # fat tree: hosts per leaf switch
    uplinks: int = 16  # fat tree: spines (uplinks < leaf oversubscribes leaf:uplinks)
    # Incast: a port queues `queue_s` seconds of its line rate and `queue_burst` bytes more (the
    # emulation's tbf: 20 ms, and its 256 KiB bucket, which a burst fills first); a round's first
    # burst into a reducer (W connections x their initial window, the smaller of TCP's 10 segments
    # after idle and the chunks of the window) beyond it is lost, and the connections that lost it
    # resend after the minimum retransmission timeout. None: no losses (fan-in kept within the
    # queue: receiver-driven credits or paced sends). A switch port: queue_burst 0.
    queue_s: float | None = 0.020
    queue_burst: int = 256 * 1024
    init_window: int = 10 * 1448
    rto: float = 0.200

    def platform(self) -> dict[str, Any]:
        kind = "fat_tree" if self.topology == "fat-tree" else "star"
        return {"kind": kind, "latency": self.latency, "leaf": self.leaf, "uplinks": self.uplinks}


@dataclass(frozen=True)
class Reducers:
    """The reducers' CPU: `threads` event-loop threads, each summing `core_gbps` (Gbit/s)."""

    threads: int = 8
    core_gbps: float = 8 * 1.9  # reducer.deploy.planner.REDUCER_CORE_GBPS
    ring_core_gbps: float | None = None  # the ring's summing rate per rank; None: not a limit (NCCL sums on the GPU)
    # CPU a worker's one communication thread spends per frame it sends or receives (a chunk out,
    # its result back: two per chunk), microseconds; 0: not modelled. It caps what a worker moves
    # each way at chunk / (2 x frame): 8 KiB chunks at 5 us, 0.82 GB/s (docs/performance.md).
    worker_frame_us: float = 0.0


DEFAULT_CPU = Reducers()


@dataclass
class Result:
    algo: str
    nbytes: int
    seconds: float
    bound: float  # the link bound of the algorithm, seconds
    simulated_hosts: int
    events: int
    extra: dict[str, Any] = field(default_factory=dict)


def worker_line_bps(net: Network, cpu: Reducers, chunk: int) -> float:
    """A worker's link rate as the engine takes it (line rate, bytes/s), capped by its CPU's
    chunk / (2 x worker_frame_us) of payload each way when that is modelled."""
    line = net.worker_gbps * GBPS
    if cpu.worker_frame_us <= 0:
        return line
    return min(line, chunk / (2 * cpu.worker_frame_us * 1e-6) / net.efficiency)


def _common(net: Network, socket_buffer: int) -> dict[str, Any]:
    return {"platform": net.platform(), "efficiency": net.efficiency, "gamma": socket_buffer}


def _scaled(workers: int, reducers: int) -> tuple[int, int]:
    """(W_s, R_s): the smallest job with the same W:R that keeps W_s <= MAX_WORKERS (R_s >= 1)."""
    if workers <= MAX_WORKERS and reducers <= MAX_WORKERS:
        return workers, reducers
    f = math.gcd(workers, reducers)
    w, r = workers // f, reducers // f  # the ratio in lowest terms
    if w <= MAX_WORKERS and r <= MAX_WORKERS:
        k = max(1, min(MAX_WORKERS // w, MAX_WORKERS // r))
        return w * k, r * k
    if workers >= reducers:
        return MAX_WORKERS, max(1, round(reducers * MAX_WORKERS / workers))
    return max(1, round(workers * MAX_WORKERS / reducers)), MAX_WORKERS


def _check_fat_tree(workers: int, reducers: int, net: Network) -> None:
    if max(workers, reducers) > MAX_FAT_TREE_WORKERS:
        raise ConfigError(
            f"--topology fat-tree simulates every host: at most {MAX_FAT_TREE_WORKERS} workers and reducers"
        )
    if net.reducer_gbps not in (None, net.worker_gbps):
        raise ConfigError("--topology fat-tree has one link rate: leave --reducer-gbps out (or equal to --gbps)")


def late_links(net: Network, workers: int, w_s: int, r_s: int, burst: int, reducer_gbps: float) -> list[list[int]]:
    """Per simulated worker, the reducers whose connection lost its first burst (incast): the
    real job's fraction of the W connections that overflow a reducer port, on every reducer."""
    late: list[list[int]] = [[] for _ in range(w_s)]
    if net.queue_s is None:
        return late
    fit = int((reducer_gbps * GBPS * net.queue_s + net.queue_burst) // max(burst, 1))
    if workers <= fit:
        return late
    lost = math.ceil(w_s * (workers - fit) / workers)
    for j in range(r_s):
        for m in range(lost):
            late[(j + m) % w_s].append(j)
    return late


def simulate_rs(
    nbytes: int, workers: int, reducers: int, net: Network, cpu: Reducers = DEFAULT_CPU, s: Settings = DEFAULTS
) -> Result:
    pipe = rs_pipeline(nbytes, workers, reducers, s)
    used = [sh for sh in pipe.shards if sh[0]]
    reducer_gbps = net.reducer_gbps or net.worker_gbps
    # The rate a link's results come back at (what its path window is sized from: client/schedule.cc
    # sample_rate): its share of the worker's link and of the reducer's.
    share = net.efficiency * GBPS * min(net.worker_gbps / len(used), reducer_gbps / workers)
    pipe = with_path_window(pipe, net.latency, share, s)
    if net.topology == "fat-tree":
        _check_fat_tree(workers, len(used), net)
        w_s, r_s = workers, len(used)
    else:
        w_s, r_s = _scaled(workers, len(used))
    sum_bps = cpu.core_gbps * GBPS * cpu.threads * w_s / workers
    threads = max(1, min(cpu.threads, w_s))
    # the CPU is modelled where it can matter: summing under 4x the reducer link's rate
    reducer_bps = reducer_gbps * GBPS * w_s / workers
    cpu_bound = sum_bps < 4 * reducer_bps
    burst = min(net.init_window, pipe.window * used[0][1])
    spec = _common(net, pipe.socket_buffer) | {
        "algo": "rs",
        "workers": w_s,
        # the largest shards (the even split puts the extra element first) on the simulated reducers
        "shards": [list(sh) for sh in used[:r_s]] + [list(used[0])] * max(0, r_s - len(used)),
        "window": pipe.window,
        "slots": pipe.slots,
        "worker_bps": worker_line_bps(net, cpu, used[0][1]) * r_s / len(used),
        "reducer_bps": reducer_bps,
        "sum_bps": sum_bps / threads if cpu_bound else 0,
        "threads": threads,
        "late": late_links(net, workers, w_s, r_s, burst, reducer_gbps),
        "rto": net.rto,
    }
    out = engine.run(spec)
    payload = net.efficiency * GBPS
    bound = max(nbytes / (net.worker_gbps * payload), workers * nbytes / (len(used) * reducer_gbps * payload))
    return Result(
        "rs",
        nbytes,
        out["seconds"],
        bound,
        w_s + r_s,
        out["events"],
        {
            "chunk": used[0][1],
            "shard": used[0][0],
            "window": pipe.window,
            "slots": pipe.slots,
            "reducers_used": len(used),
        },
    )


def simulate_ring(nbytes: int, ranks: int, net: Network, cpu: Reducers = DEFAULT_CPU, s: Settings = DEFAULTS) -> Result:
    pipe = ring_pipeline(nbytes, ranks, s)
    n_s = min(ranks, MAX_WORKERS)
    if net.topology == "fat-tree":
        _check_fat_tree(ranks, 0, net)
        n_s = ranks
    spec = _common(net, pipe.socket_buffer) | {
        "algo": "ring",
        "ranks": n_s,
        "steps": pipe.steps,
        "segment": pipe.segment,
        "chunk": pipe.chunk,
        "worker_bps": worker_line_bps(net, cpu, pipe.chunk),
        "sum_bps": cpu.ring_core_gbps * GBPS if cpu.ring_core_gbps else 0,
    }
    out = engine.run(spec)
    payload = net.worker_gbps * net.efficiency * GBPS
    bound = 2 * (ranks - 1) / ranks * nbytes / payload
    return Result(
        "ring", nbytes, out["seconds"], bound, n_s, out["events"], {"chunk": pipe.chunk, "segment": pipe.segment}
    )
