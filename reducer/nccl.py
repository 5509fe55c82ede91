"""An NCCL-style shim: code written against CuPy's ``cupy.cuda.nccl`` can all-reduce through the reducers.

    from reducer import nccl
    comm = nccl.NcclCommunicator()              # reducer.init() discovery, or NcclCommunicator(reducer_comm)
    nccl.groupStart()
    for g in grads:                             # many small all-reduces ...
        comm.allReduce(g.data.ptr, g.data.ptr, g.size, nccl.ncclFloat32, nccl.ncclSum, stream.ptr)
    nccl.groupEnd()                             # ... sent as a few fused buffers

``allReduce(sendbuf, recvbuf, count, datatype, op, stream)`` takes pointers (ints) and NCCL's
own enum values. Host pointers are used in place (that is how it is tested without a GPU);
device pointers are recognised with ``cudaPointerGetAttributes`` (through CuPy) and staged
through pinned host memory (reducer.frameworks). Calls between ``groupStart()`` and
``groupEnd()`` are collected and submitted together at ``groupEnd()``, through the
communicator's tensor fusion: N small all-reduces become a few fused rounds.

Differences from NCCL: the all-reduce is complete when allReduce / groupEnd returns (host
memory), or ordered on ``stream`` by an event (device memory, also blocking the host until the
reducers answered); ncclProd and 8-bit / unsigned dtypes are not supported by the reducers
(ConfigError).

Hierarchical mode (nodes with several GPUs): ``NcclCommunicator(hierarchical=h)`` with
``h = HierarchicalAllreduce(...)``: reduce-scatter inside the node over a torch.distributed
group (NCCL on GPUs, gloo on CPUs), each local rank all-reduces its slice through the
reducers (one reducer group per local rank, world size = number of nodes), then all-gather
inside the node. Each node then sends its data to the reducers once in total (1/L per GPU)
instead of once per GPU.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import config
from .cluster import discover_worker
from .communicator import Communicator as ReducerCommunicator
from .communicator import init
from .dtypes import numpy_as_tensor, numpy_dtype
from .errors import ConfigError, ReductionError
from .frameworks import check_contiguous_tensor, is_device_array

# NCCL's numbering (nccl.h, ncclDataType_t / ncclRedOp_t).
ncclInt8 = ncclChar = 0
ncclUint8 = 1
ncclInt32 = ncclInt = 2
ncclUint32 = 3
ncclInt64 = 4
ncclUint64 = 5
ncclFloat16 = ncclHalf = 6
ncclFloat32 = ncclFloat = 7
ncclFloat64 = ncclDouble = 8
ncclBfloat16 = 9

ncclSum = 0
ncclProd = 1
ncclMax = 2
ncclMin = 3
ncclAvg = 4

_DTYPES = {
    ncclInt32: "int32",
    ncclInt64: "int64",
    ncclFloat16: "float16",
    ncclFloat32: "float32",
    ncclFloat64: "float64",
    ncclBfloat16: "bfloat16",
}
_DTYPE_NAMES = {
    0: "ncclInt8",
    1: "ncclUint8",
    2: "ncclInt32",
    3: "ncclUint32",
    4: "ncclInt64",
    5: "ncclUint64",
    6: "ncclFloat16",
    7: "ncclFloat32",
    8: "ncclFloat64",
    9: "ncclBfloat16",
}
_OPS = {ncclSum: "sum", ncclMax: "max", ncclMin: "min", ncclAvg: "avg"}
_OP_NAMES = {0: "ncclSum", 1: "ncclProd", 2: "ncclMax", 3: "ncclMin", 4: "ncclAvg"}

__all__ = ["NcclCommunicator", "Communicator", "HierarchicalAllreduce", "groupStart", "groupEnd", "hierarchical"] + [
    n for n in list(globals()) if n.startswith("nccl")
]


def dtype_of(datatype: int) -> str:
    """Wire dtype name for an NCCL datatype enum."""
    try:
        return _DTYPES[int(datatype)]
    except KeyError:
        name = _DTYPE_NAMES.get(int(datatype), str(datatype))
        raise ConfigError(
            f"datatype {name} is not supported by the reducers; supported: "
            + ", ".join(_DTYPE_NAMES[k] for k in sorted(_DTYPES))
        ) from None


def op_of(op: int) -> str:
    """Reducer op name for an NCCL reduction enum."""
    try:
        return _OPS[int(op)]
    except KeyError:
        name = _OP_NAMES.get(int(op), str(op))
        raise ConfigError(
            f"reduction {name} is not supported by the reducers (ncclSum, ncclAvg, ncclMin, ncclMax)"
        ) from None


# ====================================================================== groups
_group = threading.local()


def _group_state() -> tuple[int, list[tuple[NcclCommunicator, tuple]]]:
    if not hasattr(_group, "depth"):
        _group.depth = 0
        _group.calls = []
    return _group.depth, _group.calls


def groupStart() -> None:
    """Start collecting all-reduces (of this thread) until the matching groupEnd()."""
    _group_state()
    _group.depth += 1


def groupEnd() -> None:
    """Submit every all-reduce collected since groupStart() together (fused) and wait for them."""
    depth, calls = _group_state()
    if depth <= 0:
        raise ConfigError("groupEnd() without groupStart()")
    _group.depth = depth - 1
    if _group.depth:
        return
    _group.calls = []
    by_comm: dict[int, tuple[NcclCommunicator, list[tuple]]] = {}
    for comm, call in calls:
        by_comm.setdefault(id(comm), (comm, []))[1].append(call)
    first_error: BaseException | None = None
    for comm, lst in by_comm.values():
        try:
            comm._run(lst)
        except BaseException as exc:  # finish every communicator's group, then raise
            if first_error is None:
                first_error = exc
    if first_error is not None:
        raise first_error


# ====================================================================== pointers
_cupy_mod: Any = False  # False: not looked up yet


def _cupy() -> Any:
    global _cupy_mod
    if _cupy_mod is False:
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
            _cupy_mod = cupy
        except Exception:  # no CuPy, or no GPU / driver
            _cupy_mod = None
    return _cupy_mod


def is_device_pointer(ptr: int) -> bool:
    """True if `ptr` is CUDA device (or managed) memory; always False without CuPy and a GPU."""
    cupy = _cupy()
    if cupy is None or not ptr:
        return False
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
    except Exception:  # plain host memory on older CUDA raises
        return False
    return int(getattr(attrs, "type", 0)) in (2, 3)  # cudaMemoryTypeDevice, cudaMemoryTypeManaged


def _host_array(ptr: int, count: int, dtype: np.dtype) -> np.ndarray:
    if count == 0:
        return np.empty(0, dtype)
    if not ptr:
        raise ConfigError("null buffer pointer")
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(int(ptr))
    return np.frombuffer(memoryview(raw), dtype=dtype, count=count)


def _device_array(ptr: int, count: int, dtype: np.dtype) -> Any:
    cupy = _cupy()
    mem = cupy.cuda.UnownedMemory(int(ptr), count * dtype.itemsize, None)
    return cupy.ndarray((count,), dtype, cupy.cuda.MemoryPointer(mem, 0))


def _as_array(buf: Any, count: int, dtype: np.dtype) -> Any:
    """A pointer (int) as an array of `count` elements; array-likes are used as they are."""
    if isinstance(buf, (int, np.integer)):
        ptr = int(buf)
        return _device_array(ptr, count, dtype) if is_device_pointer(ptr) else _host_array(ptr, count, dtype)
    return buf


class _StreamContext:
    """`with` the caller's CUDA stream as CuPy's current stream (a no-op for host memory / stream 0)."""

    def __init__(self, stream: Any, device: bool) -> None:
        self._cm = None
        if device and stream:
            cupy = _cupy()
            ptr = stream if isinstance(stream, int) else getattr(stream, "ptr", stream)
            self._cm = cupy.cuda.ExternalStream(int(ptr))

    def __enter__(self) -> None:
        if self._cm is not None:
            self._cm.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._cm is not None:
            self._cm.__exit__(*exc)


# ====================================================================== communicator
class NcclCommunicator:
    """NCCL-style all-reduce through the reducers (see the module docstring).

    comm: a reducer.Communicator (default: reducer.init(**init_kwargs)); hierarchical: a
    HierarchicalAllreduce to go through the node's local group first.
    """

    def __init__(
        self, comm: Any = None, *, hierarchical: HierarchicalAllreduce | None = None, **init_kwargs: Any
    ) -> None:
        if comm is None and hierarchical is not None:
            comm = hierarchical.comm
        if comm is None:
            comm = init(**init_kwargs)
        elif init_kwargs:
            raise ConfigError(f"unexpected arguments with an explicit communicator: {', '.join(init_kwargs)}")
        self.comm = comm
        self.hierarchical = hierarchical

    # CuPy's NcclCommunicator API
    def rank_id(self) -> int:
        h = self.hierarchical
        return h.global_rank if h is not None else self.comm.rank

    def size(self) -> int:
        h = self.hierarchical
        return h.global_size if h is not None else self.comm.world_size

    def device_id(self) -> int:
        return -1

    def destroy(self) -> None:
        self.comm.close()

    abort = destroy

    def allReduce(self, sendbuf: Any, recvbuf: Any, count: int, datatype: int, op: int, stream: Any = 0) -> None:
        """recvbuf = reduction of every worker's sendbuf (`count` elements); in place if they are equal."""
        call = (sendbuf, recvbuf, int(count), dtype_of(datatype), op_of(op), stream)
        depth, calls = _group_state()
        if depth > 0:
            calls.append((self, call))
        else:
            self._run([call])

    # -- internal ----------------------------------------------------------------------
    def _prepare(self, call: tuple) -> tuple[Any, str, Any, bool]:
        sendbuf, recvbuf, count, dtype, op, stream = call
        dt = numpy_dtype(dtype)
        recv = _as_array(recvbuf, count, dt)
        device = not isinstance(recv, np.ndarray) and _is_device(recv)
        same = sendbuf is recvbuf or (
            isinstance(sendbuf, (int, np.integer))
            and isinstance(recvbuf, (int, np.integer))
            and int(sendbuf) == int(recvbuf)
        )
        if not same:
            send = _as_array(sendbuf, count, dt)
            with _StreamContext(stream, device):
                if isinstance(recv, np.ndarray) and isinstance(send, np.ndarray):
                    np.copyto(recv, send)
                else:
                    recv[...] = send  # device copy on the caller's stream
        return recv, op, stream, device

    def _run(self, calls: Sequence[tuple]) -> None:
        items = [self._prepare(c) for c in calls]
        if self.hierarchical is not None:
            self.hierarchical._run_arrays([(a, op) for a, op, _, _ in items])
            return
        handles = []
        for arr, op, stream, device in items:
            with _StreamContext(stream, device):
                handles.append(self.comm.allreduce_async(arr, op=op))
        if not handles:
            return
        errors: list[BaseException] = []
        for (_arr, _op, stream, device), h in zip(reversed(items), reversed(handles)):  # last first: one flush
            with _StreamContext(stream, device):
                try:
                    h.wait()
                except ReductionError as exc:
                    errors.append(exc)
        if errors:
            raise errors[-1]


