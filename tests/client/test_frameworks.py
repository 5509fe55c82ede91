"""Arrays from every framework: torch CPU tensors (zero copy), DLPack objects, device staging.

There is no GPU here: the device staging path (pinned buffers, side-stream copies, events) is
exercised with a fake device backend that defers its copies like a CUDA stream would, so a
missing synchronisation shows up as wrong data. The real torch CUDA test runs only on a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import addresses
from test_fusion import comm, ok, run_workers

import reducer
from reducer import frameworks
from reducer.errors import ConfigError

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------------------- torch CPU
def test_torch_cpu_tensors_in_place(reducers):
    servers = reducers(2)
    addrs = addresses(servers)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]

    def work(r):
        g = torch.Generator().manual_seed(7 + r)
        ts = [(torch.randn(33, 5, generator=g) * 3).to(dt) for dt in dtypes]
        model = torch.nn.Linear(4, 3)
        model(torch.ones(2, 4)).sum().backward()
        grad = model.weight.grad
        inputs = [t.clone() for t in ts] + [grad.clone()]
        ptrs = [t.data_ptr() for t in ts] + [grad.data_ptr()]
        with comm(addrs, r, 2, "torch") as c:
            hs = [c.allreduce_async(t, name=str(t.dtype)) for t in ts]
            hs.append(c.allreduce_async(grad, op="avg"))
            c.synchronize()
            assert hs[0].wait() is ts[0]
            blocking = torch.full((5,), float(r + 1))
            assert c.allreduce(blocking) is blocking  # the blocking API takes torch tensors too
        return inputs, ts + [grad], ptrs, [t.data_ptr() for t in ts] + [grad.data_ptr()], blocking

    res = ok(run_workers(2, work))
    for i in range(len(dtypes) + 1):
        a, b = res[0][0][i].double(), res[1][0][i].double()
        ref = (a + b) / (2 if i == len(dtypes) else 1)
        got = res[0][1][i]
        tol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-6
        assert torch.allclose(got.double(), ref, rtol=tol, atol=tol), (i, got.dtype)
        assert torch.equal(res[0][1][i], res[1][1][i])
    for r in range(2):
        assert res[r][2] == res[r][3]  # reduced in the callers' own storage
        assert torch.equal(res[r][4], torch.full((5,), 3.0))


def test_torch_noncontiguous_is_refused(reducers):
    servers = reducers(1)
    with comm(addresses(servers), 0, 1, "nc") as c:
        with pytest.raises(ConfigError, match="contiguous"):
            c.allreduce_async(torch.ones(4, 4).t())
        with pytest.raises(ConfigError):
            c.allreduce_async(torch.ones(3, dtype=torch.complex64))


# ---------------------------------------------------------------------------- DLPack
class DLPackOnly:
    """An object that offers nothing but DLPack (like a JAX or TF CPU array)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._inner.__dlpack_device__()


def test_dlpack_objects(reducers):
    servers = reducers(1)
    addrs = addresses(servers)

    def work(r):
        a = np.full(17, r + 1.0, np.float32)
        t = torch.full((2, 3), float(r + 1), dtype=torch.float64)
        with comm(addrs, r, 2, "dl") as c:
            h1 = c.allreduce_async(DLPackOnly(a))
            c.allreduce_async(DLPackOnly(t), op="max")
            c.synchronize()
            assert isinstance(h1.wait(), DLPackOnly)
            c.allreduce(DLPackOnly(a))  # blocking API: 3 + 3
        return a, t

    for a, t in ok(run_workers(2, work)):
        assert (a == 6).all() and bool((t == 2).all())


def test_cuda_dlpack_without_gpu_says_what_is_missing():
    class CudaThing:
        def __dlpack__(self, *a: Any, **k: Any) -> Any:  # pragma: no cover - never called
            raise AssertionError

        def __dlpack_device__(self) -> Any:
            return (2, 0)

    assert frameworks.is_device_array(CudaThing())
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA memory"):
            frameworks.stage(CudaThing())
    with pytest.raises(ConfigError, match="allreduce_async"):
        reducer.arrays.host_view(CudaThing())


def test_unknown_objects_are_refused():
    with pytest.raises(ConfigError, match="cannot all-reduce"):
        frameworks.stage(object())
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ConfigError, match="read-only"):
        frameworks.stage(ro)


# ---------------------------------------------------------------------------- device staging
class FakeDeviceArray:
    """'Device memory': no buffer protocol, no DLPack; only the fake backend can copy it."""

    def __init__(self, values: np.ndarray) -> None:
        self.mem = np.ascontiguousarray(values)


