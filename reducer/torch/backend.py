"""The torch.distributed backend "reduction_server".

    import reducer.torch  # noqa: F401   (registers the backend)
    dist.init_process_group("reduction_server")   # MASTER_ADDR/PORT, RANK, WORLD_SIZE as usual

Routing (docs/pytorch.md):
- through the reducers: all_reduce (sum, avg, min, max) and allreduce_coalesced, reduce,
  reduce_scatter (all variants: the reducers reduce the whole input, each rank keeps its slice),
  barrier (a one-element round, so it also waits for every earlier reduction of this group);
  the dtypes the reducers know (float32/64, float16, bfloat16, int32/64);
- through an internal gloo group built from the same store: broadcast, all_gather (all variants),
  gather, scatter, all_to_all_single, send/recv, and all_reduce/reduce/reduce_scatter of other ops
  (product, bitwise) or dtypes (bool, uint8, int8, ...);
- unsupported (a NotImplementedError naming the collective): all_to_all with tensor lists,
  coalescing managers, split/merge of groups.

Each process group gets its own group on the reducers, named ``<RS_GROUP>.torch.<id>`` where the id
is drawn by rank 0 and shared through the store, so several groups (and several runs against the
same reducers) never mix.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

import reducer

from .. import config
from ..dtypes import OPS, SUPPORTED, torch_dtype
from ..errors import ConfigError
from .hooks import close_completer, cpp_future, reduce_async

# torch.distributed has it at runtime, but its stubs do not re-export it
_AllgatherOptions = dist.distributed_c10d.AllgatherOptions

log = logging.getLogger(__name__)

BACKEND_NAME = "reduction_server"

__all__ = ["BACKEND_NAME", "ReductionServerProcessGroup", "register_backend"]

# dtypes and ops that travel to the reducers (the table of reducer/dtypes.py); others go through gloo.
_REDUCER_DTYPES = frozenset(torch_dtype(name) for name in SUPPORTED)
_REDUCER_OPS = tuple((getattr(dist.ReduceOp, name.upper()), name) for name in OPS)


def _op_name(reduce_op: Any) -> str | None:
    for red, name in _REDUCER_OPS:
        try:
            if reduce_op == red:
                return name
        except TypeError:  # PREMUL_SUM and other ops that do not compare with RedOpType
            return None
    return None


class _Work(dist.Work):
    """A collective's Work: wait() raises the reduction's own exception (a reducer.ReductionError
    subclass), get_future() is the Future C++ callers such as DDP's reducer wait on, which carries
    the error as a C++ error. (A Work made from the Future alone, with torch's
    _create_work_from_future, returns from wait() without raising: a failed all-reduce would pass
    silently, and DDP would crash reading the error as the result.)"""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut
        self._cpp = cpp_future(fut)

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()  # bounded: the communicator fails its rounds after RS_TIMEOUT
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> torch.futures.Future:
        return self._cpp


def _work(fut: torch.futures.Future) -> dist.Work:
    return _Work(fut)


def _done_work(value: Any) -> dist.Work:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return _work(fut)


def _unsupported(collective: str, hint: str = "") -> NotImplementedError:
    return NotImplementedError(
        f"the {BACKEND_NAME!r} backend does not support {collective}" + (f": {hint}" if hint else "")
    )


def _gloo_group(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> dist.ProcessGroup:
    """A gloo ProcessGroup on a PrefixStore of `store`, for the collectives the reducers do not do."""
    prefixed = dist.PrefixStore(f"{BACKEND_NAME}/gloo/", store)
    backend = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    pg = dist.ProcessGroup(prefixed, rank, size)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    for device in ("cpu", "cuda"):
        pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, backend)
    return pg


def _group_id(store: dist.Store, rank: int) -> str:
    key = f"{BACKEND_NAME}/group_id"
    if rank == 0:
        store.set(key, uuid.uuid4().hex[:12])
    return store.get(key).decode()


class ReductionServerProcessGroup(dist.ProcessGroup):
    """A torch.distributed ProcessGroup whose reductions go through the reducers.

    Created by ``dist.init_process_group("reduction_server")`` (or ``dist.new_group(backend=...)``);
    the reducers come from discovery (CLUSTER_SPEC, TF_CONFIG or RS_REDUCERS), the rank and size from
    torch. ``comm`` / ``init_kwargs`` are for direct construction (tests, custom setups): a
    Communicator passed as ``comm`` stays open when the group shuts down.
    """

    # The collectives below are the backend API that torch calls as (tensors, opts), the form
    # ProcessGroupGloo implements; torch's stub of ProcessGroup declares the public overloads
    # instead, hence the `type: ignore[override]` (and [assignment] on the aliases).

    def __init__(
        self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta, comm: Any = None, **init_kwargs: Any
    ) -> None:
        # the binding's (rank, size) form; torch's stub lists only (store, rank, size)
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._rank = int(rank)
        self._size = int(size)
        self._fallback = _gloo_group(store, rank, size, timeout)
        self._owns_comm = comm is None  # shutdown() closes only a connection made here
        if comm is None:
            group = f"{config.get('group', init_kwargs.pop('group', None))}.torch.{_group_id(store, rank)}"
            try:
                comm = reducer.init(rank=rank, world_size=size, group=group, **init_kwargs)
            except ConfigError as exc:
                raise ConfigError(
                    f"the {BACKEND_NAME!r} torch.distributed backend cannot find the reducers: {exc}"
                ) from None
        elif init_kwargs:
            raise TypeError(f"unexpected arguments with comm=: {', '.join(sorted(init_kwargs))}")
        self._comm = comm
        log.info("%s process group: rank %d of %d, %r", BACKEND_NAME, rank, size, comm)

    # -- identity ----------------------------------------------------------------------------
    @property
    def communicator(self) -> Any:
        """The reducer.Communicator this group reduces through."""
        return self._comm

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"ReductionServerProcessGroup(rank={self._rank}, size={self._size}, {self._comm!r})"

    # -- routing helpers ---------------------------------------------------------------------
    def _op_for(self, collective: str, tensors: Sequence[torch.Tensor], reduce_op: Any) -> str | None:
        """The reducer op name if these tensors can go through the reducers, else None (use gloo)."""
        op = _op_name(reduce_op)
        if op is not None and all(t.dtype in _REDUCER_DTYPES for t in tensors):
            return op
        if op == "avg":
            bad = sorted({str(t.dtype) for t in tensors if t.dtype not in _REDUCER_DTYPES})
            raise _unsupported(
                f"{collective} with ReduceOp.AVG on {', '.join(bad)}",
                f"the reducers average {', '.join(sorted(str(d) for d in _REDUCER_DTYPES))}",
            )
        return None

    def _reduce(
        self,
        tensors: Sequence[torch.Tensor],
        op: str,
        name: str,
        after: Callable[[], None] | None = None,
        result: Any = None,
    ) -> torch.futures.Future:
        """All-reduce `tensors` through the reducers (copies for non-contiguous ones), then after()."""
        targets: list[torch.Tensor] = []
        copies: list[tuple] = []
        for t in tensors:
            if t.is_contiguous():
                targets.append(t)
            else:
                c = t.contiguous()
                targets.append(c)
                copies.append((t, c))
        value = list(tensors) if result is None else result

        def finish() -> Any:
            for dst, src in copies:
                dst.copy_(src)
            if after is not None:
                after()
            return value

        return reduce_async(self._comm, targets, op, finish, name=name)

    # -- all-reduce --------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        opts = dist.AllreduceOptions() if opts is None else opts
        op = self._op_for("all_reduce", tensors, opts.reduceOp)
        if op is None:
            return self._fallback.allreduce(tensors, opts)
        return _work(self._reduce(tensors, op, "all_reduce"))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = dist.AllreduceCoalescedOptions() if opts is None else opts
        op = self._op_for("allreduce_coalesced", tensors, opts.reduceOp)
        if op is None:
            return self._fallback.allreduce_coalesced(tensors, opts)
        return _work(self._reduce(tensors, op, "allreduce_coalesced"))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        opts = dist.ReduceOptions() if opts is None else opts
        op = self._op_for("reduce", tensors, opts.reduceOp)
        if op is None:
            return self._fallback.reduce(tensors, opts)
        if opts.rootRank == self._rank:
            return _work(self._reduce(tensors, op, "reduce"))
        # Other ranks contribute without having their tensors overwritten.
        return _work(
            self._reduce(
                [t.clone(memory_format=torch.contiguous_format) for t in tensors], op, "reduce", result=list(tensors)
            )
        )

    def barrier(self, opts: Any = None) -> dist.Work:
        token = torch.zeros(1, dtype=torch.int32)
        return _work(self._reduce([token], "sum", "barrier", result=[token]))

    # -- reduce-scatter: the reducers reduce the whole input, each rank keeps its slice --------
    def reduce_scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> dist.Work:
        opts = dist.ReduceScatterOptions() if opts is None else opts
        flat_inputs = [t for lst in input_lists for t in lst]
        op = self._op_for("reduce_scatter", flat_inputs + list(outputs), opts.reduceOp)
        if op is None:
            return self._fallback.reduce_scatter(outputs, input_lists, opts)
        if len(outputs) != len(input_lists) or any(len(lst) != self._size for lst in input_lists):
            raise ValueError(f"reduce_scatter needs one list of {self._size} input tensors per output tensor")
        fulls = [torch.cat([t.reshape(-1) for t in lst]) for lst in input_lists]
        offsets = [sum(t.numel() for t in lst[: self._rank]) for lst in input_lists]

        def scatter() -> None:
            for out, full, off in zip(outputs, fulls, offsets):
                out.copy_(full[off : off + out.numel()].view(out.shape))

        return _work(self._reduce(fulls, op, "reduce_scatter", after=scatter, result=list(outputs)))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    reduce_scatter_single = _reduce_scatter_base  # type: ignore[assignment]

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        opts = dist.ReduceScatterOptions() if opts is None else opts
        op = self._op_for("reduce_scatter_tensor", list(inputs) + list(outputs), opts.reduceOp)
        if op is None:
            if len(outputs) != 1:
                raise _unsupported(
                    f"reduce_scatter_tensor_coalesced of {outputs[0].dtype} tensors", "reduce them one at a time"
                )
            return self._fallback._reduce_scatter_base(outputs[0], inputs[0], opts)
        for out, inp in zip(outputs, inputs):
            if inp.numel() != out.numel() * self._size:
                raise ValueError(
                    f"reduce_scatter_tensor: input has {inp.numel()} elements, expected "
                    f"{self._size} x {out.numel()} (world size x output)"
                )
        fulls = [inp.reshape(-1).clone() for inp in inputs]

        def scatter() -> None:
            for out, full in zip(outputs, fulls):
                n = out.numel()
                out.copy_(full[self._rank * n : (self._rank + 1) * n].view(out.shape))

        return _work(self._reduce(fulls, op, "reduce_scatter_tensor", after=scatter, result=list(outputs)))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # type: ignore[assignment]

    # -- through gloo --------------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        return self._fallback.broadcast(tensors, dist.BroadcastOptions() if opts is None else opts)

    def allgather(  # type: ignore[override]
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: Any = None,
    ) -> dist.Work:
        return self._fallback.allgather(output_lists, inputs, _AllgatherOptions() if opts is None else opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._fallback._allgather_base(output, input, _AllgatherOptions() if opts is None else opts)

    all_gather_single = _allgather_base

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        return self._fallback.allgather_coalesced(output_lists, inputs, _AllgatherOptions() if opts is None else opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        return self._fallback.allgather_into_tensor_coalesced(
            outputs, inputs, _AllgatherOptions() if opts is None else opts
        )

    all_gather_single_coalesced = allgather_into_tensor_coalesced  # type: ignore[assignment]

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        return self._fallback.gather(output_lists, inputs, dist.GatherOptions() if opts is None else opts)

    def scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> dist.Work:
        return self._fallback.scatter(outputs, input_lists, dist.ScatterOptions() if opts is None else opts)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> dist.Work:
        return self._fallback.alltoall_base(
            output, input, output_split_sizes, input_split_sizes, dist.AllToAllOptions() if opts is None else opts
        )

    all_to_all_single = alltoall_base  # type: ignore[assignment]

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        return self._fallback.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        return self._fallback.recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        return self._fallback.recv_anysource(tensors, tag)

    # -- unsupported -----------------------------------------------------------------------------
    def alltoall(self, *args: Any, **kwargs: Any) -> dist.Work:
        raise _unsupported("all_to_all with tensor lists", "use dist.all_to_all_single")

    def start_coalescing(self, device: Any) -> None:
        raise _unsupported(
            "coalescing managers (_coalescing_manager / batched collectives)",
            "issue the collectives one by one, or use allreduce_coalesced",
        )

    def end_coalescing(self, device: Any) -> dist.Work:
        raise _unsupported("coalescing managers (_coalescing_manager / batched collectives)")

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    def split_group(self, *args: Any, **kwargs: Any) -> Any:
        raise _unsupported("split_group", "create sub-groups with dist.new_group(ranks, backend='reduction_server')")

    def merge_remote_group(self, *args: Any, **kwargs: Any) -> Any:
        raise _unsupported("merge_remote_group")

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> Any:
        raise _unsupported("monitored_barrier", "use dist.barrier()")

    # -- lifetime ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Close the connections to the reducers and the gloo group (dist.destroy_process_group). Idempotent.

        Every thread this group's communicator started has ended on return (docs/pytorch.md, "Shutdown")."""
        for what in ("_comm", "_fallback"):
            obj = getattr(self, what, None)
            if obj is None or (what == "_comm" and not getattr(self, "_owns_comm", False)):
                continue
            try:
                if what == "_comm":
                    obj.close()  # its threads end; rounds still in flight fail
                    close_completer(obj)  # the futures of those rounds complete, then its thread ends
                else:
                    obj.shutdown()
            except Exception:  # pragma: no cover - best effort at teardown
                log.debug("closing %s failed", what, exc_info=True)

    def abort(self) -> None:
        self.shutdown()


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> ReductionServerProcessGroup:
    return ReductionServerProcessGroup(store, rank, size, timeout)


def register_backend() -> None:
    """Register "reduction_server" with torch.distributed (done by ``import reducer.torch``)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