Communicator = NcclCommunicator  # the short name; CuPy calls it NcclCommunicator


def _is_device(arr: Any) -> bool:
    return is_device_array(arr)


# ====================================================================== hierarchical
class HierarchicalAllreduce:
    """All-reduce for nodes with several processes (GPUs) each.

    local_group: a torch.distributed ProcessGroup of the processes of this node (NCCL for CUDA
    tensors, gloo for CPU tensors); comm: a reducer.Communicator joining the local rank's
    reducer group (rank = node rank, world size = number of nodes; see hierarchical()).
    For a tensor of n elements: reduce-scatter inside the node (each local rank gets a
    slice of n/L elements summed over the node), all-reduce that slice through the reducers,
    all-gather the slices inside the node.
    """

    def __init__(self, comm: Any, local_group: Any, local_rank: int, local_size: int) -> None:
        import torch  # noqa: F401  (hierarchical mode needs torch.distributed)

        self.comm = comm
        self.local_group = local_group
        self.local_rank = int(local_rank)
        self.local_size = int(local_size)
        self.node_rank = comm.rank
        self.num_nodes = comm.world_size
        self.global_rank = self.node_rank * self.local_size + self.local_rank
        self.global_size = self.num_nodes * self.local_size

    def allreduce(self, tensor: Any, op: str = "sum") -> Any:
        """Reduce a torch tensor in place over every process of every node; returns it."""
        self.allreduce_coalesced([tensor], op)
        return tensor

    def allreduce_coalesced(self, tensors: Sequence[Any], op: str = "sum") -> list[Any]:
        """Reduce several tensors of one dtype in place, as one flat buffer."""
        self._run_arrays([(t, op) for t in tensors])
        return list(tensors)

    def _run_arrays(self, items: Sequence[tuple[Any, str]]) -> None:
        import torch

        groups: dict[tuple[Any, str, Any], list[Any]] = {}
        for arr, op in items:
            t = arr if isinstance(arr, torch.Tensor) else _to_torch(arr)
            check_contiguous_tensor(t)
            groups.setdefault((t.dtype, op, t.device), []).append(t)
        for (dtype, op, device), ts in groups.items():
            self._reduce_flat(ts, dtype, op, device)

    def _reduce_flat(self, tensors: list[Any], dtype: Any, op: str, device: Any) -> None:
        import torch
        import torch.distributed as dist

        L = self.local_size
        if op == "avg" and not dtype.is_floating_point:
            raise ConfigError("avg of integer tensors is not supported in hierarchical mode")
        n = sum(t.numel() for t in tensors)
        if n == 0:
            return
        per = -(-n // L)
        if len(tensors) == 1 and n == per * L:
            flat = tensors[0].view(-1)  # in place, no copy
            copy_back = False
        else:
            flat = torch.zeros(per * L, dtype=dtype, device=device)
            off = 0
            for t in tensors:
                flat[off : off + t.numel()].copy_(t.view(-1))
                off += t.numel()
            copy_back = True
        slices = list(flat.split(per))
        mine = torch.empty(per, dtype=dtype, device=device)
        local_op = {
            "sum": dist.ReduceOp.SUM,
            "avg": dist.ReduceOp.SUM,
            "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX,
        }[op]
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = local_op  # type: ignore[assignment]  # the binding takes a RedOpType for its ReduceOp
        self.local_group.reduce_scatter([mine], [slices], opts).wait()
        self.comm.allreduce_async(mine, op=op).wait()  # avg: divides by the number of nodes
        if op == "avg":
            mine.div_(L)
        self.local_group.allgather([slices], [mine]).wait()
        if copy_back:
            off = 0
            for t in tensors:
                t.view(-1).copy_(flat[off : off + t.numel()])
                off += t.numel()


def _to_torch(arr: Any) -> Any:
    import torch

    if isinstance(arr, np.ndarray):
        return numpy_as_tensor(arr)
    return torch.from_dlpack(arr)


def hierarchical(
    local_group: Any,
    *,
    local_rank: int | None = None,
    local_size: int | None = None,
    node_rank: int | None = None,
    num_nodes: int | None = None,
    reducers: Any = None,
    group: str | None = None,
    **comm_kwargs: Any,
) -> HierarchicalAllreduce:
    """Build a HierarchicalAllreduce: connects this local rank to reducer group "<group>.local<k>".

    Missing values come from cluster discovery (reducer.cluster: CLUSTER_SPEC / TF_CONFIG /
    RS_*, LOCAL_RANK / LOCAL_WORLD_SIZE).
    """
    if None in (local_rank, local_size, node_rank, num_nodes) or reducers is None:
        info = discover_worker(reducers=reducers, local_rank=local_rank, local_world_size=local_size)
        reducers = info.reducers if reducers is None else reducers
        local_rank = info.local_rank if local_rank is None else local_rank
        local_size = info.local_world_size if local_size is None else local_size
        node_rank = info.node_rank if node_rank is None else node_rank
        num_nodes = info.num_nodes if num_nodes is None else num_nodes
        comm_kwargs.setdefault("job_id", info.job_id)
    assert local_rank is not None and local_size is not None and node_rank is not None and num_nodes is not None
    base = config.get("group", group)
    comm = ReducerCommunicator(
        reducers, int(node_rank), int(num_nodes), group=f"{base}.local{int(local_rank)}", **comm_kwargs
    )
    return HierarchicalAllreduce(comm, local_group, int(local_rank), int(local_size))
