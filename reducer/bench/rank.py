"""One benchmark process: a measured worker rank, or a reducer node.

Started by reducer.bench.runner as ``python -m reducer.bench.rank`` (inside a network
namespace when hosts are emulated). It reads one JSON job from stdin and talks to the
runner in JSON lines: its own messages on stdout start with MARKER (anything else a
library prints there is passed through as log text), the runner's answers come on stdin.

Worker life cycle (spawned once per algorithm, all sizes or steps in one process):
  -> {"event": "listen", "port": P}        its ring / gloo-store port (or null)
  <- {"addresses": ["host:port", ...]}     every rank's listen address
  -> {"event": "ready"}                    connected to the group
  <- {"start": true}                       after the runner has looked at the connections
  -> {"event": "result", "key": K, "samples_us": [...], "wrong": k}   per size / step case
  -> {"event": "done", "stats": {...}}
Sizes (job "sizes"), per size and iteration: restore the input, barrier, time one all-reduce,
barrier, check the result against the reference. The barrier is a one-element all-reduce of
the algorithm itself, so no measured rank starts an iteration before all have finished
the previous one and every rank's clock starts at (nearly) the same moment.
Training steps (job "steps": one case per bucket plan and backward time, key = its index):
the same, but the timed part is one step of DDP's gradient traffic (step_once): bucket k
is started when its release time has passed, as DDP starts it when its last gradient is
ready; the step ends when every bucket is reduced (op avg, as DDP averages).

Reducer life cycle (job "control_plane": also a gRPC control plane and a /metrics endpoint):
  -> {"event": "ready", "port": P[, "control_address": "host:port", "metrics_url": U]} ... until stdin closes
  -> {"event": "done", "stats": {...}}
Poller life cycle (reducer.bench.poller; job "control", "metrics", "interval"):
  -> {"event": "ready"} ... polls until stdin closes ... -> {"event": "done", "polls": {...}}
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import config
from .._native import core
from ..addresses import parse_address
from ..communicator import Communicator
from ..dtypes import numpy_dtype, tensor_as_numpy, torch_dtype
from ..server import ReducerServer
from .cpu_monitor import read_cpu_times
from .data import count_wrong, count_wrong_tiled, fill_input, make_input, reference, step_tolerance
from .poller import Poller

MARKER = "@@rsb "


def cpu_seconds() -> float:
    """CPU time (user + system, all threads) this process has used."""
    t = os.times()
    return t.user + t.system


def emit(**msg: Any) -> None:
    sys.stdout.write(MARKER + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _read_json_line() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("benchmark runner went away (stdin closed)")
    return json.loads(line)


# ------------------------------------------------------------------------ algorithms
class _Algo:
    """An all-reduce implementation as the worker loop sees it."""

    dtype: str  # the job's wire dtype name, set by each implementation's constructor

    def listen_port(self) -> int | None:
        return None

    def connect(self, addresses: list[str]) -> None:
        pass

    def alloc(self, count: int) -> Any:
        """A work buffer of `count` elements: a numpy array (possibly sharing a tensor's memory)."""
        return np.empty(count, dtype=numpy_dtype(self.dtype))

    def prepare(self, buf: Any) -> Callable[[], object]:
        """A no-argument function that all-reduces `buf` in place (the timed call)."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    # -- training steps: DDP's buckets, views of one flat gradient buffer, in bucket order
    wire = "float32"  # what a gradient travels as (the result's precision)

    def bucket_objects(self, buf: Any, counts: list[int]) -> list[Any]:
        """What start_bucket takes for each bucket of `counts` elements laid out in `buf`."""
        raise NotImplementedError

    def start_bucket(self, bucket: Any) -> Any:
        """Start averaging one bucket; returns what finish_step waits for."""
        raise NotImplementedError

    def finish_step(self, pending: list[Any]) -> None:
        """Wait until every bucket started is reduced."""

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def _slices(counts: list[int]) -> list[tuple[int, int]]:
    """(offset, count) of each bucket: laid out one after another in the flat gradient buffer."""
    out, off = [], 0
    for n in counts:
        out.append((off, n))
        off += n
    return out


class _RS(_Algo):
    hook_name = "allreduce_hook"

    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.dtype = job["dtype"]

    def connect(self, addresses: list[str]) -> None:
        j = self.job
        extra: dict[str, Any] = {}
        if "steps" in j and config.env_text("fusion_threshold") is None:
            extra["fusion_threshold"] = 0  # as reducer.torch.HookState connects for DDP's (already fused) buckets
        self.comm = Communicator(
            j["reducers"],
            rank=j["rank"],
            world_size=j["world"],
            group=j["group"],
            job_id="bench",
            timeout=j["timeout"],
            connect_timeout=j["connect_timeout"],
            **extra,
        )
        self._tiny = np.zeros(1, dtype=np.float32)

    # The DDP hook path: every bucket goes through reducer.torch's hook, as DDP calls it.
    def bucket_objects(self, buf: Any, counts: list[int]) -> list[Any]:
        import torch

        from ..torch import hooks

        self._hook = getattr(hooks, self.hook_name)
        self._state = hooks.HookState(self.comm)
        flat = torch.from_numpy(buf)
        return [_GradBucket(k, flat[off : off + n]) for k, (off, n) in enumerate(_slices(counts))]

    def start_bucket(self, bucket: Any) -> Any:
        return self._hook(self._state, bucket)

    def finish_step(self, pending: list[Any]) -> None:
        for fut in pending:
            fut.wait()

    def prepare(self, buf: Any) -> Callable[[], object]:
        # compression: 'bf16' / 'fp16' (the float32 buffer goes 16-bit on the wire) or 'none',
        # explicitly: RS_COMPRESSION in the environment does not change what is measured.
        comm, op, comp = self.comm, self.job["op"], self.job.get("compression") or "none"
        return lambda: comm.allreduce(buf, op=op, compression=comp)

    def barrier(self) -> None:
        self.comm.allreduce(self._tiny, compression="none")

    def stats(self) -> dict[str, Any]:
        return self.comm.stats()

    def close(self) -> None:
        self.comm.close()


class _RSBf16(_RS):
    """The bf16 hook: each bucket cast to bfloat16 (divided by the world size), summed, cast back."""

    hook_name = "bf16_compress_hook"
    wire = "bfloat16"


class _GradBucket:
    """What a DDP communication hook reads of torch.distributed.GradBucket."""

    def __init__(self, index: int, tensor: Any):
        self._index, self._tensor = index, tensor

    def index(self) -> int:
        return self._index

    def buffer(self) -> Any:
        return self._tensor


class _Ring(_Algo):
    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.dtype = job["dtype"]
        # chunk: the runner's (--ring-chunk-bytes, else RS_CHUNK_BYTES); socket buffer: RS_SOCKET_BUFFER as
        # for rs, else the core's default
        self.ring = core.Ring(
            job["rank"],
            job["world"],
            listen_host=job["bind_host"],
            port=0,
            timeout=job["timeout"],
            chunk_bytes=job["chunk_bytes"],
            socket_buffer=config.socket_buffer_arg(),
            session=job["session"],
        )

    def listen_port(self) -> int | None:
        return int(self.ring.port)

    def connect(self, addresses: list[str]) -> None:
        self.ring.connect(addresses, self.job["connect_timeout"])
        self._tiny = np.zeros(1, dtype=np.float32)

    def prepare(self, buf: Any) -> Callable[[], object]:
        ring, ptr, nbytes, dtype, op = self.ring, int(buf.ctypes.data), int(buf.nbytes), self.dtype, self.job["op"]
        return lambda: ring.allreduce_ptr(ptr, nbytes, dtype, op)

    def barrier(self) -> None:
        self.ring.allreduce_ptr(int(self._tiny.ctypes.data), 4, "float32", "sum")

    def bucket_objects(self, buf: Any, counts: list[int]) -> list[Any]:
        return [(int(buf[off:].ctypes.data), n * buf.itemsize) for off, n in _slices(counts)]

    def start_bucket(self, bucket: Any) -> Any:
        self.ring.allreduce_ptr(bucket[0], bucket[1], self.dtype, "avg")  # one at a time, in order
        return None

    def stats(self) -> dict[str, Any]:
        return dict(self.ring.stats())

    def close(self) -> None:
        self.ring.close()


class _Gloo(_Algo):
    """torch.distributed with the gloo backend (a ring all-reduce on CPU tensors)."""

    def __init__(self, job: dict[str, Any]):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.job = torch, dist, job
        self.dtype = job["dtype"]
        self.timeout = datetime.timedelta(seconds=max(60.0, job["timeout"]))
        self.store = None
        if job["rank"] == 0:
            # Rank 0 hosts the rendezvous store on a free port; the runner hands it to the others.
            self.store = dist.TCPStore(
                job["bind_host"], 0, job["world"], True, timeout=self.timeout, wait_for_workers=False
            )

    def listen_port(self) -> int | None:
        return int(self.store.port) if self.store is not None else None

    def connect(self, addresses: list[str]) -> None:
        dist, j = self.dist, self.job
        if self.store is None:
            host, port = parse_address(addresses[0])
            self.store = dist.TCPStore(host, port, j["world"], False, timeout=self.timeout)
        dist.init_process_group("gloo", store=self.store, rank=j["rank"], world_size=j["world"], timeout=self.timeout)
        self._tiny = self.torch.zeros(1, dtype=self.torch.float32)

    def alloc(self, count: int) -> Any:
        t = self.torch.empty(count, dtype=torch_dtype(self.dtype))
        arr = tensor_as_numpy(t)
        self._tensors = getattr(self, "_tensors", {})
        self._tensors[id(arr)] = (arr, t)  # the tensor behind each numpy view
        return arr

    def prepare(self, buf: Any) -> Callable[[], object]:
        torch, dist = self.torch, self.dist
        t = self._tensors[id(buf)][1]
        op, world = self.job["op"], self.job["world"]
        if op == "avg":  # gloo has no AVG: sum, then divide (as DDP does)
            if t.is_floating_point():
                return lambda: (dist.all_reduce(t, op=dist.ReduceOp.SUM), t.div_(world))
            return lambda: (dist.all_reduce(t, op=dist.ReduceOp.SUM), torch.div(t, world, rounding_mode="trunc", out=t))
        rop = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
        return lambda: dist.all_reduce(t, op=rop)

    def release(self, buf: Any) -> None:
        self._tensors.pop(id(buf), None)

    def bucket_objects(self, buf: Any, counts: list[int]) -> list[Any]:
        flat = self._tensors[id(buf)][1]
        return [flat[off : off + n] for off, n in _slices(counts)]

    def start_bucket(self, bucket: Any) -> Any:
        # DDP's default communication: divide by the world size, then an asynchronous sum
        bucket.div_(self.job["world"])
        return self.dist.all_reduce(bucket, op=self.dist.ReduceOp.SUM, async_op=True)

    def finish_step(self, pending: list[Any]) -> None:
        for work in pending:
            work.wait()

    def barrier(self) -> None:
        self.dist.all_reduce(self._tiny)

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:
            pass


class _GlooBF16(_Gloo):
    """gloo all-reducing a bfloat16 copy of the float32 buffer, as torch's bf16_compress_hook does
    (cast, divide by the world size for avg, all-reduce, copy back): the baseline of rs with
    compression. The cast copies are part of the timed call, as they are in the hook."""

    def prepare(self, buf: Any) -> Callable[[], object]:
        torch, dist = self.torch, self.dist
        t = self._tensors[id(buf)][1]
        op, world = self.job["op"], self.job["world"]
        rop = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[
            op
        ]

        def run() -> None:
            c = t.to(torch.bfloat16)
            if op == "avg":
                c.div_(world)
            dist.all_reduce(c, op=rop)
            t.copy_(c)

        return run


# rs+cp: rs measured against reducers that run their control plane (the runner starts those and a poller)
ALGOS = {"rs": _RS, "rs+cp": _RS, "rs+bf16": _RSBf16, "ring": _Ring, "gloo": _Gloo, "gloo-bf16": _GlooBF16}


# ------------------------------------------------------------------------ worker
def run_worker(job: dict[str, Any]) -> int:
    algo = ALGOS[job["algo"]](job)
    emit(event="listen", port=algo.listen_port())
    reply = _read_json_line()
    algo.connect(reply["addresses"])
    emit(event="ready", cpu_s=cpu_seconds())
    _read_json_line()  # {"start": true}
    if "steps" in job:
        _step_loop(algo, job)
    else:
        _size_loop(algo, job)
    emit(event="done", stats=algo.stats(), cpu_s=cpu_seconds())
    algo.close()
    return 0


class _CpuSampler:
    """Rank 0 samples the whole machine's CPU over the timed parts of the iterations."""

    def __init__(self, rank: int):
        self._read = read_cpu_times if rank == 0 else None
        self.busy = self.total = 0
        self._c0: Any = None

    def start(self) -> None:
        self._c0 = self._read() if self._read else None

    def stop(self, timed: bool) -> None:
        c1 = self._read() if self._read else None
        if timed and self._c0 and c1:
            self.busy, self.total = self.busy + c1[0] - self._c0[0], self.total + c1[1] - self._c0[1]

    def percent(self, samples_us: list[float]) -> float | None:
        # /proc/stat counts in clock ticks (10 ms): only meaningful over enough timed time
        return 100.0 * self.busy / self.total if self.total and sum(samples_us) >= 2e5 else None


MAX_WARMUP_ITERS = 1000
MAX_TIMED_ITERS = 200


def iterations_for(size: int, count: int, min_bytes: int, cap: int) -> int:
    """`count` iterations, or enough that they move `min_bytes` (at most `cap`) if that is more.
    Every rank derives the same count."""
    by_bytes = -(-min_bytes // size) if min_bytes > 0 and size > 0 else 0
    return max(count, min(by_bytes, cap))


def warmup_iterations(size: int, warmup: int, warmup_bytes: int) -> int:
    """Untimed iterations before a size's timed ones: `warmup`, and enough that the warm-up moves
    `warmup_bytes` (new TCP connections open their windows, caches and page tables settle),
    at most MAX_WARMUP_ITERS."""
    return iterations_for(size, warmup, warmup_bytes, MAX_WARMUP_ITERS)


def timed_iterations(size: int, iters: int, iters_bytes: int) -> int:
    """Timed iterations of a size: `iters`, and enough that they move `iters_bytes`, at most
    MAX_TIMED_ITERS. A small round's time varies by 30-60% from one iteration to the next on a
    busy host (scheduling, the emulated link's token bucket), so a median of 10 samples is itself
    noisy; more samples steady a run's median (they do not remove the differences between runs
    that come from the host's state: docs/performance.md, "Session of 2026-11-25")."""
    return iterations_for(size, iters, iters_bytes, MAX_TIMED_ITERS)


def _size_loop(algo: _Algo, job: dict[str, Any]) -> None:
    rank, world, dtype, op = job["rank"], job["world"], job["dtype"], job["op"]
    esize = numpy_dtype(dtype).itemsize
    for size in job["sizes"]:
        count = size // esize
        inp = make_input(rank, count, dtype)
        expected, tol = reference(world, count, dtype, op, wire=job.get("wire_dtype"))
        buf = algo.alloc(count)
        fn = algo.prepare(buf)
        samples: list[float] = []
        wrong = 0
        cpu = _CpuSampler(rank)
        warm = warmup_iterations(size, job["warmup"], job.get("warmup_bytes", 0))
        for it in range(warm + timed_iterations(size, job["iters"], job.get("iters_bytes", 0))):
            np.copyto(buf, inp)
            algo.barrier()
            cpu.start()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            cpu.stop(it >= warm)
            algo.barrier()  # nobody checks (uses CPU) while another rank is still timing
            if it >= warm:
                samples.append((t1 - t0) * 1e6)
                wrong = max(wrong, count_wrong(buf, expected, tol))
        emit(
            event="result",
            key=size,
            samples_us=samples,
            wrong=wrong,
            cpu_percent=cpu.percent(samples),
            link_window_max=algo.stats().get("link_window_max"),
        )
        if hasattr(algo, "release"):
            algo.release(buf)
        del inp, expected, buf, fn


def step_once(algo: _Algo, buckets: list[Any], release_s: list[float]) -> None:
    """One training step's gradient traffic: bucket k starts once release_s[k] seconds have passed."""
    t0 = time.perf_counter()
    pending = []
    for bucket, at in zip(buckets, release_s):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # the backward pass runs on the accelerator: the host CPU is free
        pending.append(algo.start_bucket(bucket))
    algo.finish_step(pending)


def _step_loop(algo: _Algo, job: dict[str, Any]) -> None:
    rank, world = job["rank"], job["world"]
    buf = algo.alloc(job["elements"])
    tol = step_tolerance(algo.wire, world)
    n_iter = job["warmup"] + job["iters"]
    for case in job["steps"]:
        buckets = algo.bucket_objects(buf, case["counts"])
        samples: list[float] = []
        wrong = 0
        cpu = _CpuSampler(rank)
        for it in range(n_iter):
            fill_input(buf, rank)
            algo.barrier()
            cpu.start()
            t0 = time.perf_counter()
            step_once(algo, buckets, case["release_s"])
            t1 = time.perf_counter()
            cpu.stop(it >= job["warmup"])
            algo.barrier()
            if it >= job["warmup"]:
                samples.append((t1 - t0) * 1e6)
                if it in (job["warmup"], n_iter - 1):  # a whole model's check is slow: first and last
                    wrong = max(wrong, count_wrong_tiled(buf, world, "avg", tol))
        emit(event="result", key=case["key"], samples_us=samples, wrong=wrong, cpu_percent=cpu.percent(samples))
        del buckets


# ------------------------------------------------------------------------ reducer
def run_reducer(job: dict[str, Any]) -> int:
    srv = ReducerServer(host=job["bind_host"], port=0, threads=job.get("threads")).start()
    side = _ControlSide(srv, job["bind_host"]) if job.get("control_plane") else None
    emit(event="ready", port=srv.port, cpu_s=cpu_seconds(), **(side.addresses() if side else {}))
    sys.stdin.read()  # until the runner closes our stdin (or dies)
    stats = srv.stats()
    cpu = cpu_seconds()
    if side is not None:
        side.stop()
    srv.stop()
    emit(event="done", stats=stats, cpu_s=cpu)
    return 0


class _ControlSide:
    """A reducer's control plane and metrics endpoint, as `reduction-server serve` runs them (both on
    any free port of the reducer's host), with serve's liveness refresh every 0.25 s."""

    def __init__(self, srv: Any, host: str) -> None:
        from ..control.lifecycle import Lifecycle
        from ..control.metrics import MetricsEndpoint, reducer_registry
        from ..control.service import ControlPlane

        lifecycle = Lifecycle(srv)
        self.control = ControlPlane(srv, lifecycle, host=host, port=0).start()
        self.metrics = MetricsEndpoint(reducer_registry(srv, lifecycle), host=host, port=0)
        self._stop = threading.Event()
        self._refresh = threading.Thread(target=self._refresh_loop, name="rs-refresh", daemon=True)
        self._refresh.start()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(0.25):
            self.control.refresh()

    def addresses(self) -> dict[str, str]:
        return {"control_address": self.control.address, "metrics_url": self.metrics.url}

    def stop(self) -> None:
        self._stop.set()
        self._refresh.join(2.0)
        self.control.stop(0)
        self.metrics.stop()


# ------------------------------------------------------------------------ control-plane poller
def run_poller(job: dict[str, Any]) -> int:
    """Poll the reducers' control planes (reducer.bench.poller) until the runner closes our stdin."""
    poller = Poller(job["control"], job["metrics"], interval=job["interval"])
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(stop,), name="rs-poller", daemon=True)
    cpu0 = cpu_seconds()
    emit(event="ready", cpu_s=cpu0)
    thread.start()
    sys.stdin.read()
    stop.set()
    thread.join(30.0)
    poller.close()
    poller.counts.cpu_s = cpu_seconds() - cpu0
    emit(event="done", polls=poller.counts.as_dict(), cpu_s=cpu_seconds())
    return 0


def main() -> int:
    job = _read_json_line()
    try:
        if job["role"] == "reducer":
            return run_reducer(job)
        if job["role"] == "poller":
            return run_poller(job)
        return run_worker(job)
    except SystemExit:
        raise
    except BaseException as exc:  # report, so the runner can show why
        emit(event="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
