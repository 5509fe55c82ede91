"""Worker-side functions of tests/client/test_compression.py: 16-bit wire compression of float32 rounds.

They run in separate processes (conftest.run_ranks, or test_torch's pool for DDP) and return
their results; the test process compares them with the reference (`expected`), which it
computes from the same deterministic inputs (`make_values`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from async_tasks import client, split

import reducer

WIRES = {"bf16": "bfloat16", "fp16": "float16"}

# (compression, op, elements, segments) of one round; compression "" = a plain float32 round.
Spec = tuple[str, str, int, int]


def _f32(bits: Any) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


# Values every rank puts somewhere: rounding ties of both wire types (also in the subnormal
# range), float32 and float16 subnormals, the float16 overflow edge, inf, NaN, signed zeros.
SPECIAL = np.concatenate(
    [
        _f32(
            [
                0x3F808000,
                0x3F818000,
                0x3F808001,
                0x00008000,
                0x00018000,
                0x007FFFFF,
                0x00000001,
                0x80000001,
                0x7F7F8000,
                0x7F7FFFFF,
                0x3F801000,
                0x3F803000,
                0x33000000,
                0x33C00000,
                0x33400000,
                0x387FE000,
                0x477FE000,
                0x477FF000,
                0x7F800000,
                0xFF800000,
                0x7FC00000,
                0xFFC00001,
                0x80000000,
                0x00000000,
            ]
        ),
        np.array([65504.0, 65520.0, 1e-41, -1e-41, 2.0**-24, 2.0**-25, 0.5, -0.5], np.float32),
    ]
)


def make_values(n: int, rank: int, seed: int) -> np.ndarray:
    """Rank `rank`'s float32 input: values of every magnitude (subnormal to near overflow),
    bfloat16 ties, specials at random places, and places where every rank holds the same tie
    (so the sums are ties again)."""
    rng = np.random.default_rng([seed, n, 7])  # the same on every rank
    own = np.random.default_rng([seed, n, rank, 11])
    x = (own.standard_normal(n) * np.exp2(own.integers(-40, 12, size=n))).astype(np.float32)
    if n == 0:
        return x
    ties = (own.integers(0x0080, 0x7F00, size=n, dtype=np.uint32) << 16) | 0x8000
    pick = own.random(n) < 0.2
    x[pick] = _f32(ties[pick] | (own.integers(0, 2, size=n, dtype=np.uint32)[pick] << 31))
    shared = rng.random(n) < 0.1
    x[shared] = _f32(((rng.integers(0x3000, 0x4800, size=n, dtype=np.uint32) << 16) | 0x8000)[shared])
    k = max(1, n // 50)
    x[own.integers(0, n, size=k)] = own.choice(SPECIAL, size=k)
    return x


def expected(inputs: Sequence[np.ndarray], compression: str, op: str) -> np.ndarray:
    """The defined result of an all-reduce of float32 `inputs` (rank order): sum/avg from
    test_convert.compressed_allreduce_reference; min/max fold the inputs (each rounded once to
    the wire type) in rank order with the reducer's NaN rule (a NaN accumulator stays, a NaN
    input replaces), which needs no rounding afterwards. compression "": a float32 all-reduce."""
    from test_convert import WIRES as NP_WIRES
    from test_convert import compressed_allreduce_reference

    wt = NP_WIRES[WIRES[compression]] if compression else None
    if wt is not None and op in ("sum", "avg"):
        return compressed_allreduce_reference(list(inputs), WIRES[compression], op)
    with np.errstate(all="ignore"):
        xs = [x.astype(wt).astype(np.float32) if wt is not None else x for x in inputs]
        acc = xs[0].copy()
        for x in xs[1:]:
            if op in ("sum", "avg"):
                acc = acc + x
            elif op == "min":
                acc = np.where(np.isnan(acc) | (acc < x), acc, x)
            else:
                acc = np.where(np.isnan(acc) | (acc > x), acc, x)
        if op == "avg":
            acc = acc / np.float32(len(xs))
    return acc


def rounds(
    rank: int,
    world: int,
    addrs: Sequence[str],
    group: str,
    specs: Sequence[Spec],
    seed: int,
    streams: int = 1,
    chunk_bytes: int = 1 << 20,
    window: int = 4,
    max_rounds_in_flight: int = 8,
) -> dict[str, Any]:
    """Start every round of `specs` (compressed or plain, contiguous or scatter-gather) without
    waiting, then finish them in a rank-specific random order with test() and wait()."""
    c = client(
        addrs,
        rank,
        world,
        group,
        streams=streams,
        chunk_bytes=chunk_bytes,
        window=window,
        max_rounds_in_flight=max_rounds_in_flight,
    )
    ids: list[int] = []
    bufs: list[list[np.ndarray]] = []  # kept alive until every round is done
    for i, (comp, op, n, parts) in enumerate(specs):
        pieces = split(make_values(n, rank, seed * 1000 + i), parts)
        bufs.append(pieces)
        if len(pieces) == 1:
            ids.append(c.start_ptr(pieces[0].ctypes.data, pieces[0].nbytes, "float32", op, compression=comp))
        else:
            ids.append(c.start_segments([(p.ctypes.data, p.nbytes) for p in pieces], "float32", op, compression=comp))
    most_in_flight = c.in_flight
    order = list(range(len(specs)))
    random.Random(rank * 7919 + seed).shuffle(order)
    deadline = time.monotonic() + 120
    for k, i in enumerate(order):
        if k % 2:
            c.wait(ids[i])
        else:
            while not c.test(ids[i]):
                assert time.monotonic() < deadline, "round did not finish"
                time.sleep(0.0002)
    stats = c.stats()
    c.close()
    return {"results": [np.concatenate(b) for b in bufs], "stats": stats, "most_in_flight": most_in_flight}


def communicator_paths(rank: int, world: int, addrs: Sequence[str], group: str, n: int, seed: int) -> dict[str, Any]:
    """The Communicator's entry points: the same float32 input reduced plain, with bf16 and fp16
    (allreduce, allreduce_raw, allreduce_raw_async), and by the compression setting; the wire
    bytes each round took (client stats)."""
    out: dict[str, Any] = {"sent": {}, "results": {}}
    x = make_values(n, rank, seed)
    ints = np.arange(n, dtype=np.float64) * (rank + 1)  # exact in float64: must stay untouched
    with reducer.Communicator(
        addrs, rank, world, group=group, timeout=30, connect_timeout=30, compression="bf16"
    ) as comm:

        def run(name: str, fn: Any, arr: np.ndarray) -> None:
            before = comm.stats()["bytes_sent"]
            fn(arr)
            out["sent"][name] = comm.stats()["bytes_sent"] - before
            out["results"][name] = arr

        run("none", lambda a: comm.allreduce(a, compression="none"), x.copy())
        run("setting", comm.allreduce, x.copy())  # the communicator's compression: bf16
        run("fp16", lambda a: comm.allreduce(a, op="avg", compression="fp16"), x.copy())
        run(
            "raw_bf16",
            lambda a: comm.allreduce_raw(a.ctypes.data, a.nbytes, "float32", "max", compression="bfloat16"),
            x.copy(),
        )

        def raw_async(a: np.ndarray) -> None:
            r = comm.allreduce_raw_async(a.ctypes.data, a.nbytes, "float32", "min", compression="fp16")
            r.wait()
            assert r.done()

        run("async_fp16", raw_async, x.copy())
        run("float64", comm.allreduce, ints.copy())  # the setting applies to float32 only
    return out
