"""PyTorch integration: DDP hooks, the "reduction_server" backend, the DDP example (docs/pytorch.md).

Reducers run in this process; workers are spawned processes (a small pool that imports torch once)
on loopback. Every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import io
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np
import pytest
from paths import ROOT

pytestmark = pytest.mark.timeout(120)

EXAMPLE = os.path.join(ROOT, "examples", "pytorch", "train_ddp.py")
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_SKLEARN = importlib.util.find_spec("sklearn") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (pip install .[torch])")
needs_sklearn = pytest.mark.skipif(not HAVE_SKLEARN, reason="the example needs scikit-learn (pip install scikit-learn)")
TASK_TIMEOUT = 60.0
STEPS = 30

# -- helpers run in the test process ------------------------------------------------------------


def _free_port() -> int:
    """A port for torch's TCPStore: outside the ephemeral range, where an outgoing connection of
    another test could take it before the store binds it (EADDRINUSE, seen in CI)."""
    from reducer.launch import free_ports

    return free_ports(1)[0]


def _worker_env(rank: int, world: int, port: int, addrs: list[str]) -> dict[str, str]:
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "RS_REDUCERS": ",".join(addrs),
        "RS_TIMEOUT": "20",
        "RS_CONNECT_TIMEOUT": "20",
    }


def _run(pool: _Pool, fn: Any, world: int, addrs: list[str], **kw: Any) -> list[Any]:
    """fn(env=..., rank=r, world=world, **kw) on `world` pool processes at once; results by rank."""
    port = _free_port()
    futs = [pool.submit(fn, env=_worker_env(r, world, port, addrs), rank=r, world=world, **kw) for r in range(world)]
    return pool.results(futs)


def _rounds(servers: list[Any]) -> int:
    return sum(int(s.stats()["rounds_completed"]) for s in servers)


class _Pool:
    """Three spawned processes with torch, DDP (torch._dynamo) and the data set imported once.
    When a task fails, its peers may stay blocked in a rendezvous or a collective (a rank whose
    partner died waits out torch's timeout): the processes are then replaced, so that one failure
    does not make the next test wait behind them."""

    def __init__(self) -> None:
        self._ex = self._start()

    @staticmethod
    def _start() -> ProcessPoolExecutor:
        ex = ProcessPoolExecutor(max_workers=3, mp_context=mp.get_context("spawn"))
        list(ex.map(_warm, range(3), timeout=TASK_TIMEOUT))
        return ex

    def submit(self, fn: Any, **kw: Any) -> Future[Any]:
        return self._ex.submit(fn, **kw)

    def results(self, futs: list[Future[Any]]) -> list[Any]:
        """The futures' results in order; on any failure the pool is replaced, then it raises."""
        try:
            return [f.result(timeout=TASK_TIMEOUT) for f in futs]
        except BaseException:
            self.close()
            self._ex = self._start()
            raise

    def close(self) -> None:
        procs = list(getattr(self._ex, "_processes", {}).values())
        self._ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)


@pytest.fixture(scope="module")
def tpool():
    pool = _Pool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def servers(reducers):
    return reducers(2)


# -- tasks run in the worker processes ------------------------------------------------------------


def _warm(_: int) -> int:
    import torch._dynamo  # noqa: F401  (what DDP imports on first use: 1-2 s)

    import reducer.torch  # noqa: F401

    _example()
    if HAVE_SKLEARN:
        from sklearn.datasets import load_digits

        load_digits()
    return os.getpid()


_example_module = None


