"""allreduce_async without packing copies and with several rounds in flight.

Fused rounds are scatter-gather rounds over the tensors' own memory (reducer.fusion.engine),
compressed ones too (the transport narrows float32 chunk by chunk). The network thread keeps
several rounds in flight. Workers are threads of this process against real
ReducerServer instances on loopback; nothing here is timed: overlap is made certain by holding
one worker back until the other has rounds in flight (a round cannot finish without every
worker's contribution).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import addresses
from test_fusion import _Spy, comm, ok, run_workers

import reducer
from reducer.errors import MismatchError, ReductionError, ReductionTimeout

pytestmark = pytest.mark.timeout(60)

BF16 = np.dtype(ml_dtypes.bfloat16)
INF = float("inf")
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16, BF16]


def _ranges(pairs) -> list[tuple[int, int]]:
    """Byte ranges [start, end) sorted, adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for start, n in sorted(pairs):
        if n == 0:
            continue
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], start + n)
        else:
            out.append((start, start + n))
    return out


def _data_segments(spy: _Spy) -> list[tuple[int, int]]:
    return [seg for call, segs in zip(spy.calls, spy.segments) if call[4] != reducer.fusion.PROBE_TAG for seg in segs]


def _inputs(world: int, seed: int = 11):
    """Per rank: mixed dtypes and sizes (0 included), as numpy arrays; one in four as a torch CPU tensor."""
    sizes = [int(s) for s in np.random.default_rng(seed).integers(0, 700, size=48)] + [5000, 0]
    per_rank = []
    for r in range(world):
        rng = np.random.default_rng(seed * 10 + r)
        arrays = []
        for i, n in enumerate(sizes):
            dt = np.dtype(DTYPES[i % len(DTYPES)])
            if dt.kind == "i":
                a = rng.integers(-(10**6), 10**6, size=n).astype(dt)
            else:
                a = (rng.standard_normal(n) * 3).astype(dt)
            arrays.append(a)
        per_rank.append(arrays)
    return per_rank


def _check_sum(per_rank, got: list[np.ndarray], world: int) -> None:
    for i, a in enumerate(got):
        xs = [per_rank[r][i] for r in range(world)]
        if a.dtype.kind == "i":
            np.testing.assert_array_equal(a, sum(x.astype(np.int64) for x in xs).astype(a.dtype))
            continue
        ref = sum(x.astype(np.float64) for x in xs)
        # inputs exact in float64; one rounding of the sum to the array's dtype
        eps = {
            np.dtype(np.float64): 2.0**-52,
            np.dtype(np.float32): 2.0**-23,
            np.dtype(np.float16): 2.0**-10,
            BF16: 2.0**-7,
        }[a.dtype]
        bound = eps * (sum(np.abs(x.astype(np.float64)) for x in xs)) + 1e-30
        assert (np.abs(a.astype(np.float64) - ref) <= bound).all(), (i, a.dtype)


# ---------------------------------------------------------------------------- no copies
@pytest.mark.parametrize("threshold", [4096, 64 << 20])
def test_cpu_tensors_are_sent_from_their_own_memory(reducers, threshold):
    """No packing: every byte on the wire is a byte of a caller's array (numpy or torch CPU)."""
    servers = reducers(2)
    addrs, world = addresses(servers), 2
    inputs = _inputs(world)

    def work(r):
        arrays = [a.copy() for a in inputs[r]]
        objs: list[Any] = [torch.from_numpy(a) if i % 4 == 1 and a.dtype != BF16 else a for i, a in enumerate(arrays)]
        with comm(addrs, r, world, f"nocopy{threshold}", fusion_threshold=threshold, cycle_time_ms=INF) as c:
            spy = c._fusion()._client = _Spy(c._client)
            hs = [c.allreduce_async(o, op="sum", name=f"t{i}") for i, o in enumerate(objs)]
            c.synchronize()
            assert all(h.done() and h.exception() is None for h in hs)
            return arrays, spy, c.fusion_stats()

    res = ok(run_workers(world, work))
    for arrays, spy, st in res:
        _check_sum(inputs, arrays, world)
        assert st["compressed_tensors"] == 0
        # the data rounds' segments cover exactly the arrays' memory, nothing else
        tensors = _ranges((a.ctypes.data, a.nbytes) for a in arrays)
        assert _ranges(_data_segments(spy)) == tensors
        assert st["bytes"] == sum(a.nbytes for a in arrays)
        assert st["fused_rounds"] >= 1 and st["segments"] == len(_data_segments(spy))
    assert res[0][2] == res[1][2]  # the counters follow the agreed rounds


