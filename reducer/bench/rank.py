"""One benchmark process: a measured worker rank, or a reducer node.

Started by reducer.bench.runner as ``python -m reducer.bench.rank`` (inside a network
namespace when hosts are emulated). It reads one JSON job from stdin and talks to the
runner in JSON lines: its own messages on stdout start with MARKER (anything else a
library prints there is passed through as log text), the runner's answers come on stdin.

Worker life cycle (spawned once per algorithm, all sizes in one process):
  -> {"event": "listen", "port": P}        its ring / gloo-store port (or null)
  <- {"addresses": ["host:port", ...]}     every rank's listen address
  -> {"event": "ready"}                    connected to the group
  -> {"event": "size", "size": S, "samples_us": [...], "wrong": k}   per size
  -> {"event": "done", "stats": {...}}
Per size and iteration: restore the input, barrier, time one all-reduce, barrier,
check the result against the reference. The barrier is a one-element all-reduce of
the algorithm itself, so no measured rank starts an iteration before all have finished
the previous one and every rank's clock starts at (nearly) the same moment.

Reducer life cycle:
  -> {"event": "ready", "port": P} ... runs until stdin closes ... -> {"event": "done", "stats": {...}}
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

MARKER = "@@rsb "


def cpu_seconds() -> float:
    """CPU time (user + system, all threads) this process has used."""
    t = os.times()
    return t.user + t.system


def emit(**msg: Any) -> None:
    sys.stdout.write(MARKER + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _read_json_line() -> Dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("benchmark runner went away (stdin closed)")
    return json.loads(line)


# ------------------------------------------------------------------------ algorithms
class _Algo:
    """An all-reduce implementation as the worker loop sees it."""

    def listen_port(self) -> Optional[int]:
        return None

    def connect(self, addresses: List[str]) -> None:
        pass

    def alloc(self, count: int) -> Any:
        """A work buffer of `count` elements: a numpy array (possibly sharing a tensor's memory)."""
        import numpy as np

        from ..dtypes import numpy_dtype

        return np.empty(count, dtype=numpy_dtype(self.dtype))

    def prepare(self, buf: Any) -> Callable[[], None]:
        """A no-argument function that all-reduces `buf` in place (the timed call)."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def stats(self) -> Dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class _RS(_Algo):
    def __init__(self, job: Dict[str, Any]):
        self.job = job
        self.dtype = job["dtype"]

    def connect(self, addresses: List[str]) -> None:
        import numpy as np

        from ..communicator import Communicator

        j = self.job
        self.comm = Communicator(j["reducers"], rank=j["rank"], world_size=j["world"], group=j["group"],
                                 job_id="bench", timeout=j["timeout"], connect_timeout=j["connect_timeout"])
        self._tiny = np.zeros(1, dtype=np.float32)

    def prepare(self, buf: Any) -> Callable[[], None]:
        # compression: 'bf16' / 'fp16' (the float32 buffer goes 16-bit on the wire) or 'none',
        # explicitly: RS_COMPRESSION in the environment does not change what is measured.
        comm, op, comp = self.comm, self.job["op"], self.job.get("compression") or "none"
        return lambda: comm.allreduce(buf, op=op, compression=comp)

    def barrier(self) -> None:
        self.comm.allreduce(self._tiny, compression="none")

    def stats(self) -> Dict[str, Any]:
        return self.comm.stats()

    def close(self) -> None:
        self.comm.close()


class _Ring(_Algo):
    def __init__(self, job: Dict[str, Any]):
        from .._native import core

        self.job = job
        self.dtype = job["dtype"]
        self.ring = core.Ring(job["rank"], job["world"], job["bind_host"], 0, job["timeout"], job["chunk_bytes"],
                              4 << 20, job["session"])

    def listen_port(self) -> Optional[int]:
        return int(self.ring.port)

    def connect(self, addresses: List[str]) -> None:
        import numpy as np

        self.ring.connect(addresses, self.job["connect_timeout"])
        self._tiny = np.zeros(1, dtype=np.float32)

    def prepare(self, buf: Any) -> Callable[[], None]:
        ring, ptr, nbytes, dtype, op = self.ring, int(buf.ctypes.data), int(buf.nbytes), self.dtype, self.job["op"]
        return lambda: ring.allreduce_ptr(ptr, nbytes, dtype, op)

    def barrier(self) -> None:
        self.ring.allreduce_ptr(int(self._tiny.ctypes.data), 4, "float32", "sum")

    def stats(self) -> Dict[str, Any]:
        return dict(self.ring.stats())

    def close(self) -> None:
        self.ring.close()


class _Gloo(_Algo):
    """torch.distributed with the gloo backend (a ring all-reduce on CPU tensors)."""

    def __init__(self, job: Dict[str, Any]):
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.job = torch, dist, job
        self.dtype = job["dtype"]
        self.timeout = datetime.timedelta(seconds=max(60.0, job["timeout"]))
        self.store = None
        if job["rank"] == 0:
            # Rank 0 hosts the rendezvous store on a free port; the runner hands it to the others.
            self.store = dist.TCPStore(job["bind_host"], 0, job["world"], True, timeout=self.timeout,
                                       wait_for_workers=False)

    def listen_port(self) -> Optional[int]:
        return int(self.store.port) if self.store is not None else None

    def connect(self, addresses: List[str]) -> None:
        dist, j = self.dist, self.job
        if self.store is None:
            from ..addresses import parse_address

            host, port = parse_address(addresses[0])
            self.store = dist.TCPStore(host, port, j["world"], False, timeout=self.timeout)
        dist.init_process_group("gloo", store=self.store, rank=j["rank"], world_size=j["world"], timeout=self.timeout)
        self._tiny = self.torch.zeros(1, dtype=self.torch.float32)

    def alloc(self, count: int) -> Any:
        from ..dtypes import tensor_as_numpy, torch_dtype

        t = self.torch.empty(count, dtype=torch_dtype(self.dtype))
        arr = tensor_as_numpy(t)
        self._tensors = getattr(self, "_tensors", {})
        self._tensors[id(arr)] = (arr, t)  # the tensor behind each numpy view
        return arr

    def prepare(self, buf: Any) -> Callable[[], None]:
        torch, dist = self.torch, self.dist
        t = self._tensors[id(buf)][1]
        op, world = self.job["op"], self.job["world"]
        if op == "avg":  # gloo has no AVG: sum, then divide (as DDP does)
            if t.is_floating_point():
                return lambda: (dist.all_reduce(t, op=dist.ReduceOp.SUM), t.div_(world))
            return lambda: (dist.all_reduce(t, op=dist.ReduceOp.SUM),
                            torch.div(t, world, rounding_mode="trunc", out=t))
        rop = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
        return lambda: dist.all_reduce(t, op=rop)

    def release(self, buf: Any) -> None:
        self._tensors.pop(id(buf), None)

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

    def prepare(self, buf: Any) -> Callable[[], None]:
        torch, dist = self.torch, self.dist
        t = self._tensors[id(buf)][1]
        op, world = self.job["op"], self.job["world"]
        rop = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
               "max": dist.ReduceOp.MAX}[op]

        def run() -> None:
            c = t.to(torch.bfloat16)
            if op == "avg":
                c.div_(world)
            dist.all_reduce(c, op=rop)
            t.copy_(c)

        return run


ALGOS = {"rs": _RS, "ring": _Ring, "gloo": _Gloo, "gloo-bf16": _GlooBF16}


# ------------------------------------------------------------------------ worker
def run_worker(job: Dict[str, Any]) -> int:
    import numpy as np

    from .data import count_wrong, make_input, reference

    algo = ALGOS[job["algo"]](job)
    emit(event="listen", port=algo.listen_port())
    reply = _read_json_line()
    algo.connect(reply["addresses"])
    emit(event="ready", cpu_s=cpu_seconds())
    rank, world, dtype, op = job["rank"], job["world"], job["dtype"], job["op"]
    from ..dtypes import numpy_dtype

    esize = numpy_dtype(dtype).itemsize
    from .cpu_monitor import read_cpu_times

    # rank 0 samples the whole machine's CPU over the timed iterations
    cpu_times = read_cpu_times if rank == 0 else None
    for size in job["sizes"]:
        count = size // esize
        inp = make_input(rank, count, dtype)
        expected, tol = reference(world, count, dtype, op, wire=job.get("wire_dtype"))
        buf = algo.alloc(count)
        fn = algo.prepare(buf)
        samples: List[float] = []
        wrong = 0
        busy = total = 0
        for it in range(job["warmup"] + job["iters"]):
            np.copyto(buf, inp)
            algo.barrier()
            c0 = cpu_times() if cpu_times else None
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            c1 = cpu_times() if cpu_times else None
            algo.barrier()  # nobody checks (uses CPU) while another rank is still timing
            if it >= job["warmup"]:
                samples.append((t1 - t0) * 1e6)
                wrong = max(wrong, count_wrong(buf, expected, tol))
                if c0 and c1:
                    busy, total = busy + c1[0] - c0[0], total + c1[1] - c0[1]
        # /proc/stat counts in clock ticks (10 ms): only meaningful over enough timed time
        cpu = 100.0 * busy / total if total and sum(samples) >= 2e5 else None
        emit(event="size", size=size, samples_us=samples, wrong=wrong, cpu_percent=cpu)
        if hasattr(algo, "release"):
            algo.release(buf)
        del inp, expected, buf, fn
    emit(event="done", stats=algo.stats(), cpu_s=cpu_seconds())
    algo.close()
    return 0


# ------------------------------------------------------------------------ reducer
def run_reducer(job: Dict[str, Any]) -> int:
    from ..server import ReducerServer

    srv = ReducerServer(host=job["bind_host"], port=0, threads=job.get("threads")).start()
    emit(event="ready", port=srv.port, cpu_s=cpu_seconds())
    sys.stdin.read()  # until the runner closes our stdin (or dies)
    stats = srv.stats()
    cpu = cpu_seconds()
    srv.stop()
    emit(event="done", stats=stats, cpu_s=cpu)
    return 0


def main() -> int:
    job = _read_json_line()
    try:
        if job["role"] == "reducer":
            return run_reducer(job)
        return run_worker(job)
    except SystemExit:
        raise
    except BaseException as exc:  # report, so the runner can show why
        emit(event="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
