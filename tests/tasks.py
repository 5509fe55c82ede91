"""Worker-side functions run in separate processes by the tests (see conftest.run_ranks)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import reducer
from reducer.dtypes import numpy_dtype

SIZES = (0, 1, 7, 1023, 1_000_003)
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
OPS = ("sum", "avg", "min", "max")


def make_data(dtype: str, n: int, rank: int, seed: int = 0) -> np.ndarray:
    """Deterministic per-rank input; integers include negatives and large values."""
    rng = np.random.default_rng([seed, rank, n, DTYPES.index(dtype)])
    dt = numpy_dtype(dtype)
    if dtype.startswith("int"):
        hi = 2**20 if dtype == "int32" else 2**40
        return rng.integers(-hi, hi, size=n).astype(dt)
    return rng.standard_normal(n).astype(np.float32).astype(dt)


def reference(dtype: str, op: str, n: int, world: int, seed: int = 0) -> np.ndarray:
    """float64 reference (exact int64 arithmetic for integers), reduced in rank order."""
    xs = [make_data(dtype, n, r, seed) for r in range(world)]
    fold = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum}[op]
    if dtype.startswith("int"):
        acc = xs[0].astype(np.int64)
        for x in xs[1:]:
            acc = fold(acc, x.astype(np.int64))
        if op == "avg":  # truncating division, like C
            acc = np.sign(acc) * (np.abs(acc) // world)
        return acc.astype(numpy_dtype(dtype))
    acc = xs[0].astype(np.float64)
    for x in xs[1:]:
        acc = fold(acc, x.astype(np.float64))
    if op == "avg":
        acc = acc / world
    return acc


def tolerance(dtype: str, world: int) -> tuple[float, float]:
    return {
        "float32": (1e-5, 1e-5 * world),
        "float64": (1e-12, 1e-12 * world),
        "float16": (2e-3, 4e-3 * world),
        "bfloat16": (1e-2, 2e-2 * world),
    }[dtype]


def check(result: np.ndarray, dtype: str, op: str, n: int, world: int, seed: int = 0) -> str | None:
    ref = reference(dtype, op, n, world, seed)
    if dtype.startswith("int"):
        if not np.array_equal(result, ref):
            bad = int(np.flatnonzero(result != ref)[0])
            return f"{dtype} {op} n={n}: element {bad} is {result[bad]}, expected {ref[bad]}"
        return None
    rtol, atol = tolerance(dtype, world)
    got = result.astype(np.float64)
    if not np.allclose(got, ref, rtol=rtol, atol=atol):
        bad = int(np.flatnonzero(~np.isclose(got, ref, rtol=rtol, atol=atol))[0])
        return f"{dtype} {op} n={n}: element {bad} is {got[bad]}, expected {ref[bad]}"
    return None


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def matrix(
    rank: int,
    world: int,
    addrs: Sequence[str],
    group: str,
    dtypes: Sequence[str] = DTYPES,
    ops: Sequence[str] = OPS,
    sizes: Sequence[int] = SIZES,
    streams: int = 1,
    chunk_bytes: int | None = None,
) -> dict[str, Any]:
    """All-reduce every dtype x op x size; returns errors and result digests."""
    errors: list[str] = []
    digests: dict[str, str] = {}
    with reducer.Communicator(
        addrs, rank, world, group=group, timeout=30, connect_timeout=30, streams=streams, chunk_bytes=chunk_bytes
    ) as comm:
        for dtype in dtypes:
            for op in ops:
                for n in sizes:
                    a = make_data(dtype, n, rank)
                    out = comm.allreduce(a, op=op)
                    assert out is a
                    err = check(a, dtype, op, n, world)
                    if err:
                        errors.append(err)
                    digests[f"{dtype}/{op}/{n}"] = digest(a)
    return {"errors": errors, "digests": digests}


def large(
    rank: int, world: int, addrs: Sequence[str], group: str, nbytes: int = 64 << 20, streams: int = 1
) -> dict[str, Any]:
    n = nbytes // 4
    with reducer.Communicator(addrs, rank, world, group=group, timeout=60, connect_timeout=30, streams=streams) as comm:
        a = make_data("float32", n, rank, seed=7)
        comm.allreduce(a)
        err = check(a, "float32", "sum", n, world, seed=7)
        return {"error": err, "digest": digest(a)}


def back_to_back(rank: int, world: int, addrs: Sequence[str], group: str, rounds: int = 200) -> dict[str, Any]:
    with reducer.Communicator(addrs, rank, world, group=group, timeout=30, connect_timeout=30) as comm:
        a = np.zeros(1000, np.int64)
        for i in range(rounds):
            a[:] = rank + i
            comm.allreduce(a)
            expect = sum(r + i for r in range(world))
            if not (a == expect).all():
                return {"error": f"round {i}: got {a[0]}, expected {expect}"}
        return {"error": None, "stats": comm.stats()}


def allreduce_once(
    rank: int,
    world: int,
    addrs: Sequence[str],
    group: str,
    n: int = 1000,
    dtype: str = "float32",
    op: str = "sum",
    job_id: str | None = None,
    auth_token: str | None = None,
    timeout: float = 10.0,
    connect_timeout: float = 10.0,
    repeat: int = 1,
    sizes_by_rank: Sequence[int] | None = None,
    dtypes_by_rank: Sequence[str] | None = None,
    ops_by_rank: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One (or `repeat`) all-reduce of ones; per-rank size/dtype/op overrides model disagreements."""
    if sizes_by_rank:
        n = sizes_by_rank[rank]
    if dtypes_by_rank:
        dtype = dtypes_by_rank[rank]
    if ops_by_rank:
        op = ops_by_rank[rank]
    with reducer.Communicator(
        addrs,
        rank,
        world,
        group=group,
        job_id=job_id,
        auth_token=auth_token,
        timeout=timeout,
        connect_timeout=connect_timeout,
    ) as comm:
        a = np.ones(n, numpy_dtype(dtype))
        for _ in range(repeat):
            a[:] = 1
            comm.allreduce(a, op=op)
        return {"value": a[:4].astype(np.float64).tolist(), "n": n}


