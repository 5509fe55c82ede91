"""DDP communication hooks that all-reduce gradient buckets through the reducers.

    import reducer.torch as rst
    ddp = DDP(model, bucket_cap_mb=64)
    ddp.register_comm_hook(rst.HookState(), rst.allreduce_hook)

Semantics match torch's built-in hooks (torch.distributed.algorithms.ddp_comm_hooks.default_hooks):
the Future holds one tensor shaped like ``bucket.buffer()`` holding the mean over workers.
Each bucket is handed to ``Communicator.allreduce_async`` as soon as DDP has it (the compress
hooks start a compressed round of a float32 CPU bucket with ``Communicator.allreduce_raw_async``:
the transport converts it chunk by chunk), so the network work overlaps the rest of the backward
pass; one completion thread per communicator waits for the handles in submission order and
completes the futures in that order.
"""

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

import reducer
from reducer import config

from .. import lifetime
from ..errors import ReductionError
from ..lifetime import join_threads

log = logging.getLogger(__name__)

__all__ = ["HookState", "allreduce_hook", "bf16_compress_hook", "fp16_compress_hook"]


# -- futures completed in submission order -------------------------------------------------------


class _Completer:
    """One thread per communicator: waits for handles in FIFO order and completes futures.

    close() ends the thread (joined, bounded); one never closed is closed at interpreter exit
    (reducer.lifetime), after the communicators, whose closing fails the rounds it may wait for.
    Between items the thread holds nothing: no tensor of the last round is freed by it later.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pid = os.getpid()  # a forked child has not the thread (and maybe not the lock)
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        lifetime.close_at_exit(self, lifetime.HELPERS)

    def submit(self, handles: Sequence[Any], fut: torch.futures.Future, finish: Callable[[], Any]) -> None:
        with self._lock:
            if not self._closed:
                self._queue.put((handles, fut, finish))
                return
        self._complete(fut, None, ReductionError("the communicator was closed before this all-reduce started"))

    def close(self, timeout: float = lifetime.EXIT_JOIN_TIMEOUT) -> bool:
        """Complete the futures submitted so far, then end the thread; True once it has ended
        (False, with a WARNING, if it is still waiting for a round after `timeout` seconds)."""
        if os.getpid() != self._pid:
            return True  # a forked child's copy: the thread is the parent's
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        lifetime.forget(self)
        return join_threads([self._thread], timeout, "reducer.torch completion thread")

    def close_at_exit(self) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._process(*item)
            del item  # nothing of this round stays referenced while the thread waits for the next

    def _process(self, handles: Sequence[Any], fut: torch.futures.Future, finish: Callable[[], Any]) -> None:
        try:
            for handle in handles:
                handle.wait()  # bounded: the communicator fails its handles after RS_TIMEOUT
            value = finish()
        except Exception as exc:  # delivered to whoever waits on the future
            self._complete(fut, None, exc)
        else:
            self._complete(fut, value, None)

    @staticmethod
    def _complete(fut: torch.futures.Future, value: Any, error: BaseException | None) -> None:
        # Never let one future take the thread down: every later future would hang.
        try:
            if error is None:
                fut.set_result(value)
            else:
                fut.set_exception(error)
        except Exception as exc:
            log.error("completing a reducer.torch future failed: %s", exc)
            if not fut.done():
                try:
                    fut.set_exception(exc)
                except Exception:  # pragma: no cover - nothing more to do
                    pass


_completers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_completers_lock = threading.Lock()


def _completer(comm: Any) -> _Completer:
    with _completers_lock:
        completer = _completers.get(comm)
        if completer is None:
            completer = _Completer(f"reducer.torch-completer-{getattr(comm, 'rank', '?')}")
            _completers[comm] = completer
            # When the communicator is freed; at exit reducer.lifetime closes it, in order.
            weakref.finalize(comm, completer.close).atexit = False
        return completer


def close_completer(comm: Any) -> None:
    """End the completion thread of `comm` (closed by its owner): every future submitted through
    it completes first, with the error of its rounds when the communicator failed them."""
    with _completers_lock:
        completer = _completers.pop(comm, None)
    if completer is not None:
        completer.close()


def _future_for(tensors: Sequence[torch.Tensor]) -> torch.futures.Future:
    names = sorted({str(t.device) for t in tensors if t.device.type != "cpu"})
    devices: list[int | str | torch.device] = list(names)
    return torch.futures.Future(devices=devices) if devices else torch.futures.Future()


def cpp_future(fut: torch.futures.Future) -> torch.futures.Future:
    """`fut` as torch's C++ side must see it: DDP's reducer (a comm hook's result, a Work's
    get_future()) reads the value in C++. An error set with ``Future.set_exception`` is visible
    to Python only: C++ takes the exception object for the value, and DDP's reducer then reads
    it as a tensor list (torch 2.x crashes). A ``then()`` child carries the error as a C++ error,
    so backward() raises it (as a RuntimeError naming the original exception)."""
    return fut.then(_value)


def _value(fut: torch.futures.Future) -> Any:
    return fut.wait()  # raises what set_exception stored


def reduce_async(
    comm: Any, tensors: Sequence[torch.Tensor], op: str, finish: Callable[[], Any], name: str | None = None
) -> torch.futures.Future:
    """Submit every tensor with comm.allreduce_async; the returned Future gets finish()'s value.

    The tensors must be contiguous (they are reduced in place). Futures of one communicator
    complete in submission order.
    """
    handles = [comm.allreduce_async(t, op=op, name=name) for t in tensors if t.numel() > 0]
    fut = _future_for(tensors)
    _completer(comm).submit(handles, fut, finish)
    return fut


# -- hook state ---------------------------------------------------------------------------------

_default_comm: Any = None
_default_lock = threading.Lock()


class HookState:
    """State for the hooks: the Communicator the gradients go through.

    comm: a reducer.Communicator (or a ReductionServerProcessGroup, whose communicator is
    used). None: if ``process_group`` (default: the default group) is a "reduction_server"
    group, its communicator; otherwise connect with ``reducer.init(**init_kwargs)``, taking rank
    and world size from that group so the hook reduces within the same workers as DDP. Without
    keyword arguments that connection is made once per process and shared by every HookState.
    """

    def __init__(self, comm: Any = None, process_group: Any = None, **init_kwargs: Any) -> None:
        owns = False
        if comm is not None and hasattr(comm, "communicator") and not hasattr(comm, "allreduce_async"):
            comm = comm.communicator
        if comm is None:
            comm, owns = _connect(process_group, init_kwargs)
        if not hasattr(comm, "allreduce_async"):
            raise TypeError(f"HookState needs a reducer.Communicator, got {type(comm).__name__}")
        self.comm = comm
        self._owns = owns  # close() only closes a connection this HookState made

    @property
    def world_size(self) -> int:
        return int(self.comm.world_size)

    def close(self) -> None:
        """Close the connection HookState() made (the shared one too: the next HookState() reconnects).

        A communicator passed in, or borrowed from a "reduction_server" process group, stays open.
        """
        global _default_comm
        if not self._owns:
            return
        with _default_lock:
            if self.comm is _default_comm:
                _default_comm = None
        self.comm.close()
        close_completer(self.comm)

    def __repr__(self) -> str:
        return f"HookState({self.comm!r})"


def _connect(process_group: Any, init_kwargs: dict) -> tuple[Any, bool]:
    """(communicator, whether the caller owns it) for HookState(comm=None)."""
    global _default_comm

    pg = process_group
    if pg is None and dist.is_initialized():
        pg = dist.distributed_c10d._get_default_group()
    if not init_kwargs and hasattr(pg, "communicator"):  # DDP over the "reduction_server" backend
        return pg.communicator, False
    kwargs = dict(init_kwargs)
    if pg is not None:
        kwargs.setdefault("rank", dist.get_rank(process_group))
        kwargs.setdefault("world_size", dist.get_world_size(process_group))
    if process_group is not None:  # a sub-group: its own group on the reducers, named by its members
        ranks = "-".join(str(r) for r in dist.get_process_group_ranks(process_group))
        kwargs.setdefault("group", f"{config.get('group')}.ranks-{ranks}")
    # DDP buckets are already fused (bucket_cap_mb): unless the user configured fusion, send each
    # bucket as its own round and skip the fusion engine's agreement round per bucket.
    defaults = {} if config.env_text("fusion_threshold") is not None else {"fusion_threshold": 0}
    if not set(kwargs) <= {"rank", "world_size"}:
        return reducer.init(**{**defaults, **kwargs}), True
    with _default_lock:
        comm = _default_comm
        if comm is None or (comm.rank, comm.world_size) != (
            kwargs.get("rank", comm.rank),
            kwargs.get("world_size", comm.world_size),
        ):
            comm = _default_comm = reducer.init(**{**defaults, **kwargs})
        return comm, True


def _comm_of(state: Any) -> Any:
    if isinstance(state, HookState):
        return state.comm
    if state is None:  # like torch's hooks with state=None: the default group, one shared connection
        return HookState().comm
    comm = getattr(state, "communicator", None)  # a "reduction_server" process group
    if comm is not None:
        return comm
    if hasattr(state, "allreduce_async"):
        return state
    raise TypeError(
        f"hook state must be a reducer.torch.HookState (or a reducer.Communicator), got {type(state).__name__}: "
        "register the hook with ddp.register_comm_hook(reducer.torch.HookState(), hook)"
    )


# -- hooks --------------------------------------------------------------------------------------


# No `from __future__ import annotations` here: DDP compares the hooks' annotations with the real
# dist.GradBucket and torch.futures.Future[torch.Tensor] objects.


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over all workers through the reducers (like torch's allreduce_hook)."""
    comm = _comm_of(state)
    buffer = bucket.buffer()
    target = buffer if buffer.is_contiguous() else buffer.contiguous()

    def finish() -> torch.Tensor:
        if target is not buffer:
            buffer.copy_(target)
        return buffer

    return cpp_future(reduce_async(comm, [target], "avg", finish, name=f"ddp.bucket{bucket.index()}"))


