"""Every thread the library starts ends before the interpreter finalizes.

A Python thread still running when the interpreter finalizes is stopped by the interpreter the
next time it takes the GIL; if that happens inside C++ code (the core's wait, a tensor freed by
torch), the C++ runtime calls std::terminate and the process aborts with status 134 after the
work succeeded ("terminate called without an active exception", issue 24). So objects that own
threads end them in close() (joined, bounded), and register here for the processes that never
call close(): one atexit handler, registered when the library is imported, closes whatever is
still open before the interpreter finalizes, in two phases:

1. CONNECTIONS (Communicators): their rounds in flight fail, so no thread stays blocked in one;
   their own threads (reducer.fusion) end.
2. HELPERS (reducer.torch's completion threads, which wait for those rounds): closed and joined.

Every join is bounded (EXIT_JOIN_TIMEOUT); a thread that does not end in time is named in a
WARNING and left behind, never waited for without end. A forked child closes nothing of its
parent's: this registry is emptied in the child, a Communicator copied into it knows it is a copy
(reducer.communicator), and so does the core's client (Client.inherited, csrc/client/idle.cc).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

CONNECTIONS, HELPERS = 0, 1
EXIT_JOIN_TIMEOUT = 10.0  # seconds each phase may take at exit

_lock = threading.RLock()  # reentrant: a garbage collection under it may run a close() that forgets
_open: list[weakref.WeakSet[Any]] = [weakref.WeakSet(), weakref.WeakSet()]


def close_at_exit(obj: Any, phase: int) -> None:
    """Call obj.close_at_exit() at interpreter exit unless obj is gone by then (held weakly)."""
    with _lock:
        _open[phase].add(obj)


def forget(obj: Any) -> None:
    """obj was closed: nothing to do for it at exit."""
    with _lock:
        for objs in _open:
            objs.discard(obj)


def join_threads(threads: Iterable[threading.Thread], timeout: float, what: str) -> bool:
    """Join `threads` (all of them within `timeout` seconds); False, with a WARNING naming the
    ones still running, if some did not end. The calling thread itself is skipped."""
    me = threading.current_thread()
    others = [t for t in threads if t is not me]
    deadline = time.monotonic() + timeout
    for t in others:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in others if t.is_alive()]
    if left:
        log.warning("%s: thread(s) %s still running after %.1fs; leaving them behind", what, ", ".join(left), timeout)
    return not left


def _close_all() -> None:
    for phase in (CONNECTIONS, HELPERS):
        with _lock:
            objs = list(_open[phase])
            _open[phase].clear()
        for obj in objs:
            try:
                obj.close_at_exit()
            except Exception:  # one failure must not keep the others open
                log.warning("closing %r at exit failed", obj, exc_info=True)


def _forget_all_in_child() -> None:
    """A forked child has none of the parent's threads, and its copies of the parent's
    connections are the parent's to close (a goodbye from the child would end the parent's group)."""
    global _lock
    _lock = threading.RLock()  # the parent may have held it while forking
    for objs in _open:
        objs.clear()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_all_in_child)
