"""The NCCL-style shim with host pointers, group fusion, and hierarchical mode over gloo."""

from __future__ import annotations

from datetime import timedelta

import ml_dtypes
import numpy as np
import pytest
from conftest import addresses
from test_fusion import INF, comm, ok, rounds, run_workers

from reducer import nccl
from reducer.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


def test_enums_use_nccls_numbering():
    assert (
        nccl.ncclInt8,
        nccl.ncclUint8,
        nccl.ncclInt32,
        nccl.ncclUint32,
        nccl.ncclInt64,
        nccl.ncclUint64,
        nccl.ncclFloat16,
        nccl.ncclFloat32,
        nccl.ncclFloat64,
        nccl.ncclBfloat16,
    ) == tuple(range(10))
    assert (nccl.ncclSum, nccl.ncclProd, nccl.ncclMax, nccl.ncclMin, nccl.ncclAvg) == tuple(range(5))
    assert nccl.ncclFloat == nccl.ncclFloat32 and nccl.ncclHalf == nccl.ncclFloat16
    with pytest.raises(ConfigError, match="ncclUint8"):
        nccl.dtype_of(nccl.ncclUint8)
    with pytest.raises(ConfigError, match="ncclProd"):
        nccl.op_of(nccl.ncclProd)
    with pytest.raises(ConfigError, match="groupStart"):
        nccl.groupEnd()


CASES = [
    (nccl.ncclFloat32, np.float32, nccl.ncclSum),
    (nccl.ncclFloat64, np.float64, nccl.ncclMax),
    (nccl.ncclInt32, np.int32, nccl.ncclMin),
    (nccl.ncclInt64, np.int64, nccl.ncclSum),
    (nccl.ncclFloat16, np.float16, nccl.ncclAvg),
    (nccl.ncclBfloat16, ml_dtypes.bfloat16, nccl.ncclSum),
]


def _expected(op, world, n):
    vals = [np.arange(n, dtype=np.float64) + 10 * (r + 1) for r in range(world)]
    return {
        nccl.ncclSum: sum(vals),
        nccl.ncclMax: np.maximum.reduce(vals),
        nccl.ncclMin: np.minimum.reduce(vals),
        nccl.ncclAvg: sum(vals) / world,
    }[op]


@pytest.mark.parametrize("grouped", [False, True])
def test_host_pointers(reducers, grouped):
    servers = reducers(2)
    addrs, world, n = addresses(servers), 2, 37

    def work(r):
        with comm(addrs, r, world, "ptr") as c:
            nc = nccl.NcclCommunicator(c)
            assert nc.rank_id() == r and nc.size() == world
            sends = [(np.arange(n) + 10 * (r + 1)).astype(dt) for _, dt, _ in CASES]
            recvs = [np.zeros(n, dt) for _, dt, _ in CASES]
            inplace = np.full(5, r + 1.0, np.float32)
            if grouped:
                nccl.groupStart()
            for (nd, _, op), s, d in zip(CASES, sends, recvs):
                nc.allReduce(s.ctypes.data, d.ctypes.data, n, nd, op, 0)  # out of place
            nc.allReduce(inplace.ctypes.data, inplace.ctypes.data, 5, nccl.ncclFloat32, nccl.ncclSum, 0)
            nc.allReduce(0, 0, 0, nccl.ncclFloat32, nccl.ncclSum, 0)  # count 0 is fine
            if grouped:
                assert (inplace == r + 1).all()  # nothing happens before groupEnd
                nccl.groupEnd()
            return sends, recvs, inplace

    for r, (sends, recvs, inplace) in enumerate(ok(run_workers(world, work))):
        for (_, dt, op), s, d in zip(CASES, sends, recvs):
            np.testing.assert_allclose(d.astype(np.float64), _expected(op, world, n), rtol=1e-2)
            np.testing.assert_array_equal(s, (np.arange(n) + 10 * (r + 1)).astype(dt))  # send untouched
        assert (inplace == 3).all()


