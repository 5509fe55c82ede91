"""16-bit wire compression of float32 rounds in the transport (csrc/client, compression=).

The definition (test_convert.compressed_allreduce_reference): each input rounded once to the
wire type, summed in float32 in rank order, rounded once, widened. Every worker must get
exactly those bits, whatever the round's shape (contiguous, scatter-gather), the rounds in
flight, the streams, chunk size and window; and the wire must carry half the bytes.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import compression_tasks
import numpy as np
import pytest
from async_tasks import client
from compression_tasks import expected, make_values
from conftest import addresses, run_ranks
from test_convert import assert_same_float32
from test_torch import _run, needs_sklearn, needs_torch, task_hook_grads, tpool  # noqa: F401  (fixture)

import reducer
from reducer.errors import ConfigError

pytestmark = pytest.mark.timeout(240)

SIZES = (0, 1, 7, 1000, 20_001, 100_003, 300_001)


def specs(seed: int, count: int) -> list[compression_tasks.Spec]:
    """Every compression x op once, then random rounds (some plain float32), the same on every rank."""
    rng = random.Random(seed)
    out = [
        (c, op, rng.choice(SIZES[3:]), rng.choice((1, 3)))
        for c in ("bf16", "fp16")
        for op in ("sum", "avg", "min", "max")
    ]
    while len(out) < count:
        out.append(
            (
                rng.choice(("bf16", "fp16", "bf16", "fp16", "")),
                rng.choice(("sum", "avg", "min", "max")),
                rng.choice(SIZES),
                rng.choice((1, 1, 3)),
            )
        )
    return out


def check_rounds(res: list[Any], plan: list[compression_tasks.Spec], world: int, seed: int) -> None:
    for i, (comp, op, n, _) in enumerate(plan):
        want = expected([make_values(n, r, seed * 1000 + i) for r in range(world)], comp, op)
        for r, out in enumerate(res):
            got = out["results"][i]
            assert got.dtype == np.float32 and got.size == n
            try:
                assert_same_float32(got, want)
            except AssertionError as exc:
                raise AssertionError(f"round {i} ({comp or 'plain'} {op} n={n}) on rank {r}: {exc}") from None
            # bit-identical on every worker, NaN payloads included
            assert got.tobytes() == res[0]["results"][i].tobytes(), f"round {i}: rank {r} differs from rank 0"


@pytest.mark.parametrize(
    "world,nred,streams,chunk,window,max_rounds",
    [
        (2, 1, 1, 1 << 20, 4, 8),
        (3, 2, 2, 8192, 2, 8),
        (2, 3, 1, 65536, 1, 4),
        (3, 3, 1, 16384, 4, 3),
    ],
)
def test_rounds_in_flight_match_the_definition(pool, reducers, world, nred, streams, chunk, window, max_rounds):
    """Compressed rounds (every op, odd sizes, ties, subnormals, inf, NaN; contiguous and
    scatter-gather) mixed with plain float32 rounds, all started before any is waited for, then
    finished in a different order on every worker: every result is the definition, bit for bit,
    and the same bits on every worker."""
    seed = world * 10 + nred
    plan = specs(seed, 20)
    servers = reducers(nred)
    res = run_ranks(
        pool,
        compression_tasks.rounds,
        world,
        timeout=200,
        addrs=addresses(servers),
        group=f"cmp-{world}-{nred}",
        specs=plan,
        seed=seed,
        streams=streams,
        chunk_bytes=chunk,
        window=window,
        max_rounds_in_flight=max_rounds,
    )
    check_rounds(res, plan, world, seed)
    for r in res:
        assert r["stats"]["rounds"] == len(plan) and r["stats"]["reconnects"] == 0
    assert max(r["most_in_flight"] for r in res) > 1


def test_communicator_entry_points_and_wire_bytes(pool, reducers):
    """allreduce / allreduce_raw / allreduce_raw_async with compression=, the communicator's
    compression setting as the default for float32 (only), 'none' overriding it; compressed
    rounds put half the bytes of the plain round on the wire."""
    n, seed, world = 1 << 20, 5, 2
    servers = reducers(2)
    res = run_ranks(
        pool,
        compression_tasks.communicator_paths,
        world,
        timeout=200,
        addrs=addresses(servers),
        group="cmp-comm",
        n=n,
        seed=seed,
    )
    inputs = [make_values(n, r, seed) for r in range(world)]
    want = {
        "none": expected(inputs, "", "sum"),
        "setting": expected(inputs, "bf16", "sum"),
        "fp16": expected(inputs, "fp16", "avg"),
        "raw_bf16": expected(inputs, "bf16", "max"),
        "async_fp16": expected(inputs, "fp16", "min"),
    }
    ints = sum(np.arange(n, dtype=np.float64) * (r + 1) for r in range(world))
    for out in res:
        for name, w in want.items():
            assert_same_float32(out["results"][name], w)
            assert out["results"][name].tobytes() == res[0]["results"][name].tobytes(), name
        np.testing.assert_array_equal(out["results"]["float64"], ints)
        sent = out["sent"]
        # headers: 48 bytes a frame, at most a few hundred frames here
        assert 4 * n <= sent["none"] < 4 * n + 48 * 512
        assert 8 * n <= sent["float64"] < 8 * n + 48 * 512
        for name in ("setting", "fp16", "raw_bf16", "async_fp16"):
            assert 2 * n <= sent[name] < 2 * n + 48 * 512, (name, sent[name])
            assert abs(sent[name] / sent["none"] - 0.5) < 0.01, (name, sent[name], sent["none"])
    # the compressed result really differs from the float32 all-reduce (the test can tell them apart)
    assert not np.array_equal(want["setting"], want["none"])


def test_compression_needs_float32_and_whole_floats(reducers):
    """Compression of anything but float32, of segments that split a float, or an unknown
    compression is refused before anything is sent; the session stays usable."""
    addrs = addresses(reducers(1))
    c = client(addrs, 0, 1, "cmp-errors")
    try:
        for dtype in ("float64", "float16", "bfloat16", "int32", "int64"):
            buf = np.zeros(16, np.uint8)
            with pytest.raises(ConfigError, match="needs a float32 buffer"):
                c.start_ptr(buf.ctypes.data, 16, dtype, "sum", compression="bf16")
        raw = np.zeros(9, np.float32)
        with pytest.raises(ConfigError, match="whole, 4-byte aligned"):
            c.start_segments([(raw.ctypes.data, 6), (raw.ctypes.data + 6, 10)], "float32", "sum", compression="fp16")
        with pytest.raises(ConfigError, match="whole, 4-byte aligned"):
            c.start_ptr(raw.ctypes.data + 2, 32, "float32", "sum", compression="fp16")
        with pytest.raises(ValueError, match="unknown compression"):
            c.start_ptr(raw.ctypes.data, 36, "float32", "sum", compression="int8")
        x = np.array([1.0 + 2.0**-9, 3.0, np.inf], np.float32)  # one worker: just the two roundings
        c.wait(c.start_ptr(x.ctypes.data, x.nbytes, "float32", "sum", compression="bf16"))
        np.testing.assert_array_equal(x, np.array([1.0, 3.0, np.inf], np.float32))
        assert c.stats()["reconnects"] == 0
    finally:
        c.close()
    with reducer.Communicator(addrs, 0, 1, group="cmp-errors-comm", timeout=10, connect_timeout=10) as comm:
        with pytest.raises(ConfigError, match="needs a float32 buffer"):
            comm.allreduce(np.zeros(4, np.float64), compression="bf16")
        with pytest.raises(ConfigError, match="unknown compression"):
            comm.allreduce(np.zeros(4, np.float32), compression="fp8")
        y = np.array([1.0 + 2.0**-12], np.float32)
        comm.allreduce(y, compression="fp16")
        assert y[0] == 1.0
    with pytest.raises(ConfigError, match="unknown compression"):
        reducer.Communicator(addrs, 0, 1, group="cmp-errors-bad", compression="int4")


def test_rounds_from_two_threads(reducers):
    """One thread starts compressed rounds while another waits for them (the DDP hook's pattern)."""
    addrs = addresses(reducers(2))
    world, n, count = 2, 50_001, 12
    results: list[list[np.ndarray]] = [[], []]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            c = client(addrs, r, world, "cmp-threads")
            import queue

            q: queue.SimpleQueue[Any] = queue.SimpleQueue()

            def waiter() -> None:
                while (item := q.get()) is not None:
                    c.wait(item)

            t = threading.Thread(target=waiter)
            t.start()
            for i in range(count):
                x = make_values(n, r, 900 + i)
                results[r].append(x)
                q.put(c.start_ptr(x.ctypes.data, x.nbytes, "float32", "avg", compression=("bf16", "fp16")[i % 2]))
            q.put(None)
            t.join(60)
            c.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    for i in range(count):
        want = expected([make_values(n, r, 900 + i) for r in range(world)], ("bf16", "fp16")[i % 2], "avg")
        for r in range(world):
            assert_same_float32(results[r][i], want)


# ------------------------------------------------------------------------------------- DDP hooks
@needs_torch
@needs_sklearn
def test_ddp_compress_hooks_match_the_definition(tpool, reducers):  # noqa: F811
    """bf16_compress_hook / fp16_compress_hook on float32 CPU buckets, 3 workers: the mean of the
    local gradients by the definition (each rounded once, averaged in float32, rounded once), bit
    for bit, on every worker. (torch's recipe, dividing each 16-bit gradient by 3 before the sum,
    rounds more often and gives other bits.)"""
    servers = reducers(2)
    res = _run(tpool, task_hook_grads, 3, [s.address for s in servers])
    local = res[0]["local"]
    for r in res:
        for a, b in zip(r["local"], local):
            np.testing.assert_array_equal(a, b)  # the same local gradients everywhere
        for name in ("bf16", "fp16"):
            assert_same_float32(r[name], expected(local, name, "avg"))
            assert r[name].tobytes() == res[0][name].tobytes()


# ------------------------------------------------------------------------------------- benchmark
def test_bench_summary_with_compression():
    """The summary's theory and %bound count the 16-bit wire bytes of compressed rs and gloo-bf16."""
    from reducer.bench import report

    def row(algo: str, t: float, wire: str) -> dict:
        return report.make_row(algo, 64 << 20, 16 << 20, "float32", "sum", 4, 4, [[t], [t]], 0, wire_dtype=wire)

    rows = [row("rs", 1000.0, "bfloat16"), row("gloo", 3000.0, "float32"), row("gloo-bf16", 1500.0, "bfloat16")]
    text = report.format_summary(rows, 4, 4, emulate_gbps=1.0)
    assert "theory = 2 x 2(n-1)/n = 3.000" in text and "2(n-1)/n = 1.500" in text
    line = [ln for ln in text.splitlines() if ln.strip().startswith(str(64 << 20))][0].split()
    assert line[4:7] == ["3.00x", "1.50x", "3.00x"]  # rs/gloo, rs/gloo-bf16, theory
    rate = report.TCP_PAYLOAD_FRACTION * 1e9 / 8
    bounds = [float(c.rstrip("%")) for c in line[7:10]]
    assert line[10:] == ["met"]  # issue 12's target column: rs above 95% of its (16-bit) bound, no ring run
    # rs: S/2 per link; gloo: S x 1.5; gloo-bf16: S/2 x 1.5
    for got, nbytes, t in zip(bounds, ((64 << 20) / 2, (64 << 20) * 1.5, (64 << 20) * 0.75), (1e-3, 3e-3, 1.5e-3)):
        assert got == pytest.approx(100 * nbytes / rate / t, abs=0.06)


@needs_torch
def test_bench_compression_end_to_end(tmp_path):
    """`reduction-server bench --compression bf16`: rs sends 16-bit (results checked), gloo-bf16 runs
    by default as its baseline; --compression needs float32."""
    import json

    from test_bench import _bench

    jp = tmp_path / "bench.json"
    res = _bench(
        [
            "--workers",
            "2",
            "--reducers",
            "2",
            "--sizes",
            "4K,256K",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--algos",
            "rs,gloo-bf16",
            "--compression",
            "bf16",
            "--op",
            "avg",
            "--json",
            str(jp),
        ],
        timeout=200,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "compression=bf16" in res.stdout and "rs/gloo-bf16" in res.stdout
    rows = json.loads(jp.read_text())
    assert sorted({r["algo"] for r in rows}) == ["gloo-bf16", "rs"] and len(rows) == 4
    for r in rows:
        assert r["wrong"] == 0 and r["dtype"] == "float32" and r["wire_dtype"] == "bfloat16"
        if r["algo"] == "rs":
            assert r["compression"] == "bf16"
    res = _bench(["--workers", "2", "--reducers", "1", "--sizes", "4K", "--dtype", "float64", "--compression", "fp16"])
    assert res.returncode == 2 and "compresses float32 buffers" in res.stderr