def _compress_hook(dtype: torch.dtype, compression: str, state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
    comm = _comm_of(state)
    buffer = bucket.buffer()
    if buffer.dtype == torch.float32 and buffer.device.type == "cpu":
        # The transport narrows each chunk as it sends it and widens the mean straight back into
        # the bucket: no cast copy. Each gradient is rounded once to 16 bits, the reducers sum in
        # float32 and divide by the world size, the mean is rounded once.
        target = buffer if buffer.is_contiguous() else buffer.contiguous()
        rounds = (
            [comm.allreduce_raw_async(target.data_ptr(), target.numel() * 4, "float32", "avg", compression=compression)]
            if target.numel()
            else []
        )

        def finish_in_place() -> torch.Tensor:
            if target is not buffer:
                buffer.copy_(target)
            return buffer

        fut = _future_for([buffer])
        _completer(comm).submit(rounds, fut, finish_in_place)
        return cpp_future(fut)
    # Other dtypes, and device buckets (casting on the device halves the copy to the host too):
    # as torch's built-ins: cast, divide by the world size (keeps fp16 sums in range), sum, cast back.
    compressed = buffer.to(dtype).div_(comm.world_size)
    if not compressed.is_contiguous():
        compressed = compressed.contiguous()

    def finish() -> torch.Tensor:
        buffer.copy_(compressed)
        return buffer

    return cpp_future(reduce_async(comm, [compressed], "sum", finish, name=f"ddp.bucket{bucket.index()}"))


def fp16_compress_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Like allreduce_hook, but the bucket travels as float16 (half the bytes).

    A float32 CPU bucket is converted by the transport chunk by chunk (no copy); the result is
    each gradient rounded once to float16, averaged in float32, rounded once."""
    return _compress_hook(torch.float16, "fp16", state, bucket)


def reducer_bf16_compress_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Like allreduce_hook, but the bucket travels as bfloat16 (half the bytes, float32's range).

    A float32 CPU bucket is converted by the transport chunk by chunk (no copy); the result is
    each gradient rounded once to bfloat16, averaged in float32, rounded once."""
    return _compress_hook(torch.bfloat16, "bf16", state, bucket)


# Public name bf16_compress_hook, but not as the function's __name__: DDP refuses any hook *named*
# "bf16_compress_hook" unless NCCL >= 2.10 is available, which this hook does not need.
bf16_compress_hook = reducer_bf16_compress_hook
