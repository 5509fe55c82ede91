"""One rank of the GPU check: a process that is one NCCL "host" (``python -m reducer.gpucheck.worker``).

Started by ``reduction-server launch``'s library code (reducer.launch), which gives it RANK,
WORLD_SIZE, MASTER_ADDR/MASTER_PORT and CLUSTER_SPEC (the reducers). It gives itself a distinct
NCCL_HOSTID (so two processes on one GPU are two NCCL nodes and their traffic goes through the
net plugin), points NCCL_DEBUG_FILE at its run directory, and runs one task:

- ``sums``: in-place all-reduce (sum) of float32 / bfloat16 / float16 tensors of each size,
  inputs small integers so every sum is exact, each result compared element by element with a
  float64 numpy reference computed on the CPU;
- ``ddp``: a few DistributedDataParallel steps of a small model, losses recorded;
- ``teardown``: one small all-reduce, then the communicator is destroyed;
- ``bench``: float32 sum all-reduces of each size (``--bench``, reducer.gpucheck.bench): the
  first call timed alone, then warm-up calls, then timed calls, each between two CUDA events
  (perf_counter on the CPU), no host synchronization between them; the last result is checked
  (every rank's input is rank + 1, refilled before each call). The result file is rewritten
  after every size, so a phase stopped at its time limit still leaves the sizes it finished.

Every task ends with ``destroy_process_group()``; the result JSON is written before it (with
``teardown: "pending"``) and again after it (``"ok"``), so a crash at teardown is visible.
A watchdog (faulthandler) ends the process with a traceback after --timeout seconds.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import sys
import time
from typing import Any

import numpy as np

from .bench_report import iteration_plan

DTYPES = ("float32", "bfloat16", "float16")
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _base(n: int) -> Any:
    i = np.arange(n, dtype=np.int64)
    return (i * 7 + (i >> 12) * 3 + (i >> 9)) % 17


def pattern(n: int, rank: int, base: Any = None) -> Any:
    """Rank `rank`'s input as a numpy int64 array: small integers in [-8, 8] with no short
    period (a misplaced chunk changes the values), so sums of 2 are exact in every dtype checked."""
    b = _base(n) if base is None else base
    return ((b + rank * 5) % 17) - 8


def expected_sum(n: int, world: int, base: Any = None) -> Any:
    """The float64 reference: the sum of every rank's pattern."""
    b = _base(n) if base is None else base
    total = np.zeros(n, dtype=np.float64)
    for r in range(world):
        total += pattern(n, r, b)
    return total


def _write(path: str, result: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, path)


def run_sums(
    torch: Any, dist: Any, dev: Any, rank: int, world: int, sizes: list[int], dtypes: list[str]
) -> list[dict[str, Any]]:
    out = []
    for name in dtypes:
        dtype = getattr(torch, name)
        for size in sizes:
            n = max(1, size // _ITEMSIZE[name])
            base = _base(n)
            x = torch.from_numpy(pattern(n, rank, base).astype(np.float32)).to(dev).to(dtype)
            _sync(torch, dev)
            t0 = time.perf_counter()
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            _sync(torch, dev)
            seconds = time.perf_counter() - t0
            got = x.float().cpu().numpy().astype(np.float64)
            want = expected_sum(n, world, base)
            bad = np.nonzero(got != want)[0]
            row: dict[str, Any] = {
                "dtype": name,
                "bytes": n * _ITEMSIZE[name],
                "count": n,
                "mismatches": int(bad.size),
                "seconds": round(seconds, 6),
            }
            if bad.size:
                k = int(bad[0])
                row["first_bad"] = {"index": k, "got": float(got[k]), "want": float(want[k])}
            out.append(row)
            del x
    return out


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


class _CallTimer:
    """Seconds per call: CUDA events recorded on the current stream around each call (resolved
    at the end, so the calls run back to back), or perf_counter on the CPU."""

    def __init__(self, torch: Any, dev: Any) -> None:
        self.torch, self.cuda = torch, dev.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """(start, stop) pairs marked in turn -> each call's seconds."""
        pairs = zip(self.marks[0::2], self.marks[1::2])
        if self.cuda:
            self.torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in pairs]
        return [b - a for a, b in pairs]


