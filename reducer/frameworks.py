"""Arrays from every framework as host memory the transport can use.

* numpy arrays, torch CPU tensors, CPU DLPack objects and buffers: used in place (zero copy).
* torch CUDA tensors and CuPy arrays: staged through pinned host buffers. The copy to the host
  is queued on a side stream at submission (after the work already queued on the caller's
  current stream), the copy back is queued on the same side stream when the result arrives,
  and ``Handle.wait`` makes the caller's current stream wait for it. So device copies of some
  tensors overlap the network rounds of others.

Everything except the device copies themselves is shared with the CPU path: a device backend
(:class:`DeviceBackend`) only says how to allocate pinned memory, copy, and record and wait for
events; :class:`DeviceStaged` and the pinned buffer pool are plain Python used for every device.
Neither torch nor CuPy is imported here unless the caller's object comes from it.

The GPU backends were written against the torch and CuPy stream APIs but have NOT been run on
a GPU (there is none where this was developed); the generic staging logic is tested on the CPU
with a fake device backend (tests/client/test_frameworks.py).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

from .dtypes import numpy_as_tensor, tensor_as_numpy, torch_numpy_dtype, wire_name
from .errors import ConfigError

__all__ = [
    "Staged",
    "DeviceStaged",
    "DeviceBackend",
    "PinnedPool",
    "stage",
    "host_array",
    "register_backend",
    "is_device_array",
]

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


class Staged:
    """Host memory holding one array's data for the all-reduce.

    host: writable, C-contiguous numpy array (the caller's own memory for host arrays);
    shape: the caller's shape. The hooks run in this order: before_read (fusion thread, before
    the data is sent), after_write (fusion thread, once the result is in `host`),
    finish (the waiting thread, in Handle.wait / synchronize). release() gives resources back
    when the all-reduce failed.
    """

    __slots__ = ("array", "host", "shape")

    def __init__(self, array: Any, host: np.ndarray, shape: tuple[int, ...] | None = None) -> None:
        self.array = array
        self.host = host
        self.shape = tuple(int(d) for d in host.shape) if shape is None else shape

    def before_read(self) -> None:
        pass

    def after_write(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def release(self) -> None:
        pass


# ====================================================================== host arrays
def check_contiguous_tensor(t: Any) -> None:
    """ConfigError unless the torch tensor `t` is contiguous (it is reduced in place)."""
    if not t.is_contiguous():
        raise ConfigError("tensor must be contiguous (call .contiguous() and copy the result back)")


def _torch_cpu_numpy(t: Any) -> np.ndarray:
    check_contiguous_tensor(t)
    try:
        return tensor_as_numpy(t)
    except (TypeError, RuntimeError) as exc:
        raise ConfigError(f"cannot all-reduce a torch tensor of dtype {t.dtype}: {exc}") from None


def _dlpack_device(obj: Any) -> int | None:
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None or not hasattr(obj, "__dlpack__"):
        return None
    dev = fn()
    return int(dev[0])


def host_array(obj: Any) -> np.ndarray | None:
    """A zero-copy numpy view of `obj` if its memory is on the host; None for device arrays.

    Accepts numpy arrays, torch CPU tensors, objects with __dlpack__ on the CPU and anything with
    the buffer protocol; raises ConfigError for anything else.
    """
    if isinstance(obj, np.ndarray):
        return obj
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            return None
        return _torch_cpu_numpy(obj)
    if _find_backend(obj) is not None:
        return None
    dev = _dlpack_device(obj)
    if dev is not None:
        if dev in (_DL_CPU, _DL_CUDA_HOST):
            try:
                return np.from_dlpack(obj)
            except (TypeError, BufferError, RuntimeError) as exc:
                raise ConfigError(f"cannot read {type(obj).__name__} through DLPack: {exc}") from None
        return None
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        raise ConfigError(
            f"cannot all-reduce an object of type {type(obj).__name__}: pass a numpy array, a torch tensor, a "
            "CuPy array, an object with __dlpack__, or a buffer"
        ) from None


def check_host(arr: np.ndarray) -> np.ndarray:
    """`arr` if the all-reduce can use it in place (C-contiguous, writable, a wire dtype), else ConfigError."""
    if not arr.flags.c_contiguous:
        raise ConfigError("array must be C-contiguous (use np.ascontiguousarray and copy the result back)")
    if not arr.flags.writeable:
        raise ConfigError("array is read-only: the all-reduce writes the result in place")
    wire_name(arr.dtype)
    return arr


def is_device_array(obj: Any) -> bool:
    """True for torch CUDA tensors, CuPy arrays and DLPack objects in device memory."""
    if isinstance(obj, np.ndarray):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.device.type != "cpu"
    if _find_backend(obj) is not None:
        return True
    dev = _dlpack_device(obj)
    return dev is not None and dev not in (_DL_CPU, _DL_CUDA_HOST)


def stage(obj: Any) -> Staged:
    """Host memory for `obj`: in place for host arrays, a pinned staging buffer for device arrays."""
    host = host_array(obj)
    if host is not None:
        return Staged(obj, check_host(host))
    backend = _find_backend(obj)
    if backend is None and _dlpack_device(obj) in (_DL_CUDA, _DL_CUDA_MANAGED):
        obj, backend = _from_cuda_dlpack(obj)
    if backend is None:
        raise ConfigError(
            f"cannot all-reduce a {type(obj).__name__} on this device: no backend for it "
            "(torch CUDA tensors and CuPy arrays are supported)"
        )
    return DeviceStaged(obj, backend)


# ====================================================================== device staging
class PinnedPool:
    """Page-locked host buffers reused across steps, keyed by size (rounded up to 4 KiB).

    A buffer comes back with the event of the last copy that reads it; it is reused only after
    that event has completed, so the next D2H copy never overwrites data still being copied.
    """

    def __init__(self, backend: DeviceBackend) -> None:
        self._backend = backend
        self._free: dict[int, list[tuple[np.ndarray, Any]]] = {}
        self._lock = threading.Lock()
        self.allocated = 0

    @staticmethod
    def _size(nbytes: int) -> int:
        return max(4096, (nbytes + 4095) // 4096 * 4096)

    def take(self, nbytes: int) -> np.ndarray:
        size = self._size(nbytes)
        with self._lock:
            lst = self._free.get(size)
            item = lst.pop() if lst else None
        if item is None:
            self.allocated += size
            return self._backend.alloc_pinned(size)
        buf, event = item
        if event is not None:
            self._backend.synchronize(event)
        return buf

    def give(self, buf: np.ndarray, event: Any) -> None:
        with self._lock:
            self._free.setdefault(int(buf.nbytes), []).append((buf, event))


class DeviceBackend:
    """The device-specific part of staging: pinned memory, async copies, events. Subclass per framework."""

    name = "device"

    def __init__(self) -> None:
        self.pool = PinnedPool(self)
        self._streams: dict[Any, Any] = {}
        self._lock = threading.Lock()

    # -- what a framework implements -------------------------------------------------------
    @staticmethod
    def matches(obj: Any) -> bool:
        raise NotImplementedError

    def describe(self, obj: Any) -> tuple[np.dtype, tuple[int, ...], bool]:
        """(numpy dtype, shape, is contiguous) of a device array."""
        raise NotImplementedError

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        raise NotImplementedError

    def device_key(self, obj: Any) -> Any:
        return None

    def new_stream(self, obj: Any) -> Any:
        raise NotImplementedError

    def copy_to_host(self, obj: Any, host: np.ndarray, stream: Any) -> Any:
        """Queue device -> host on `stream` after the caller's current stream; return an event."""
        raise NotImplementedError

    def copy_to_device(self, host: np.ndarray, obj: Any, stream: Any) -> Any:
        """Queue host -> device on `stream`; return an event."""
        raise NotImplementedError

    def synchronize(self, event: Any) -> None:
        raise NotImplementedError

    def wait_on_current(self, obj: Any, event: Any) -> None:
        """Make the caller's current stream (on obj's device) wait for `event`."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------
    def side_stream(self, obj: Any) -> Any:
        key = self.device_key(obj)
        with self._lock:
            s = self._streams.get(key)
            if s is None:
                s = self._streams[key] = self.new_stream(obj)
            return s


class DeviceStaged(Staged):
    """A device array staged through a pinned host buffer (see the module docstring)."""

    __slots__ = ("backend", "_buf", "_stream", "_d2h", "_h2d")

    def __init__(self, obj: Any, backend: DeviceBackend) -> None:
        dtype, shape, contiguous = backend.describe(obj)
        if not contiguous:
            raise ConfigError("device array must be contiguous")
        wire_name(dtype)
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = numel * dtype.itemsize
        buf = backend.pool.take(nbytes)
        super().__init__(obj, buf[:nbytes].view(dtype), tuple(int(d) for d in shape))
        self.backend = backend
        self._buf: np.ndarray | None = buf
        self._stream = backend.side_stream(obj)
        self._d2h = backend.copy_to_host(obj, self.host, self._stream)
        self._h2d: Any = None

    def before_read(self) -> None:
        self.backend.synchronize(self._d2h)

    def after_write(self) -> None:
        self._h2d = self.backend.copy_to_device(self.host, self.array, self._stream)

    def finish(self) -> None:
        if self._h2d is not None:
            self.backend.wait_on_current(self.array, self._h2d)
        self.release()

    def release(self) -> None:
        buf, self._buf = self._buf, None
        if buf is not None:
            self.backend.pool.give(buf, self._h2d if self._h2d is not None else self._d2h)


# ---------------------------------------------------------------------- torch CUDA
class TorchCudaBackend(DeviceBackend):
    name = "torch.cuda"

    def __init__(self) -> None:
        super().__init__()
        import torch

        self.torch = torch

    @staticmethod
    def matches(obj: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(obj, torch.Tensor) and obj.device.type == "cuda"

    def describe(self, t: Any) -> tuple[np.dtype, tuple[int, ...], bool]:
        return torch_numpy_dtype(t.dtype), tuple(t.shape), bool(t.is_contiguous())

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True).numpy()

    def device_key(self, t: Any) -> Any:
        return t.device.index

    def new_stream(self, t: Any) -> Any:
        return self.torch.cuda.Stream(device=t.device)

    @staticmethod
    def _pair(t: Any, host: np.ndarray) -> tuple[Any, Any]:
        """The device tensor and the pinned host buffer as two flat tensors of one dtype."""
        return t.reshape(-1), numpy_as_tensor(host)

    def copy_to_host(self, t: Any, host: np.ndarray, stream: Any) -> Any:
        torch = self.torch
        dev, h = self._pair(t, host)
        stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(stream):
            h.copy_(dev, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        t.record_stream(stream)
        return ev

    def copy_to_device(self, host: np.ndarray, t: Any, stream: Any) -> Any:
        torch = self.torch
        dev, h = self._pair(t, host)
        with torch.cuda.stream(stream):
            dev.copy_(h, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        return ev

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def wait_on_current(self, t: Any, event: Any) -> None:
        self.torch.cuda.current_stream(t.device).wait_event(event)


# ---------------------------------------------------------------------- CuPy
class CupyBackend(DeviceBackend):
    name = "cupy"

    def __init__(self) -> None:
        super().__init__()
        import cupy

        self.cupy = cupy

    @staticmethod
    def matches(obj: Any) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and isinstance(obj, cupy.ndarray)

    def describe(self, a: Any) -> tuple[np.dtype, tuple[int, ...], bool]:
        return np.dtype(a.dtype), tuple(a.shape), bool(a.flags.c_contiguous)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cupy.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(mem, np.uint8, nbytes)

    def device_key(self, a: Any) -> Any:
        return a.device.id

    def new_stream(self, a: Any) -> Any:
        with a.device:
            return self.cupy.cuda.Stream(non_blocking=True)

    def copy_to_host(self, a: Any, host: np.ndarray, stream: Any) -> Any:
        with a.device:
            stream.wait_event(self.cupy.cuda.get_current_stream().record())
            try:
                a.reshape(-1).get(stream=stream, out=host, blocking=False)
            except TypeError:  # CuPy < 11: no `blocking` (the copy then waits for the side stream)
                a.reshape(-1).get(stream=stream, out=host)
            return stream.record()

    def copy_to_device(self, host: np.ndarray, a: Any, stream: Any) -> Any:
        with a.device:
            a.reshape(-1).set(host, stream=stream)
            return stream.record()

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def wait_on_current(self, a: Any, event: Any) -> None:
        with a.device:
            self.cupy.cuda.get_current_stream().wait_event(event)


# ---------------------------------------------------------------------- registry
_BACKEND_TYPES: list[tuple[str, type[DeviceBackend]]] = [("torch", TorchCudaBackend), ("cupy", CupyBackend)]
_BACKENDS: dict[str, DeviceBackend] = {}
_EXTRA: list[DeviceBackend] = []
_REG_LOCK = threading.Lock()


def register_backend(backend: DeviceBackend) -> None:
    """Add a device backend (e.g. another framework, or a fake device in tests); it is tried first."""
    with _REG_LOCK:
        _EXTRA.insert(0, backend)


def unregister_backend(backend: DeviceBackend) -> None:
    with _REG_LOCK:
        if backend in _EXTRA:
            _EXTRA.remove(backend)


def _find_backend(obj: Any) -> DeviceBackend | None:
    for extra in list(_EXTRA):
        if extra.matches(obj):
            return extra
    for module, cls in _BACKEND_TYPES:
        if module not in sys.modules:  # import-guarded: only frameworks the caller already uses
            continue
        if not cls.matches(obj):
            continue
        with _REG_LOCK:
            b = _BACKENDS.get(module)
            if b is None:
                b = _BACKENDS[module] = cls()
        return b
    return None


def _from_cuda_dlpack(obj: Any) -> tuple[Any, DeviceBackend | None]:
    """A CUDA DLPack object as a CuPy array or torch tensor (whichever is installed)."""
    try:
        import cupy

        arr = cupy.from_dlpack(obj)
        return arr, _find_backend(arr)
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            arr = torch.from_dlpack(obj)
            return arr, _find_backend(arr)
    except ImportError:
        pass
    raise ConfigError(f"{type(obj).__name__} is in CUDA memory (DLPack): staging it needs CuPy, or torch with CUDA")