def hold_round(
    rank: int,
    world: int,
    addrs: Sequence[str],
    group: str,
    n: int = 1 << 20,
    timeout: float = 20.0,
    again: bool = False,
    failover: bool = True,
) -> dict[str, Any]:
    """Enter an all-reduce and report the error (if any); optionally try again after it."""
    comm = reducer.Communicator(
        addrs, rank, world, group=group, timeout=timeout, connect_timeout=timeout, failover=failover
    )
    out: dict[str, Any] = {}
    a = np.ones(n, np.float32)
    t0 = time.monotonic()
    try:
        comm.allreduce(a)
        out["first"] = "ok"
    except reducer.ReductionError as exc:
        out["first"] = f"{type(exc).__name__}: {exc}"
    out["elapsed"] = time.monotonic() - t0
    if again:
        a[:] = 1
        try:
            comm.allreduce(a)
            out["second"] = float(a[0])
        except reducer.ReductionError as exc:
            out["second"] = f"{type(exc).__name__}: {exc}"
    comm.close()
    return out


def join_and_wait(
    addrs: Sequence[str], rank: int, world: int, group: str, seconds: float = 60.0, failover: bool = True
) -> None:
    """Joins the group, then stays silent for `seconds` (a process the test may kill)."""
    comm = reducer.Communicator(addrs, rank, world, group=group, timeout=60, connect_timeout=30, failover=failover)
    time.sleep(seconds)
    comm.close()


def serve_forever(port_file: str) -> None:
    """Target for a reducer process the test kills mid-round."""
    srv = reducer.ReducerServer(host="127.0.0.1", port=0).start()
    with open(port_file + ".tmp", "w") as fh:
        fh.write(str(srv.port))
    os.replace(port_file + ".tmp", port_file)
    time.sleep(600)
