"""One asyncio event loop, in a daemon thread, for every control plane of this process.

The control plane's gRPC server is a grpc.aio server: an RPC whose request has not fully arrived
costs a suspended coroutine, not a thread (grpc's threaded server holds a pool thread until the
request message comes, so a few half-sent requests would stop it answering anything). All the
control planes of a process share this loop (grpc.aio is happiest with one).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any

from . import import_grpc

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def shared_loop() -> asyncio.AbstractEventLoop:
    """The running loop of the control planes (started on first use)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                # grpc.aio tears its poller down when its last server or channel goes and the next
                # one starts another; with one loop for the life of the process, keep it up.
                import_grpc().aio.init_grpc_aio()
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="rs-control-loop", daemon=True).start()
            ready.wait(10.0)
            _loop = loop
        return _loop


def run(coro: Awaitable[Any], timeout: float = 10.0) -> Any:
    """Run `coro` on the shared loop from another thread and return its result."""
    loop = shared_loop()
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)  # type: ignore[arg-type]


def in_loop_thread() -> bool:
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False