def test_views_of_one_flat_buffer_go_as_one_segment(reducers):
    """Tensors that are adjacent in memory (views of one flat gradient buffer) merge into one segment."""
    servers = reducers(2)
    addrs, world = addresses(servers), 2
    sizes = [3, 64, 1, 250, 17, 1000, 5]

    def work(r):
        flat = np.arange(sum(sizes), dtype=np.float32) * (r + 1)
        views, off = [], 0
        for n in sizes:
            views.append(flat[off : off + n])
            off += n
        with comm(addrs, r, world, "flat", fusion_threshold=1 << 20, cycle_time_ms=INF) as c:
            spy = c._fusion()._client = _Spy(c._client)
            for v in views:
                c.allreduce_async(v)
            c.synchronize()
            return flat, _data_segments(spy), c.fusion_stats()

    for flat, segs, st in ok(run_workers(world, work)):
        np.testing.assert_array_equal(flat, np.arange(flat.size, dtype=np.float32) * 3)
        assert segs == [(flat.ctypes.data, flat.nbytes)]
        assert st["fused_rounds"] == 1 and st["segments"] == 1 and st["tensors"] == len(sizes)


# ---------------------------------------------------------------------------- compression
# (compression, the wire dtype, unit roundoff u of the wire type, half the spacing of its subnormals)
COMPRESSIONS = [("bf16", BF16, 2.0**-8, 2.0**-134), ("fp16", np.dtype(np.float16), 2.0**-11, 2.0**-25)]