class FakeEvent:
    def __init__(self, fn) -> None:
        self.fn = fn

    def run(self) -> None:
        if self.fn is not None:
            self.fn()
            self.fn = None


class FakeBackend(frameworks.DeviceBackend):
    """Copies run only when someone synchronises on / waits for their event (like a stream)."""

    name = "fake"

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.allocs = 0
        self.streams = 0

    def matches(self, obj: Any) -> bool:
        return isinstance(obj, FakeDeviceArray)

    def describe(self, a: FakeDeviceArray):
        return a.mem.dtype, a.mem.shape, True

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        self.allocs += 1
        buf = np.empty(nbytes, np.uint8)
        buf[:] = 0xFF  # NaN-ish garbage: packing before the copy finished would be visible
        return buf

    def new_stream(self, a: Any) -> Any:
        self.streams += 1
        return "side"

    def copy_to_host(self, a, host, stream):
        self.log.append("d2h-queued")
        snapshot = a.mem.reshape(-1).copy()  # what the device holds when the copy is queued

        def run():
            self.log.append("d2h")
            host[...] = snapshot

        return FakeEvent(run)

    def copy_to_device(self, host, a, stream):
        self.log.append("h2d-queued")

        def run():
            self.log.append("h2d")
            a.mem.reshape(-1)[...] = host

        return FakeEvent(run)

    def synchronize(self, event: FakeEvent) -> None:
        event.run()

    def wait_on_current(self, a, event: FakeEvent) -> None:
        self.log.append("wait")
        event.run()


@pytest.fixture
def fake_backend():
    b = FakeBackend()
    frameworks.register_backend(b)
    yield b
    frameworks.unregister_backend(b)


def test_device_staging_through_pinned_buffers(reducers, fake_backend):
    servers = reducers(2)
    addrs = addresses(servers)
    backends = [fake_backend, FakeBackend()]  # one "GPU" per worker
    frameworks.register_backend(backends[1])
    backends[1].matches = lambda obj: isinstance(obj, FakeDeviceArray) and getattr(obj, "rank", 0) == 1
    fake_backend.matches = lambda obj: isinstance(obj, FakeDeviceArray) and getattr(obj, "rank", 0) == 0

    def step(c, r, k):
        devs = []
        for i in range(6):
            d = FakeDeviceArray(np.full((i + 1, 2), float(r + k + i), np.float32 if i % 3 else np.float64))
            d.rank = r
            devs.append(d)
        host = np.full(4, float(r + 1), np.float32)  # host and device arrays share fused buffers
        hs = [c.allreduce_async(d, name=f"d{i}") for i, d in enumerate(devs)]
        hs.append(c.allreduce_async(host))
        c.synchronize()
        return devs, host

    def work(r):
        with comm(addrs, r, 2, "dev", fusion_threshold=1 << 20) as c:
            out = [step(c, r, k) for k in range(3)]
        return out

    try:
        res = ok(run_workers(2, work))
    finally:
        frameworks.unregister_backend(backends[1])
    for k in range(3):
        devs, host = res[0][k]
        for i, d in enumerate(devs):
            assert (d.mem == float(2 * k + 2 * i + 1)).all(), (k, i, d.mem)
        assert (host == 3).all()
    for b in backends:
        # every copy ran, in order: d2h before the data was read, h2d before the caller got it back
        assert b.log.count("d2h") == b.log.count("h2d") == b.log.count("wait") == 18
        assert b.log.index("d2h") < b.log.index("h2d-queued") < b.log.index("h2d") <= b.log.index("wait") + 1
        assert b.allocs == 6  # pinned buffers are allocated in the first step, reused afterwards
        assert b.streams == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_torch_cuda_tensors(reducers):  # pragma: no cover - not run where this was written
    servers = reducers(1)
    addrs = addresses(servers)

    def work(r):
        ts = [torch.full((1000 + i,), float(r + 1), device="cuda") for i in range(10)]
        ts.append(torch.full((3,), float(r + 1), device="cuda", dtype=torch.bfloat16))
        with comm(addrs, r, 2, "cuda") as c:
            for t in ts:
                c.allreduce_async(t)
            c.synchronize()
        torch.cuda.synchronize()
        return [t.cpu() for t in ts]

    for ts in ok(run_workers(2, work)):
        assert all(bool((t == 3).all()) for t in ts)