def _example() -> Any:
    global _example_module
    if _example_module is None:
        spec = importlib.util.spec_from_file_location("train_ddp", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _example_module = module
    return _example_module


@contextlib.contextmanager
def _in_env(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def task_collectives(env: dict[str, str], rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import reducer.torch as rst
    from reducer.torch.hooks import reduce_async

    R = dist.ReduceOp
    with _in_env(env):
        dist.init_process_group("reduction_server", timeout=datetime.timedelta(seconds=30))
        pg = dist.distributed_c10d._get_default_group()
        assert isinstance(pg, rst.ReductionServerProcessGroup), type(pg)
        assert dist.get_backend() == "reduction_server"
        assert (dist.get_rank(), dist.get_world_size()) == (rank, world)
        ranks = torch.arange(world, dtype=torch.float64)

        # all_reduce: every op, several dtypes, sync
        base = torch.arange(1000, dtype=torch.float64)
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
            for op, expect in ((R.SUM, base * world + ranks.sum()), (R.MIN, base), (R.MAX, base + world - 1)):
                t = (base + rank).to(dtype)
                dist.all_reduce(t, op=op)
                assert torch.equal(t, expect.to(dtype)), (dtype, op, t[:4])
        t = (base * 2 + rank * 2).to(torch.float32)
        dist.all_reduce(t, op=R.AVG)
        assert torch.equal(t, (base * 2 + (world - 1)).to(torch.float32)), t[:4]
        for dtype in (torch.float16, torch.bfloat16):  # small integers: exact in 16-bit floats
            t = torch.full((33,), float(rank + 1), dtype=dtype)
            dist.all_reduce(t)
            assert torch.equal(t, torch.full((33,), world * (world + 1) / 2, dtype=dtype)), (dtype, t[:3])

        # async_op: several in flight, waited out of order
        tensors = [torch.full((n,), float(rank + i), dtype=torch.float32) for i, n in enumerate((5, 300_000, 1, 70))]
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for i in reversed(range(len(works))):
            works[i].wait()
            assert torch.equal(tensors[i], torch.full_like(tensors[i], world * i + ranks.sum().item())), i
        w = dist.all_reduce(torch.ones(3), async_op=True)
        fut = w.get_future()
        assert torch.equal(fut.wait()[0], torch.full((3,), float(world)))

        # non-contiguous tensor (a transposed view) is reduced in place
        m = (torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank).t()
        dist.all_reduce(m)
        assert torch.equal(m, (torch.arange(12, dtype=torch.float32).reshape(3, 4) * world + ranks.sum().item()).t())

        # allreduce_coalesced through the reducers
        group = [torch.full((7,), float(rank)), torch.full((3, 3), 1.0)]
        pg.allreduce_coalesced(group, dist.AllreduceCoalescedOptions()).wait()
        assert torch.equal(group[0], torch.full((7,), ranks.sum().item())) and torch.equal(
            group[1], torch.full((3, 3), world * 1.0)
        )

        # ops/dtypes the reducers do not do fall back to gloo; AVG of uint8 has nowhere to go
        p = torch.full((4,), float(rank + 1))
        dist.all_reduce(p, op=R.PRODUCT)
        assert torch.equal(p, torch.full((4,), float(np.prod(np.arange(1, world + 1)))))
        u = torch.full((4,), rank + 1, dtype=torch.uint8)
        dist.all_reduce(u)
        assert torch.equal(u, torch.full((4,), world * (world + 1) // 2, dtype=torch.uint8))
        with pytest.raises(NotImplementedError, match="all_reduce with ReduceOp.AVG on torch.uint8"):
            dist.all_reduce(torch.ones(2, dtype=torch.uint8), op=R.AVG)

        # reduce to a root: root gets the sum, the others keep their input
        r = torch.full((5,), float(rank + 1))
        dist.reduce(r, dst=world - 1)
        assert torch.equal(r, torch.full((5,), world * (world + 1) / 2 if rank == world - 1 else float(rank + 1)))

        # reduce_scatter (tensor and list forms) through the reducers
        inp = torch.arange(world * 4, dtype=torch.float32) + rank
        out = torch.empty(4)
        dist.reduce_scatter_tensor(out, inp)
        assert torch.equal(out, (torch.arange(4, dtype=torch.float32) + rank * 4) * world + ranks.sum().item())
        out2 = torch.empty(2, dtype=torch.int64)
        dist.reduce_scatter(out2, [torch.full((2,), r * 10 + rank, dtype=torch.int64) for r in range(world)])
        assert torch.equal(out2, torch.full((2,), rank * 10 * world + int(ranks.sum().item()), dtype=torch.int64))

        # broadcast (every root), all_gather (both forms), gather/scatter, all_to_all_single, send/recv
        for root in range(world):
            for dtype in (torch.float32, torch.int64, torch.uint8):
                b = torch.full((6,), rank, dtype=dtype)
                dist.broadcast(b, src=root)
                assert torch.equal(b, torch.full((6,), root, dtype=dtype)), (root, dtype)
        gathered = [torch.empty(3) for _ in range(world)]
        dist.all_gather(gathered, torch.full((3,), float(rank)))
        assert all(torch.equal(g, torch.full((3,), float(i))) for i, g in enumerate(gathered))
        flat = torch.empty(world * 2, dtype=torch.int32)
        dist.all_gather_into_tensor(flat, torch.full((2,), rank, dtype=torch.int32))
        assert torch.equal(flat, torch.arange(world, dtype=torch.int32).repeat_interleave(2))
        a2a = torch.empty(world)
        dist.all_to_all_single(a2a, torch.arange(world, dtype=torch.float32) + 10 * rank)
        assert torch.equal(a2a, torch.arange(world, dtype=torch.float32) * 10 + rank)
        if world > 1:
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            sent, got = torch.full((2,), float(rank)), torch.empty(2)
            reqs = [dist.isend(sent, nxt), dist.irecv(got, prv)]
            for q in reqs:
                q.wait()
            assert torch.equal(got, torch.full((2,), float(prv)))

        # barrier: nobody leaves before the last rank arrives
        if rank == world - 1:
            time.sleep(0.4)
        t0 = time.perf_counter()
        dist.barrier()
        waited = time.perf_counter() - t0
        if rank == 0 and world > 1:
            assert waited > 0.3, waited

        # a sub-group gets its own group on the reducers
        if world >= 3:
            sub = dist.new_group([0, 2])
            if rank in (0, 2):
                assert dist.get_backend(sub) == "reduction_server"
                s_t = torch.full((3,), float(rank + 1))
                dist.all_reduce(s_t, group=sub)
                assert torch.equal(s_t, torch.full((3,), 4.0))
                assert sub.communicator.group != pg.communicator.group and sub.communicator.world_size == 2
            dist.barrier()

        # unsupported collectives say which one
        with pytest.raises(NotImplementedError, match="all_to_all with tensor lists"):
            dist.all_to_all([torch.empty(1) for _ in range(world)], [torch.ones(1) for _ in range(world)])

        # futures of one communicator complete in submission order (the large one first)
        order: list[int] = []
        futs = []
        for i, n in enumerate((2_000_000, 10, 50_000, 1, 300)):
            x = torch.ones(n)
            f = reduce_async(pg.communicator, [x], "sum", lambda x=x: x)
            futs.append(f.then(lambda _f, i=i: order.append(i)))
        torch.futures.wait_all(futs)
        assert order == [0, 1, 2, 3, 4], order
        return {"rank": rank}


def task_train(env: dict[str, str], rank: int, world: int, argv: list[str]) -> str:
    """Run examples/pytorch/train_ddp.py's main() here; returns what it printed."""
    with _in_env(env):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = _example().main(argv)
        assert code == 0
        return buf.getvalue()


def task_backend_errors(env: dict[str, str], rank: int, world: int, first: str) -> dict[str, Any]:
    """Over the backend, with the only reducer stopped after one training step: the error must
    reach the caller instead of passing silently or crashing the process. `first` is the call
    made first after the stop (its round fails in flight: "all_reduce" fails in Work.wait(),
    "backward" in the Future DDP's reducer waits on); the other one is made after it."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import reducer
    import reducer.torch  # noqa: F401  (registers the backend)

    srv = reducer.ReducerServer(host="127.0.0.1", port=0).start()
    out: dict[str, Any] = {}
    # a short connect timeout: the reconnect to the stopped reducer fails in seconds, not 20
    with _in_env({**env, "RS_REDUCERS": f"127.0.0.1:{srv.port}", "RS_TIMEOUT": "10", "RS_CONNECT_TIMEOUT": "3"}):
        dist.init_process_group("reduction_server", timeout=datetime.timedelta(seconds=30))
        try:
            torch.manual_seed(0)
            model = DDP(torch.nn.Linear(8, 4))
            model(torch.ones(2, 8)).sum().backward()
            t = torch.ones(4)
            dist.all_reduce(t)
            out["before"] = t.tolist()
            srv.stop()

            def all_reduce() -> None:
                dist.all_reduce(torch.ones(4))

            def backward() -> None:
                model(torch.ones(2, 8)).sum().backward()

            calls = {"all_reduce": all_reduce, "backward": backward}
            for name in sorted(calls, key=lambda n: n != first):
                try:
                    calls[name]()
                    out[name] = "no error"
                except Exception as exc:
                    out[name] = f"{type(exc).__name__}: {exc}"
        finally:
            dist.destroy_process_group()
    return out


def task_hook_grads(env: dict[str, str], rank: int, world: int) -> dict[str, Any]:
    """One backward per hook on the same batch; also every rank's exact local gradients."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import reducer.torch as rst

    ex = _example()
    torch.set_num_threads(1)
    with _in_env(env):
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        x, y, _, _ = ex.load_digits_split(0)
        batches = [(x[r * 64 : (r + 1) * 64], y[r * 64 : (r + 1) * 64]) for r in range(world)]
        torch.manual_seed(0)
        model = ex.make_model()
        local = []
        for bx, by in batches:
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(bx), by).backward()
            local.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
        stacked = torch.stack(local).double()
        out: dict[str, Any] = {
            "mean": stacked.mean(0).numpy(),
            "mean_abs": stacked.abs().mean(0).numpy(),
            "local": [g.numpy() for g in local],
        }
        state = rst.HookState()
        not_done_at_return = 0

        for name, hook in (
            ("allreduce", rst.allreduce_hook),
            ("bf16", rst.bf16_compress_hook),
            ("fp16", rst.fp16_compress_hook),
        ):
            model.zero_grad(set_to_none=True)
            ddp = DDP(model, bucket_cap_mb=0.001)  # ~1 kB buckets: several per backward
            calls: list[int] = []

            def watched(st, bucket, hook=hook):  # no annotations: DDP checks them
                nonlocal not_done_at_return
                fut = hook(st, bucket)
                not_done_at_return += int(not fut.done())
                calls.append(bucket.index())
                return fut

            # allreduce_hook through a wrapper that watches its futures; the others as they are (DDP
            # checks hooks by name, e.g. refuses one named bf16_compress_hook without NCCL)
            ddp.register_comm_hook(state, watched if name == "allreduce" else hook)
            bx, by = batches[rank]
            for _ in range(2):  # DDP rebuilds its buckets (to bucket_cap_mb) after the first backward
                calls.clear()
                model.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(ddp(bx), by).backward()
            out[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy()
            if name == "allreduce":
                out["buckets"] = len(calls)
            del ddp
        out["not_done_at_return"] = not_done_at_return
        state.close()
        return out


# -- tests ---------------------------------------------------------------------------------------


def test_import_without_torch_is_actionable():
    """torch is optional: reducer.torch says how to install it, the rest of the library works."""
    code = r"""
import sys
sys.modules["torch"] = None          # as if torch were not installed
import numpy as np
import reducer
from reducer import cluster, config, errors
try:
    import reducer.torch
except ImportError as exc:
    print("IMPORT-ERROR:", exc)
else:
    raise SystemExit("import reducer.torch succeeded without torch")
with reducer.ReducerServer(host="127.0.0.1", port=0) as srv:
    comm = reducer.Communicator([srv.address], rank=0, world_size=1, timeout=10, connect_timeout=10)
    a = np.arange(5, dtype=np.float32)
    comm.allreduce(a)
    if hasattr(comm, "allreduce_async"):
        comm.allreduce_async(a).wait(timeout=10)
    comm.close()
assert "torch" not in {m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
print("LIBRARY-OK", a.tolist())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hint = "install it with pip install torch (or reinstall this package with its 'torch' extra"
    assert hint in proc.stdout, proc.stdout
    assert "reduction-server[" not in proc.stdout  # not on a package index: no hint that cannot work
    assert "IMPORT-ERROR: reducer.torch needs PyTorch" in proc.stdout
    assert "LIBRARY-OK [0.0, 1.0, 2.0, 3.0, 4.0]" in proc.stdout


@needs_torch
@pytest.mark.parametrize("world", [2, 3])
def test_backend_collectives(tpool, servers, world):
    before = _rounds(servers)
    results = _run(tpool, task_collectives, world, [s.address for s in servers])
    assert [r["rank"] for r in results] == list(range(world))
    assert _rounds(servers) - before >= 20, "the reductions did not go through the reducers"


@needs_torch
def test_registration_and_errors(reducers, monkeypatch):
    import torch
    import torch.distributed as dist

    import reducer
    import reducer.torch as rst

    assert "reduction_server" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["reduction_server"] == ["cpu", "cuda"]
    rst.register_backend()  # idempotent
    with pytest.raises(TypeError, match="HookState"):
        rst.allreduce_hook(object(), None)
    assert rst.bf16_compress_hook.__name__ != "bf16_compress_hook"  # DDP would demand NCCL for that name

    # no reducers to be found: the error says which backend and what to set
    for var in ("CLUSTER_SPEC", "TF_CONFIG", "RS_REDUCERS", "RS_RANK", "RS_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    timeout = datetime.timedelta(seconds=10)
    with pytest.raises(reducer.ConfigError, match="'reduction_server'.*RS_REDUCERS"):
        rst.ReductionServerProcessGroup(dist.HashStore(), 0, 1, timeout)

    # a one-rank group from discovery (RS_REDUCERS): reductions work, unsupported collectives are named
    (srv,) = reducers(1)
    monkeypatch.setenv("RS_REDUCERS", srv.address)
    pg = rst.ReductionServerProcessGroup(dist.HashStore(), 0, 1, timeout)
    try:
        assert pg.getBackendName() == "reduction_server" and pg.communicator.world_size == 1
        assert pg.communicator.group.startswith("default.torch.")
        t = torch.arange(4.0)
        pg.allreduce([t]).wait()
        assert torch.equal(t, torch.arange(4.0))
        with pytest.raises(NotImplementedError, match="split_group"):
            pg.split_group([0])
        with pytest.raises(NotImplementedError, match="coalescing"):
            pg._start_coalescing(torch.device("cpu"))
        # a HookState on a reduction_server group uses that group's connection
        assert rst.HookState(pg).comm is pg.communicator
    finally:
        pg.shutdown()
    assert srv.stats()["rounds_completed"] >= 1


@needs_torch
@needs_sklearn
def test_ddp_hook_and_backend_match_gloo(tpool, servers, tmp_path):
    """Same seed, same steps: hook DDP, plain DDP over the backend and plain gloo DDP agree."""
    import torch

    addrs = [s.address for s in servers]
    tmp = str(tmp_path)
    common = ["--steps", str(STEPS), "--log-every", "1", "--bucket-cap-mb", "0.02"]
    runs = {
        "gloo": ["--backend", "gloo"],
        "hook": [],
        "nohook": ["--no-hook"],
    }
    out: dict[str, Any] = {}
    for name, extra in runs.items():
        before = _rounds(servers)
        save = os.path.join(tmp, f"{name}-{{rank}}.pt")
        logs = _run(tpool, task_train, 2, addrs, argv=common + extra + ["--save", save])
        rounds = _rounds(servers) - before
        params = [torch.load(save.replace("{rank}", str(r))) for r in range(2)]
        losses = [float(v) for v in re.findall(r"^step \d+ loss (\S+)$", logs[0], re.M)]
        out[name] = (params, losses, rounds, logs[0])
    assert out["gloo"][2] == 0, "plain gloo DDP must not touch the reducers"
    for name in ("hook", "nohook"):
        params, losses, rounds, log = out[name]
        assert rounds >= STEPS, (name, rounds)
        assert len(losses) == STEPS, log
        assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), (name, losses)
        for k in params[0]:  # every worker holds the same parameters, bit for bit
            assert torch.equal(params[0][k], params[1][k]), (name, k)
            torch.testing.assert_close(
                params[0][k],
                out["gloo"][0][0][k],  # float32 default tolerances
                msg=lambda m: f"{name} vs gloo, {k}: {m}",
            )
    assert "reducer.torch allreduce hook" in out["hook"][3]
    assert "reduction_server backend" in out["nohook"][3]


@needs_torch
@needs_sklearn
def test_compressed_hooks_within_rounding(tpool, servers):
    res = _run(tpool, task_hook_grads, 2, [s.address for s in servers])
    mean, mean_abs = res[0]["mean"], res[0]["mean_abs"]
    assert res[0]["buckets"] >= 3
    for r in res:
        np.testing.assert_allclose(r["allreduce"], mean, rtol=1e-5, atol=1e-7)
        for name, eps, dtype in (("bf16", 2.0**-8, "bfloat16"), ("fp16", 2.0**-11, np.float16)):
            err = np.abs(r[name].astype(np.float64) - mean)
            bound = 3 * eps * mean_abs + 1e-7
            assert (err <= bound).all(), (name, float((err / bound).max()))
            # the values really travelled in 16 bits
            import ml_dtypes

            dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
            assert np.array_equal(r[name].astype(dt).astype(np.float32), r[name]), name
        assert not np.array_equal(r["bf16"], r["allreduce"])
    for name in ("allreduce", "bf16", "fp16"):
        assert np.array_equal(res[0][name], res[1][name]), name
    # the hook returns before its bucket is reduced (the work overlaps the backward pass)
    assert sum(r["not_done_at_return"] for r in res) > 0


@needs_torch
@needs_sklearn
def test_example_script_under_the_launcher(tmp_path):
    """The documented command: reduction-server launch --workers 2 --reducers 2 -- python train_ddp.py."""
    cmd = [
        sys.executable,
        "-m",
        "reducer.cli.main",
        "launch",
        "--workers",
        "2",
        "--reducers",
        "2",
        "--",
        sys.executable,
        EXAMPLE,
        "--steps",
        str(STEPS),
        "--log-every",
        "1",
        "--save",
        str(tmp_path / "p{rank}.pt"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RS_")}
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=100)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "gloo DDP + reducer.torch allreduce hook, 2 workers" in out, out[-4000:]
    losses = [float(v) for v in re.findall(r"\[worker 0\.0\] step \d+ loss (\S+)", out)]
    assert len(losses) == STEPS and np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    rounds = [int(n) for n in re.findall(r"stopped after (\d+) rounds", out)]
    assert len(rounds) == 2 and min(rounds) >= STEPS, out[-4000:]
    import torch

    p0, p1 = (torch.load(tmp_path / f"p{r}.pt") for r in range(2))
    assert all(torch.equal(p0[k], p1[k]) for k in p0)


@needs_torch
@pytest.mark.parametrize("first", ["all_reduce", "backward"])
def test_backend_errors_reach_the_caller(tpool, first):
    """A failed reduction is an exception, never a silent no-op or a crash: wait() on a backend
    Work raises the reducer error (torch's Work made from a Future returns True even when the
    Future failed), and DDP's backward() raises it (DDP's reducer once read the exception object
    as the bucket's result and crashed the process)."""
    port = _free_port()
    (out,) = tpool.results(
        [tpool.submit(task_backend_errors, env=_worker_env(0, 1, port, []), rank=0, world=1, first=first)]
    )
    assert out["before"] == [1.0] * 4, out
    assert out["all_reduce"].startswith("PeerLostError: every reducer is lost"), out
    if first == "backward":  # failed in flight: the C++ error of the Future DDP waits on
        assert (
            out["backward"].startswith("RuntimeError") and "PeerLostError: every reducer is lost" in out["backward"]
        ), out
    else:  # the engine has failed: the next submit raises the same error at once
        assert out["backward"].startswith("PeerLostError: every reducer is lost"), out


@needs_torch
@pytest.mark.parametrize("path", ["hook", "backend"])
def test_ddp_training_survives_a_reducer_kill(tpool, servers, tmp_path, path):
    """A reducer SIGKILLed in the middle of DDP training (through the reducer.torch hook) costs
    nothing: the job finishes, and every parameter equals, bit for bit, the run without the
    failure; both through the hook and as plain DDP over the reduction_server backend (whose
    fusion engine's agreement probes then fail over too: a worker's data and probe clients each
    read their links while idle, tests/client/test_cross_group_failover.py)."""
    import torch
    from test_failover import Victim

    common = ["--steps", str(STEPS), "--log-every", "1", "--bucket-cap-mb", "0.02"]
    if path == "backend":
        common.append("--no-hook")
    good = servers[0]
    ref_save = os.path.join(str(tmp_path), "ref-{rank}.pt")
    _run(tpool, task_train, 2, [s.address for s in servers], argv=common + ["--save", ref_save])
    victim = Victim()
    try:
        save = os.path.join(str(tmp_path), "kill-{rank}.pt")
        port = _free_port()
        addrs = [victim.address, good.address]
        before = int(good.stats()["rounds_completed"])
        futs = [
            tpool.submit(
                task_train, env=_worker_env(r, 2, port, addrs), rank=r, world=2, argv=common + ["--save", save]
            )
            for r in range(2)
        ]
        deadline = time.monotonic() + TASK_TIMEOUT
        while int(good.stats()["rounds_completed"]) - before < STEPS // 2:  # halfway through training
            assert time.monotonic() < deadline and not any(f.done() for f in futs), "training did not progress"
            time.sleep(0.01)
        victim.kill()
        logs = tpool.results(futs)
    finally:
        victim.kill()
    assert len(re.findall(r"^step \d+ loss", logs[0], re.M)) == STEPS, logs[0]
    for r in range(2):
        want = torch.load(ref_save.replace("{rank}", str(r)))
        got = torch.load(save.replace("{rank}", str(r)))
        for k in want:
            assert torch.equal(want[k], got[k]), k


def task_dataloader(env: dict[str, str], rank: int, world: int, mode: str) -> dict[str, Any]:
    """DDP (gloo, the reducer.torch hook, or the reduction_server backend) over 3 epochs of a
    DataLoader whose 2 workers are forked at each epoch, while this process's clients (and their
    idle-progress threads) are live: the final parameters."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import reducer.torch as rst

    ex = _example()
    torch.set_num_threads(1)
    with _in_env(env):
        dist.init_process_group(
            "reduction_server" if mode == "backend" else "gloo", timeout=datetime.timedelta(seconds=30)
        )
        x, y, _, _ = ex.load_digits_split(0)
        data = TensorDataset(x[:192], y[:192])
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=2, multiprocessing_context="fork")
        torch.manual_seed(0)
        model = ex.make_model()
        ddp = DDP(model, bucket_cap_mb=0.02)
        state = rst.HookState() if mode == "hook" else None
        if state is not None:
            ddp.register_comm_hook(state, rst.allreduce_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        steps = 0
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for bx, by in loader:  # (new worker processes forked for each epoch)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(ddp(bx), by).backward()
                opt.step()
                steps += 1
        out = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        out["steps"] = steps
        if state is not None:
            state.close()
        return out


@needs_torch
@needs_sklearn
def test_ddp_with_forking_dataloader_workers(tpool, servers):
    """Issue 28 point 3: DataLoader workers (num_workers=2, forked at every epoch) inherit the
    worker's clients; they must leave the parent's connections alone. Hook and backend runs finish
    all 3 epochs with parameters equal, bit for bit, to gloo's (a sum of 2 in rank order, halved)."""
    addrs = [s.address for s in servers]
    runs = {mode: _run(tpool, task_dataloader, 2, addrs, mode=mode) for mode in ("gloo", "hook", "backend")}
    for mode, res in runs.items():
        assert res[0]["steps"] == res[1]["steps"] == 3 * 192 // (2 * 16), (mode, res[0]["steps"])
        for k in res[0]:
            np.testing.assert_array_equal(res[0][k], res[1][k], err_msg=f"{mode}: ranks differ at {k}")
            np.testing.assert_array_equal(res[0][k], runs["gloo"][0][k], err_msg=f"{mode} vs gloo at {k}")
