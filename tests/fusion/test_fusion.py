"""allreduce_async: tensor fusion, deterministic cuts, fingerprints, compression, handles.

Workers are threads of this process (the C++ all-reduce releases the GIL) talking to real
ReducerServer instances on loopback.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import addresses

import reducer
from reducer.errors import ConfigError, MismatchError, ReductionError, ReductionTimeout

pytestmark = pytest.mark.timeout(60)

BF16 = np.dtype(ml_dtypes.bfloat16)
INF = float("inf")


def run_workers(world: int, fn: Callable[[int], Any], timeout: float = 30.0) -> list[Any]:
    """fn(rank) in `world` threads; results (or the exception raised) by rank."""
    out: list[Any] = [None] * world

    def target(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            out[r] = exc

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    return out


def ok(results: list[Any]) -> list[Any]:
    for r, res in enumerate(results):
        if isinstance(res, BaseException):
            raise AssertionError(f"rank {r} failed: {res!r}") from res
    return results


def comm(addrs, rank, world, group, **kw) -> reducer.Communicator:
    kw.setdefault("timeout", 10.0)
    kw.setdefault("connect_timeout", 10.0)
    return reducer.Communicator(addrs, rank, world, group=group, **kw)


def rounds(servers) -> list[int]:
    return [s.stats()["rounds_completed"] for s in servers]


# ---------------------------------------------------------------------------- correctness
def _tensors(seed: int, rank: int, big: int):
    """A step's worth of mixed tensors: several dtypes and ops, a 0-size one, one bigger than `big`."""
    rng = np.random.default_rng(seed * 100 + rank)
    spec = []
    for i in range(60):
        dt = [np.float32, np.float64, np.int32, np.int64, np.float16, BF16][i % 6]
        op = ["sum", "avg", "max", "min"][(i // 6) % 4]
        if dt in (np.int32, np.int64) and op == "avg":
            op = "sum"
        n = int(np.random.default_rng(seed + i).integers(0, 300))  # same shapes on every rank
        spec.append((dt, op, (n,) if i % 5 else (n // 3 + 1, 3)))
    spec.append((np.float32, "sum", (big // 4 + 17,)))
    spec.append((np.float32, "sum", (0,)))
    arrays = []
    for dt, op, shape in spec:
        if np.dtype(dt).kind == "i":
            a = rng.integers(-1000, 1000, size=shape).astype(dt)
        else:
            a = (rng.standard_normal(shape) * 4).astype(dt)
        arrays.append((a, op))
    return arrays


def _reference(per_rank, i: int, world: int) -> np.ndarray:
    xs = [per_rank[r][i][0].astype(np.float64) for r in range(world)]
    op = per_rank[0][i][1]
    if op == "sum":
        return sum(xs)
    if op == "avg":
        return sum(xs) / world
    return np.maximum.reduce(xs) if op == "max" else np.minimum.reduce(xs)


@pytest.mark.parametrize("threshold", [0, 2048, 64 << 20])
def test_fused_and_unfused_equal_reference(reducers, threshold):
    servers = reducers(2)
    addrs, world = addresses(servers), 3
    inputs = [_tensors(1, r, 4096) for r in range(world)]

    def work(r):
        mine = [(a.copy(), op) for a, op in inputs[r]]
        with comm(addrs, r, world, "ref", fusion_threshold=threshold) as c:
            handles = [c.allreduce_async(a, op=op, name=f"t{i}") for i, (a, op) in enumerate(mine)]
            assert handles[3].wait() is mine[3][0]  # wait() returns the caller's array, reduced in place
            c.synchronize()
            assert all(h.done() for h in handles)
            return [a for a, _ in mine], c.fusion_stats()

    res = ok(run_workers(world, work))
    for i in range(len(inputs[0])):
        ref = _reference(inputs, i, world)
        got = res[0][0][i]
        assert got.dtype == inputs[0][i][0].dtype and got.shape == ref.shape
        tol = {2: 1e-12, 4: 1e-5, 8: 1e-12}[got.dtype.itemsize] if got.dtype.kind == "f" else 0
        if got.dtype in (np.float16, BF16):
            tol = 2e-2 if got.dtype == BF16 else 4e-3
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * 8)
        for r in range(1, world):  # every worker holds bit-identical results
            assert res[r][0][i].tobytes() == got.tobytes()
    stats = res[0][1]
    nonempty = sum(a.size > 0 for a, _ in inputs[0])
    assert nonempty <= stats["tensors"] <= len(inputs[0])  # a round of 0 bytes is never sent
    if threshold == 0:
        assert stats["tensors"] == nonempty
        assert stats["probes"] == 0 and stats["fused_rounds"] == 0
    else:
        assert stats["fused_rounds"] >= 1


def test_fusion_does_not_change_the_bits(reducers):
    """Fused and unfused rounds reduce element by element in rank order: identical results."""
    servers = reducers(2)
    addrs, world = addresses(servers), 3
    inputs = [_tensors(2, r, 1024) for r in range(world)]
    out = {}
    for threshold in (0, 1024, 1 << 20):

        def work(r):
            mine = [(a.copy(), op) for a, op in inputs[r]]
            with comm(addrs, r, world, f"bits{threshold}", fusion_threshold=threshold) as c:
                for a, op in mine:
                    c.allreduce_async(a, op=op)
                c.synchronize()
            return b"".join(a.tobytes() for a, _ in mine)

        out[threshold] = ok(run_workers(world, work))[0]
    assert out[0] == out[1024] == out[1 << 20]


# ---------------------------------------------------------------------------- round counts
def test_thousand_small_tensors_in_a_handful_of_rounds(reducers):
    servers = reducers(2)
    addrs = addresses(servers)
    n = 1000
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 64, size=n)
    data = [[rng.standard_normal(int(s)).astype(np.float32) for s in sizes] for _ in range(2)]

    def work(r, **kw):
        arrs = [d.copy() for d in data[r]]
        with comm(addrs, r, 2, "thousand", **kw) as c:
            for a in arrs:
                c.allreduce_async(a)
            c.synchronize()
            return arrs, c.fusion_stats()

    # cycle timer off: one probe agrees on all 1000 tensors, one fused buffer carries them.
    before = rounds(servers)
    res = ok(run_workers(2, lambda r: work(r, cycle_time_ms=INF)))
    # Rounds per reducer: small rounds (the 16-byte probe) use one reducer, rotated (minimum shard).
    delta = [a - b for a, b in zip(rounds(servers), before)]
    assert 2 <= sum(delta) <= 3, delta
    assert res[0][1]["tensors"] == n and res[0][1]["fused_rounds"] == 1 and res[0][1]["probes"] == 1
    for i in range(n):
        np.testing.assert_array_equal(res[0][0][i], (data[0][i].astype(np.float64) + data[1][i]).astype(np.float32))

    # default 5 ms cycle: the timer may split the step into a few agreed flushes, never 1000 rounds.
    before = rounds(servers)
    res = ok(run_workers(2, lambda r: work(r)))
    used = [a - b for a, b in zip(rounds(servers), before)]
    assert sum(used) <= 80, used
    assert res[0][1] == res[1][1]

    # a threshold splits the buffer at deterministic points: 8000-byte buffers
    before = rounds(servers)
    res = ok(run_workers(2, lambda r: work(r, cycle_time_ms=INF, fusion_threshold=8000)))
    expect, fill = 0, 0  # simulate the documented cut rule
    for s in sizes:
        b = int(s) * 4
        if fill + b > 8000:
            expect, fill = expect + 1, 0
        fill += b
        if fill == 8000:
            expect, fill = expect + 1, 0
    expect += fill > 0  # the flush at synchronize()
    st = res[0][1]
    assert st == res[1][1]
    # an agreed flush before the last tensor (synchronize() raced the first probe) adds one partial buffer
    assert expect <= st["rounds"] - st["probes"] <= expect + st["flushes"] - 1
    delta = sum(rounds(servers)) - sum(before)  # each round reaches 1 or 2 reducers (minimum shard)
    assert st["rounds"] <= delta <= 2 * st["rounds"]


def test_fusion_off_sends_one_round_per_tensor(reducers):
    servers = reducers(1)
    addrs = addresses(servers)

    def work(r):
        arrs = [np.full(i + 1, r + 1.0, np.float32) for i in range(25)]
        with comm(addrs, r, 2, "off", fusion_threshold=0) as c:
            hs = [c.allreduce_async(a) for a in arrs]
            for h in hs:
                h.wait()
            return c.fusion_stats(), arrs

    res = ok(run_workers(2, work))
    assert res[0][0]["rounds"] == 25 and res[0][0]["probes"] == 0
    assert servers[0].stats()["rounds_completed"] == 25
    assert all((a == 3).all() for a in res[0][1])


class _Spy:
    """Wraps the C++ client to record what goes on the wire: per round started, (address of its
    first segment, bytes of its segments, dtype, op, tag, compression); the segments themselves
    in `segments`."""

    def __init__(self, real):
        self.real = real
        self.calls = []
        self.segments = []

    def _record(self, segments, dtype, op, tag, compression):
        self.calls.append((segments[0][0], sum(n for _, n in segments), dtype, op, tag, compression))
        self.segments.append(list(segments))

    def start_segments(self, segments, dtype, op, tag, compression=""):
        rid = self.real.start_segments(segments, dtype, op, tag, compression=compression)
        self._record(segments, dtype, op, tag, compression)
        return rid

    def try_start_segments(self, segments, dtype, op, tag, compression=""):
        rid = self.real.try_start_segments(segments, dtype, op, tag, compression=compression)
        if rid is not None:
            self._record(segments, dtype, op, tag, compression)
        return rid

    def __getattr__(self, name):  # wait, in_flight, ...: the real client's
        return getattr(self.real, name)


def test_large_tensor_goes_alone_in_place(reducers):
    servers = reducers(2)
    addrs = addresses(servers)

    def work(r):
        big = np.full(100_000, r + 1.0, np.float32)
        small = [np.full(10, r + 1.0, np.float32) for _ in range(3)]
        with comm(addrs, r, 2, "big", fusion_threshold=4096, cycle_time_ms=INF) as c:
            spy = c._fusion()._client = _Spy(c._client)
            hs = [
                c.allreduce_async(small[0]),
                c.allreduce_async(big),
                c.allreduce_async(small[1]),
                c.allreduce_async(small[2]),
            ]
            c.synchronize()
            assert all(h.done() for h in hs)
            return spy.calls, big.ctypes.data, big, small

    res = ok(run_workers(2, work))
    for calls, big_ptr, big, small in res:
        data = [c for c in calls if c[4] != reducer.fusion.PROBE_TAG]
        # the big tensor is sent from the caller's memory (no copy) before the partly filled buffer
        assert data[0][0] == big_ptr and data[0][1] == 400_000
        assert data[1][1] == 3 * 40  # the three small ones, fused
        assert (big == 3).all() and all((s == 3).all() for s in small)
    # fingerprints: same tags on both workers, different per round
    tags0 = [c[4] for c in res[0][0]]
    assert tags0 == [c[4] for c in res[1][0]] and len(set(tags0)) == len(tags0)


# ---------------------------------------------------------------------------- determinism
def test_different_wait_points_and_timing_still_agree(reducers):
    """Cuts are agreed: workers waiting at different places, at different speeds, stay in step."""
    servers = reducers(2)
    addrs, world = addresses(servers), 3
    n = 300

    def work(r):
        rnd = random.Random(r)
        arrs = [np.full(1 + (i * 7) % 50, float(r + i), np.float32) for i in range(n)]
        with comm(addrs, r, world, "timing", fusion_threshold=512, cycle_time_ms=0.3) as c:
            hs = []
            for i, a in enumerate(arrs):
                hs.append(c.allreduce_async(a, name=f"g{i}"))
                if rnd.random() < 0.05:
                    time.sleep(rnd.random() * 0.004)
                if r == 0 and i % 37 == 0:
                    hs[i // 2].wait()  # only rank 0 waits here
                if r == 1 and i % 53 == 0:
                    c.synchronize()  # only rank 1 synchronizes here
            c.synchronize()
            return arrs, c.fusion_stats()

    res = ok(run_workers(world, work))
    for i in range(n):
        expect = sum(float(r + i) for r in range(world))
        for r in range(world):
            assert (res[r][0][i] == expect).all()
    assert res[0][1]["rounds"] == res[1][1]["rounds"] == res[2][1]["rounds"]
    assert res[0][1]["flushes"] >= 2


def test_blocking_allreduce_after_async_keeps_order(reducers):
    servers = reducers(1)
    addrs = addresses(servers)

    def work(r):
        a = np.full(10, r + 1.0, np.float32)
        b = np.full(3, r + 1.0, np.float64)
        with comm(addrs, r, 2, "order") as c:
            h = c.allreduce_async(a)
            c.allreduce(b)  # finishes `a` first, then its own round
            assert h.done()
            return a, b

    for a, b in ok(run_workers(2, work)):
        assert (a == 3).all() and (b == 3).all()


# ---------------------------------------------------------------------------- fingerprints
def _mismatch(reducers, world, make, expect_index, expect_words, rank_kw=lambda r: {}, **kw):
    servers = reducers(2)
    addrs = addresses(servers)

    def work(r):
        tensors = make(r)
        with comm(addrs, r, world, "mm", timeout=5.0, **kw, **rank_kw(r)) as c:
            hs = [c.allreduce_async(a, name=name) for a, name in tensors]
            with pytest.raises(MismatchError) as info:
                c.synchronize()
            # every handle of this step fails, later submissions too
            assert all(h.done() and isinstance(h.exception(), ReductionError) for h in hs)
            with pytest.raises(ReductionError):
                c.allreduce_async(np.ones(3, np.float32))
            # the blocking path reconnects and still works (uncompressed on every worker)
            x = np.ones(4, np.float32)
            c.allreduce(x, compression="none")
            assert (x == world).all()
            return str(info.value)

    t0 = time.monotonic()
    messages = ok(run_workers(world, work))
    assert time.monotonic() - t0 < 15
    for r, msg in enumerate(messages):
        assert f"first difference is at tensor #{expect_index}" in msg, msg
        assert f"on rank {r}" in msg
        for w in expect_words:
            assert w in msg, msg
    return messages


def test_mismatch_shape_names_first_differing_tensor(reducers):
    def make(r):
        t = [(np.ones(10, np.float32), f"p{i}") for i in range(20)]
        if r == 2:
            t[7] = (np.ones(12, np.float32), "p7")
        return t

    msgs = _mismatch(reducers, 3, make, 7, ["'p7'", "size in bytes (40 to 48)"])
    assert "float32[12]" in msgs[2] and "float32[10]" in msgs[0]


def test_mismatch_name(reducers):
    def make(r):
        return [(np.ones(10, np.float32), f"layer{i}" if (r, i) != (1, 3) else "other") for i in range(8)]

    msgs = _mismatch(reducers, 3, make, 3, ["name"])
    assert "'other'" in msgs[1] and "'layer3'" in msgs[0]


def test_mismatch_order(reducers):
    def make(r):
        t = [(np.ones(5 + i, np.float32), f"w{i}") for i in range(10)]
        if r == 1:
            t[4], t[5] = t[5], t[4]
        return t

    msgs = _mismatch(reducers, 2, make, 4, ["size in bytes (36 to 40)"])
    assert "'w4'" in msgs[0] and "'w5'" in msgs[1]


def test_mismatch_dtype_across_buffers(reducers):
    """Different dtypes put tensors in different fused buffers: still named exactly."""

    def make(r):
        t = [(np.ones(6, np.float32), None) for _ in range(6)]
        if r == 0:
            t[2] = (np.ones(6, np.float64), None)
        return t

    _mismatch(reducers, 2, make, 2, ["dtype (float32 / float64)"])


def test_mismatch_compression_setting(reducers):
    """One worker compresses float32, the others do not: named at the first float32 tensor."""

    def make(r):
        return [(np.ones(10, np.float32), f"g{i}") for i in range(6)]

    _mismatch(
        reducers,
        3,
        make,
        0,
        ["'g0'", "size in bytes (20 to 40)", "wire dtype (compression) (float32 / bfloat16)"],
        rank_kw=lambda r: {"compression": "bf16" if r == 1 else None},
    )


def test_mismatch_compressed_float32_against_bfloat16(reducers):
    """float32 sent as bfloat16 and a bfloat16 tensor have the same wire dtype and size, but are not
    the same round (the transport narrows one of them): the dtype difference is named."""

    def make(r):
        t = [(np.ones(10, np.float32), f"g{i}") for i in range(6)]
        if r == 0:
            t[3] = (np.ones(10, BF16), "g3")
        return t

    msgs = _mismatch(reducers, 2, make, 3, ["'g3'", "dtype (float32 / bfloat16)"], compression="bf16")
    assert all("wire dtype" not in m and "size in bytes" not in m for m in msgs), msgs


def test_mismatch_in_a_later_step(reducers):
    """Earlier steps succeed; the first differing tensor is counted from the start."""

    def make(r):
        t = [(np.ones(4, np.float32), f"a{i}") for i in range(30)]
        if r == 1:
            t[25] = (np.ones(4, np.int32), "a25")
        return t

    servers = reducers(2)
    addrs = addresses(servers)

    def work(r):
        with comm(addrs, r, 2, "later", timeout=5.0, fusion_threshold=64) as c:
            for _step in range(2):
                for a, n in make(0):
                    c.allreduce_async(a, name=n)
                c.synchronize()
            for a, n in make(r):
                c.allreduce_async(a, name=n)
            with pytest.raises(MismatchError) as info:
                c.synchronize()
            return str(info.value)

    for msg in ok(run_workers(2, work)):
        assert "tensor #85" in msg and "dtype (float32 / int32)" in msg, msg


def test_mismatch_fusion_threshold(reducers):
    servers = reducers(1)
    addrs = addresses(servers)

    def work(r):
        with comm(addrs, r, 2, "thr", timeout=5.0, fusion_threshold=1000 if r else 2000) as c:
            for _i in range(50):
                c.allreduce_async(np.ones(25, np.float32))
            with pytest.raises(MismatchError) as info:
                c.synchronize()
            return str(info.value)

    for msg in ok(run_workers(2, work)):
        assert "different fusion thresholds (1000 to 2000 bytes" in msg, msg


# ---------------------------------------------------------------------------- compression
@pytest.mark.parametrize("compression,dtype,eps", [("bf16", BF16, 2.0**-8), ("fp16", np.float16, 2.0**-11)])
def test_compression_within_16bit_rounding(reducers, compression, dtype, eps):
    servers = reducers(2)
    addrs, world = addresses(servers), 3
    rng = np.random.default_rng(5)
    shapes = [int(s) for s in rng.integers(1, 3000, size=40)] + [70_000]
    data = [[(rng.standard_normal(s) * 10).astype(np.float32) for s in shapes] for _ in range(world)]
    ints = [np.arange(10, dtype=np.int64) * (r + 1) for r in range(world)]

    def work(r):
        arrs = [d.copy() for d in data[r]]
        iv = ints[r].copy()
        with comm(addrs, r, world, "cmp", compression=compression, fusion_threshold=32 << 10) as c:
            for a in arrs:
                c.allreduce_async(a)
            c.allreduce_async(iv)
            c.synchronize()
            return arrs, iv, c.fusion_stats()

    res = ok(run_workers(world, work))
    for i in range(len(shapes)):
        xs = [data[r][i].astype(np.float64) for r in range(world)]
        ref = sum(xs)
        # each input rounded once to 16 bits, the float32 sum rounded once; eps = unit roundoff
        bound = eps * (sum(np.abs(x) for x in xs) + np.abs(ref)) * 1.001 + 1e-6
        for r in range(world):
            got = res[r][0][i]
            assert got.dtype == np.float32
            assert (np.abs(got - ref) <= bound).all()
        # and it really went through 16 bits: the results are representable in the wire dtype
        assert (res[0][0][i].astype(dtype).astype(np.float32) == res[0][0][i]).all()
    np.testing.assert_array_equal(res[0][1], np.arange(10) * 6)  # int64 untouched by compression
    st = res[0][2]
    assert st["bytes"] == sum(shapes) * 2 + 80  # half the float32 bytes, plus the int64 tensor


def test_bad_settings():
    with pytest.raises(ConfigError):
        reducer.fusion.compression_dtype("int8")
    with pytest.raises(ConfigError):
        reducer.Communicator(["127.0.0.1:1"], 0, 1, fusion_threshold=-1)


# ---------------------------------------------------------------------------- handles & life cycle
def test_handle_wait_timeout_then_success(reducers):
    servers = reducers(1)
    addrs = addresses(servers)

    def work(r):
        a = np.full(8, r + 1.0, np.float32)
        with comm(addrs, r, 2, "hw") as c:
            if r == 1:
                time.sleep(0.6)
            h = c.allreduce_async(a, name="late")
            if r == 0:
                assert not h.done()
                with pytest.raises(ReductionTimeout):
                    h.wait(timeout=0.2)
            assert h.wait(timeout=10) is a
            assert h.done() and h.exception() is None
            return a

    assert all((a == 3).all() for a in ok(run_workers(2, work)))


def test_close_stops_background_threads(reducers):
    servers = reducers(1)
    c = comm(addresses(servers), 0, 1, "close")
    a = np.ones(5, np.float32)
    assert c.allreduce_async(a).wait() is a and (a == 1).all()
    engine = c._engine
    threads = [engine._fusion_thread, engine._net_thread]
    assert all(t.is_alive() for t in threads)
    c.close()
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(ReductionError):
        c.allreduce_async(a)
    c.close()  # idempotent


def test_close_fails_pending_handles(reducers):
    servers = reducers(1)
    cs = ok(run_workers(2, lambda r: comm(addresses(servers), r, 2, "pending", timeout=2.0, cycle_time_ms=INF)))
    # nothing asks for a flush (no timer, no wait, far below the threshold): the handle stays pending
    h = cs[0].allreduce_async(np.ones(3, np.float32))
    time.sleep(0.05)
    assert not h.done()
    cs[0].close()
    assert h.done() and isinstance(h.exception(), ReductionError)
    cs[1].close()