@pytest.mark.parametrize("compression,wire,u,tiny", COMPRESSIONS, ids=[c[0] for c in COMPRESSIONS])
def test_compressed_rounds_copy_nothing_and_match_the_blocking_path(reducers, compression, wire, u, tiny):
    """Under compression float32 tensors go out as float32 segments of their own memory with the
    client's compression= (the transport narrows and widens chunk by chunk): no copy, no cast.
    They get a fused round of their own (never shared with tensors that are 16-bit already, nor
    with other dtypes). Results: bit for bit what Communicator.allreduce(compression=) gives the
    same tensor alone and the definition (each input rounded once to the wire type, summed in
    float32 in rank order, rounded once, widened), within the 16-bit bound of a float64
    reference; the real 16-bit and float64 tensors of the same step are exact."""
    from compression_tasks import expected, make_values
    from test_convert import assert_same_float32

    from reducer.fusion.engine import CLIENT_ROUND_BYTES

    servers = reducers(2)
    addrs, world = addresses(servers), 2
    wire_name = reducer.dtypes.wire_name(wire)
    threshold = 8192
    rng = np.random.default_rng(21)
    kinds = [np.dtype(np.float32), wire, np.dtype(np.float32), np.dtype(np.float64)]
    # small ones fused; 6000 float32 (12000 wire bytes) alone; one alone above CLIENT_ROUND_BYTES on the
    # wire (two client rounds); a 0-size one
    specs = [(int(n), kinds[i % 4]) for i, n in enumerate(rng.integers(1, 900, size=30))]
    specs += [
        (6000, np.dtype(np.float32)),
        (CLIENT_ROUND_BYTES // 2 + 1000, np.dtype(np.float32)),
        (0, np.dtype(np.float32)),
    ]

    def inputs(r: int) -> list[np.ndarray]:
        out = []
        for i, (n, dt) in enumerate(specs):
            if dt == np.float32:
                out.append(make_values(n, r, seed=100 + i))  # ties, subnormals, inf, NaN, overflow edges
            else:
                out.append((np.random.default_rng([i, r]).standard_normal(n) * 5).astype(dt))
        return out

    data = [inputs(r) for r in range(world)]
    f32 = [i for i, (_, dt) in enumerate(specs) if dt == np.float32]

    def work(r):
        arrays = [a.copy() for a in data[r]]
        objs: list[Any] = [torch.from_numpy(a) if i % 8 == 2 else a for i, a in enumerate(arrays)]
        with comm(
            addrs, r, world, f"cmp{compression}", fusion_threshold=threshold, cycle_time_ms=INF, compression=compression
        ) as c:
            spy = c._fusion()._client = _Spy(c._client)
            for o in objs:
                c.allreduce_async(o)
            c.synchronize()
            # the same float32 tensors alone, through the blocking path (its compression argument)
            alone = {i: c.allreduce(data[r][i].copy(), compression=compression) for i in f32 if specs[i][0]}
            return arrays, alone, spy, c.fusion_stats()

    res = ok(run_workers(world, work))
    for arrays, alone, spy, st in res:
        for i, a in enumerate(arrays):
            xs = [d[i] for d in data]
            if i in f32:
                assert a.dtype == np.float32
                assert_same_float32(a, expected(xs, compression, "sum"))
                if a.size:
                    assert_same_float32(a, alone[i])
                # within one 16-bit rounding of each input and of the result, where nothing overflows
                x64 = [x.astype(np.float64) for x in xs]
                small = np.isfinite(a) & np.all([np.abs(x) < 1e4 for x in x64], axis=0)  # no inf, NaN, overflow
                x64 = [x[small] for x in x64]
                ref = sum(x64)
                bound = u * (sum(np.abs(x) for x in x64) + np.abs(ref)) * 1.001 + (world + 1) * tiny
                assert (np.abs(a[small].astype(np.float64) - ref) <= bound).all(), i
                assert small.sum() >= 0.5 * a.size  # the bound is checked on most elements
            elif a.dtype == np.float64:
                np.testing.assert_array_equal(a, xs[0] + xs[1])
            else:  # a 16-bit tensor: summed in float32, rounded once
                want = (xs[0].astype(np.float32) + xs[1].astype(np.float32)).astype(wire)
                np.testing.assert_array_equal(a.view(np.uint16), want.view(np.uint16))
        calls = [(call, segs) for call, segs in zip(spy.calls, spy.segments) if call[4] != reducer.fusion.PROBE_TAG]
        own = {i: (arrays[i].ctypes.data, arrays[i].nbytes) for i in range(len(specs))}
        for call, segs in calls:
            # a round is float32 with compression (its segments inside float32 tensors) or a plain round
            inside = {i for p, n in segs for i, (lo, size) in own.items() if lo <= p and p + n <= lo + size}
            assert len(inside) >= 1 and sum(n for _, n in segs) == call[1]
            if call[5]:
                assert call[2] == "float32" and call[5] == wire_name and inside <= set(f32)
            else:
                assert call[2] in (wire_name, "float64") and not inside & set(f32)
        # every byte on the wire is a caller's array, nothing else (no staging copy)
        assert _ranges(seg for _, segs in calls for seg in segs) == _ranges(own.values())
        # above CLIENT_ROUND_BYTES on the wire: client rounds of CLIENT_ROUND_BYTES wire bytes (twice as many float32)
        lo, size = own[len(specs) - 2]
        big = [call[1] for call, segs in calls if all(lo <= p < lo + size for p, _ in segs)]
        assert big == [2 * CLIENT_ROUND_BYTES, size - 2 * CLIENT_ROUND_BYTES]
        assert st["compressed_tensors"] == len(f32)
        assert st["bytes"] == sum(n * (2 if dt == np.float32 else dt.itemsize) for n, dt in specs)
    assert res[0][3] == res[1][3]


def test_large_rounds_go_as_client_rounds_of_bounded_size(reducers):
    """A round above CLIENT_ROUND_BYTES is sent as consecutive client rounds of at most that size
    (cut between elements, same tag), straight from the tensors; results exact."""
    from reducer.fusion.engine import CLIENT_ROUND_BYTES

    servers = reducers(2)
    addrs, world = addresses(servers), 2
    big = (2 * CLIENT_ROUND_BYTES + 3 * 8) // 8  # float64 elements: two full pieces and 24 bytes
    sizes = [big, 1000, 7, CLIENT_ROUND_BYTES // 4 - 3]  # float64 alone; small float32 ones fused

    def work(r):
        arrays = [np.arange(sizes[0], dtype=np.float64) * (r + 1)]
        arrays += [np.arange(n, dtype=np.float32) + r for n in sizes[1:]]
        with comm(addrs, r, world, "pieces", fusion_threshold=64 << 20, cycle_time_ms=INF) as c:
            spy = c._fusion()._client = _Spy(c._client)
            for a in arrays:
                c.allreduce_async(a)
            c.synchronize()
            return arrays, spy, c.fusion_stats()

    for arrays, spy, st in ok(run_workers(world, work)):
        np.testing.assert_array_equal(arrays[0], np.arange(sizes[0], dtype=np.float64) * 3)
        for a, n in zip(arrays[1:], sizes[1:]):
            np.testing.assert_array_equal(a, np.arange(n, dtype=np.float32) * 2 + 1)
        data = [(call, segs) for call, segs in zip(spy.calls, spy.segments)]
        assert all(call[1] <= CLIENT_ROUND_BYTES for call, _ in data)
        f64 = [call for call, _ in data if call[2] == "float64"]
        assert [c[1] for c in f64] == [CLIENT_ROUND_BYTES, CLIENT_ROUND_BYTES, 24] and len({c[4] for c in f64}) == 1
        f32 = [segs for call, segs in data if call[2] == "float32"]
        f32_bytes = sum(n for n in sizes[1:]) * 4
        assert [sum(n for _, n in segs) for segs in f32] == [CLIENT_ROUND_BYTES, f32_bytes - CLIENT_ROUND_BYTES]
        assert _ranges(seg for segs in f32 for seg in segs) == _ranges((a.ctypes.data, a.nbytes) for a in arrays[1:])
        assert st["rounds"] - st["probes"] == 2 and st["fused_rounds"] == 1  # agreed rounds, not client rounds


# ---------------------------------------------------------------------------- rounds in flight
class _Gate(_Spy):
    """A client spy that holds this worker's first data round until `ready()` is true (bounded)."""

    def __init__(self, real, ready):
        super().__init__(real)
        self._ready = ready
        self._opened = False

    def _hold(self, tag):
        if self._opened or tag == reducer.fusion.PROBE_TAG:
            return
        deadline = time.monotonic() + 10.0
        while not self._ready() and time.monotonic() < deadline:
            time.sleep(0.001)
        self._opened = True

    def start_segments(self, segments, dtype, op, tag, compression=""):
        self._hold(tag)
        return super().start_segments(segments, dtype, op, tag, compression)

    def try_start_segments(self, segments, dtype, op, tag, compression=""):
        self._hold(tag)
        return super().try_start_segments(segments, dtype, op, tag, compression)


def _gated(addrs, world, group, make, hold_until, **kw):
    """Rank 1 starts its first data round only once rank 0's client has `hold_until` rounds in flight."""
    comms: dict[int, reducer.Communicator] = {}
    have0 = threading.Event()

    def work(r):
        arrays = make(r)
        with comm(addrs, r, world, group, **kw) as c:
            engine = c._fusion()
            if r == 0:
                comms[0] = c
                have0.set()
                spy = engine._client = _Spy(c._client)
            else:
                assert have0.wait(10)
                spy = engine._client = _Gate(c._client, lambda: comms[0]._client.in_flight >= hold_until)
            hs = [c.allreduce_async(a, name=f"g{i}") for i, a in enumerate(arrays)]
            try:
                c.synchronize()
                err = None
            except ReductionError as exc:
                err = exc
            # the blocking path works afterwards (after an error it reconnects: no stray round may follow)
            x = np.full(5, r + 1.0, np.float32)
            c.allreduce(x)
            assert (x == 3).all()
            return arrays, hs, err, spy, c.fusion_stats(peaks=True)

    return run_workers(world, work)


# Five fused rounds cut by one agreed flush: 40 tensors of 250 elements, tensor i in the buffer
# of dtype STEP_DTYPES[i % 5]; with a 64 KiB threshold and no cycle timer the only probe is the
# one synchronize() asks for, after every tensor was submitted, so all five rounds are cut at once.
STEP_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16]
STEP = dict(fusion_threshold=64 << 10, cycle_time_ms=INF)


def _step(r: int, n: int = 40) -> list[np.ndarray]:
    return [np.full(250, i + r, STEP_DTYPES[i % 5]) for i in range(n)]


def test_fused_rounds_overlap(reducers):
    """The network thread starts fused round n+1 while round n is unfinished (client in_flight > 1)."""
    servers = reducers(2)
    addrs, world = addresses(servers), 2
    res = ok(_gated(addrs, world, "overlap", _step, 3, **STEP))
    for arrays, hs, err, _spy, st in res:
        assert err is None and all(h.done() and h.exception() is None for h in hs)
        for i, a in enumerate(arrays):
            assert a.dtype == STEP_DTYPES[i % 5] and (a == 2 * i + 1).all()
        assert st["fused_rounds"] == 5 and st["probes"] == 1 and st["compressed_tensors"] == 0
    assert res[0][4]["max_in_flight"] >= 3  # rank 0 had three fused rounds on the wire at once
    assert res[0][4]["max_in_flight"] <= 8  # the client's max_rounds_in_flight


def test_mismatch_with_rounds_in_flight(reducers):
    """A mismatch in the 2nd of 5 fused rounds, with rounds in flight: every handle of that round
    and the later ones fails with the diagnosed MismatchError naming the differing tensor, the
    first round's handles hold correct sums or that error, and the blocking path still works
    afterwards (no stray round)."""
    servers = reducers(2)
    addrs, world = addresses(servers), 2

    def make(r):
        arrays = _step(r)
        if r == 1:
            arrays[21] = np.full(251, 21.0 + r, np.float64)  # 21 % 5 == 1: the float64 round
        return arrays

    res = ok(_gated(addrs, world, "mm-inflight", make, 3, timeout=5.0, **STEP))
    for r, (arrays, hs, err, _spy, _st) in enumerate(res):
        assert isinstance(err, MismatchError), err
        assert "first difference is at tensor #21" in str(err) and f"on rank {r}" in str(err)
        assert all(h.done() for h in hs)
        for i, h in enumerate(hs):
            if i % 5:  # rounds 2..5
                assert isinstance(h.exception(), MismatchError), (i, h.exception())
            elif h.exception() is None:
                assert (arrays[i] == 2 * i + 1).all()
            else:
                assert isinstance(h.exception(), MismatchError)
        with pytest.raises(MismatchError):
            hs[21].wait()
    assert res[0][4]["max_in_flight"] >= 3


def test_timeout_with_rounds_in_flight(reducers):
    """A worker stops submitting: the other's rounds in flight fail with ReductionTimeout, the
    rounds before them completed correctly."""
    servers = reducers(1)
    addrs, world = addresses(servers), 2
    done0 = threading.Event()

    def work(r):
        arrays = [np.full(100, float(i + r), np.float64) for i in range(8)]
        with comm(addrs, r, world, "to-inflight", fusion_threshold=0, timeout=1.0) as c:
            hs = [c.allreduce_async(a) for a in (arrays if r == 0 else arrays[:3])]
            err = None
            try:
                c.synchronize()
            except ReductionError as exc:
                err = exc
            if r == 0:
                done0.set()
            else:
                assert done0.wait(20)  # stay connected until rank 0 has its error
            return arrays, hs, err

    res = ok(run_workers(world, work))
    arrays, hs, err = res[0]
    assert isinstance(err, ReductionTimeout), err
    for i in range(3):
        assert hs[i].exception() is None and (arrays[i] == 2 * i + 1).all()
    for i in range(3, 8):
        assert isinstance(hs[i].exception(), ReductionTimeout)
    assert res[1][2] is None and all((res[1][0][i] == 2 * i + 1).all() for i in range(3))