def test_group_fuses_many_small_allreduces(reducers):
    servers = reducers(2)
    addrs = addresses(servers)
    n = 200

    def work(r, grouped):
        bufs = [np.full(3 + i % 11, r + 1.0, np.float32) for i in range(n)]
        with comm(addrs, r, 2, f"grp{grouped}", cycle_time_ms=INF) as c:
            nc = nccl.NcclCommunicator(c)
            if grouped:
                nccl.groupStart()
            for b in bufs:
                nc.allReduce(b.ctypes.data, b.ctypes.data, b.size, nccl.ncclFloat32, nccl.ncclSum, None)
            if grouped:
                nccl.groupEnd()
        return bufs

    before = rounds(servers)
    res = ok(run_workers(2, lambda r: work(r, True)))
    # one agreement probe (one reducer: minimum shard) + one fused round (one or both reducers)
    assert 2 <= sum(rounds(servers)) - sum(before) <= 3
    assert all((b == 3).all() for b in res[0] + res[1])

    before = rounds(servers)
    res = ok(run_workers(2, lambda r: work(r, False)))
    assert sum(rounds(servers)) - sum(before) >= n  # outside a group each call is its own all-reduce
    assert all((b == 3).all() for b in res[0] + res[1])


def test_hierarchical_refuses_a_non_contiguous_tensor_before_any_traffic():
    torch = pytest.importorskip("torch")

    class _Comm:  # never used: the check comes first
        rank, world_size = 0, 2

    h = nccl.HierarchicalAllreduce(_Comm(), None, local_rank=0, local_size=2)
    with pytest.raises(ConfigError, match=r"call \.contiguous\(\)"):
        h.allreduce(torch.zeros(4, 4).t())


def test_hierarchical_two_nodes_two_local_ranks_gloo(reducers):
    """2 nodes x 2 local ranks (threads): reduce-scatter in the node, slices via reducers, all-gather."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    servers = reducers(2)
    addrs = addresses(servers)
    stores = [dist.HashStore() for _ in range(2)]
    nodes, local = 2, 2

    def work(g):
        node, lr = divmod(g, local)
        pg = dist.ProcessGroupGloo(stores[node], lr, local, timedelta(seconds=20))
        h = nccl.hierarchical(
            pg,
            local_rank=lr,
            local_size=local,
            node_rank=node,
            num_nodes=nodes,
            reducers=addrs,
            group="hier",
            timeout=10.0,
            connect_timeout=10.0,
        )
        try:
            assert (h.global_rank, h.global_size) == (g, 4)
            a = torch.arange(10, dtype=torch.float32) * (g + 1)  # 10 % 2 == 0: reduced in place
            b = torch.full((7,), float(g))  # odd length: padded
            c = torch.full((3, 3), float(g), dtype=torch.float64)
            h.allreduce(a)
            h.allreduce(b, op="max")
            h.allreduce_coalesced([c, torch.zeros(0, dtype=torch.float64)], op="avg")
            # the NCCL-style API in hierarchical mode, a group of host pointers
            x = np.full(9, g + 1, np.int64)
            y = np.full(5, float(g), np.float32)
            nc = nccl.NcclCommunicator(hierarchical=h)
            nccl.groupStart()
            nc.allReduce(x.ctypes.data, x.ctypes.data, 9, nccl.ncclInt64, nccl.ncclSum, 0)
            nc.allReduce(y.ctypes.data, y.ctypes.data, 5, nccl.ncclFloat32, nccl.ncclMin, 0)
            nccl.groupEnd()
            return a, b, c, x, y
        finally:
            h.comm.close()

    res = ok(run_workers(nodes * local, work, timeout=40))
    for a, b, c, x, y in res:
        assert torch.equal(a, torch.arange(10, dtype=torch.float32) * 10)
        assert torch.equal(b, torch.full((7,), 3.0))
        assert torch.allclose(c, torch.full((3, 3), 1.5, dtype=torch.float64))
        assert (x == 10).all() and (y == 0).all()
    # each local rank's slice went through its own reducer group, once per call
    assert sum(s.stats()["rounds_completed"] for s in servers) >= 2 * 4