def _memory_cap(torch: Any, dev: Any) -> int:
    """The largest buffer a rank allocates: 1/8 of the GPU's memory (two ranks share it, and
    the same number on both, so both skip the same sizes); no cap on the CPU."""
    if dev.type != "cuda":
        return 0
    return int(torch.cuda.mem_get_info(dev)[1] // 8)


def bench_one(torch: Any, dist: Any, dev: Any, rank: int, world: int, size: int, plan: tuple[int, int]) -> dict:
    """One size of the bench task: first call, warm-up, timed calls, the last result checked."""
    warmup, iters = plan
    n = max(1, size // 4)
    x = torch.empty(n, dtype=torch.float32, device=dev)
    mine, want = float(rank + 1), float(world * (world + 1) // 2)
    x.fill_(mine)
    _sync(torch, dev)
    t0 = time.perf_counter()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    _sync(torch, dev)
    first = time.perf_counter() - t0
    for _ in range(warmup):
        x.fill_(mine)
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    _sync(torch, dev)
    timer = _CallTimer(torch, dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        x.fill_(mine)
        timer.mark()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        timer.mark()
    times = timer.seconds()
    loop = (time.perf_counter() - t0) / max(1, iters)
    wrong = int((x != want).sum().item())
    del x
    return {
        "bytes": n * 4,
        "first_seconds": round(first, 6),
        "warmup": warmup,
        "times": [round(t, 7) for t in times],
        "loop_seconds": round(loop, 7),
        "wrong": wrong,
    }


def run_bench(
    torch: Any, dist: Any, dev: Any, rank: int, world: int, args: argparse.Namespace, save: Any
) -> list[dict[str, Any]]:
    """The bench task over --sizes; `save(rows)` after each size."""
    rows: list[dict[str, Any]] = []
    cap = _memory_cap(torch, dev)
    for size in [int(s) for s in args.sizes.split(",") if s]:
        if cap and size > cap:
            rows.append({"bytes": size, "skipped": f"over 1/8 of the GPU's memory ({cap} B)"})
        else:
            rows.append(
                bench_one(
                    torch, dist, dev, rank, world, size, iteration_plan(size, args.warmup, args.iters, args.iters_bytes)
                )
            )
        save(rows)
    return rows


def run_ddp(torch: Any, dev: Any, rank: int, steps: int, width: int) -> dict[str, Any]:
    """Deterministic DDP steps (same seed, same data on every run); returns losses and a
    checksum of the final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.use_deterministic_algorithms(True)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width)
    ).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, width, generator=gen).to(dev)
        y = torch.randn(64, width, generator=gen).to(dev)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    with torch.no_grad():
        checksum = float(sum(p.double().sum().item() for p in model.parameters()))
    params = sum(p.numel() for p in model.parameters())
    return {"losses": losses, "param_checksum": checksum, "parameters": params}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m reducer.gpucheck.worker")
    p.add_argument("--task", choices=("sums", "ddp", "teardown", "bench"), required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--sizes", default="4096", help="comma-separated byte sizes (sums)")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20, help="bench: timed calls per size, at most")
    p.add_argument("--warmup", type=int, default=5, help="bench: warm-up calls per size, at most")
    p.add_argument("--iters-bytes", type=int, default=2 << 30, help="bench: bytes of timed calls per size")
    p.add_argument(
        "--no-reducers", action="store_true", help="drop the reducer addresses the launcher gave (CLUSTER_SPEC etc.)"
    )
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu runs the same code over gloo (the CPU tests of this module)",
    )
    return p.parse_args(argv)


def prepare_env(args: argparse.Namespace, rank: int) -> None:
    """Settings that must be in the environment before CUDA / NCCL start."""
    os.environ["NCCL_HOSTID"] = f"rs-gpucheck-host-{rank}"
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(args.run_dir, f"nccl-rank{rank}.log")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (DDP task)
    if args.no_reducers:
        for key in ("CLUSTER_SPEC", "TF_CONFIG", "RS_REDUCERS"):
            os.environ.pop(key, None)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    faulthandler.dump_traceback_later(args.timeout, exit=True)  # a hang becomes exit 1 with a traceback
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    prepare_env(args, rank)
    path = os.path.join(args.run_dir, f"result-rank{rank}.json")
    result: dict[str, Any] = {"rank": rank, "world": world, "task": args.task, "teardown": "not reached"}
    _write(path, result)

    import torch
    import torch.distributed as dist

    if args.device == "cuda":
        torch.cuda.set_device(0)
        dev, backend = torch.device("cuda", 0), "nccl"
        result["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    else:
        dev, backend = torch.device("cpu"), "gloo"
    result["torch"] = torch.__version__
    t0 = time.perf_counter()
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=max(30.0, args.timeout / 2)),
        device_id=dev if dev.type == "cuda" else None,
    )
    result["init_seconds"] = round(time.perf_counter() - t0, 3)
    if args.task == "sums":
        sizes = [int(s) for s in args.sizes.split(",") if s]
        result["sums"] = run_sums(torch, dist, dev, rank, world, sizes, args.dtypes.split(","))
    elif args.task == "ddp":
        result["ddp"] = run_ddp(torch, dev, rank, args.steps, args.width)
    elif args.task == "bench":
        result["bench"] = run_bench(
            torch, dist, dev, rank, world, args, lambda rows: _write(path, dict(result, bench=rows))
        )
    else:
        x = torch.ones(1024, device=dev)
        dist.all_reduce(x)
        _sync(torch, dev)
        result["teardown_sum_ok"] = bool((x == world).all().item())
    result["teardown"] = "pending"
    _write(path, result)
    dist.destroy_process_group()
    result["teardown"] = "ok"
    _write(path, result)
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
