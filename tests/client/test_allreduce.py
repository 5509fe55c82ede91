"""End-to-end all-reduce correctness: worker processes on loopback against in-process reducers."""

from __future__ import annotations

import numpy as np
import pytest
import tasks
from conftest import addresses, run_ranks

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("world,nred", [(1, 1), (2, 3), (3, 2), (5, 1)])
def test_every_dtype_op_and_size(pool, reducers, world, nred):
    servers = reducers(nred)
    results = run_ranks(pool, tasks.matrix, world, addrs=addresses(servers), group=f"m{world}{nred}")
    for r, res in enumerate(results):
        assert res["errors"] == [], f"rank {r}: {res['errors'][:5]}"
    # Every worker holds bit-identical results.
    for res in results[1:]:
        assert res["digests"] == results[0]["digests"]


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("nred", [1, 2, 3])
def test_world_and_reducer_counts(pool, reducers, world, nred):
    servers = reducers(nred)
    results = run_ranks(
        pool,
        tasks.matrix,
        world,
        addrs=addresses(servers),
        group="wr",
        dtypes=("float32", "int64"),
        ops=("sum",),
        sizes=(0, 1, 2, 7, 1023, 1_000_003),
    )
    for res in results:
        assert res["errors"] == []


def test_bit_identical_across_runs_and_streams(pool, reducers):
    servers = reducers(2)
    kw = dict(
        addrs=addresses(servers),
        dtypes=("float32", "float16", "bfloat16"),
        ops=("sum", "avg"),
        sizes=(1023, 300_001),
        chunk_bytes=64 << 10,
    )
    first = run_ranks(pool, tasks.matrix, 3, group="bit1", **kw)
    second = run_ranks(pool, tasks.matrix, 3, group="bit2", streams=3, **kw)
    assert all(r["errors"] == [] for r in first + second)
    assert first[0]["digests"] == second[0]["digests"] == second[2]["digests"]


def test_64_mib(pool, reducers):
    servers = reducers(2)
    results = run_ranks(pool, tasks.large, 3, addrs=addresses(servers), group="big", streams=2)
    assert all(r["error"] is None for r in results), results
    assert len({r["digest"] for r in results}) == 1


def test_200_rounds_back_to_back(pool, reducers):
    servers = reducers(2)
    results = run_ranks(pool, tasks.back_to_back, 2, addrs=addresses(servers), group="b2b")
    assert all(r["error"] is None for r in results), results
    assert results[0]["stats"]["rounds"] == 200
    # 8 KB rounds fit one reducer each (minimum shard 64 KiB), rotated over the reducers.
    assert sum(s.stats()["rounds_completed"] for s in servers) == 200


def test_two_groups_at_once(pool, reducers):
    servers = reducers(2)
    addrs = addresses(servers)
    futs = [pool.submit(tasks.allreduce_once, rank=r, world=2, addrs=addrs, group="a", repeat=20) for r in range(2)]
    futs += [
        pool.submit(tasks.allreduce_once, rank=r, world=3, addrs=addrs, group="b", job_id="other", repeat=20)
        for r in range(3)
    ]
    out = [f.result(timeout=60) for f in futs]
    assert [o["value"][0] for o in out] == [2, 2, 3, 3, 3]


def test_in_process_api(reducers):
    """The blocking API on numpy arrays in one process (world size 1), incl. bfloat16 and stats."""
    import ml_dtypes

    import reducer

    servers = reducers(2)
    with reducer.Communicator(addresses(servers), 0, 1, group="solo") as comm:
        assert comm.rank == 0 and comm.world_size == 1
        a = np.arange(10, dtype=ml_dtypes.bfloat16)
        assert comm.allreduce(a, op="max") is a
        np.testing.assert_array_equal(a, np.arange(10, dtype=ml_dtypes.bfloat16))
        b = np.arange(12, dtype=np.float64).reshape(3, 4)
        comm.allreduce(b)
        np.testing.assert_array_equal(b, np.arange(12).reshape(3, 4))
        with pytest.raises(reducer.ConfigError, match="C-contiguous"):
            comm.allreduce(np.zeros((4, 4), np.float32)[:, 1])
        with pytest.raises(reducer.ConfigError, match="not supported"):
            comm.allreduce(np.zeros(4, np.complex64))
        with pytest.raises(reducer.ConfigError, match="unsupported op"):
            comm.allreduce(np.zeros(4, np.float32), op="prod")
    stats = servers[0].stats()
    for key in ("bytes_received", "bytes_sent", "rounds_completed", "connected_workers", "groups"):
        assert key in stats
    assert stats["bytes_received"] > 0 and stats["bytes_sent"] > 0


def test_ipv6_loopback(reducers):
    import socket

    import reducer

    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        srv = reducers(1, host="::1")[0]
    except reducer.ReductionError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    assert srv.address.startswith("[::1]:")
    with reducer.Communicator([srv.address], 0, 1, group="v6") as comm:
        a = np.ones(5, np.float32)
        comm.allreduce(a)
        assert a.sum() == 5


def test_hostname_address(reducers):
    import reducer

    srv = reducers(1)[0]
    with reducer.Communicator([f"localhost:{srv.port}"], 0, 1, group="name") as comm:
        a = np.ones(3, np.int32)
        comm.allreduce(a)
        assert a.tolist() == [1, 1, 1]
